// @jobbroker/client/testing: a fake client for unit tests of code that enqueues jobs, with no
// broker. It records every enqueue (after the producer middleware added with use(), as the real
// client would send it) so a test can assert on what was enqueued.
import { toEnqueueRequest, type BatchJob, type CallOptions, type Client, type EnqueueOptions } from "./client.js";
import type { Payload } from "./convert.js";
import type { EnqueueRequest } from "./gen/jobbroker/v1/broker.js";
import { composeProducer, composeProducerBatch, type EnqueueResult, type ProducerMiddleware } from "./middleware.js";

/**
 * The producer side of a `Client`: type the code under test with it (`Producer`, not `Client`),
 * and a test passes a `FakeClient` where production passes a `Client`.
 */
export type Producer = Pick<Client, "enqueue" | "enqueueBatch">;

/** One job a `FakeClient` was asked to enqueue. */
export interface RecordedJob {
  /** The id the fake gave it ("fake-1", "fake-2"...). */
  jobId: string;
  queue: string;
  /** The payload as it would go on the wire: bytes as they are, a string as UTF-8, else JSON. */
  payload: Buffer;
  headers: Record<string, string>;
  /** The whole request as the middleware left it (priority, delay, dedupKey, maxAttempts...). */
  request: EnqueueRequest;
  /** The payload as UTF-8 text. */
  text(): string;
  /** The payload parsed as JSON. */
  json<T = unknown>(): T;
}

/**
 * Records enqueues instead of sending them. `enqueue` and `enqueueBatch` take the real client's
 * arguments, run its producer middleware (`use()`), and resolve with a made-up job id; a second
 * enqueue with a `dedupKey` already seen on that queue is `deduplicated` (same id, not recorded
 * again), as the broker would answer. `fail` makes the next enqueues reject (a broker that is
 * down, a full queue).
 *
 * ```ts
 * const fake = new FakeClient();
 * await signUp(fake, "ada@example.com");      // code that calls producer.enqueue(...)
 * assert.deepEqual(fake.jobsIn("emails").map((j) => j.json()), [{ to: "ada@example.com" }]);
 * ```
 */
export class FakeClient implements Producer {
  /** Every recorded job, in enqueue order. */
  readonly jobs: RecordedJob[] = [];
  private readonly middleware: ProducerMiddleware[] = [];
  private readonly dedup = new Map<string, string>();
  private failWith: Error | undefined;
  private nextId = 1;

  /** Adds producer middleware, as `Client.use()` does. */
  use(middleware: ProducerMiddleware): this {
    this.middleware.push(middleware);
    return this;
  }

  enqueue(queue: string, payload?: Payload, options: EnqueueOptions = {}, _call?: CallOptions): Promise<EnqueueResult> {
    return composeProducer(this.middleware, async (r) => this.record(r))(toEnqueueRequest(queue, payload, options));
  }

  enqueueBatch(jobs: BatchJob[], _call?: CallOptions): Promise<EnqueueResult[]> {
    const requests = jobs.map((j) => ({ ...toEnqueueRequest(j.queue, j.payload, j), dependsOnIndex: [...(j.dependsOnIndex ?? [])] }));
    return composeProducerBatch(this.middleware, async (rs) => {
      this.throwIfFailing();
      return rs.map((r) => this.record(r));
    })(requests);
  }

  /** The recorded jobs of one queue, in enqueue order. */
  jobsIn(queue: string): RecordedJob[] {
    return this.jobs.filter((j) => j.queue === queue);
  }

  /** Makes every later enqueue reject with `error` (undefined: succeed again). */
  fail(error: Error | undefined): this {
    this.failWith = error;
    return this;
  }

  /** Forgets the recorded jobs and dedup keys. */
  clear(): void {
    this.jobs.length = 0;
    this.dedup.clear();
  }

  /** Nothing to close; here so the fake can stand in for a Client everywhere. */
  close(): void {}

  private throwIfFailing(): void {
    if (this.failWith) throw this.failWith;
  }

  private record(request: EnqueueRequest): EnqueueResult {
    this.throwIfFailing();
    const key = request.dedupKey ? `${request.queue}\u0000${request.dedupKey}` : "";
    const seen = key ? this.dedup.get(key) : undefined;
    if (seen !== undefined) return { jobId: seen, deduplicated: true };
    const jobId = `fake-${this.nextId++}`;
    if (key) this.dedup.set(key, jobId);
    const payload = Buffer.from(request.payload);
    this.jobs.push({
      jobId,
      queue: request.queue,
      payload,
      headers: { ...request.headers },
      request,
      text: () => payload.toString("utf8"),
      json: <T>() => JSON.parse(payload.toString("utf8")) as T,
    });
    return { jobId, deduplicated: false };
  }
}
