import type { ClientDuplexStream } from "@grpc/grpc-js";
import { Client, defaultWorkerId, type ClientOptions } from "./client";
import { asBuffer, durationFromMs, encodePayload } from "./convert";
import {
  JobBrokerError,
  JobCancelledError,
  PermanentError,
  RetryAfterError,
  Status,
  statusName,
} from "./errors";
import type { AckRequest, LeasedJob, WorkRequest, WorkResponse, WorkResult } from "./gen/jobbroker/v1/broker";
import { StepLog } from "./steps";

/**
 * What a handler sees of the job it runs (one attempt).
 *
 * `signal` aborts when the job should stop: its lease was lost, an operator cancelled it, or
 * the worker is shutting down past its grace period. Pass it to fetch() and friends.
 */
export class JobContext {
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
  readonly signal: AbortSignal;

  /** @internal */
  constructor(
    job: LeasedJob,
    signal: AbortSignal,
    private readonly saveStep: (checkpoint: Uint8Array) => Promise<WorkResult>,
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
    this.signal = signal;
  }

  /** The payload as UTF-8 text. */
  text(): string {
    return this.payload.toString("utf8");
  }

  /** The payload parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }

  /** True once `signal` has aborted. */
  get cancelled(): boolean {
    return this.signal.aborted;
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
    const r = await this.saveStep(checkpoint);
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
 * (see `retryAfter()`) asks for the next attempt after a given delay.
 */
export type Handler = (job: JobContext) => unknown | Promise<unknown>;

export interface WorkerOptions extends ClientOptions {
  /** Use this client's channel instead of dialing `address` (the worker does not close it). */
  client?: Client;
  /** Names this worker in attempt histories; default "<hostname>-<pid>". */
  workerId?: string;
  /** Jobs run at once. Default 1. */
  concurrency?: number;
  /**
   * Jobs held ready beyond `concurrency`, so a freed slot need not wait for the next push (the
   * stream's max_in_flight is concurrency + prefetch). They hold leases while they wait; a
   * graceful stop gives them back unstarted. Default 0.
   */
  prefetch?: number;
  /**
   * Lease asked for each job; default the job's, else the queue's. Heartbeats go out every third
   * of the lease as granted, so a dead or hung worker loses its jobs after one lease.
   */
  leaseDurationMs?: number;
  /** Reconnect backoff after the stream broke: doubles from this (default 100 ms)... */
  reconnectInitialMs?: number;
  /** ...up to this (default 5 s). */
  reconnectMaxMs?: number;
  /** How long `run()`'s SIGTERM/SIGINT stop lets running handlers finish. Default 30 s. */
  shutdownGraceMs?: number;
  /** Where the worker reports trouble; default console.error. */
  log?: (message: string) => void;
}

/** Attempts this worker finished, by outcome (for tests and logs). */
export interface WorkerStats {
  acked: number;
  failed: number;
  released: number;
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

interface Held {
  job: LeasedJob;
  abort: AbortController;
  leaseMs: number;
  timer?: NodeJS.Timeout;
  lost: boolean;
}

interface Pending {
  request: WorkRequest;
  onResult?: (r: WorkResult) => void;
}

type Outcome =
  | { ok: true; result: Buffer }
  | { ok: false; error: string; permanent: boolean; retryAfterMs?: number };

// The broker takes at most 1000 acks in one AckBatchRequest.
const maxAcksPerMessage = 1000;

function leaseGone(code: number): boolean {
  return code === Status.FAILED_PRECONDITION || code === Status.NOT_FOUND;
}

function errorText(e: unknown): string {
  if (e instanceof Error) return e.message || e.name;
  return String(e);
}

/**
 * Runs handlers for jobs the broker pushes over one Broker.Work stream: `concurrency` at a
 * time, heartbeats while they run, ack or fail when they return, reconnects with backoff when
 * the broker goes away, and stops gracefully.
 *
 *   const worker = new Worker({ concurrency: 4 });
 *   worker.handle("emails", async (job) => { await send(job.json(), job.idempotencyKey); });
 *   await worker.run(); // until SIGTERM or SIGINT
 */
export class Worker {
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

  private readonly handlers = new Map<string, Handler>();
  private state: "new" | "running" | "stopping" | "closed" = "new";
  private closing = false; // the connection loop ends
  private nextRequestId = 1;
  private subscribeRequestId = 0;
  private stream: ClientDuplexStream<WorkRequest, WorkResponse> | null = null;
  private readonly held = new Map<string, Held>();
  private readonly queued: string[] = []; // held, not started
  private readonly running = new Set<string>();
  private readonly pending = new Map<number, Pending>(); // unanswered ack/fail/release/step save
  private readonly heartbeats = new Map<number, string>(); // request id -> job id
  // Acks not yet sent: they wait while an ack message is unanswered (ackRequestId), then go out
  // together. One ack message in flight is the worker's group commit: a busy worker sends one per
  // broker round trip instead of one per job.
  private acks: AckRequest[] = [];
  private ackRequestId = 0; // the unanswered ack message; 0 = none
  private readonly listeners = new Set<() => void>();
  private readonly statsValue: WorkerStats = { acked: 0, failed: 0, released: 0, reconnects: 0, ackMessages: 0, acksRefused: 0 };
  private firstSubscribe?: (r: { code: number; message: string }) => void;
  private fatal?: JobBrokerError; // a refused subscription
  private loopDone?: Promise<void>;
  private wakeLoop?: () => void;
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
    this.shutdownGraceMs = options.shutdownGraceMs ?? 30_000;
    this.log = options.log ?? ((m) => console.error(`jobbroker worker: ${m}`));
  }

  /** Registers the handler of `queue`. Call before start()/run(). Returns the worker. */
  handle(queue: string, handler: Handler): this {
    if (this.state !== "new") throw new Error("register handlers before start()");
    this.handlers.set(queue, handler);
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
    if (answered && answered.code !== Status.OK && answered.code !== Status.UNAVAILABLE) {
      await this.stop(0);
      throw new JobBrokerError(answered.code, answered.message);
    }
  }

  /**
   * start() (unless already started), then work until SIGTERM or SIGINT, then stop gracefully
   * (`shutdownGraceMs`). Resolves once stopped; rejects if the subscription is refused.
   */
  async run(): Promise<void> {
    if (this.state === "new") await this.start();
    const onSignal = (sig: NodeJS.Signals) => {
      this.log(`${sig}: stopping (grace ${this.shutdownGraceMs} ms)`);
      void this.stop(this.shutdownGraceMs);
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    try {
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
   * Graceful stop: takes no new jobs, gives back (Release) the ones received but not started,
   * lets running handlers finish for up to `graceMs`, then aborts the stragglers' signals and
   * waits for them to return, waits for the broker's answers to the last acks, and closes.
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
    this.state = "stopping";
    const deadline = Date.now() + graceMs;
    this.write({ requestId: this.newRequestId(), flow: { maxInFlight: 0 } });
    this.releaseQueued();
    // Buffered acks count: they go out when the ack message ahead of them is answered.
    const idle = () => this.running.size === 0 && this.pending.size === 0 && this.acks.length === 0;
    await this.until(idle, deadline - Date.now());
    for (const h of this.held.values()) {
      if (!h.abort.signal.aborted) {
        h.abort.abort(new JobCancelledError("shutdown", "the worker is shutting down"));
      }
    }
    await this.until(() => this.running.size === 0);
    // The last acks' answers get a moment (and at least a short one past the grace period).
    await this.until(idle, Math.max(deadline - Date.now(), 2000));
    this.closing = true;
    for (const h of this.held.values()) clearInterval(h.timer);
    for (const [, p] of this.pending) {
      p.onResult?.({ requestId: 0, code: Status.UNAVAILABLE, message: "the worker stopped", leaseDeadline: undefined, cancelRequested: false, itemErrors: [] });
    }
    const stream = this.stream;
    if (stream) {
      stream.end();
      // The broker ends the call once it has answered everything; do not wait forever.
      const t = setTimeout(() => stream.cancel(), 1000);
      await this.until(() => this.stream === null, 2000);
      clearTimeout(t);
      this.stream?.cancel();
    }
    this.wakeLoop?.();
    await this.loopDone;
    if (this.ownsClient) this.client.close();
    this.state = "closed";
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

  /** Writes on the current stream; false if there is none. */
  private write(request: WorkRequest): boolean {
    const s = this.stream;
    if (!s) return false;
    try {
      s.write(request);
      return true;
    } catch {
      return false;
    }
  }

  /** Sends a request whose answer matters; it is sent again on a new stream if unanswered. */
  private sendTracked(request: WorkRequest, onResult?: (r: WorkResult) => void): void {
    this.pending.set(request.requestId, { request, onResult });
    this.write(request);
  }

  private async connectionLoop(): Promise<void> {
    let backoff = this.reconnectInitialMs;
    while (!this.closing) {
      const stream = this.client.broker.work();
      this.stream = stream;
      let subscribed = false;
      const ended = new Promise<{ code: number; message: string }>((resolve) => {
        stream.on("data", (m: WorkResponse) => {
          if (this.onMessage(m)) subscribed = true;
        });
        stream.on("error", (e: { code?: number; details?: string; message?: string }) =>
          resolve({ code: e.code ?? Status.UNKNOWN, message: e.details ?? e.message ?? "" }),
        );
        stream.on("status", (s: { code: number; details: string }) => resolve({ code: s.code, message: s.details }));
      });
      if (this.state === "running") {
        this.subscribeRequestId = this.newRequestId();
        this.write({
          requestId: this.subscribeRequestId,
          subscribe: {
            queues: [...this.handlers.keys()],
            workerId: this.workerId,
            maxInFlight: this.concurrency + this.prefetch,
            leaseDuration: durationFromMs(this.leaseDurationMs),
            batchPushes: true,
          },
        });
      }
      // Acks, fails, releases and step saves the last stream did not answer: idempotent per
      // lease, so sending them again is safe.
      for (const p of this.pending.values()) this.write(p.request);

      const end = await ended;
      if (this.stream === stream) this.stream = null;
      this.heartbeats.clear();
      this.notify();
      if (this.firstSubscribe) {
        this.firstSubscribe(end.code === Status.OK ? { code: Status.UNAVAILABLE, message: "the stream ended" } : end);
        this.firstSubscribe = undefined;
      }
      if (this.closing) return;
      this.statsValue.reconnects++;
      if (subscribed) backoff = this.reconnectInitialMs;
      this.log(`stream ended (${statusName(end.code)}: ${end.message}); reconnecting in ${backoff} ms`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, backoff);
        this.wakeLoop = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.wakeLoop = undefined;
      backoff = Math.min(backoff * 2, this.reconnectMaxMs);
    }
  }

  /** Handles one message; true for the answer that accepted this stream's subscription. */
  private onMessage(m: WorkResponse): boolean {
    let subscribed = false;
    if (m.job) {
      this.onJob(m.job);
    } else if (m.jobBatch) {
      for (const job of m.jobBatch.jobs) this.onJob(job); // each exactly as if pushed alone
    } else if (m.result) {
      const r = m.result;
      const p = this.pending.get(r.requestId);
      if (r.requestId === this.subscribeRequestId) {
        subscribed = r.code === Status.OK;
        if (this.firstSubscribe) {
          this.firstSubscribe({ code: r.code, message: r.message });
          this.firstSubscribe = undefined;
        }
        if (!subscribed) this.onRefused(r);
      } else if (p) {
        this.pending.delete(r.requestId);
        if (p.onResult) p.onResult(r);
        else if (r.code !== Status.OK && !leaseGone(r.code)) this.log(`${statusName(r.code)}: ${r.message}`);
      } else {
        const jobId = this.heartbeats.get(r.requestId);
        if (jobId !== undefined) {
          this.heartbeats.delete(r.requestId);
          if (leaseGone(r.code)) this.loseLease(jobId, r.message);
          else if (r.cancelRequested) this.cancelJob(jobId);
        }
      }
    } else if (m.leaseLost) {
      this.loseLease(m.leaseLost.jobId, "the lease ran out");
    } else if (m.cancelRequested) {
      this.cancelJob(m.cancelRequested.jobId);
    }
    this.notify();
    return subscribed;
  }

  private onRefused(r: WorkResult): void {
    const err = new JobBrokerError(r.code, `subscribe refused: ${r.message}`);
    this.log(err.message);
    if (this.state === "running" && !this.fatal) {
      // A refusal (e.g. a bad queue name) does not get better by retrying: stop the worker.
      this.fatal = err;
      void this.stop(0);
    }
  }

  private loseLease(jobId: string, why: string): void {
    const h = this.held.get(jobId);
    if (!h) return;
    h.lost = true;
    clearInterval(h.timer);
    if (!h.abort.signal.aborted) h.abort.abort(new JobCancelledError("lease-lost", `lease lost: ${why}`));
  }

  private cancelJob(jobId: string): void {
    const h = this.held.get(jobId);
    if (h && !h.abort.signal.aborted) {
      h.abort.abort(new JobCancelledError("cancel-requested", "an operator cancelled the job"));
    }
  }

  private onJob(job: LeasedJob): void {
    if (this.state !== "running") {
      // Pushed before our flow 0 arrived: give it straight back.
      this.sendRelease(job);
      return;
    }
    const arrived = Date.now();
    const deadline = job.leaseDeadline ? job.leaseDeadline.getTime() : arrived;
    // Heartbeats follow the lease as granted; the floor guards against clock skew.
    const leaseMs = Math.max(deadline - arrived, 300);
    const h: Held = { job, abort: new AbortController(), leaseMs, lost: false };
    h.timer = setInterval(() => this.heartbeat(h), leaseMs / 3);
    this.held.set(job.jobId, h);
    this.queued.push(job.jobId);
    this.pump();
  }

  private heartbeat(h: Held): void {
    if (h.lost || !this.stream) return;
    const requestId = this.newRequestId();
    this.heartbeats.set(requestId, h.job.jobId);
    this.write({ requestId, heartbeat: { jobId: h.job.jobId, leaseId: h.job.leaseId, extendBy: undefined } });
  }

  private sendRelease(job: LeasedJob): void {
    this.statsValue.released++;
    this.sendTracked({ requestId: this.newRequestId(), release: { jobId: job.jobId, leaseId: job.leaseId, delay: undefined } });
  }

  private releaseQueued(): void {
    for (const id of this.queued.splice(0)) {
      const h = this.held.get(id)!;
      clearInterval(h.timer);
      this.held.delete(id);
      this.sendRelease(h.job);
    }
    this.notify();
  }

  private pump(): void {
    while (this.state === "running" && this.running.size < this.concurrency && this.queued.length > 0) {
      const id = this.queued.shift()!;
      const h = this.held.get(id)!;
      this.running.add(id);
      void this.runJob(h);
    }
  }

  private async runJob(h: Held): Promise<void> {
    const job = h.job;
    const saveStep = (checkpoint: Uint8Array) =>
      new Promise<WorkResult>((resolve) => {
        this.sendTracked(
          { requestId: this.newRequestId(), heartbeat: { jobId: job.jobId, leaseId: job.leaseId, extendBy: undefined, checkpoint: asBuffer(checkpoint) } },
          (r) => {
            if (leaseGone(r.code)) this.loseLease(job.jobId, r.message);
            resolve(r);
          },
        );
      });
    const ctx = new JobContext(job, h.abort.signal, saveStep);
    let outcome: Outcome;
    try {
      const handler = this.handlers.get(job.queue);
      if (!handler) throw new Error(`no handler for queue "${job.queue}"`);
      const result = await handler(ctx);
      outcome = { ok: true, result: encodePayload(result) };
    } catch (e) {
      outcome = {
        ok: false,
        error: errorText(e),
        permanent: e instanceof PermanentError,
        retryAfterMs: e instanceof RetryAfterError ? e.delayMs : undefined,
      };
    }
    this.complete(h, outcome);
  }

  private complete(h: Held, outcome: Outcome): void {
    const { jobId, leaseId } = h.job;
    clearInterval(h.timer);
    if (outcome.ok) {
      this.statsValue.acked++;
      this.acks.push({ jobId, leaseId, result: outcome.result });
      this.flushAcks();
    } else {
      this.statsValue.failed++;
      this.sendTracked({
        requestId: this.newRequestId(),
        fail: {
          jobId,
          leaseId,
          error: outcome.error,
          permanent: outcome.permanent,
          retryAfter: durationFromMs(outcome.retryAfterMs),
        },
      });
    }
    this.held.delete(jobId);
    this.running.delete(jobId);
    this.pump();
    this.notify();
  }

  /**
   * Sends the buffered acks, unless an ack message is unanswered: they then wait for its answer
   * and go out together (one AckBatch, or a plain ack when there is one). An idle worker's ack
   * thus leaves at once. Without a stream the message waits in `pending` and goes out on the next
   * one, whose answer clears ackRequestId.
   */
  private flushAcks(): void {
    if (this.ackRequestId !== 0 || this.acks.length === 0 || this.closing) return;
    const batch = this.acks.splice(0, maxAcksPerMessage);
    const requestId = this.newRequestId();
    const request: WorkRequest =
      batch.length === 1 ? { requestId, ack: batch[0] } : { requestId, ackBatch: { acks: batch } };
    this.ackRequestId = requestId;
    this.statsValue.ackMessages++;
    this.sendTracked(request, (r) => this.onAckResult(requestId, batch.length, r));
  }

  private onAckResult(requestId: number, acks: number, r: WorkResult): void {
    // requestId 0 is no answer: the worker closed with this message unanswered.
    if (r.requestId !== 0) {
      if (r.code !== Status.OK && !leaseGone(r.code)) this.log(`ack: ${statusName(r.code)}: ${r.message}`);
      // Acks the broker did not apply; the others in the batch were. A stale or unknown lease
      // means another attempt owns the job now: nothing to do, as for a single ack.
      for (const e of r.itemErrors) {
        if (!leaseGone(e.code)) this.log(`ack not applied: ${statusName(e.code)}: ${e.message}`);
      }
      this.statsValue.acksRefused += r.code !== Status.OK ? acks : r.itemErrors.length;
    }
    if (this.ackRequestId === requestId) {
      this.ackRequestId = 0;
      this.flushAcks(); // what completed while this one was unanswered
    }
  }
}
