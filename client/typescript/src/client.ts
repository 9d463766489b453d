import { readFileSync } from "node:fs";
import os from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import {
  ChannelCredentials,
  InterceptingCall,
  Metadata,
  credentials as grpcCredentials,
  type CallOptions as GrpcCallOptions,
  type ChannelOptions,
  type Interceptor,
  type ServiceError,
} from "@grpc/grpc-js";
import {
  AdminClient,
  CancelJobRequest,
  DeleteJobRequest,
  DeleteScheduleRequest,
  GetClusterRequest,
  GetJobRequest,
  GetQueueRequest,
  GetScheduleRequest,
  ListJobsRequest,
  ListQueuesRequest,
  ListSchedulesRequest,
  ListWorkersRequest,
  PauseQueueRequest,
  PurgeQueueRequest,
  PutScheduleRequest,
  ResumeQueueRequest,
  RetryJobRequest,
  ScheduleCatchUp,
  TriggerScheduleRequest,
  UpdateQueuePolicyRequest,
  WatchJobRequest,
  type ClusterInfo,
  type DeleteJobResponse,
  type DeleteScheduleResponse,
  type ListJobsResponse,
  type ListQueuesResponse,
  type ListSchedulesResponse,
  type ListWorkersResponse,
  type PurgeQueueResponse,
  type QueueInfo,
  type RetryJobResponse,
  type Schedule,
  type TriggerScheduleResponse,
  type WorkerInfo,
} from "./gen/jobbroker/v1/admin.js";
import {
  AckRequest,
  BrokerClient,
  EnqueueBatchRequest,
  FailRequest,
  HeartbeatRequest,
  LeaseRequest,
  ReleaseRequest,
  type AckResponse,
  type EnqueueBatchResponse,
  type EnqueueRequest,
  type EnqueueResponse,
  type FailResponse,
  type HeartbeatResponse,
  type LeaseResponse,
  type LeasedJob,
  type ReleaseResponse,
} from "./gen/jobbroker/v1/broker.js";
import { JobState, type Job } from "./gen/jobbroker/v1/job.js";
import { QueuePolicy } from "./gen/jobbroker/v1/policy.js";
import { version } from "./gen/version.js";
import { asBuffer, durationFromMs, encodePayload, type Payload } from "./convert.js";
import { JobBrokerError, JobEndedError, Status, fromServiceError } from "./errors.js";
import { composeProducer, composeProducerBatch, type EnqueueResult, type ProducerMiddleware } from "./middleware.js";
import { BatchStream } from "./batch-stream.js";
import { Coalescer } from "./coalescer.js";
import { partitionOfQueue } from "./partition.js";
import { Router, isTransient, type Endpoint, type Route } from "./router.js";
import type { RoutingTable } from "./routing-table.js";

export type { EnqueueResult };

/** "a:1, b:2" as ["a:1", "b:2"]: one variable names every node of a cluster. */
function splitAddresses(list: string): string[] {
  const addresses = list
    .split(",")
    .map((a) => a.trim())
    .filter((a) => a !== "");
  return addresses.length > 0 ? addresses : [list];
}

/** The broker address when none is given: $JOBBROKER_ADDRESS, else 127.0.0.1:7070. */
export function defaultAddress(): string {
  return process.env.JOBBROKER_ADDRESS || "127.0.0.1:7070";
}

/**
 * What this library calls itself in the "jobbroker-client" metadata of every call
 * ("jobbroker-typescript/0.1.0"): Admin.ListWorkers shows it, so an operator can tell which
 * library (and version) a worker runs. The version is the repository's VERSION file, which the
 * build writes into src/gen/version.ts (and package.json).
 */
export const clientName = `jobbroker-typescript/${version}`;

/** Adds the library's name and, when there is one, the bearer token to every call. */
function callMetadata(token: string | undefined): Interceptor {
  return (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set("jobbroker-client", clientName);
        // Metadata rather than grpc-js call credentials: those refuse a plaintext channel, and a
        // token on a laptop broker without TLS is a legitimate (if unwise) setup.
        if (token) metadata.set("authorization", `Bearer ${token}`);
        next(metadata, listener);
      },
    });
}

/** "<hostname>-<pid>": names a worker in attempt histories. */
export function defaultWorkerId(): string {
  return `${os.hostname()}-${process.pid}`;
}

/** PEM given inline, as bytes or as a file path. */
export type Pem = string | Uint8Array;

/**
 * How a Client (and a Worker, which takes the same options) reaches the broker. Every field is
 * optional: with none, a plaintext channel to $JOBBROKER_ADDRESS (else 127.0.0.1:7070), the token
 * in $JOBBROKER_TOKEN if set, a 10 s deadline on unary calls, and keepalive pings after 10 s
 * without a frame (5 s for the answer).
 */
export interface ClientOptions {
  /**
   * "host:port" (a comma-separated list is taken as `addresses`, as the other clients and the CLI
   * take it); default $JOBBROKER_ADDRESS (the same form), else 127.0.0.1:7070. Ignored when
   * `addresses` is set.
   */
  address?: string;
  /**
   * Several brokers (the nodes of a cluster), asked in order for the cluster's layout before the
   * first call. In a cluster each call then goes straight to its partition's leader (see
   * "Cluster" in the README); outside one, to the first that answered. A call answered
   * UNAVAILABLE makes the client ask again before the next call (and a retry-safe call is retried
   * there). A worker's stream moves the same way when it ends.
   */
  addresses?: string[];
  /**
   * TLS: `true` trusts the system's roots; a PEM (text starting "-----BEGIN", bytes, or a file
   * path) trusts that CA only. Default: plaintext, as the broker serves by default.
   */
  tls?: boolean | Pem;
  /** Mutual TLS: the certificate chain to present (PEM text, bytes or a file path). Implies TLS. */
  clientCert?: Pem;
  /** Mutual TLS: `clientCert`'s private key (PEM text, bytes or a file path). */
  clientKey?: Pem;
  /** The name the broker's certificate must carry, when it is not the address's host. */
  tlsServerName?: string;
  /**
   * Sent as `authorization: Bearer <token>` on every call (docs/security.md); default
   * $JOBBROKER_TOKEN. Use TLS with it anywhere but a laptop.
   */
  token?: string;
  /**
   * Deadline of each unary call in ms (a Lease's `waitMs` is added to it); default 10 s,
   * `Infinity` for none. A call's `CallOptions.deadlineMs` overrides it. Streams have none.
   */
  deadlineMs?: number;
  /**
   * Keepalive pings on every channel the client dials (a Worker's too), so that a broker that
   * froze, lost power or sits behind a firewall that drops packets is noticed: TCP alone does not,
   * and a worker's Work stream would wait on it forever. After `keepaliveTimeMs` the client pings,
   * and a ping unanswered for `keepaliveTimeoutMs` closes the connection: its calls fail and its
   * streams end UNAVAILABLE, and a worker reconnects after its backoff (to another node in a
   * cluster). Pings go out with no call open too (`grpc.keepalive_permit_without_calls`), so an
   * idle producer's dead connection is found before its next call. Default true; false (or a
   * `keepaliveTimeMs` of 0) sends no pings (the broker still pings its clients:
   * `--keepalive-time`).
   */
  keepalive?: boolean;
  /**
   * How long a connection may go on without a ping, in ms: 1000 (the broker accepts a client's
   * pings at most once a second) to 3 600 000, or 0 for no pings; default 10 000.
   * `grpc.keepalive_time_ms`.
   */
  keepaliveTimeMs?: number;
  /**
   * How long a ping may go unanswered before the connection is closed, in ms: 1000 to 600 000;
   * default 5000. `grpc.keepalive_timeout_ms`.
   */
  keepaliveTimeoutMs?: number;
  /** Replaces the credentials built from `tls`/`clientCert` (e.g. a custom verifier). */
  credentials?: ChannelCredentials;
  /**
   * Extra grpc-js channel options. They win over the client's own (the keepalive options
   * above included: a `"grpc.keepalive_time_ms"` here replaces `keepaliveTimeMs`).
   */
  channelOptions?: ChannelOptions;
  /** grpc-js interceptors run on every call after the library's own (metadata, logging, tests). */
  interceptors?: Interceptor[];
  /**
   * Enqueue coalescing (README "Enqueue coalescing"): concurrent `enqueue()` calls of one
   * partition are sent together as one EnqueueBatch, each caller still answered on its own.
   * Default true; false sends every `enqueue()` as one unary Enqueue, as before.
   */
  batching?: boolean;
  /** A batch is sent once it holds this many jobs: 1 to 1000, default 100. */
  batchMaxJobs?: number;
  /** ... or once its jobs' payload and header (name and value) bytes reach this; default 1 MiB. */
  batchMaxBytes?: number;
  /**
   * How long a batch that could be sent waits for more jobs, in ms; default 0: until the end of
   * the current turn of the event loop (the enqueues of one turn go together).
   */
  batchLingerMs?: number;
  /** Batches of one partition in flight at once (default 4); later jobs wait in the open batch. */
  batchMaxInFlight?: number;
  /**
   * Send the coalesced batches as messages of one EnqueueStream per node instead of one
   * EnqueueBatch call each (default true): a message costs grpc-js far less than a call.
   */
  batchStream?: boolean;
}

/** Per-call options, the last argument of every Client method. */
export interface CallOptions {
  /** This call's deadline in ms, instead of the client's `deadlineMs`. */
  deadlineMs?: number;
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
  /**
   * While a job of the queue holds this key, enqueueing it again returns that job
   * (deduplicated). It also makes the enqueue safe to retry: only enqueues with a key are
   * retried after UNAVAILABLE.
   */
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
  /**
   * false: this call is sent alone, as a unary Enqueue at once, not merged with other calls
   * (the client's `batching` option for one call). Default: the client's `batching`.
   */
  batch?: boolean;
}

/** One job of an `enqueueBatch` (sent as given: never merged with others, never split). */
export interface BatchJob extends Omit<EnqueueOptions, "batch"> {
  queue: string;
  /** Bytes as they are, a string as UTF-8, anything else as JSON. */
  payload?: Payload;
  /** Earlier jobs of the same batch it waits for, by index (a fan-out/fan-in in one call). */
  dependsOnIndex?: number[];
}

/** `enqueueAndWait`'s options: the enqueue's, and how long to wait. */
export interface EnqueueAndWaitOptions extends EnqueueOptions {
  /**
   * Give up waiting after this long (the job itself goes on): rejects with a JobBrokerError
   * DEADLINE_EXCEEDED naming the job's last state. Default: wait as long as it takes.
   */
  waitTimeoutMs?: number;
  /** Stop waiting when this aborts (rejects with its reason; the job goes on). */
  signal?: AbortSignal;
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

/** A recurring schedule for `putSchedule`: its timing and the job each run enqueues. */
export interface ScheduleSpec {
  /** 1 to 128 characters of [A-Za-z0-9._:-]; names the schedule and its runs' dedup keys. */
  scheduleId: string;
  /** A cron expression (5 fields, or 6 with seconds first). Exactly one of cron and everyMs. */
  cron?: string;
  /** A fixed interval, at least 1 s, counted from the schedule's creation (or startAt). */
  everyMs?: number;
  /** An IANA zone for cron ("Europe/Berlin"); default UTC. */
  timeZone?: string;
  /** The queue each run enqueues into. */
  queue: string;
  /** Each run's payload: bytes as they are, a string as UTF-8, anything else as JSON. */
  payload?: Payload;
  /**
   * Each run's enqueue options. Not dedupKey, delayMs, runAt nor expireAt: the schedule names
   * and times its runs (the broker refuses them with INVALID_ARGUMENT).
   */
  template?: EnqueueOptions;
  /** A paused schedule enqueues nothing; resuming goes on with the next run after now. */
  paused?: boolean;
  /** No run before this time. */
  startAt?: Date;
  /** No run after this time. */
  endAt?: Date;
  /** Runs missed while no broker ran it: one at once (the default) or none. */
  catchUp?: ScheduleCatchUp;
}

/** Deep-partial form of a message, as `fromPartial` takes it. */
export type PartialMessage<T> = T extends Date | Uint8Array
  ? T
  : T extends (infer U)[]
    ? PartialMessage<U>[]
    : T extends object
      ? { [K in keyof T]?: PartialMessage<T[K]> }
      : T;

type Callback<Res> = (err: ServiceError | null, response: Res) => void;
/** Starts one unary call on `endpoint`; typed by the stub method it calls. */
type Invoke<Res> = (endpoint: Endpoint, metadata: Metadata, options: Partial<GrpcCallOptions>, callback: Callback<Res>) => unknown;

// Safe retries: a call whose repeat cannot duplicate anything is tried this many times in all
// when the broker answers UNAVAILABLE (restarting, draining, a partition without a leader),
// waiting retryBackoffMs, then twice that, between attempts.
const retryAttempts = 3;
const retryBackoffMs = 50;
const defaultDeadlineMs = 10_000;

// Enqueue coalescing's defaults (docs/worker-contract.md §10).
const defaultBatchMaxJobs = 100;
const defaultBatchMaxBytes = 1024 * 1024;
const defaultBatchLingerMs = 0;
const defaultBatchMaxInFlight = 4;
// The broker takes at most this many jobs in one EnqueueBatch.
const maxBatchJobs = 1000;

/** An integer option, checked (`fallback` when unset): a bad value is refused naming the option. */
function integer(name: string, value: number | undefined, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `at least ${min}` : `from ${min} to ${max}`;
    throw new RangeError(`${name} must be an integer ${range}, not ${String(value)}`);
  }
  return value;
}

/** The coalescing options, checked: a bad value is refused by the constructor, naming the option. */
function batchingOptions(o: ClientOptions): { batching: boolean; maxJobs: number; maxBytes: number; lingerMs: number; maxInFlight: number } {
  if (o.batching !== undefined && typeof o.batching !== "boolean") {
    throw new TypeError(`batching must be true or false, not ${String(o.batching)}`);
  }
  const lingerMs = o.batchLingerMs ?? defaultBatchLingerMs;
  if (typeof lingerMs !== "number" || !Number.isFinite(lingerMs) || lingerMs < 0) {
    throw new RangeError(`batchLingerMs must be a finite number of ms, 0 or more, not ${String(lingerMs)}`);
  }
  return {
    batching: o.batching ?? true,
    maxJobs: integer("batchMaxJobs", o.batchMaxJobs, defaultBatchMaxJobs, 1, maxBatchJobs),
    maxBytes: integer("batchMaxBytes", o.batchMaxBytes, defaultBatchMaxBytes, 1, Number.MAX_SAFE_INTEGER),
    lingerMs,
    maxInFlight: integer("batchMaxInFlight", o.batchMaxInFlight, defaultBatchMaxInFlight, 1, Number.MAX_SAFE_INTEGER),
  };
}

// Keepalive's defaults: the broker's own (--keepalive-time 10 s, --keepalive-timeout 5 s).
const defaultKeepaliveTimeMs = 10_000;
const defaultKeepaliveTimeoutMs = 5_000;

/**
 * The grpc-js options of the keepalive options, checked (a bad value is refused naming the
 * option, with `keepalive: false` too); none with `keepalive: false` or `keepaliveTimeMs: 0`.
 * grpc-js has no cap on pings without data (grpc core's `grpc.http2.max_pings_without_data`): it
 * pings a quiet Work stream for as long as it is open.
 */
function keepaliveChannelOptions(o: ClientOptions): ChannelOptions {
  if (o.keepalive !== undefined && typeof o.keepalive !== "boolean") {
    throw new TypeError(`keepalive must be true or false, not ${String(o.keepalive)}`);
  }
  // 0: no pings (as docs/worker-contract.md §5 lets a time of zero mean).
  const timeMs = o.keepaliveTimeMs === 0 ? 0 : integer("keepaliveTimeMs", o.keepaliveTimeMs, defaultKeepaliveTimeMs, 1000, 3_600_000);
  const timeoutMs = integer("keepaliveTimeoutMs", o.keepaliveTimeoutMs, defaultKeepaliveTimeoutMs, 1000, 600_000);
  if (o.keepalive === false || timeMs === 0) return {};
  return {
    "grpc.keepalive_time_ms": timeMs,
    "grpc.keepalive_timeout_ms": timeoutMs,
    "grpc.keepalive_permit_without_calls": 1,
  };
}

/**
 * The grpc-js options of every channel a client dials: the library's (reconnect backoff, message
 * size, keepalive, TLS name), then the caller's `channelOptions`, which win. @internal
 */
export function channelOptionsOf(o: ClientOptions): ChannelOptions {
  return {
    // Reconnect quickly after a broker restart (grpc-js waits up to 120 s by default).
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 5000,
    "grpc.max_receive_message_length": 16 * 1024 * 1024,
    ...keepaliveChannelOptions(o),
    ...(o.tlsServerName ? { "grpc.ssl_target_name_override": o.tlsServerName } : {}),
    ...(o.channelOptions ?? {}),
  };
}

const terminalStates = new Set<JobState>([
  JobState.JOB_STATE_COMPLETED,
  JobState.JOB_STATE_FAILED,
  JobState.JOB_STATE_CANCELLED,
]);

/** A PEM option's bytes: inline text, bytes, or the contents of the file it names. */
function readPem(pem: Pem): Buffer {
  if (pem instanceof Uint8Array) return Buffer.from(pem);
  if (pem.trimStart().startsWith("-----BEGIN")) return Buffer.from(pem, "utf8");
  return readFileSync(pem);
}

function channelCredentials(o: ClientOptions): ChannelCredentials {
  if (o.credentials) return o.credentials;
  const mutual = o.clientCert !== undefined || o.clientKey !== undefined;
  if (!o.tls && !mutual) return grpcCredentials.createInsecure();
  if (mutual && (o.clientCert === undefined || o.clientKey === undefined)) {
    throw new Error("clientCert and clientKey go together (mutual TLS)");
  }
  const ca = typeof o.tls === "string" || o.tls instanceof Uint8Array ? readPem(o.tls) : null;
  return grpcCredentials.createSsl(
    ca,
    o.clientKey === undefined ? null : readPem(o.clientKey),
    o.clientCert === undefined ? null : readPem(o.clientCert),
  );
}

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

function toEnqueueResult(r: EnqueueResponse): EnqueueResult {
  return { jobId: r.jobId, deduplicated: r.deduplicated };
}

/**
 * The producer and operator API of jobbroker: Broker (enqueue, lease, heartbeat, ack, fail,
 * release) and Admin (jobs, queues, schedules, workers, the cluster). Every method returns a
 * promise that rejects with a `JobBrokerError` carrying the gRPC status code. Call `close()`
 * when done.
 *
 *   const client = new Client({ address: "127.0.0.1:7070" });
 *   const { jobId } = await client.enqueue("emails", { to: "ada@example.com" });
 *
 * Routing: before its first call the client asks a broker for the cluster's layout
 * (Admin.GetCluster) and sends each call to the leader of its queue's or job's partition; calls
 * any node serves go to the node that answered. It asks again after a call failed UNAVAILABLE
 * or DEADLINE_EXCEEDED (a leader moved, a node died). A broker that is not part of a cluster, or
 * refuses GetCluster, serves every call.
 *
 * Retries: a call answered UNAVAILABLE is tried again (3 attempts in all, 50 then 100 ms
 * apart; routed afresh, so to another node when the layout changed) only when a repeat cannot
 * do anything twice: reads, ack/fail/release/heartbeat (idempotent per lease), queue and
 * schedule puts, and enqueues whose every job has a dedup key. Any other call, an enqueue
 * without a dedup key first of all, is tried once: the caller sees the error and decides.
 */
export class Client {
  readonly address: string;
  /** The addresses this client was given, in order (`address` alone when `addresses` is not set). */
  readonly addresses: readonly string[];
  /** Which node each call goes to; shared with a Worker built on this client. @internal */
  readonly router: Router;
  private readonly deadlineMs: number;
  private readonly producerMiddleware: ProducerMiddleware[] = [];
  /** Merges single enqueues into batches; undefined with `batching: false`. */
  private readonly coalescer: Coalescer | undefined;
  // The batch key's partition of each queue under `keyTable`: FNV over BigInt is too slow to
  // compute for every job at the throughput coalescing is for.
  private keyTable: RoutingTable | undefined;
  private readonly keyOfQueue = new Map<string, string>();
  /** `batchStream`: each node's EnqueueStream, by address. */
  private readonly batchStreams: Map<string, BatchStream> | undefined;

  constructor(options: ClientOptions | string = {}) {
    const o: ClientOptions = typeof options === "string" ? { address: options } : options;
    const { batching, ...limits } = batchingOptions(o);
    const addresses = [...new Set(o.addresses?.length ? o.addresses : splitAddresses(o.address || defaultAddress()))];
    this.addresses = addresses;
    this.address = addresses[0];
    this.deadlineMs = o.deadlineMs ?? defaultDeadlineMs;
    const creds = channelCredentials(o);
    const token = o.token ?? (process.env.JOBBROKER_TOKEN || undefined);
    const channelOptions = channelOptionsOf(o);
    const interceptors = [callMetadata(token), ...(o.interceptors ?? [])];
    const dial = (address: string): Endpoint => {
      const broker = new BrokerClient(address, creds, { ...channelOptions, interceptors });
      // The admin stub shares the broker stub's channel.
      const admin = new AdminClient(address, creds, {
        ...channelOptions,
        channelOverride: broker.getChannel(),
        interceptors,
      });
      return { address, broker, admin };
    };
    this.router = new Router(addresses, dial, this.deadlineMs);
    if (o.batchStream !== undefined && typeof o.batchStream !== "boolean") {
      throw new TypeError(`batchStream must be true or false, not ${String(o.batchStream)}`);
    }
    this.batchStreams = o.batchStream ?? true ? new Map() : undefined;
    this.coalescer = batching
      ? new Coalescer(limits, {
          placeOf: (r) => this.placeOf(r.queue),
          sendOne: (r, deadlineMs) => this.sendEnqueue(r, { deadlineMs }),
          sendBatch: (rs, deadlineMs) => this.sendEnqueueBatch(rs, { deadlineMs }),
        })
      : undefined;
  }

  /**
   * A batch key's place: the queue's partition in the last cluster table the client holds, else
   * (no table yet, or a broker outside a cluster, whose partitions the client does not route by)
   * the queue itself. Either way a batch never spans partitions.
   */
  private placeOf(queue: string): string {
    const table = this.router.lastTable;
    if (!table.isCluster) return `queue ${queue}`;
    if (table !== this.keyTable) {
      this.keyTable = table;
      this.keyOfQueue.clear();
    }
    let place = this.keyOfQueue.get(queue);
    if (place === undefined) {
      if (this.keyOfQueue.size >= 10_000) this.keyOfQueue.clear(); // bounded: queue names may be many
      place = `partition ${partitionOfQueue(queue, table.partitionCount)}`;
      this.keyOfQueue.set(queue, place);
    }
    return place;
  }

  /**
   * The generated Broker stub of a node that serves any call (the one that last told the
   * cluster's layout, else the first address), for calls this class does not wrap.
   */
  get broker(): BrokerClient {
    return this.router.anyNode().broker;
  }

  /** The generated Admin stub of the same node as `broker`. */
  get admin(): AdminClient {
    return this.router.anyNode().admin;
  }

  /**
   * Adds producer middleware: it wraps every enqueue (and each job of an enqueueBatch), the
   * first added outermost. It gets the request (it may change it: add headers, say) and `next`,
   * and resolves with what `next` resolved (or its own result, without calling `next`).
   */
  use(middleware: ProducerMiddleware): this {
    this.producerMiddleware.push(middleware);
    return this;
  }

  /**
   * Closes the channels; calls after this fail. Enqueues waiting in a batch are sent first (at
   * once, without linger), and the channels close once every batch in flight was answered: await
   * it to know those callers have their answers. It never rejects.
   */
  async close(): Promise<void> {
    const draining = this.coalescer?.close();
    if (draining) await draining;
    for (const stream of this.batchStreams?.values() ?? []) stream.close();
    this.router.close();
  }

  private grpcOptions(call: CallOptions, extraMs: number): Partial<GrpcCallOptions> {
    const ms = call.deadlineMs ?? this.deadlineMs;
    return Number.isFinite(ms) ? { deadline: new Date(Date.now() + ms + extraMs) } : {};
  }

  /**
   * One unary call, sent to the node `route` names; `retry` says a repeat is harmless (the class
   * comment's rule).
   */
  private async call<Res>(route: Route, retry: boolean, invoke: Invoke<Res>, call: CallOptions = {}, extraMs = 0): Promise<Res> {
    const attempts = retry ? retryAttempts : 1;
    for (let attempt = 1; ; attempt++) {
      const endpoint = await this.router.nodeFor(route);
      try {
        return await new Promise<Res>((resolve, reject) => {
          invoke(endpoint, new Metadata(), this.grpcOptions(call, extraMs), (err, response) => {
            if (err) reject(err);
            else resolve(response);
          });
        });
      } catch (e) {
        const error = fromServiceError(e);
        const code = error instanceof JobBrokerError ? error.code : undefined;
        // Retried or not, the next call asks where the partitions are first: the node may be
        // gone or no longer lead.
        if (isTransient(code)) this.router.markStale();
        if (code !== Status.UNAVAILABLE || attempt >= attempts) throw error;
        await sleep(retryBackoffMs * 2 ** (attempt - 1));
      }
    }
  }

  // ---- Broker ---------------------------------------------------------------------------------

  /**
   * Adds one job; resolves once it is durable. `payload`: bytes as they are, a string as UTF-8,
   * anything else as JSON. INVALID_ARGUMENT names a malformed field; ALREADY_EXISTS if
   * `dedupKey` is held by a job with another payload; RESOURCE_EXHAUSTED for a full queue.
   * Retried after UNAVAILABLE only with a `dedupKey` (without one, a retry could enqueue twice).
   * Concurrent calls go together in EnqueueBatch calls (the `batching` client options; `batch:
   * false` for this call alone), each still answered with its own job or its own error.
   */
  enqueue(queue: string, payload?: Payload, options: EnqueueOptions = {}, call?: CallOptions): Promise<EnqueueResult> {
    return this.enqueueRequest(toEnqueueRequest(queue, payload, options), options.batch !== false, call);
  }

  /**
   * Sends one EnqueueRequest through the producer middleware, then (`batch`, and the client's
   * `batching`) through the coalescer: the middleware sees each call on its own, as before.
   */
  private enqueueRequest(request: EnqueueRequest, batch: boolean, call: CallOptions = {}): Promise<EnqueueResult> {
    const coalescer = batch ? this.coalescer : undefined;
    // async: a request the middleware left malformed rejects the call instead of throwing.
    const send = coalescer
      ? async (r: EnqueueRequest) => coalescer.add(r, call.deadlineMs ?? this.deadlineMs)
      : (r: EnqueueRequest) => this.sendEnqueue(r, call);
    return composeProducer(this.producerMiddleware, send)(request);
  }

  /** One unary Enqueue, retried after UNAVAILABLE only with a dedup key. */
  private async sendEnqueue(request: EnqueueRequest, call: CallOptions): Promise<EnqueueResult> {
    const r = await this.call<EnqueueResponse>(
      { queue: request.queue },
      request.dedupKey !== "",
      (e, md, o, cb) => e.broker.enqueue(request, md, o, cb),
      call,
    );
    return toEnqueueResult(r);
  }

  /** One EnqueueBatch of `requests`, retried after UNAVAILABLE only when every job has a dedup key. */
  private async sendEnqueueBatch(requests: EnqueueRequest[], call?: CallOptions): Promise<EnqueueResult[]> {
    // Every field of an EnqueueRequest is set already: no fromPartial copy of each job.
    const request: EnqueueBatchRequest = { jobs: requests };
    const retry = requests.every((r) => r.dedupKey !== "");
    const route: Route = requests.length > 0 ? { queue: requests[0].queue } : "any";
    const streams = this.batchStreams;
    const invoke: Invoke<EnqueueBatchResponse> = (e, md, o, cb) => {
      let stream = streams?.get(e.address);
      if (streams && stream === undefined) streams.set(e.address, (stream = new BatchStream(e.broker)));
      if (stream === undefined || stream.unsupported) return e.broker.enqueueBatch(request, md, o, cb);
      stream.send(request, o, (err, response) => {
        // A broker older than EnqueueStream refused the stream, not the batch: sent as a call.
        if (err?.code === Status.UNIMPLEMENTED && stream.unsupported) e.broker.enqueueBatch(request, md, o, cb);
        else cb(err, response);
      });
    };
    const r = await this.call<EnqueueBatchResponse>(route, retry, invoke, call);
    return r.results.map(toEnqueueResult);
  }

  /**
   * Adds 1 to 1000 jobs, all or nothing; results are in the order of `jobs`. Retried after
   * UNAVAILABLE only when every job has a `dedupKey`.
   */
  async enqueueBatch(jobs: BatchJob[], call?: CallOptions): Promise<EnqueueResult[]> {
    const requests = jobs.map((j) => ({
      ...toEnqueueRequest(j.queue, j.payload, j),
      dependsOnIndex: [...(j.dependsOnIndex ?? [])],
    }));
    // Sent as given: never merged with other calls, never split (§10).
    return composeProducerBatch(this.producerMiddleware, (rs) => this.sendEnqueueBatch(EnqueueBatchRequest.fromPartial({ jobs: rs }).jobs, call))(requests);
  }

  /**
   * Enqueues a job, then watches it (Admin.WatchJob) until it ends: resolves with the COMPLETED
   * job (its `result` is the handler's), rejects with a `JobEndedError` naming the state for a
   * FAILED or CANCELLED one, and with a JobBrokerError DEADLINE_EXCEEDED after `waitTimeoutMs`
   * (the job goes on). A watch cut by a broker restart is opened again.
   */
  async enqueueAndWait(queue: string, payload?: Payload, options: EnqueueAndWaitOptions = {}): Promise<Job> {
    const { waitTimeoutMs, signal, ...enqueueOptions } = options;
    const giveUp = waitTimeoutMs === undefined ? undefined : Date.now() + waitTimeoutMs;
    const { jobId } = await this.enqueue(queue, payload, enqueueOptions);
    return this.waitForJob(jobId, { giveUp, waitTimeoutMs, signal });
  }

  /** Watches `jobId` until it ends (enqueueAndWait's second half). */
  private async waitForJob(jobId: string, o: { giveUp?: number; waitTimeoutMs?: number; signal?: AbortSignal }): Promise<Job> {
    let last: Job | undefined;
    for (let backoff = retryBackoffMs; ; backoff = Math.min(backoff * 2, 1000)) {
      const left = o.giveUp === undefined ? undefined : o.giveUp - Date.now();
      const timedOut = () =>
        new JobBrokerError(
          Status.DEADLINE_EXCEEDED,
          `job ${jobId} had not ended after ${o.waitTimeoutMs} ms` + (last ? `: still ${JobState[last.state]}` : ""),
        );
      if (left !== undefined && left <= 0) throw timedOut();
      try {
        for await (const job of this.watchJob(jobId, { signal: o.signal, deadlineMs: left })) {
          last = job;
          if (job.state === JobState.JOB_STATE_COMPLETED) return job;
          if (terminalStates.has(job.state)) throw new JobEndedError(job);
        }
      } catch (e) {
        if (!(e instanceof JobBrokerError)) throw e;
        if (e.code === Status.DEADLINE_EXCEEDED && left !== undefined) throw timedOut();
        // A broker restart ends the watch: watch again. Anything else is the caller's to see.
        if (e.code !== Status.UNAVAILABLE) throw e;
      }
      await sleep(backoff);
    }
  }

  /**
   * The job as it is now, then the job again at each change (state, attempt, progress,
   * snoozes, cancel request), ending after the message that shows a terminal state. NOT_FOUND
   * for an unknown job; UNAVAILABLE if the broker shuts down (watch again). `signal` ends the
   * watch early (the iteration throws its reason); no deadline unless `deadlineMs` is given.
   */
  async *watchJob(jobId: string, options: { signal?: AbortSignal; deadlineMs?: number } = {}): AsyncGenerator<Job> {
    options.signal?.throwIfAborted();
    const endpoint = await this.router.nodeFor({ jobId });
    const grpcOptions = this.grpcOptions({ deadlineMs: options.deadlineMs ?? Infinity }, 0);
    const stream = endpoint.admin.watchJob(WatchJobRequest.fromPartial({ jobId }), new Metadata(), grpcOptions);
    const cancel = () => stream.cancel();
    options.signal?.addEventListener("abort", cancel, { once: true });
    try {
      for await (const message of stream) {
        const job: Job = message;
        yield job;
      }
    } catch (e) {
      options.signal?.throwIfAborted();
      const error = fromServiceError(e);
      // Not after DEADLINE_EXCEEDED: the watch's deadline is the caller's wait, not a sign of a
      // node gone.
      if (error instanceof JobBrokerError && error.code === Status.UNAVAILABLE) this.router.markStale();
      throw error;
    } finally {
      options.signal?.removeEventListener("abort", cancel);
      stream.cancel();
    }
  }

  /** Leases up to `maxJobs` ready jobs of `queue` (empty when none was ready within `waitMs`). */
  async lease(queue: string, options: LeaseOptions = {}, call?: CallOptions): Promise<LeasedJob[]> {
    const request = LeaseRequest.fromPartial({
      queue,
      workerId: options.workerId ?? defaultWorkerId(),
      maxJobs: options.maxJobs ?? 1,
      leaseDuration: durationFromMs(options.leaseDurationMs),
      wait: durationFromMs(options.waitMs),
    });
    // Never retried: a lease whose answer was lost holds jobs nobody works until it runs out.
    const r = await this.call<LeaseResponse>({ queue }, false, (e, md, o, cb) => e.broker.lease(request, md, o, cb), call, options.waitMs ?? 0);
    return r.jobs;
  }

  /**
   * Extends a lease (by `extendByMs`, default the lease's own length) and optionally saves a
   * checkpoint and progress. FAILED_PRECONDITION if the lease is no longer held.
   */
  heartbeat(
    lease: LeaseHandle,
    options: { extendByMs?: number; checkpoint?: Uint8Array; progress?: Payload } = {},
    call?: CallOptions,
  ): Promise<HeartbeatResponse> {
    const request = HeartbeatRequest.fromPartial({
      jobId: lease.jobId,
      leaseId: lease.leaseId,
      extendBy: durationFromMs(options.extendByMs),
      checkpoint: options.checkpoint === undefined ? undefined : asBuffer(options.checkpoint),
      progress: options.progress === undefined ? undefined : encodePayload(options.progress),
    });
    return this.call<HeartbeatResponse>({ jobId: lease.jobId }, true, (e, md, o, cb) => e.broker.heartbeat(request, md, o, cb), call);
  }

  /** Completes the job, keeping `result` with it. FAILED_PRECONDITION for a stale lease. */
  async ack(lease: LeaseHandle, result?: Payload, call?: CallOptions): Promise<void> {
    const request = AckRequest.fromPartial({ jobId: lease.jobId, leaseId: lease.leaseId, result: encodePayload(result) });
    await this.call<AckResponse>({ jobId: lease.jobId }, true, (e, md, o, cb) => e.broker.ack(request, md, o, cb), call);
  }

  /** Fails the attempt: retried after a backoff, or dead (permanent, or no attempts left). */
  fail(lease: LeaseHandle, error: string, options: FailOptions = {}, call?: CallOptions): Promise<FailResponse> {
    const request = FailRequest.fromPartial({
      jobId: lease.jobId,
      leaseId: lease.leaseId,
      error,
      permanent: options.permanent ?? false,
      retryAfter: durationFromMs(options.retryAfterMs),
    });
    return this.call<FailResponse>({ jobId: lease.jobId }, true, (e, md, o, cb) => e.broker.fail(request, md, o, cb), call);
  }

  /**
   * Gives the job back unstarted: READY again, no attempt counted; with `delayMs` (a snooze)
   * SCHEDULED that much later.
   */
  async release(lease: LeaseHandle, options: { delayMs?: number } = {}, call?: CallOptions): Promise<void> {
    const request = ReleaseRequest.fromPartial({ jobId: lease.jobId, leaseId: lease.leaseId, delay: durationFromMs(options.delayMs) });
    await this.call<ReleaseResponse>({ jobId: lease.jobId }, true, (e, md, o, cb) => e.broker.release(request, md, o, cb), call);
  }

  // ---- Admin: jobs ----------------------------------------------------------------------------

  /** The job, with its state, attempts, checkpoint and result. NOT_FOUND for an unknown id. */
  getJob(jobId: string, call?: CallOptions): Promise<Job> {
    const request = GetJobRequest.fromPartial({ jobId });
    return this.call<Job>({ jobId }, true, (e, md, o, cb) => e.admin.getJob(request, md, o, cb), call);
  }

  /** One page of a queue's jobs. */
  listJobs(queue: string, options: ListJobsOptions = {}, call?: CallOptions): Promise<ListJobsResponse> {
    // fromPartial sets every field the options leave out (and any field a newer proto adds) to
    // its default; the generated encoder would write an `undefined` string field as a value.
    const request = ListJobsRequest.fromPartial({ queue, ...options });
    return this.call<ListJobsResponse>({ queue }, true, (e, md, o, cb) => e.admin.listJobs(request, md, o, cb), call);
  }

  /** READY/SCHEDULED: cancelled at once; ACTIVE: the worker is told (cancel_requested). */
  cancelJob(jobId: string, call?: CallOptions): Promise<Job> {
    const request = CancelJobRequest.fromPartial({ jobId });
    return this.call<Job>({ jobId }, false, (e, md, o, cb) => e.admin.cancelJob(request, md, o, cb), call);
  }

  /** A FAILED or CANCELLED job back to READY, attempts reset. */
  async retryJob(jobId: string, call?: CallOptions): Promise<Job> {
    const request = RetryJobRequest.fromPartial({ jobId });
    const r = await this.call<RetryJobResponse>({ jobId }, false, (e, md, o, cb) => e.admin.retryJob(request, md, o, cb), call);
    if (!r.job) throw new JobBrokerError(Status.INTERNAL, `RetryJob of ${jobId} answered without the job`);
    return r.job;
  }

  /** Bulk redrive: every job of `queue` in `state` (default FAILED) back to READY. */
  retryQueue(
    queue: string,
    options: { state?: JobState; dryRun?: boolean; limit?: number } = {},
    call?: CallOptions,
  ): Promise<RetryJobResponse> {
    const request = RetryJobRequest.fromPartial({ queue, ...options });
    return this.call<RetryJobResponse>({ queue }, false, (e, md, o, cb) => e.admin.retryJob(request, md, o, cb), call);
  }

  /** Removes a job that is not ACTIVE. */
  async deleteJob(jobId: string, call?: CallOptions): Promise<void> {
    const request = DeleteJobRequest.fromPartial({ jobId });
    await this.call<DeleteJobResponse>({ jobId }, false, (e, md, o, cb) => e.admin.deleteJob(request, md, o, cb), call);
  }

  // ---- Admin: queues --------------------------------------------------------------------------

  /** Every queue the token may see, by name. */
  async listQueues(call?: CallOptions): Promise<QueueInfo[]> {
    const request = ListQueuesRequest.fromPartial({});
    const r = await this.call<ListQueuesResponse>("any", true, (e, md, o, cb) => e.admin.listQueues(request, md, o, cb), call);
    return r.queues;
  }

  /** Effective policy, counts by state (keyed "JOB_STATE_READY", ...) and oldest ready age. */
  getQueue(queue: string, call?: CallOptions): Promise<QueueInfo> {
    const request = GetQueueRequest.fromPartial({ queue });
    return this.call<QueueInfo>({ queue }, true, (e, md, o, cb) => e.admin.getQueue(request, md, o, cb), call);
  }

  /** Changes a queue's policy at run time (persisted); fields left out keep their value. */
  updateQueuePolicy(
    queue: string,
    policy: PartialMessage<QueuePolicy>,
    options: { reset?: boolean } = {},
    call?: CallOptions,
  ): Promise<QueueInfo> {
    const request: UpdateQueuePolicyRequest = { queue, policy: QueuePolicy.fromPartial(policy), reset: options.reset ?? false };
    return this.call<QueueInfo>({ queue }, true, (e, md, o, cb) => e.admin.updateQueuePolicy(request, md, o, cb), call);
  }

  /** Stops leasing from the queue (enqueues are still accepted). */
  pauseQueue(queue: string, call?: CallOptions): Promise<QueueInfo> {
    const request = PauseQueueRequest.fromPartial({ queue });
    return this.call<QueueInfo>({ queue }, true, (e, md, o, cb) => e.admin.pauseQueue(request, md, o, cb), call);
  }

  /** Leases from the queue again. */
  resumeQueue(queue: string, call?: CallOptions): Promise<QueueInfo> {
    const request = ResumeQueueRequest.fromPartial({ queue });
    return this.call<QueueInfo>({ queue }, true, (e, md, o, cb) => e.admin.resumeQueue(request, md, o, cb), call);
  }

  /** Removes the queue's jobs in `states` (default every terminal state); resolves to the count. */
  async purgeQueue(queue: string, states: JobState[] = [], call?: CallOptions): Promise<number> {
    const request = PurgeQueueRequest.fromPartial({ queue, states });
    const r = await this.call<PurgeQueueResponse>({ queue }, false, (e, md, o, cb) => e.admin.purgeQueue(request, md, o, cb), call);
    return r.purged;
  }

  // ---- Admin: workers and the cluster ---------------------------------------------------------

  /** The workers connected now (of `queue`, if given), by worker id, with what they run. */
  async listWorkers(queue = "", call?: CallOptions): Promise<WorkerInfo[]> {
    const request = ListWorkersRequest.fromPartial({ queue });
    const r = await this.call<ListWorkersResponse>("any", true, (e, md, o, cb) => e.admin.listWorkers(request, md, o, cb), call);
    return r.workers;
  }

  /** The cluster as the node asked sees it (a single node answers as a cluster of one). */
  getCluster(call?: CallOptions): Promise<ClusterInfo> {
    const request = GetClusterRequest.fromPartial({});
    return this.call<ClusterInfo>("any", true, (e, md, o, cb) => e.admin.getCluster(request, md, o, cb), call);
  }

  // ---- Admin: schedules -----------------------------------------------------------------------

  /**
   * Creates or replaces a recurring schedule; resolves with it as stored (`nextRunAt` set).
   * INVALID_ARGUMENT names a bad field (no timing, both timings, a dedup key in the template).
   */
  putSchedule(spec: ScheduleSpec, call?: CallOptions): Promise<Schedule> {
    const request = PutScheduleRequest.fromPartial({
      schedule: {
        scheduleId: spec.scheduleId,
        cron: spec.cron ?? "",
        every: durationFromMs(spec.everyMs),
        timeZone: spec.timeZone ?? "",
        template: toEnqueueRequest(spec.queue, spec.payload, spec.template),
        paused: spec.paused ?? false,
        startAt: spec.startAt,
        endAt: spec.endAt,
        catchUp: spec.catchUp ?? ScheduleCatchUp.SCHEDULE_CATCH_UP_UNSPECIFIED,
      },
    });
    return this.call<Schedule>({ queue: spec.queue }, true, (e, md, o, cb) => e.admin.putSchedule(request, md, o, cb), call);
  }

  /** The schedule, with its next and last runs. NOT_FOUND for an unknown id. */
  getSchedule(scheduleId: string, call?: CallOptions): Promise<Schedule> {
    const request = GetScheduleRequest.fromPartial({ scheduleId });
    return this.call<Schedule>("any", true, (e, md, o, cb) => e.admin.getSchedule(request, md, o, cb), call);
  }

  /** Every schedule (whose template enqueues into `queue`, if given), by id. */
  async listSchedules(queue = "", call?: CallOptions): Promise<Schedule[]> {
    const request = ListSchedulesRequest.fromPartial({ queue });
    const r = await this.call<ListSchedulesResponse>(queue ? { queue } : "any", true, (e, md, o, cb) => e.admin.listSchedules(request, md, o, cb), call);
    return r.schedules;
  }

  /** Removes a schedule; the jobs it already enqueued stay. */
  async deleteSchedule(scheduleId: string, call?: CallOptions): Promise<void> {
    const request = DeleteScheduleRequest.fromPartial({ scheduleId });
    await this.call<DeleteScheduleResponse>("any", false, (e, md, o, cb) => e.admin.deleteSchedule(request, md, o, cb), call);
  }

  /**
   * Enqueues one run now, outside the timing (also while paused); `nextRunAt` does not change.
   * Not retried: a repeat a moment later is another run.
   */
  async triggerSchedule(scheduleId: string, call?: CallOptions): Promise<EnqueueResult> {
    const request = TriggerScheduleRequest.fromPartial({ scheduleId });
    const r = await this.call<TriggerScheduleResponse>("any", false, (e, md, o, cb) => e.admin.triggerSchedule(request, md, o, cb), call);
    return { jobId: r.jobId, deduplicated: r.deduplicated };
  }
}
