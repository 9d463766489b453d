// Producer coalescing (docs/worker-contract.md §10): concurrent enqueue() calls merged into
// EnqueueBatch calls, each caller still answered on its own. Internal to the library: Client
// builds one and sends through it what a single enqueue used to send as a unary call.
//
// Why the client splits a refused batch instead of the broker answering per job:
// docs/decisions.md, "Producer coalescing".
import type { EnqueueRequest } from "./gen/jobbroker/v1/broker.js";
import { JobBrokerError, Status } from "./errors.js";
import type { EnqueueResult } from "./middleware.js";

/** The limits of the batches, as the client options give them (validated by the Client). */
export interface CoalescerOptions {
  /** A batch is sent once it holds this many jobs (1 to 1000). */
  maxJobs: number;
  /** ... or once its jobs' payload and header bytes reach this. */
  maxBytes: number;
  /** How long a batch that could be sent waits for more jobs; 0: until the end of the loop's turn. */
  lingerMs: number;
  /** Batches of one key in flight at once; later jobs wait in the open batch. */
  maxInFlight: number;
}

/** What the coalescer sends through: the client's routing, retries and deadlines. */
export interface CoalescerTransport {
  /**
   * Where a job goes, as a string: its partition in the client's last cluster table, else its
   * queue. Jobs of one place (and the same dedup-or-not) share batches.
   */
  placeOf(request: EnqueueRequest): string;
  /** One unary Enqueue (retried after UNAVAILABLE when it has a dedup key). */
  sendOne(request: EnqueueRequest, deadlineMs: number): Promise<EnqueueResult>;
  /** One EnqueueBatch of 2 to 1000 jobs of one place (retried when every job has a dedup key). */
  sendBatch(requests: EnqueueRequest[], deadlineMs: number): Promise<EnqueueResult[]>;
}

// Statuses that refuse a batch whole and apply nothing: each job is then sent again alone, so
// that only a bad job's own caller fails, with the message a unary call gives (§10 "Answers").
const refusedWhole = new Set<number>([
  Status.INVALID_ARGUMENT,
  Status.RESOURCE_EXHAUSTED,
  Status.ALREADY_EXISTS,
  Status.FAILED_PRECONDITION,
  Status.NOT_FOUND,
  Status.OUT_OF_RANGE,
  Status.PERMISSION_DENIED,
]);

interface QueuedJob {
  readonly request: EnqueueRequest;
  /** When its caller's deadline passes (Date.now() ms); Infinity for none. */
  readonly deadlineAt: number;
  readonly resolve: (result: EnqueueResult) => void;
  readonly reject: (error: unknown) => void;
}

class Batch {
  readonly jobs: QueuedJob[] = [];
  bytes = 0;
  /** Its linger (or turn) has passed: it goes as soon as the in-flight limit allows. */
  due = false;
  timer: NodeJS.Timeout | undefined;
}

/** The batches of one key: the open one, full ones waiting for the in-flight limit, and the count in flight. */
class KeyState {
  constructor(readonly key: string) {}
  open: Batch | undefined;
  readonly full: Batch[] = [];
  inFlight = 0;

  get idle(): boolean {
    return this.open === undefined && this.full.length === 0 && this.inFlight === 0;
  }
}

/** The bytes a job counts against `maxBytes`: its payload and its headers' names and values. */
export function jobBytes(request: EnqueueRequest): number {
  let bytes = request.payload.length;
  for (const name in request.headers) bytes += Buffer.byteLength(name) + Buffer.byteLength(request.headers[name]);
  return bytes;
}

/**
 * Gathers the jobs of one key (place, and whether the job has a dedup key) into batches and
 * sends them by the rules of §10 "When a batch is sent":
 * - a batch is closed and sent once it holds `maxJobs` jobs or `maxBytes` bytes (a job that would
 *   push the open batch past `maxBytes` starts the next one instead, so batches stay under the
 *   cap unless one job alone is larger);
 * - otherwise it is sent `lingerMs` after it opened, with 0 at the end of the current turn of the
 *   event loop (one setImmediate for all the batches opened in the turn, none per job);
 * - never more than `maxInFlight` batches of a key at once: the others wait, in call order, and
 *   go as batches in flight end.
 * A batch of one is a unary Enqueue. Deadlines: the earliest of the batch's callers'.
 */
export class Coalescer {
  private readonly keys = new Map<string, KeyState>();
  /** Batches opened in this turn with no linger: made due by one setImmediate. */
  private openedThisTurn: [KeyState, Batch][] = [];
  private turnEndScheduled = false;
  private closing = false;
  private drained: (() => void)[] = [];

  constructor(
    private readonly options: CoalescerOptions,
    private readonly transport: CoalescerTransport,
  ) {}

  /** Adds one job; resolves or rejects with its own answer. `deadlineMs`: the caller's (Infinity for none). */
  add(request: EnqueueRequest, deadlineMs: number): Promise<EnqueueResult> {
    const key = `${request.dedupKey === "" ? "n" : "d"}:${this.transport.placeOf(request)}`;
    let state = this.keys.get(key);
    if (!state) this.keys.set(key, (state = new KeyState(key)));
    const bytes = jobBytes(request);
    let batch = state.open;
    if (batch && batch.bytes + bytes > this.options.maxBytes) {
      this.seal(state);
      batch = undefined;
    }
    if (!batch) batch = this.openBatch(state);
    const deadlineAt = Date.now() + deadlineMs;
    const answer = new Promise<EnqueueResult>((resolve, reject) => {
      batch.jobs.push({ request, deadlineAt, resolve, reject });
    });
    batch.bytes += bytes;
    if (batch.jobs.length >= this.options.maxJobs || batch.bytes >= this.options.maxBytes) this.seal(state);
    else if (batch.due) this.pump(state);
    return answer;
  }

  /**
   * Sends every open batch now (no more linger) and resolves once no batch is left waiting or in
   * flight; undefined when there was none (the caller may close its channels at once). Jobs
   * added meanwhile are sent without linger and waited for too.
   */
  close(): Promise<void> | undefined {
    this.closing = true;
    for (const state of [...this.keys.values()]) {
      if (state.open) {
        state.open.due = true;
        clearTimeout(state.open.timer);
      }
      this.pump(state);
    }
    if (this.keys.size === 0) return undefined;
    return new Promise((resolve) => this.drained.push(resolve));
  }

  private openBatch(state: KeyState): Batch {
    const batch = new Batch();
    state.open = batch;
    if (this.closing) {
      batch.due = true;
    } else if (this.options.lingerMs > 0) {
      batch.timer = setTimeout(() => this.lingerEnded(state, batch), this.options.lingerMs);
    } else {
      // setImmediate runs after the I/O callbacks of this turn: every enqueue() made in the turn
      // (a burst of requests, a Promise.all) joins the batch before it leaves.
      this.openedThisTurn.push([state, batch]);
      if (!this.turnEndScheduled) {
        this.turnEndScheduled = true;
        setImmediate(() => this.turnEnded());
      }
    }
    return batch;
  }

  private turnEnded(): void {
    this.turnEndScheduled = false;
    const opened = this.openedThisTurn;
    this.openedThisTurn = [];
    for (const [state, batch] of opened) this.lingerEnded(state, batch);
  }

  private lingerEnded(state: KeyState, batch: Batch): void {
    batch.timer = undefined;
    // Sealed (full) or already sent: nothing to do.
    if (state.open !== batch) return;
    batch.due = true;
    this.pump(state);
  }

  /** The open batch is full: it leaves the open slot and waits its turn behind the full ones. */
  private seal(state: KeyState): void {
    const batch = state.open!;
    clearTimeout(batch.timer);
    batch.timer = undefined;
    state.open = undefined;
    state.full.push(batch);
    this.pump(state);
  }

  /** Sends what may go under the in-flight limit: full batches first (they are older), then a due open one. */
  private pump(state: KeyState): void {
    while (state.inFlight < this.options.maxInFlight) {
      let batch = state.full.shift();
      if (!batch && state.open?.due) {
        batch = state.open;
        state.open = undefined;
      }
      if (!batch) break;
      state.inFlight++;
      void this.dispatch(batch).finally(() => {
        state.inFlight--;
        this.pump(state);
      });
    }
    if (state.idle && this.keys.get(state.key) === state) {
      // A key per queue name would otherwise grow without bound.
      this.keys.delete(state.key);
      if (this.keys.size === 0 && this.drained.length > 0) {
        const waiting = this.drained;
        this.drained = [];
        for (const resolve of waiting) resolve();
      }
    }
  }

  /** Sends one batch and answers each of its callers; never rejects. */
  private async dispatch(batch: Batch): Promise<void> {
    const jobs = batch.jobs;
    let deadlineAt = Infinity;
    for (const job of jobs) if (job.deadlineAt < deadlineAt) deadlineAt = job.deadlineAt;
    const deadlineMs = Math.max(0, deadlineAt - Date.now());
    if (jobs.length === 1) {
      await this.sendOne(jobs[0], deadlineMs);
      return;
    }
    let results: EnqueueResult[];
    try {
      results = await this.transport.sendBatch(jobs.map((j) => j.request), deadlineMs);
    } catch (e) {
      if (e instanceof JobBrokerError && refusedWhole.has(e.code)) {
        // Nothing was applied: each job alone, all at once, each with its own deadline.
        await Promise.all(jobs.map((j) => this.sendOne(j, Math.max(0, j.deadlineAt - Date.now()))));
      } else {
        for (const job of jobs) job.reject(e);
      }
      return;
    }
    if (results.length !== jobs.length) {
      const e = new JobBrokerError(Status.INTERNAL, `EnqueueBatch of ${jobs.length} jobs answered ${results.length} results`);
      for (const job of jobs) job.reject(e);
      return;
    }
    for (let i = 0; i < jobs.length; i++) jobs[i].resolve(results[i]);
  }

  /** One job as unary Enqueue, answering its caller; never rejects. */
  private async sendOne(job: QueuedJob, deadlineMs: number): Promise<void> {
    try {
      job.resolve(await this.transport.sendOne(job.request, deadlineMs));
    } catch (e) {
      job.reject(e);
    }
  }
}
