import os from "node:os";
import {
  ChannelCredentials,
  InterceptingCall,
  Metadata,
  credentials as grpcCredentials,
  type ChannelOptions,
  type Interceptor,
  type ServiceError,
} from "@grpc/grpc-js";
import {
  AdminClient,
  ListJobsRequest,
  type ListJobsResponse,
  type QueueInfo,
  type RetryJobResponse,
} from "./gen/jobbroker/v1/admin";
import {
  BrokerClient,
  type EnqueueRequest,
  type FailResponse,
  type HeartbeatResponse,
  type LeasedJob,
} from "./gen/jobbroker/v1/broker";
import type { Job, JobState } from "./gen/jobbroker/v1/job";
import { QueuePolicy } from "./gen/jobbroker/v1/policy";
import { durationFromMs, encodePayload, type Payload } from "./convert";
import { fromServiceError } from "./errors";

/** The broker address when none is given: $JOBBROKER_ADDRESS, else 127.0.0.1:7070. */
export function defaultAddress(): string {
  return process.env.JOBBROKER_ADDRESS || "127.0.0.1:7070";
}

/**
 * What this library calls itself in the "jobbroker-client" metadata of every call
 * ("jobbroker-typescript/0.1.0"): Admin.ListWorkers shows it, so an operator can tell which
 * library (and version) a worker runs. The version is package.json's, read once at load: the
 * package ships package.json two levels above dist/src/.
 */
export const clientName = `jobbroker-typescript/${(require("../../package.json") as { version: string }).version}`;

/** Adds the "jobbroker-client" metadata to every call of the channel, unary and streaming. */
const nameTheClient: Interceptor = (options, nextCall) =>
  new InterceptingCall(nextCall(options), {
    start(metadata, listener, next) {
      metadata.set("jobbroker-client", clientName);
      next(metadata, listener);
    },
  });

/** "<hostname>-<pid>": names a worker in attempt histories. */
export function defaultWorkerId(): string {
  return `${os.hostname()}-${process.pid}`;
}

export interface ClientOptions {
  /** "host:port"; default $JOBBROKER_ADDRESS, else 127.0.0.1:7070. */
  address?: string;
  /** Default: insecure (plaintext), as the broker serves by default. */
  credentials?: ChannelCredentials;
  /** Extra grpc-js channel options. */
  channelOptions?: ChannelOptions;
  /** Deadline of each unary call in ms (a Lease's `waitMs` is added to it). Default: none. */
  timeoutMs?: number;
}

/** Every option of Broker.Enqueue. Durations are in milliseconds. */
export interface EnqueueOptions {
  /** Opaque metadata handed to the worker (trace ids, content types). */
  headers?: Record<string, string>;
  /** Higher runs first; FIFO within one priority. Default 0. */
  priority?: number;
  /** Run no earlier than this long from now. At most one of delayMs and runAt. */
  delayMs?: number;
  /** Run no earlier than this time. */
  runAt?: Date;
  /** While a job of the queue holds this key, enqueueing it again returns that job (deduplicated). */
  dedupKey?: string;
  /** How long the dedup key blocks duplicates; default the queue's dedup_ttl. */
  dedupTtlMs?: number;
  /** Attempts in total, the first included; default the queue's retry.max_attempts. */
  maxAttempts?: number;
  /** Lease length when the worker names none; default the queue's lease_duration. */
  leaseDurationMs?: number;
  /** Groups jobs for the queue's max_concurrency_per_key (e.g. a tenant id). */
  concurrencyKey?: string;
  /** Run-time limit of each attempt (100 ms to 720 h); default the queue's timeout, else none. */
  timeoutMs?: number;
  /** Not started after this time: the job dies with FAIL_REASON_EXPIRED instead. */
  expireAt?: Date;
  /**
   * Jobs (of the same partition) it waits for: JOB_STATE_WAITING until all completed, then
   * READY with their results in `LeasedJob.dependencyResults`; FAILED (DEPENDENCY_FAILED) if one
   * fails.
   */
  dependsOn?: string[];
}

/** One job of an `enqueueBatch`. */
export interface BatchJob extends EnqueueOptions {
  queue: string;
  /** Bytes as they are, a string as UTF-8, anything else as JSON. */
  payload?: Payload;
  /** Earlier jobs of the same batch it waits for, by index (a fan-out/fan-in in one call). */
  dependsOnIndex?: number[];
}

export interface EnqueueResult {
  jobId: string;
  /** True when dedupKey matched an existing job: jobId is that job and nothing was created. */
  deduplicated: boolean;
}

export interface LeaseOptions {
  /** Names the worker in the job's attempt history; default "<hostname>-<pid>". */
  workerId?: string;
  /** At most this many jobs; default 1. */
  maxJobs?: number;
  /** Lease length; default the job's, else the queue's. */
  leaseDurationMs?: number;
  /** Long poll: wait up to this long (at most 60 s) for a job when none is ready. */
  waitMs?: number;
}

/** What identifies a lease: a LeasedJob has both fields. */
export interface LeaseHandle {
  jobId: string;
  leaseId: string;
}

export interface FailOptions {
  /** No retry: the job dies with FAIL_REASON_PERMANENT. */
  permanent?: boolean;
  /** Wait this long before the next attempt instead of the computed backoff. */
  retryAfterMs?: number;
}

export interface ListJobsOptions {
  /** Only jobs in this state; default every state. */
  state?: JobState;
  /** 1 to 1000; default 100. */
  pageSize?: number;
  /** `nextPageToken` of the previous page. */
  pageToken?: string;
  newestFirst?: boolean;
  /** Only the job that holds this dedup key (none if no job holds it). */
  dedupKey?: string;
}

/** Deep-partial form of a message, as `fromPartial` takes it. */
export type PartialMessage<T> = T extends Date | Uint8Array
  ? T
  : T extends (infer U)[]
    ? PartialMessage<U>[]
    : T extends object
      ? { [K in keyof T]?: PartialMessage<T[K]> }
      : T;

type Unary<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: { deadline?: Date },
  callback: (err: ServiceError | null, response: Res) => void,
) => unknown;

export function toEnqueueRequest(queue: string, payload: Payload, o: EnqueueOptions = {}): EnqueueRequest {
  return {
    queue,
    payload: encodePayload(payload),
    headers: { ...(o.headers ?? {}) },
    priority: o.priority ?? 0,
    delay: durationFromMs(o.delayMs),
    runAt: o.runAt,
    dedupKey: o.dedupKey ?? "",
    dedupTtl: durationFromMs(o.dedupTtlMs),
    maxAttempts: o.maxAttempts ?? 0,
    leaseDuration: durationFromMs(o.leaseDurationMs),
    concurrencyKey: o.concurrencyKey ?? "",
    timeout: durationFromMs(o.timeoutMs),
    expireAt: o.expireAt,
    dependsOn: [...(o.dependsOn ?? [])],
    dependsOnIndex: [],
  };
}

/**
 * The producer and operator API of one broker over one gRPC channel: Broker (enqueue, lease,
 * heartbeat, ack, fail, release) and Admin (jobs and queues). Every method returns a promise that
 * rejects with a `JobBrokerError` carrying the gRPC status code. Call `close()` when done.
 *
 *   const client = new Client({ address: "127.0.0.1:7070" });
 *   const { jobId } = await client.enqueue("emails", { to: "ada@example.com" });
 */
export class Client {
  /** The generated Broker stub, for calls this class does not wrap. */
  readonly broker: BrokerClient;
  /** The generated Admin stub. */
  readonly admin: AdminClient;
  readonly address: string;
  private readonly timeoutMs?: number;

  constructor(options: ClientOptions | string = {}) {
    const o: ClientOptions = typeof options === "string" ? { address: options } : options;
    this.address = o.address || defaultAddress();
    this.timeoutMs = o.timeoutMs;
    const creds = o.credentials ?? grpcCredentials.createInsecure();
    const channelOptions: ChannelOptions = {
      // Reconnect quickly after a broker restart (grpc-js waits up to 120 s by default).
      "grpc.initial_reconnect_backoff_ms": 100,
      "grpc.max_reconnect_backoff_ms": 5000,
      "grpc.max_receive_message_length": 16 * 1024 * 1024,
      ...(o.channelOptions ?? {}),
    };
    this.broker = new BrokerClient(this.address, creds, { ...channelOptions, interceptors: [nameTheClient] });
    // The admin stub shares the broker stub's channel.
    this.admin = new AdminClient(this.address, creds, {
      ...channelOptions,
      channelOverride: this.broker.getChannel(),
      interceptors: [nameTheClient],
    });
  }

  /** Closes the channel; calls after this fail. */
  close(): void {
    this.broker.close();
  }

  private call<Req, Res>(
    stub: BrokerClient | AdminClient,
    method: Unary<Req, Res>,
    request: Req,
    extraMs = 0,
  ): Promise<Res> {
    const deadline = this.timeoutMs === undefined ? undefined : new Date(Date.now() + this.timeoutMs + extraMs);
    return new Promise<Res>((resolve, reject) => {
      method.call(stub, request, new Metadata(), deadline ? { deadline } : {}, (err, response) => {
        if (err) reject(fromServiceError(err));
        else resolve(response);
      });
    });
  }

  // ---- Broker ---------------------------------------------------------------------------------

  /**
   * Adds one job; resolves once it is durable. `payload`: bytes as they are, a string as UTF-8,
   * anything else as JSON. INVALID_ARGUMENT names a malformed field; ALREADY_EXISTS if
   * `dedupKey` is held by a job with another payload; RESOURCE_EXHAUSTED for a full queue.
   */
  async enqueue(queue: string, payload?: Payload, options: EnqueueOptions = {}): Promise<EnqueueResult> {
    const r = await this.call(this.broker, this.broker.enqueue as Unary<EnqueueRequest, EnqueueResult>,
      toEnqueueRequest(queue, payload, options));
    return { jobId: r.jobId, deduplicated: r.deduplicated };
  }

  /** Adds 1 to 1000 jobs, all or nothing; results are in the order of `jobs`. */
  async enqueueBatch(jobs: BatchJob[]): Promise<EnqueueResult[]> {
    const r = await this.call(this.broker, this.broker.enqueueBatch as Unary<unknown, { results: EnqueueResult[] }>, {
      jobs: jobs.map((j) => ({
        ...toEnqueueRequest(j.queue, j.payload, j),
        dependsOnIndex: [...(j.dependsOnIndex ?? [])],
      })),
    });
    return r.results.map((x) => ({ jobId: x.jobId, deduplicated: x.deduplicated }));
  }

  /** Leases up to `maxJobs` ready jobs of `queue` (empty when none was ready within `waitMs`). */
  async lease(queue: string, options: LeaseOptions = {}): Promise<LeasedJob[]> {
    const r = await this.call(
      this.broker,
      this.broker.lease as Unary<unknown, { jobs: LeasedJob[] }>,
      {
        queue,
        workerId: options.workerId ?? defaultWorkerId(),
        maxJobs: options.maxJobs ?? 1,
        leaseDuration: durationFromMs(options.leaseDurationMs),
        wait: durationFromMs(options.waitMs),
      },
      options.waitMs ?? 0,
    );
    return r.jobs;
  }

  /**
   * Extends a lease (by `extendByMs`, default the lease's own length) and optionally saves a
   * checkpoint. FAILED_PRECONDITION if the lease is no longer held.
   */
  heartbeat(lease: LeaseHandle, options: { extendByMs?: number; checkpoint?: Uint8Array } = {}): Promise<HeartbeatResponse> {
    return this.call(this.broker, this.broker.heartbeat as Unary<unknown, HeartbeatResponse>, {
      jobId: lease.jobId,
      leaseId: lease.leaseId,
      extendBy: durationFromMs(options.extendByMs),
      checkpoint: options.checkpoint,
    });
  }

  /** Completes the job, keeping `result` with it. FAILED_PRECONDITION for a stale lease. */
  async ack(lease: LeaseHandle, result?: Payload): Promise<void> {
    await this.call(this.broker, this.broker.ack as Unary<unknown, unknown>, {
      jobId: lease.jobId,
      leaseId: lease.leaseId,
      result: encodePayload(result),
    });
  }

  /** Fails the attempt: retried after a backoff, or dead (permanent, or no attempts left). */
  fail(lease: LeaseHandle, error: string, options: FailOptions = {}): Promise<FailResponse> {
    return this.call(this.broker, this.broker.fail as Unary<unknown, FailResponse>, {
      jobId: lease.jobId,
      leaseId: lease.leaseId,
      error,
      permanent: options.permanent ?? false,
      retryAfter: durationFromMs(options.retryAfterMs),
    });
  }

  /** Gives the job back unstarted: READY again, no attempt counted. */
  async release(lease: LeaseHandle): Promise<void> {
    await this.call(this.broker, this.broker.release as Unary<unknown, unknown>, {
      jobId: lease.jobId,
      leaseId: lease.leaseId,
    });
  }

  // ---- Admin ----------------------------------------------------------------------------------

  /** The job, with its state, attempts, checkpoint and result. NOT_FOUND for an unknown id. */
  getJob(jobId: string): Promise<Job> {
    return this.call(this.admin, this.admin.getJob as Unary<unknown, Job>, { jobId });
  }

  /** One page of a queue's jobs. */
  listJobs(queue: string, options: ListJobsOptions = {}): Promise<ListJobsResponse> {
    // fromPartial sets every field the options leave out (and any field a newer proto adds) to
    // its default; the generated encoder would write an `undefined` string field as a value.
    return this.call(
      this.admin,
      this.admin.listJobs as Unary<unknown, ListJobsResponse>,
      ListJobsRequest.fromPartial({
        queue,
        state: options.state ?? 0,
        pageSize: options.pageSize ?? 0,
        pageToken: options.pageToken ?? "",
        newestFirst: options.newestFirst ?? false,
        dedupKey: options.dedupKey ?? "",
      }),
    );
  }

  /** READY/SCHEDULED: cancelled at once; ACTIVE: the worker is told (cancel_requested). */
  cancelJob(jobId: string): Promise<Job> {
    return this.call(this.admin, this.admin.cancelJob as Unary<unknown, Job>, { jobId });
  }

  /** A FAILED or CANCELLED job back to READY, attempts reset. */
  async retryJob(jobId: string): Promise<Job> {
    const r = await this.call(this.admin, this.admin.retryJob as Unary<unknown, RetryJobResponse>, {
      jobId, queue: "", state: 0, dryRun: false, limit: 0,
    });
    return r.job!;
  }

  /** Bulk redrive: every job of `queue` in `state` (default FAILED) back to READY. */
  retryQueue(queue: string, options: { state?: JobState; dryRun?: boolean; limit?: number } = {}): Promise<RetryJobResponse> {
    return this.call(this.admin, this.admin.retryJob as Unary<unknown, RetryJobResponse>, {
      jobId: "", queue, state: options.state ?? 0, dryRun: options.dryRun ?? false, limit: options.limit ?? 0,
    });
  }

  /** Removes a job that is not ACTIVE. */
  async deleteJob(jobId: string): Promise<void> {
    await this.call(this.admin, this.admin.deleteJob as Unary<unknown, unknown>, { jobId });
  }

  async listQueues(): Promise<QueueInfo[]> {
    const r = await this.call(this.admin, this.admin.listQueues as Unary<unknown, { queues: QueueInfo[] }>, {});
    return r.queues;
  }

  /** Effective policy, counts by state (keyed "JOB_STATE_READY", ...) and oldest ready age. */
  getQueue(queue: string): Promise<QueueInfo> {
    return this.call(this.admin, this.admin.getQueue as Unary<unknown, QueueInfo>, { queue });
  }

  /** Changes a queue's policy at run time (persisted); fields left out keep their value. */
  updateQueuePolicy(queue: string, policy: PartialMessage<QueuePolicy>, options: { reset?: boolean } = {}): Promise<QueueInfo> {
    return this.call(this.admin, this.admin.updateQueuePolicy as Unary<unknown, QueueInfo>, {
      queue,
      policy: QueuePolicy.fromPartial(policy as never),
      reset: options.reset ?? false,
    });
  }

  pauseQueue(queue: string): Promise<QueueInfo> {
    return this.call(this.admin, this.admin.pauseQueue as Unary<unknown, QueueInfo>, { queue });
  }

  resumeQueue(queue: string): Promise<QueueInfo> {
    return this.call(this.admin, this.admin.resumeQueue as Unary<unknown, QueueInfo>, { queue });
  }

  /** Removes the queue's jobs in `states` (default every terminal state); resolves to the count. */
  async purgeQueue(queue: string, states: JobState[] = []): Promise<number> {
    const r = await this.call(this.admin, this.admin.purgeQueue as Unary<unknown, { purged: number }>, { queue, states });
    return r.purged;
  }
}
