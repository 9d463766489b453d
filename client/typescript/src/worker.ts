import type { ClientDuplexStream } from "@grpc/grpc-js";
import { Client, defaultWorkerId, type ClientOptions } from "./client.js";
import { asBuffer, durationFromMs, encodePayload } from "./convert.js";
import {
  JobBrokerError,
  JobCancelledError,
  PermanentError,
  RetryAfterError,
  SnoozeError,
  Status,
  statusName,
} from "./errors.js";
import type { AckRequest, LeasedJob, WorkRequest, WorkResponse, WorkResult } from "./gen/jobbroker/v1/broker.js";
import { AttemptOutcome } from "./gen/jobbroker/v1/job.js";
import { sameWorkGroup, workGroups, type RoutingTable, type WorkGroup } from "./routing-table.js";
import { StepLog } from "./steps.js";

/** What a JobContext asks of the worker that runs it. @internal */
export interface AttemptHooks {
  /** Sends a heartbeat carrying `checkpoint`; resolves with the broker's answer. */
  saveCheckpoint(checkpoint: Uint8Array): Promise<WorkResult>;
  /** Sends a heartbeat carrying `progress` (or queues it behind the one in flight). */
  reportProgress(progress: Buffer): void;
}

/**
 * What a handler sees of the job it runs (one attempt).
 *
 * `signal` aborts when the job should stop: an operator cancelled it, its lease was lost, it
 * reached its time-out (`timeoutAt`), or a graceful stop's grace ran out; `signal.reason` is a
 * `JobCancelledError` saying which. Pass it to fetch() and friends. The worker cannot stop code
 * that ignores it: such a handler keeps its slot until it returns, whatever ended its attempt
 * (`concurrency` is a hard bound).
 */
export class JobContext<Data = unknown> {
  readonly jobId: string;
  readonly queue: string;
  /** The payload as enqueued. */
  readonly payload: Buffer;
  readonly headers: Readonly<Record<string, string>>;
  /** 1 for the first attempt; attempt === maxAttempts is the last chance. */
  readonly attempt: number;
  readonly maxAttempts: number;
  /**
   * The same for every attempt of the job (its dedup key, else its id): pass it to side
   * effects' providers so that a repeat after a crash is harmless.
   */
  readonly idempotencyKey: string;
  /** What an earlier attempt saved (with durable steps: a serialized StepCheckpoint). */
  readonly checkpoint: Buffer;
  readonly enqueuedAt?: Date;
  /** The lease's deadline as the broker granted it (the worker's heartbeats push it on). */
  readonly leaseDeadline?: Date;
  /** When this attempt reaches its run-time limit (`signal` aborts then); unset if none. */
  readonly timeoutAt?: Date;
  /** The results of the jobs this one depended on, by job id. */
  readonly dependencyResults: Readonly<Record<string, Buffer>>;
  readonly signal: AbortSignal;

  /** @internal */
  constructor(
    job: LeasedJob,
    signal: AbortSignal,
    private readonly hooks: AttemptHooks,
  ) {
    this.jobId = job.jobId;
    this.queue = job.queue;
    this.payload = asBuffer(job.payload);
    this.headers = { ...job.headers };
    this.attempt = job.attempt;
    this.maxAttempts = job.maxAttempts;
    this.idempotencyKey = job.idempotencyKey;
    this.checkpoint = asBuffer(job.checkpoint);
    this.enqueuedAt = job.enqueuedAt;
    this.leaseDeadline = job.leaseDeadline;
    this.timeoutAt = job.timeoutAt;
    this.dependencyResults = Object.fromEntries(
      Object.entries(job.dependencyResults ?? {}).map(([id, r]) => [id, asBuffer(r)]),
    );
    this.signal = signal;
  }

  /** The payload as UTF-8 text. */
  text(): string {
    return this.payload.toString("utf8");
  }

  /** The payload parsed as JSON (typed as the handler's `Data`; not validated). */
  json<T = Data>(): T {
    return JSON.parse(this.text()) as T;
  }

  private parsed?: { value: Data };

  /** The payload parsed as JSON once, typed as the worker's (or handler's) `Data`. */
  get data(): Data {
    this.parsed ??= { value: JSON.parse(this.text()) };
    return this.parsed.value;
  }

  /** True once `signal` has aborted. */
  get cancelled(): boolean {
    return this.signal.aborted;
  }

  /**
   * Reports how far the job got (`Job.progress`, shown by WatchJob and the dashboard): a
   * heartbeat carrying it leaves at once. Bytes go as they are, a string as UTF-8, anything else
   * as JSON (by convention `{ percent: 40 }`). If a report is still unanswered, the newest value
   * goes out when it is answered and the ones in between are dropped: the last always arrives.
   */
  progress(value: unknown): void {
    this.hooks.reportProgress(encodePayload(value));
  }

  private steps?: StepLog;

  /**
   * Runs a named durable step once per job. If an earlier attempt (or this one) finished a step
   * called `name`, its saved result is returned and `fn` is not called. Otherwise `fn` runs; if it
   * throws, the error propagates (finished steps stay saved for the next attempt). If it succeeds,
   * its value is saved in the job's checkpoint as JSON, the broker confirms the save, and the
   * value is returned as JSON round-trips it (so a fresh run and a resumed run see the same
   * thing). Throws if the save is refused (the lease is gone: do not ack), if `name` was already
   * used in this attempt, or if the job's checkpoint is not a StepCheckpoint.
   */
  async step<T>(name: string, fn: () => T | Promise<T>): Promise<T> {
    this.steps ??= StepLog.parse(this.checkpoint);
    const log = this.steps;
    log.claim(name);
    const done = log.lookup(name);
    if (done.found) return done.value as T;
    const value = await fn();
    const { json, checkpoint } = log.record(name, value);
    const r = await this.hooks.saveCheckpoint(checkpoint);
    if (r.code !== Status.OK) {
      throw new JobBrokerError(
        r.code,
        `step "${name}" finished but its checkpoint was not saved (the lease is gone): ${r.message}`,
      );
    }
    return JSON.parse(json) as T;
  }
}

/**
 * A handler runs one attempt. Returning acks the job (the value, if any, is kept as its result:
 * bytes, a string, or JSON). Throwing fails the attempt with the error's message and the job is
 * retried after the queue's backoff; `PermanentError` kills it (no retry); `RetryAfterError`
 * (see `retryAfter()`) asks for the next attempt after a given delay; `SnoozeError` (see
 * `snooze()`) puts the job back for a delay without spending an attempt.
 *
 * After `signal` aborted: an operator-cancelled handler that throws (the signal's reason or
 * anything else) is failed "cancelled" (the job stays CANCELLED), while one that returns normally
 * did the work and is acked (the ack completes the job); a job whose lease was lost or that timed
 * out gets no answer whatever its handler does (the broker already ended the attempt), and one
 * cut off by a graceful stop is released.
 */
export type Handler<Data = unknown, Result = unknown> = (job: JobContext<Data>) => Result | Promise<Result>;

/**
 * Wraps every handler call (docs/worker-contract.md §9), added with `Worker.use()`: the first
 * added is the outermost. It gets the job's context and `next`, which runs the rest of the
 * chain and the handler and resolves with the handler's value (or rejects with its error).
 * What it resolves with (or throws) is what the worker answers, exactly as if the handler had:
 * a middleware that does not call `next` answers for the handler.
 */
export type WorkerMiddleware = (job: JobContext, next: () => Promise<unknown>) => Promise<unknown>;

/** Runs `handler` for `ctx` inside `middleware`, the first outermost. */
function runThrough<Data, Result>(
  middleware: readonly WorkerMiddleware[],
  ctx: JobContext<Data>,
  handler: Handler<Data, Result>,
): Promise<unknown> {
  const inner = async (): Promise<unknown> => handler(ctx);
  return middleware.reduceRight<() => Promise<unknown>>((next, m) => () => m(ctx, next), inner)();
}

/** A registered handler: builds the job's context with the handler's own types and runs it. */
type Registered = (job: LeasedJob, signal: AbortSignal, hooks: AttemptHooks) => Promise<unknown>;

export interface WorkerOptions extends ClientOptions {
  /**
   * Use this client's channels and routing instead of dialing `address` (the worker does not
   * close it).
   */
  client?: Client;
  /** Names this worker in attempt histories; default "<hostname>-<pid>". */
  workerId?: string;
  /**
   * Handlers at once, a hard bound: a handler still running after its signal aborted (even one
   * whose attempt the broker already ended) holds its slot until it returns. Default 1.
   */
  concurrency?: number;
  /**
   * Jobs held ready beyond `concurrency`, so a freed slot need not wait for the next push (the
   * stream's max_in_flight is concurrency + prefetch). They hold leases (and are heartbeated)
   * while they wait, and start in arrival order; a graceful stop gives them back unstarted.
   * Default 0.
   */
  prefetch?: number;
  /**
   * Lease asked for each job; default the job's, else the queue's. Heartbeats go out every third
   * of the lease as granted, so a dead or hung worker loses its jobs after one lease.
   */
  leaseDurationMs?: number;
  /** Reconnect backoff after the stream broke: full jitter below a bound doubling from this (default 100 ms)... */
  reconnectInitialMs?: number;
  /** ...up to this (default 5 s). */
  reconnectMaxMs?: number;
  /** How long a graceful stop (stop(), or SIGTERM/SIGINT in run()) lets running handlers finish. Default 30 s. */
  shutdownGraceMs?: number;
  /** Where the worker reports trouble; default console.error. */
  log?: (message: string) => void;
}

/** Attempts this worker finished, by outcome (for tests and logs). */
export interface WorkerStats {
  acked: number;
  failed: number;
  /** Jobs given back unstarted or cut off by a graceful stop (no attempt spent). */
  released: number;
  /** Jobs put back for a while by a handler's SnoozeError (no attempt spent). */
  snoozed: number;
  /** Attempts the broker ended under the worker (lease lost, time-out): nothing was answered. */
  attemptsLost: number;
  reconnects: number;
  /**
   * Ack and AckBatch messages sent (resends after a reconnect not counted): fewer than `acked`
   * when acks that completed while one was unanswered went out together.
   */
  ackMessages: number;
  /**
   * Acks the broker answered as not applied: a single ack refused, or an AckBatch's item errors
   * (usually a stale lease: the job's lease ran out and another attempt owns it now).
   */
  acksRefused: number;
}

/** One attempt the worker holds: waiting for a slot, or running. */
interface Held {
  job: LeasedJob;
  /** The stream that pushed it: its answers go there while it is open, else on any open one. */
  stream?: WorkStream;
  abort: AbortController;
  started: boolean;
  /** Why the signal fired, when the worker fired it for an operator cancel or a stop. */
  stoppedBy?: "cancel-requested" | "shutdown";
  /**
   * The broker ended the attempt (lease lost, time-out, leased again): nothing more is sent. A
   * started handler keeps its slot (in `stuck`) until it returns.
   */
  lost: boolean;
  heartbeatTimer?: NodeJS.Timeout;
  timeoutTimer?: NodeJS.Timeout;
  /** The progress heartbeat unanswered (its request id), 0 when none. */
  progressInFlight: number;
  /** The newest progress not yet sent. */
  progressNext?: Buffer;
}

/** An unanswered heartbeat: the attempt it was for, and the progress it carried. */
interface HeartbeatSent {
  held: Held;
  progress?: Buffer;
}

interface Pending {
  request: WorkRequest;
  onResult?: (r: WorkResult) => void;
  /** The stream that pushed the job it answers for: where it goes while that one is open. */
  origin?: WorkStream;
  /** The stream it went out on, unanswered; unset while it waits for one. */
  sentOn?: WorkStream;
  /** Answered UNAVAILABLE: goes out again after answerRetryMs, or on the next stream. */
  refused?: boolean;
}

/**
 * One Broker.Work stream of the worker, for one group of its queues (routing-table.ts
 * WorkGroup): in a cluster one per node leading a handled queue's partition.
 */
interface WorkStream {
  readonly group: WorkGroup;
  readonly call: ClientDuplexStream<WorkRequest, WorkResponse>;
  /** Requests may go out on it: the call is open and the worker has not ended it. */
  writable: boolean;
  /** The call has ended (its status or error arrived). */
  ended: boolean;
  /**
   * Ended by the worker because its group is no longer in the layout: its end is not a reason
   * to regroup again.
   */
  retired: boolean;
  /**
   * The request id of its subscription; 0 for a stream opened during a graceful stop, which does
   * not subscribe (the broker pushes nothing on it): it only carries the answers still to come.
   */
  subscribeRequestId: number;
  /** Its subscription was accepted. */
  subscribed: boolean;
  /** Opened on any node for queues a cluster's layout gave no leader: that node relays them. */
  relayed: boolean;
  /** Its subscription was refused with a code that is retried: why, for the regroup. */
  refusal?: { code: number; message: string };
  /** Its unanswered heartbeats, by request id. */
  readonly heartbeats: Map<number, HeartbeatSent>;
  // Acks not yet sent: they wait while this stream's ack message (ackRequestId) is unanswered,
  // then go out together. One ack message in flight per stream is the worker's group commit: a
  // busy worker sends one per broker round trip instead of one per job.
  acks: AckRequest[];
  ackRequestId: number; // 0 = none
}

type Outcome =
  | { kind: "ack"; result: Buffer }
  | { kind: "fail"; error: string; permanent: boolean; retryAfterMs?: number }
  | { kind: "release"; delayMs?: number };

// The broker takes at most 1000 acks in one AckBatchRequest.
const maxAcksPerMessage = 1000;

// An ack, fail, release or step save answered UNAVAILABLE (a partition between leaders, a
// broker draining: "retry") is not final: it goes out again after this long, or on the next
// stream if this one ends first (worker contract §4). Dropping it would have the job run again
// once its lease runs out.
const answerRetryMs = 250;

// A graceful stop waits this long for the handlers cancelled at the end of grace to return,
// then this long for the broker's answers (worker contract §6 step 5).
const cancelledReturnMs = 1000;
const answersWaitMs = 1000;

// A stream that ended with one of these is reopened; any other code is the caller's mistake (a
// bad queue name, a missing or refused token) and ends run() with it, since retrying would hide it.
const reconnectCodes = new Set<number>([
  Status.OK, // the broker shut down
  Status.UNAVAILABLE,
  Status.UNKNOWN,
  Status.INTERNAL,
  Status.DEADLINE_EXCEEDED,
  Status.CANCELLED,
  Status.ABORTED,
  Status.RESOURCE_EXHAUSTED,
]);

function leaseGone(code: number): boolean {
  return code === Status.FAILED_PRECONDITION || code === Status.NOT_FOUND;
}

function errorText(e: unknown): string {
  if (e instanceof Error) return e.message || e.name;
  return String(e);
}

/** What the handler's end asks for, before cancellation and stops are taken into account. */
function outcomeOf(e: unknown): Outcome {
  if (e instanceof SnoozeError) return { kind: "release", delayMs: e.delayMs };
  return {
    kind: "fail",
    error: errorText(e),
    permanent: e instanceof PermanentError,
    retryAfterMs: e instanceof RetryAfterError ? e.delayMs : undefined,
  };
}

/**
 * Runs handlers for jobs the broker pushes over one Broker.Work stream, one handler per queue
 * (the contract of docs/worker-contract.md): `concurrency` at a time and `prefetch` more held,
 * heartbeats every third of each lease, ack, fail or release when they end (acks coalesced: one
 * ack message in flight, the ones that end meanwhile follow as one AckBatch), answers sent again
 * after a reconnect, reconnects with backoff when the broker goes away, and a graceful stop.
 *
 * In a cluster (Admin.GetCluster tells where each partition's leader is) the worker opens one
 * stream per node that leads a handled queue's partition, subscribing there to those queues with
 * a share of max_in_flight, so no node relays its jobs; the queues of a partition without a leader
 * go on one more stream to any node. `concurrency` is one pool across the streams. When a stream
 * ends the worker waits its backoff, asks for the layout again and regroups: the streams whose
 * group is unchanged keep running, the others are ended and the missing ones opened (a leader
 * that moved or died). Without a layout (one broker) it is one stream, as before.
 *
 *   const worker = new Worker({ concurrency: 4 });
 *   worker.handle("emails", async (job) => { await send(job.json(), job.idempotencyKey); });
 *   await worker.run(); // until SIGTERM or SIGINT
 *
 * Everything runs on Node's event loop: a handler that blocks it (CPU work without yielding)
 * stops the heartbeats too, and its jobs' leases run out.
 */
export class Worker<Data = unknown, Result = unknown> {
  private readonly client: Client;
  private readonly ownsClient: boolean;
  private readonly workerId: string;
  private readonly concurrency: number;
  private readonly prefetch: number;
  private readonly leaseDurationMs?: number;
  private readonly reconnectInitialMs: number;
  private readonly reconnectMaxMs: number;
  private readonly shutdownGraceMs: number;
  private readonly log: (message: string) => void;

  private readonly handlers = new Map<string, Registered>();
  private readonly middleware: WorkerMiddleware[] = [];
  private state: "new" | "running" | "stopping" | "closed" = "new";
  private closing = false; // the connection loop ends
  private nextRequestId = 1;
  // The streams not ended yet (those being ended by a regroup or a stop too), in opening order.
  private streams: WorkStream[] = [];
  // Streams that ended since the connection loop last looked (not those it ended itself).
  private readonly ends: { stream: WorkStream; code: number; message: string }[] = [];
  // The reconnect backoff's bound: one for the worker, back to the initial one when a stream subscribes.
  private backoffMs: number;
  // Held attempts by job id. A job leased again (its old lease ran out) replaces its old entry.
  private readonly held = new Map<string, Held>();
  private readonly queued: Held[] = []; // held, not started, in arrival order
  private readonly running = new Set<Held>(); // started attempts the worker still answers for
  // Handlers of attempts the broker ended (lease lost, time-out) that have not returned yet.
  // They keep their slots: `concurrency` is a hard bound (worker contract §3), so a handler
  // that ignores its signal (stuck in a call that cannot be aborted) does not get new ones
  // started beside it. Jobs pushed meanwhile wait in `queued`, leased and heartbeated.
  private readonly stuck = new Set<Held>();
  private readonly pending = new Map<number, Pending>(); // unanswered ack/fail/release/step save
  // Acks of jobs that ended while no stream was open: they go out on the next one.
  private ackWaiting: AckRequest[] = [];
  // Acks answered UNAVAILABLE, with the stream they went on: first in line again when the resend
  // timer fires (or a new stream opens).
  private ackRetry: { ack: AckRequest; origin?: WorkStream }[] = [];
  private retryTimer?: NodeJS.Timeout; // set while a resend of refused answers is due
  private readonly listeners = new Set<() => void>();
  private readonly statsValue: WorkerStats = {
    acked: 0, failed: 0, released: 0, snoozed: 0, attemptsLost: 0, reconnects: 0, ackMessages: 0, acksRefused: 0,
  };
  private firstSubscribe?: (r: { code: number; message: string }) => void;
  // The streams of the first grouping whose subscription start() still waits for.
  private starting?: Set<WorkStream>;
  private fatal?: JobBrokerError; // a refused subscription, or a stream ended with a caller's error
  private loopDone?: Promise<void>;
  private stopped?: Promise<void>;

  constructor(options: WorkerOptions = {}) {
    this.ownsClient = options.client === undefined;
    this.client = options.client ?? new Client(options);
    this.workerId = options.workerId || defaultWorkerId();
    this.concurrency = Math.max(1, Math.floor(options.concurrency ?? 1));
    this.prefetch = Math.max(0, Math.floor(options.prefetch ?? 0));
    this.leaseDurationMs = options.leaseDurationMs;
    this.reconnectInitialMs = options.reconnectInitialMs ?? 100;
    this.reconnectMaxMs = options.reconnectMaxMs ?? 5000;
    this.backoffMs = this.reconnectInitialMs;
    this.shutdownGraceMs = options.shutdownGraceMs ?? 30_000;
    this.log = options.log ?? ((m) => console.error(`jobbroker worker: ${m}`));
  }

  /**
   * Registers the handler of `queue`. Call before start()/run(). Returns the worker. `Data` and
   * `Result` default to the worker's; a queue whose jobs differ names its own.
   */
  handle<D = Data, R = Result>(queue: string, handler: Handler<D, R>): this {
    if (this.state !== "new") throw new Error("register handlers before start()");
    this.handlers.set(queue, (job, signal, hooks) => runThrough(this.middleware, new JobContext<D>(job, signal, hooks), handler));
    return this;
  }

  /**
   * Adds worker middleware around every handler call; the first added is the outermost (see
   * `WorkerMiddleware`). Call before start()/run(). Returns the worker.
   */
  use(middleware: WorkerMiddleware): this {
    if (this.state !== "new") throw new Error("add middleware before start()");
    this.middleware.push(middleware);
    return this;
  }

  /** Attempts finished so far, by outcome. */
  get stats(): WorkerStats {
    return { ...this.statsValue };
  }

  /**
   * Connects and starts taking jobs. Rejects with the broker's refusal of the subscription (e.g.
   * INVALID_ARGUMENT for a bad queue name); a broker that cannot be reached yet is not an error:
   * the worker keeps reconnecting in the background.
   */
  async start(): Promise<void> {
    if (this.handlers.size === 0) throw new Error("register a handler with handle() before start()");
    if (this.state !== "new") throw new Error("the worker has already started");
    this.state = "running";
    const first = new Promise<{ code: number; message: string }>((resolve) => {
      this.firstSubscribe = resolve;
    });
    this.loopDone = this.connectionLoop();
    let timer: NodeJS.Timeout | undefined;
    const answered = await Promise.race([
      first,
      new Promise<null>((resolve) => {
        timer = setTimeout(() => resolve(null), 10_000);
      }),
    ]);
    clearTimeout(timer);
    // A refused subscription (whatever its code) or a stream ended by the caller's mistake.
    const refusal = this.fatal ?? (answered && !reconnectCodes.has(answered.code) ? new JobBrokerError(answered.code, answered.message) : undefined);
    if (refusal) {
      await this.stop(0);
      throw refusal;
    }
  }

  /**
   * start() (unless already started), then work until SIGTERM or SIGINT (or stop()), then stop
   * gracefully (`shutdownGraceMs`). Resolves once stopped; rejects if the subscription is
   * refused or the stream ends with an error retrying cannot fix (UNAUTHENTICATED, ...). A
   * second signal does not hurry the stop: SIGKILL does.
   */
  async run(): Promise<void> {
    const onSignal = (sig: NodeJS.Signals) => {
      this.log(`${sig}: stopping (grace ${this.shutdownGraceMs} ms)`);
      void this.stop(this.shutdownGraceMs);
    };
    // Before start(): its streams are open (a deploy may see the worker listed, and stop it)
    // before its promise resolves, and a signal with no handler kills Node outright.
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    try {
      if (this.state === "new") await this.start();
      await this.waitStopped();
    } finally {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    }
    if (this.fatal) throw this.fatal;
  }

  /** Resolves once stop() has finished (whoever called it). */
  async waitStopped(): Promise<void> {
    await this.until(() => this.stopped !== undefined);
    await this.stopped;
  }

  /**
   * Graceful stop: takes no new jobs (flow 0), gives back (Release) the ones received but not
   * started, lets running handlers finish for up to `graceMs`, then aborts the stragglers'
   * signals and releases their jobs whatever they end with (no attempt spent), waits up to 1 s
   * for those to return (a handler that ignores its signal has its job released anyway, and
   * whatever it ends with is dropped), then up to 1 s for the broker's answers to the last acks,
   * fails and releases, and closes every stream. Until that close a stream that ends is reopened
   * as usual (without subscribing: it only carries the answers still to come); nothing is reopened
   * after it.
   */
  stop(graceMs = this.shutdownGraceMs): Promise<void> {
    if (this.stopped) return this.stopped;
    if (this.state === "new") {
      this.state = "closed";
      this.stopped = Promise.resolve();
    } else {
      this.stopped = this.doStop(graceMs);
    }
    this.notify();
    return this.stopped;
  }

  private async doStop(graceMs: number): Promise<void> {
    // Steps 1 to 5 (docs/worker-contract.md §6) on every stream. The connection loop goes on until
    // step 6: a stream that ends meanwhile is regrouped and reopened after the usual backoff, so
    // that the answers still to come (handlers finishing in the grace, releases) reach the
    // broker. A stream opened while stopping does not subscribe: nothing is pushed on it (and
    // whatever a stream is pushed while stopping is released at once, onJob).
    this.state = "stopping";
    if (this.firstSubscribe) {
      // start() still waits for the first subscriptions: they no longer matter.
      this.firstSubscribe({ code: Status.UNAVAILABLE, message: "the worker is stopping" });
      this.firstSubscribe = undefined;
    }
    const graceEnds = Date.now() + graceMs;
    for (const s of this.streams) {
      if (s.subscribeRequestId !== 0) this.write(s, { requestId: this.newRequestId(), flow: { maxInFlight: 0 } });
    }
    this.releaseQueued();
    await this.until(() => this.running.size === 0, graceEnds - Date.now());
    for (const h of this.running) this.stopAttempt(h, "shutdown", "the worker is shutting down: its grace ran out");
    // Up to 1 s for the cancelled handlers to return (contract §6 step 5). One that ignores its
    // signal has its job released anyway; whatever it ends with later is dropped.
    if (!(await this.until(() => this.running.size === 0, cancelledReturnMs))) {
      for (const h of [...this.running]) this.abandon(h);
    }
    // Then up to 1 s for the answers. Buffered acks count: they go out when the ack message ahead
    // of them is answered; refused ones go out again after answerRetryMs.
    const answered = () =>
      this.pending.size === 0 && this.ackWaiting.length === 0 && this.ackRetry.length === 0 && this.streams.every((s) => s.acks.length === 0);
    await this.until(answered, answersWaitMs);
    // Step 6: nothing is reopened from here on (the loop, waiting on a backoff or a table, ends
    // at once); what is still unanswered is dropped.
    this.closing = true;
    this.notify();
    clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    for (const h of this.held.values()) this.forget(h);
    for (const [, p] of this.pending) {
      p.onResult?.({ requestId: 0, code: Status.UNAVAILABLE, message: "the worker stopped", leaseDeadline: undefined, cancelRequested: false, itemErrors: [] });
    }
    // Half-close every stream: the broker ends each call once it has answered what it read; do
    // not wait forever for that.
    for (const s of this.streams) this.endStream(s);
    await this.until(() => this.streams.length === 0, 2500);
    for (const s of this.streams) s.call.cancel();
    await this.loopDone;
    if (this.ownsClient) await this.client.close();
    this.state = "closed";
    this.notify();
  }

  /**
   * A graceful stop gives up on a handler that did not return within 1 s of its cancellation:
   * its job is released (no attempt spent) and its own answer, if it ever ends, is dropped. It
   * stays in `stuck`, as an attempt the broker ended does, until it returns.
   */
  private abandon(h: Held): void {
    if (h.lost) return;
    this.log(`job ${h.job.jobId}: its handler did not return within ${cancelledReturnMs} ms of its cancellation; releasing the job anyway`);
    this.forget(h);
    h.lost = true; // nothing more is sent for the attempt but this release
    this.stuck.add(h);
    this.sendRelease(h.job, h.stream);
    this.notify();
  }

  // ---- plumbing ---------------------------------------------------------------------------

  private notify(): void {
    for (const l of [...this.listeners]) l();
  }

  /** Resolves true once `pred` holds (checked on every state change), false after `timeoutMs`. */
  private until(pred: () => boolean, timeoutMs = Infinity): Promise<boolean> {
    if (pred()) return Promise.resolve(true);
    if (timeoutMs <= 0) return Promise.resolve(false);
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const listener = () => {
        if (!pred()) return;
        this.listeners.delete(listener);
        clearTimeout(timer);
        resolve(true);
      };
      this.listeners.add(listener);
      if (Number.isFinite(timeoutMs)) {
        timer = setTimeout(() => {
          this.listeners.delete(listener);
          resolve(pred());
        }, timeoutMs);
      }
    });
  }

  private newRequestId(): number {
    return this.nextRequestId++;
  }

  /** Writes on `s`; false if it takes no more writes. */
  private write(s: WorkStream, request: WorkRequest): boolean {
    if (!s.writable) return false;
    try {
      s.call.write(request);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Where an answer for a job pushed on `origin` goes now: that stream while it is open, else any
   * open one (a node sends a job's answer on to its leader by job id); undefined while none is.
   */
  private streamFor(origin?: WorkStream): WorkStream | undefined {
    if (origin?.writable) return origin;
    return this.streams.find((s) => s.writable);
  }

  /**
   * Sends a request whose answer matters, for a job pushed on `origin`; it is sent again on
   * another stream if the one it went on ends unanswered.
   */
  private sendTracked(request: WorkRequest, origin?: WorkStream, onResult?: (r: WorkResult) => void): void {
    const p: Pending = { request, origin, onResult };
    this.pending.set(request.requestId, p);
    this.sendPending(p);
  }

  /** Sends `p` where its job's answers go now, or leaves it for the next stream. */
  private sendPending(p: Pending): void {
    p.refused = false; // sent now (or on the next stream): the resend timer need not send it again
    const s = this.streamFor(p.origin);
    p.sentOn = s && this.write(s, p.request) ? s : undefined;
  }

  /**
   * Sends what waits for a stream: acks, fails, releases and step saves unanswered when their
   * stream ended (idempotent per lease: the broker answers a repeated ack of the same attempt
   * OK, so sending them again with the same lease ids is safe), the acks of jobs that ended while
   * no stream was open, and the newest unanswered progress. Heartbeats are not replayed: each
   * held job's next tick goes out on an open stream.
   */
  private sendWaiting(): void {
    if (this.closing || !this.streamFor()) return;
    for (const p of this.pending.values()) {
      if (p.sentOn === undefined) this.sendPending(p);
    }
    this.requeueRefusedAcks();
    const waiting = this.ackWaiting;
    this.ackWaiting = [];
    for (const ack of waiting) this.queueAck(ack);
    for (const h of this.held.values()) this.sendProgress(h);
  }

  /**
   * Opens the stream of `group` and subscribes, unless the worker is stopping: a stream reopened
   * then only carries the answers still to come (docs/worker-contract.md §6), so it takes no jobs.
   * Answers waiting for a stream go out on it at once.
   */
  private openStream(group: WorkGroup, table: RoutingTable): WorkStream {
    const node = this.client.router.nodeAt(group.address || table.anyAddress);
    const subscribes = this.state === "running";
    const s: WorkStream = {
      group,
      call: node.broker.work(),
      writable: true,
      ended: false,
      retired: false,
      subscribeRequestId: subscribes ? this.newRequestId() : 0,
      subscribed: false,
      relayed: group.address === "" && table.isCluster,
      heartbeats: new Map(),
      acks: [],
      ackRequestId: 0,
    };
    this.streams.push(s);
    s.call.on("data", (m: WorkResponse) => this.onMessage(s, m));
    s.call.on("error", (e: { code?: number; details?: string; message?: string }) =>
      this.onStreamEnd(s, { code: e.code ?? Status.UNKNOWN, message: e.details ?? e.message ?? "" }),
    );
    s.call.on("status", (st: { code: number; details: string }) => this.onStreamEnd(s, { code: st.code, message: st.details }));
    if (subscribes) {
      this.write(s, {
        requestId: s.subscribeRequestId,
        subscribe: {
          queues: [...group.queues],
          workerId: this.workerId,
          maxInFlight: group.share,
          leaseDuration: durationFromMs(this.leaseDurationMs),
          batchPushes: true,
        },
      });
    }
    this.sendWaiting();
    return s;
  }

  /**
   * Ends `s` from the worker's side (a regroup that dropped its group, a stop): nothing more goes
   * out on it, its buffered acks move to another stream, and it is half-closed, so the broker
   * answers what it read and ends the call (cancelled after 2 s if it does not).
   */
  private endStream(s: WorkStream): void {
    if (!s.writable) return;
    s.writable = false;
    try {
      s.call.end();
    } catch {
      // already closed
    }
    const t = setTimeout(() => s.call.cancel(), 2000);
    s.call.once("status", () => clearTimeout(t));
    s.call.once("error", () => clearTimeout(t));
    this.moveAcks(s);
  }

  /** The acks buffered for `s`, which takes no more writes, go out on another stream. */
  private moveAcks(s: WorkStream): void {
    const acks = s.acks;
    s.acks = [];
    if (this.closing) return;
    for (const ack of acks) this.queueAck(ack);
  }

  /**
   * `s` ended (its status or error arrived): its unanswered heartbeats are forgotten (their
   * progress goes out again), its unanswered requests and acks go out on another open stream or
   * wait for the next, and the connection loop hears of it unless it ended the stream itself.
   */
  private onStreamEnd(s: WorkStream, status: { code: number; message: string }): void {
    if (s.ended) return;
    s.ended = true;
    s.writable = false;
    this.streams = this.streams.filter((other) => other !== s);
    const end = s.refusal ?? status;
    for (const sent of s.heartbeats.values()) {
      const h = sent.held;
      if (sent.progress !== undefined && h.progressInFlight !== 0) {
        h.progressNext ??= sent.progress;
        h.progressInFlight = 0;
      }
    }
    s.heartbeats.clear();
    for (const p of this.pending.values()) {
      if (p.sentOn === s) p.sentOn = undefined;
    }
    this.moveAcks(s);
    this.sendWaiting();
    if (!s.retired) this.ends.push({ stream: s, ...end });
    this.startAnswered(s, end.code === Status.OK ? { code: Status.UNAVAILABLE, message: "the stream ended" } : end);
    this.notify();
  }

  /** start() waits for the subscriptions of the first streams: the first refusal, or all accepted. */
  private startAnswered(s: WorkStream, r: { code: number; message: string }): void {
    if (!this.firstSubscribe || !this.starting?.delete(s)) return;
    if (r.code !== Status.OK || this.starting.size === 0) {
      this.firstSubscribe(r);
      this.firstSubscribe = undefined;
    }
  }

  /**
   * Keeps one stream per group of the cluster's layout (routing-table.ts workGroups): opens the
   * missing ones, ends those whose group is gone, and when a stream ends waits the backoff, asks
   * for the layout again and regroups. Ends with the run: at step 6 of a graceful stop (until
   * then it reopens streams while stopping too, without subscribing), or at a caller's error.
   */
  private async connectionLoop(): Promise<void> {
    const queues = [...this.handlers.keys()];
    const maxInFlight = this.concurrency + this.prefetch;
    const over = () => this.closing;
    while (!over()) {
      // A node that died or stopped leading some queues: the layout, asked again, says where
      // they are now (with several addresses outside a cluster: the next one that answers).
      // Step 6 of a stop does not wait for an answer that is slow to come.
      const table = await this.untilClosing(this.client.router.table());
      if (table === undefined || over()) return;
      const groups = workGroups(table, queues, maxInFlight);
      for (const s of this.streams) {
        if (s.writable && !groups.some((g) => sameWorkGroup(g, s.group))) {
          // Its jobs stay held and keep their leases (replicated): their answers go on the others.
          s.retired = true;
          this.endStream(s);
        }
      }
      const opened: WorkStream[] = [];
      for (const g of groups) {
        if (!this.streams.some((s) => s.writable && sameWorkGroup(s.group, g))) opened.push(this.openStream(g, table));
      }
      if (this.firstSubscribe && !this.starting) this.starting = new Set(opened);
      if (opened.length > 0 && this.state !== "running") this.log(`stopping: reopened ${opened.length} stream(s) for the answers still to come`);

      // A node that accepted queues the layout gave no leader found one the layout lacks (it was
      // asked between an election and the table's refresh) and relays them; no leader change
      // will end that stream. So while one is open the layout is asked again after each backoff,
      // until the regroup puts those queues on their leader's own stream.
      const relayed = () => this.streams.some((s) => s.writable && s.relayed && s.subscribed);
      await this.until(() => this.ends.length > 0 || over() || relayed());
      if (over()) return;
      const first = this.ends.at(0);
      // Full jitter: workers cut off by the same broker restart do not come back in step.
      const delay = Math.round(Math.random() * this.backoffMs);
      if (first === undefined || reconnectCodes.has(first.code)) {
        if (first) {
          this.log(`stream to ${first.stream.group.address || "any node"} ended (${statusName(first.code)}: ${first.message}); regrouping in ${delay} ms`);
        }
        // Streams that end meanwhile are regrouped by the same pass.
        await this.until(() => over() || this.ends.some((e) => !reconnectCodes.has(e.code)), delay);
      }
      if (over()) return;
      const ended = this.ends.splice(0);
      const fatal = ended.find((e) => !reconnectCodes.has(e.code));
      if (fatal) {
        // Retrying would hide the caller's mistake (a bad token, a refused queue): run() ends.
        this.onFatal(new JobBrokerError(fatal.code, `the Work stream ended: ${fatal.message}`));
        return;
      }
      this.client.router.markStale();
      this.statsValue.reconnects += ended.length;
      this.backoffMs = Math.min(this.backoffMs * 2, this.reconnectMaxMs);
    }
  }

  /** `p`'s value, or undefined once step 6 of a graceful stop has begun (whichever comes first). */
  private untilClosing<T>(p: Promise<T>): Promise<T | undefined> {
    if (this.closing) return Promise.resolve(undefined);
    return new Promise<T | undefined>((resolve, reject) => {
      const listener = () => {
        if (!this.closing) return;
        this.listeners.delete(listener);
        resolve(undefined);
      };
      this.listeners.add(listener);
      p.then(
        (v) => {
          this.listeners.delete(listener);
          resolve(v);
        },
        (e: unknown) => {
          this.listeners.delete(listener);
          reject(e);
        },
      );
    });
  }

  /** Handles one message of stream `s`. */
  private onMessage(s: WorkStream, m: WorkResponse): void {
    if (m.job) {
      this.onJob(m.job, s);
    } else if (m.jobBatch) {
      for (const job of m.jobBatch.jobs) this.onJob(job, s); // each exactly as if pushed alone
    } else if (m.result) {
      const r = m.result;
      const p = this.pending.get(r.requestId);
      const beat = s.heartbeats.get(r.requestId);
      if (s.subscribeRequestId !== 0 && r.requestId === s.subscribeRequestId) {
        this.startAnswered(s, { code: r.code, message: r.message });
        if (r.code === Status.OK) {
          s.subscribed = true;
          this.backoffMs = this.reconnectInitialMs;
        } else if (reconnectCodes.has(r.code)) {
          // Refused for now (a partition without a leader in a cluster, a broker draining): a
          // stream that ends so is reopened, so this one is ended and reopened the same way.
          s.refusal = { code: r.code, message: `subscribe refused: ${r.message}` };
          s.writable = false;
          s.call.cancel();
        } else {
          this.onFatal(new JobBrokerError(r.code, `subscribe refused: ${r.message}`));
        }
      } else if (p && r.code === Status.UNAVAILABLE && p.request.ack === undefined && p.request.ackBatch === undefined) {
        // A fail, release or step save the broker could not apply now: not final (acks are
        // handled the same way in onAckResult).
        p.refused = true;
        p.sentOn = undefined;
        this.log(`request ${r.requestId} refused for now (${r.message}); sending it again in ${answerRetryMs} ms`);
        this.scheduleResend();
      } else if (p) {
        this.pending.delete(r.requestId);
        if (p.onResult) p.onResult(r);
        else if (r.code !== Status.OK && !leaseGone(r.code)) this.log(`${statusName(r.code)}: ${r.message}`);
      } else if (beat) {
        s.heartbeats.delete(r.requestId);
        this.onHeartbeatResult(beat, r);
      }
    } else if (m.leaseLost) {
      const h = this.held.get(m.leaseLost.jobId);
      if (h) {
        // Usually our own timer fired first; the broker says TIMED_OUT when it did not.
        const why =
          m.leaseLost.outcome === AttemptOutcome.ATTEMPT_OUTCOME_TIMED_OUT
            ? new JobCancelledError("timeout", "the attempt reached its time-out")
            : new JobCancelledError("lease-lost", "the broker ended the attempt: its lease ran out");
        this.loseAttempt(h, why);
      }
    } else if (m.cancelRequested) {
      const h = this.held.get(m.cancelRequested.jobId);
      if (h) this.cancelByOperator(h);
    }
    this.notify();
  }

  private onHeartbeatResult(beat: HeartbeatSent, r: WorkResult): void {
    const h = beat.held;
    if (beat.progress !== undefined && h.progressInFlight === r.requestId) {
      h.progressInFlight = 0;
      this.sendProgress(h); // the newest value reported meanwhile, if any
    }
    if (leaseGone(r.code)) {
      this.loseAttempt(h, new JobCancelledError("lease-lost", `the broker ended the attempt: ${r.message}`));
    } else if (r.code !== Status.OK) {
      this.log(`heartbeat of job ${h.job.jobId}: ${statusName(r.code)}: ${r.message}`);
    } else if (r.cancelRequested) {
      this.cancelByOperator(h);
    }
  }

  /** A refusal does not get better by retrying: the worker stops and run() rejects with it. */
  private onFatal(err: JobBrokerError): void {
    this.log(err.message);
    if (this.state === "running" && !this.fatal) {
      this.fatal = err;
      void this.stop(0);
    }
  }

  private onJob(job: LeasedJob, stream: WorkStream): void {
    if (this.state !== "running") {
      // Pushed before our flow 0 arrived: give it straight back.
      this.sendRelease(job, stream);
      return;
    }
    // The same job again means the broker ended the attempt we hold (its lease ran out) and
    // leased it anew, possibly before our heartbeat's refusal or the lease_lost reached us.
    const previous = this.held.get(job.jobId);
    if (previous) this.loseAttempt(previous, new JobCancelledError("lease-lost", "the broker leased the job again: this attempt's lease ran out"));

    const arrived = Date.now();
    const deadline = job.leaseDeadline ? job.leaseDeadline.getTime() : arrived;
    // Heartbeats follow the lease as granted; the floor guards against clock skew.
    const leaseMs = Math.max(deadline - arrived, 300);
    const h: Held = { job, stream, abort: new AbortController(), started: false, lost: false, progressInFlight: 0 };
    h.heartbeatTimer = setInterval(() => this.heartbeat(h), leaseMs / 3);
    if (job.timeoutAt) {
      // The broker ends the attempt TIMED_OUT at this moment; the handler hears it at once
      // rather than when the lease_lost arrives.
      h.timeoutTimer = setTimeout(
        () => this.loseAttempt(h, new JobCancelledError("timeout", "the attempt reached its time-out")),
        Math.max(0, job.timeoutAt.getTime() - arrived),
      );
    }
    this.held.set(job.jobId, h);
    this.queued.push(h);
    this.pump();
  }

  private heartbeat(h: Held): void {
    const s = this.streamFor(h.stream);
    if (h.lost || !s) return;
    const requestId = this.newRequestId();
    s.heartbeats.set(requestId, { held: h });
    this.write(s, { requestId, heartbeat: { jobId: h.job.jobId, leaseId: h.job.leaseId, extendBy: undefined } });
  }

  /** Sends `h`'s newest progress unless one is unanswered (then it waits for that answer). */
  private sendProgress(h: Held): void {
    if (h.lost || h.progressInFlight !== 0 || h.progressNext === undefined) return;
    const s = this.streamFor(h.stream);
    if (!s) return;
    const progress = h.progressNext;
    h.progressNext = undefined;
    const requestId = this.newRequestId();
    h.progressInFlight = requestId;
    s.heartbeats.set(requestId, { held: h, progress });
    this.write(s, { requestId, heartbeat: { jobId: h.job.jobId, leaseId: h.job.leaseId, extendBy: undefined, progress } });
  }

  /** Stops heartbeating `h` and frees its place (slot or queue position). */
  private forget(h: Held): void {
    clearInterval(h.heartbeatTimer);
    clearTimeout(h.timeoutTimer);
    if (this.held.get(h.job.jobId) === h) this.held.delete(h.job.jobId);
    this.running.delete(h);
    const i = this.queued.indexOf(h);
    if (i >= 0) this.queued.splice(i, 1);
  }

  /**
   * The broker ended the attempt (lease lost, time-out): the signal fires and nothing more is
   * sent for it. A started handler keeps its slot until it returns (`stuck`).
   */
  private loseAttempt(h: Held, why: JobCancelledError): void {
    if (h.lost) return;
    h.lost = true;
    this.statsValue.attemptsLost++;
    this.forget(h);
    if (h.started) this.stuck.add(h);
    if (!h.abort.signal.aborted) h.abort.abort(why);
    this.pump();
    this.notify();
  }

  /** Fires the signal of an attempt the worker still answers for, saying why. */
  private stopAttempt(h: Held, by: "cancel-requested" | "shutdown", message: string): void {
    if (h.lost || h.abort.signal.aborted) return;
    h.stoppedBy = by;
    h.abort.abort(new JobCancelledError(by, message));
  }

  private cancelByOperator(h: Held): void {
    if (h.lost || h.abort.signal.aborted) return;
    this.stopAttempt(h, "cancel-requested", "an operator cancelled the job");
    if (!h.started) {
      // Not started: nothing to wait for. The fail tells the broker we let go of it.
      this.forget(h);
      this.answer(h, { kind: "fail", error: "cancelled", permanent: false });
      this.notify();
    }
  }

  private sendRelease(job: LeasedJob, origin?: WorkStream, delayMs?: number): void {
    if (delayMs === undefined) this.statsValue.released++;
    else this.statsValue.snoozed++;
    this.sendTracked({ requestId: this.newRequestId(), release: { jobId: job.jobId, leaseId: job.leaseId, delay: durationFromMs(delayMs) } }, origin);
  }

  private releaseQueued(): void {
    for (const h of [...this.queued]) {
      this.forget(h);
      this.sendRelease(h.job, h.stream);
    }
    this.notify();
  }

  private pump(): void {
    while (this.state === "running" && this.running.size + this.stuck.size < this.concurrency && this.queued.length > 0) {
      const h = this.queued.shift()!;
      h.started = true;
      this.running.add(h);
      void this.runJob(h);
    }
  }

  private async runJob(h: Held): Promise<void> {
    const job = h.job;
    const hooks: AttemptHooks = {
      saveCheckpoint: (checkpoint) => this.saveCheckpoint(h, checkpoint),
      reportProgress: (progress) => {
        if (h.lost || this.held.get(job.jobId) !== h) return; // the attempt is over
        h.progressNext = progress;
        this.sendProgress(h);
      },
    };
    let outcome: Outcome;
    try {
      const run = this.handlers.get(job.queue);
      if (!run) throw new Error(`no handler for queue "${job.queue}"`);
      const result = await run(job, h.abort.signal, hooks);
      outcome = { kind: "ack", result: encodePayload(result) };
    } catch (e) {
      outcome = outcomeOf(e);
    }
    this.finish(h, outcome);
  }

  private saveCheckpoint(h: Held, checkpoint: Uint8Array): Promise<WorkResult> {
    const { jobId, leaseId } = h.job;
    if (h.lost) {
      return Promise.resolve({ requestId: 0, code: Status.FAILED_PRECONDITION, message: "the broker ended the attempt", leaseDeadline: undefined, cancelRequested: false, itemErrors: [] });
    }
    return new Promise<WorkResult>((resolve) => {
      this.sendTracked(
        { requestId: this.newRequestId(), heartbeat: { jobId, leaseId, extendBy: undefined, checkpoint: asBuffer(checkpoint) } },
        h.stream,
        (r) => {
          if (leaseGone(r.code)) this.loseAttempt(h, new JobCancelledError("lease-lost", `the broker ended the attempt: ${r.message}`));
          resolve(r);
        },
      );
    });
  }

  /** The handler of `h` ended with `outcome`; the signal, if it fired, decides what is sent. */
  private finish(h: Held, outcome: Outcome): void {
    if (h.lost) {
      // The broker ended the attempt: any answer would be refused as stale. The slot is free.
      this.stuck.delete(h);
      this.pump();
      this.notify();
      return;
    }
    this.forget(h);
    if (h.stoppedBy === "shutdown") outcome = { kind: "release" };
    else if (h.stoppedBy === "cancel-requested" && outcome.kind !== "ack") {
      // Ended by its cancellation (or failing after it): the broker keeps the job CANCELLED. A
      // normal return did the work: its ack completes the job.
      outcome = { kind: "fail", error: "cancelled", permanent: false };
    }
    this.answer(h, outcome);
    this.pump();
    this.notify();
  }

  private answer(h: Held, outcome: Outcome): void {
    const { jobId, leaseId } = h.job;
    switch (outcome.kind) {
      case "ack":
        this.statsValue.acked++;
        this.queueAck({ jobId, leaseId, result: outcome.result }, h.stream);
        break;
      case "fail":
        this.statsValue.failed++;
        this.sendTracked(
          {
            requestId: this.newRequestId(),
            fail: { jobId, leaseId, error: outcome.error, permanent: outcome.permanent, retryAfter: durationFromMs(outcome.retryAfterMs) },
          },
          h.stream,
        );
        break;
      case "release":
        this.sendRelease(h.job, h.stream, outcome.delayMs);
        break;
    }
  }

  /**
   * Buffers an ack of a job pushed on `origin` on the stream its answers go to now (or, with no
   * stream open, until the next one) and sends that stream's buffer if it can.
   */
  private queueAck(ack: AckRequest, origin?: WorkStream): void {
    const s = this.streamFor(origin);
    if (!s) {
      this.ackWaiting.push(ack);
      return;
    }
    s.acks.push(ack);
    this.flushAcks(s);
  }

  /**
   * Sends the acks buffered for `s`, unless an ack message of `s` is unanswered: they then wait
   * for its answer and go out together (one AckBatch, or a plain ack when there is one). An idle
   * worker's ack thus leaves at once. Coalescing is per stream: each stream has its own message in
   * flight. If `s` ends first, its buffered acks move to another stream, and the unanswered
   * message is sent again like any request.
   */
  private flushAcks(s: WorkStream): void {
    if (s.ackRequestId !== 0 || s.acks.length === 0 || this.closing || !s.writable) return;
    const batch = s.acks.splice(0, maxAcksPerMessage);
    const requestId = this.newRequestId();
    const request: WorkRequest =
      batch.length === 1 ? { requestId, ack: batch[0] } : { requestId, ackBatch: { acks: batch } };
    s.ackRequestId = requestId;
    this.statsValue.ackMessages++;
    this.sendTracked(request, s, (r) => this.onAckResult(s, requestId, batch, r));
  }

  /** Arranges for the answers refused with UNAVAILABLE to go out again after answerRetryMs. */
  private scheduleResend(): void {
    if (this.retryTimer || this.closing) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      this.resendRefused();
    }, answerRetryMs);
  }

  /** Sends again the acks, fails, releases and step saves the broker refused with UNAVAILABLE. */
  private resendRefused(): void {
    if (this.closing) return;
    this.requeueRefusedAcks();
    // Without a stream they wait: the next stream sends every unsent request.
    for (const p of [...this.pending.values()].filter((p) => p.refused).sort((a, b) => a.request.requestId - b.request.requestId)) {
      this.sendPending(p);
    }
  }

  /** Puts the acks refused with UNAVAILABLE back first in line, each on its stream (or any open one). */
  private requeueRefusedAcks(): void {
    if (this.ackRetry.length === 0) return;
    const retry = this.ackRetry;
    this.ackRetry = [];
    const byStream = new Map<WorkStream | undefined, AckRequest[]>();
    for (const { ack, origin } of retry) {
      const s = this.streamFor(origin);
      let acks = byStream.get(s);
      if (!acks) byStream.set(s, (acks = []));
      acks.push(ack);
    }
    for (const [s, acks] of byStream) {
      if (!s) {
        this.ackWaiting = [...acks, ...this.ackWaiting];
        continue;
      }
      s.acks = [...acks, ...s.acks];
      this.flushAcks(s);
    }
  }

  private onAckResult(s: WorkStream, requestId: number, batch: AckRequest[], r: WorkResult): void {
    // requestId 0 is no answer: the worker closed with this message unanswered.
    if (r.requestId !== 0 && r.code === Status.UNAVAILABLE) {
      // Not applied for now (a partition between leaders): every ack in it goes out again.
      this.log(`${batch.length} ack(s) refused for now (${r.message}); sending again in ${answerRetryMs} ms`);
      this.ackRetry.push(...batch.map((ack) => ({ ack, origin: s })));
      this.scheduleResend();
    } else if (r.requestId !== 0) {
      if (r.code !== Status.OK && !leaseGone(r.code)) this.log(`ack: ${statusName(r.code)}: ${r.message}`);
      // Acks the broker did not apply; the others in the batch were. A stale or unknown lease
      // means another attempt owns the job now: nothing to do, as for a single ack. UNAVAILABLE
      // is not final: that ack goes out again.
      let refused = 0;
      for (const e of r.itemErrors) {
        if (e.code === Status.UNAVAILABLE && e.index >= 0 && e.index < batch.length) {
          this.log(`ack of job ${batch[e.index].jobId} refused for now (${e.message}); sending again in ${answerRetryMs} ms`);
          this.ackRetry.push({ ack: batch[e.index], origin: s });
          this.scheduleResend();
          continue;
        }
        refused++;
        if (!leaseGone(e.code)) this.log(`ack not applied: ${statusName(e.code)}: ${e.message}`);
      }
      this.statsValue.acksRefused += r.code !== Status.OK ? batch.length : refused;
    }
    if (s.ackRequestId === requestId) {
      s.ackRequestId = 0;
      this.flushAcks(s); // what completed while this one was unanswered
    }
  }
}
