import { status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";
import { JobState, type Job } from "./gen/jobbroker/v1/job.js";

/** gRPC status codes (google.rpc.Code), as `JobBrokerError.code` carries them. */
export { GrpcStatus as Status };

/** The name of a gRPC status code: "INVALID_ARGUMENT" for 3. */
export function statusName(code: number): string {
  return GrpcStatus[code] ?? `CODE_${code}`;
}

/**
 * What every failed call of `Client` throws: the broker's (or the transport's) gRPC status.
 * `code` is a `Status` value (e.g. `Status.INVALID_ARGUMENT`), `details` the broker's message.
 */
export class JobBrokerError extends Error {
  override readonly name = "JobBrokerError";
  /** The gRPC status code (google.rpc.Code). */
  readonly code: number;
  /** The status's message, without the code prefix. */
  readonly details: string;

  constructor(code: number, details: string, options?: { cause?: unknown }) {
    super(`${statusName(code)}: ${details}`, options);
    this.code = code;
    this.details = details;
  }

  /** The code's name, e.g. "FAILED_PRECONDITION". */
  get codeName(): string {
    return statusName(this.code);
  }
}

/** Turns a grpc-js error into a JobBrokerError (anything else is returned unchanged). */
export function fromServiceError(err: unknown): unknown {
  const e = err as Partial<ServiceError> | null;
  if (e && typeof e === "object" && typeof e.code === "number") {
    return new JobBrokerError(e.code, e.details ?? e.message ?? "", { cause: err });
  }
  return err;
}

/**
 * Thrown by a handler: the job fails with no retry and dies with FAIL_REASON_PERMANENT (a bad
 * address, a validation error: something another attempt cannot fix).
 */
export class PermanentError extends Error {
  override readonly name = "PermanentError";
}

/**
 * Thrown by a handler: the attempt fails and the next one starts after `delayMs` instead of the
 * queue's computed backoff (a provider's Retry-After).
 */
export class RetryAfterError extends Error {
  override readonly name = "RetryAfterError";
  constructor(
    readonly delayMs: number,
    message = `retry after ${delayMs} ms`,
  ) {
    super(message);
  }
}

/** `throw retryAfter(30_000, "rate limited")`: shorthand for `new RetryAfterError(...)`. */
export function retryAfter(delayMs: number, message?: string): RetryAfterError {
  return new RetryAfterError(delayMs, message);
}

/**
 * Thrown by a handler: the job goes back to its queue for `delayMs` without spending an attempt
 * (Release with a delay: SCHEDULED, `Job.snoozes` + 1). For work that is not due yet, such as a
 * resource another job holds; the queue's max_snoozes bounds how often.
 */
export class SnoozeError extends Error {
  override readonly name = "SnoozeError";
  constructor(
    readonly delayMs: number,
    message = `snoozed for ${delayMs} ms`,
  ) {
    super(message);
  }
}

/** `throw snooze(5_000)`: shorthand for `new SnoozeError(...)`. */
export function snooze(delayMs: number, message?: string): SnoozeError {
  return new SnoozeError(delayMs, message);
}

/** Why a job context's `signal` was aborted. */
export class JobCancelledError extends Error {
  override readonly name = "JobCancelledError";
  constructor(
    /**
     * "cancel-requested" (an operator cancelled the job), "lease-lost" (the broker ended the
     * attempt: no heartbeat in time), "timeout" (the attempt reached its run-time limit,
     * LeasedJob.timeout_at) or "shutdown" (a graceful stop's grace ran out; the job is released).
     */
    readonly reason: "lease-lost" | "cancel-requested" | "timeout" | "shutdown",
    message: string,
  ) {
    super(message);
  }
}

/**
 * `enqueueAndWait`'s rejection for a job that ended without completing: FAILED (its attempts
 * ran out, a permanent error, a dependency failed, it expired) or CANCELLED. `job` is the job
 * as it ended (`lastError`, `failReason`, `attempts`).
 */
export class JobEndedError extends Error {
  override readonly name = "JobEndedError";
  /** JobState.JOB_STATE_FAILED or JobState.JOB_STATE_CANCELLED. */
  readonly state: JobState;
  constructor(readonly job: Job) {
    super(`job ${job.id} ended ${JobState[job.state]}${job.lastError ? `: ${job.lastError}` : ""}`);
    this.state = job.state;
  }
}
