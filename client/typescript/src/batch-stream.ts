// EnqueueBatch calls as messages of one Broker.EnqueueStream per node. Internal to the library:
// the Client sends the coalescer's batches through it when `batchStream` is on.
//
// Why: in grpc-js a unary call costs the client's main thread about 250 µs (an HTTP/2 stream
// set up and torn down, the call's filter chain), a message on an open stream about 40
// (docs/performance.md, "A stream of batches"). Batches that cost a message can be smaller and
// overlap with the broker's write.
import { Metadata, status as GrpcStatus, type CallOptions as GrpcCallOptions, type ClientDuplexStream, type ServiceError } from "@grpc/grpc-js";
import type { BrokerClient, EnqueueBatchRequest, EnqueueBatchResponse, EnqueueStreamRequest, EnqueueStreamResponse } from "./gen/jobbroker/v1/broker.js";

// What an error's callback gets as its response: nothing reads it.
const noResults: EnqueueBatchResponse = { results: [] };

/**
 * How long a stream with no batch waiting stays open. An open stream keeps the process alive
 * (grpc-js holds its connection while a call is open), so a script that enqueues and forgets
 * close() must still exit; reopening costs about one unary call, once per idle spell.
 */
export const idleCloseMs = 200;

interface Pending {
  readonly callback: (err: ServiceError | null, response: EnqueueBatchResponse) => void;
  timer: NodeJS.Timeout | undefined;
}

/** A ServiceError as grpc-js gives one, so the Client maps and retries it as a unary call's. */
function serviceError(code: number, details: string): ServiceError {
  return Object.assign(new Error(`${code} ${GrpcStatus[code] ?? ""}: ${details}`), {
    code,
    details,
    metadata: new Metadata(),
  });
}

/**
 * One node's stream. Opened on first use and again after it ended; a batch gets its answer by
 * its request_id. When the stream breaks, every batch still waiting is answered with the
 * stream's status (UNAVAILABLE when the broker went away): its outcome is unknown, as a unary
 * call cut off the same way, and the Client retries only what a unary call would retry.
 */
export class BatchStream {
  /** The open stream, and the batches sent on it that wait for their answer. */
  private current:
    | { stream: ClientDuplexStream<EnqueueStreamRequest, EnqueueStreamResponse>; pending: Map<number, Pending>; idle: NodeJS.Timeout | undefined }
    | undefined;
  private nextId = 1;
  /** The broker answered the stream UNIMPLEMENTED (it predates EnqueueStream): send calls. */
  unsupported = false;

  constructor(private readonly broker: BrokerClient) {}

  /** Sends one batch; `options.deadline` bounds the wait for its answer (DEADLINE_EXCEEDED). */
  send(
    batch: EnqueueBatchRequest,
    options: Partial<GrpcCallOptions>,
    callback: (err: ServiceError | null, response: EnqueueBatchResponse) => void,
  ): void {
    const current = this.current ?? this.open();
    const { stream, pending } = current;
    clearTimeout(current.idle);
    current.idle = undefined;
    const id = this.nextId++;
    const key = id;
    const entry: Pending = { callback, timer: undefined };
    const deadline = options.deadline;
    if (deadline !== undefined) {
      const ms = Math.max(0, (deadline instanceof Date ? deadline.getTime() : Number(deadline)) - Date.now());
      entry.timer = setTimeout(() => {
        // The broker may still apply it: unknown outcome, as for a unary call's deadline.
        if (!pending.delete(key)) return;
        this.idleAfterAnswer(current);
        callback(serviceError(GrpcStatus.DEADLINE_EXCEEDED, "Deadline exceeded"), noResults);
      }, ms);
    }
    pending.set(key, entry);
    stream.write({ requestId: id, batch });
  }

  /** Half-closes the stream; what is in flight is still answered. */
  close(): void {
    const current = this.current;
    if (current === undefined) return;
    clearTimeout(current.idle);
    this.current = undefined; // the next batch opens a new stream
    current.stream.end();
  }

  /** Once nothing waits on `current`, closes it after idleCloseMs without a new batch. */
  private idleAfterAnswer(current: NonNullable<BatchStream["current"]>): void {
    if (current.pending.size > 0 || this.current !== current) return;
    clearTimeout(current.idle);
    current.idle = setTimeout(() => {
      if (this.current === current && current.pending.size === 0) this.close();
    }, idleCloseMs);
    current.idle.unref();
  }

  private open(): NonNullable<BatchStream["current"]> {
    const stream = this.broker.enqueueStream();
    const pending = new Map<number, Pending>();
    const current: NonNullable<BatchStream["current"]> = { stream, pending, idle: undefined };
    this.current = current;
    stream.on("data", (response: EnqueueStreamResponse) => {
      const key = response.requestId;
      const entry = pending.get(key);
      if (entry === undefined) return; // its deadline passed
      pending.delete(key);
      clearTimeout(entry.timer);
      this.idleAfterAnswer(current);
      if (response.code !== 0) entry.callback(serviceError(response.code, response.message), noResults);
      else entry.callback(null, { results: response.results });
    });
    const ended = (err: ServiceError | undefined) => {
      if (this.current === current) this.current = undefined;
      clearTimeout(current.idle);
      if (err?.code === GrpcStatus.UNIMPLEMENTED) this.unsupported = true;
      const error = err ?? serviceError(GrpcStatus.UNAVAILABLE, "the enqueue stream ended");
      const waiting = [...pending.values()];
      pending.clear();
      for (const entry of waiting) {
        clearTimeout(entry.timer);
        entry.callback(error, noResults);
      }
    };
    stream.on("error", (err: ServiceError) => ended(err));
    stream.on("end", () => ended(undefined));
    return current;
  }
}
