package dev.jobbroker.client;

/**
 * Runs one attempt of a job of the queue it was registered for ({@link Worker#handle}).
 *
 * <p>Returning acks the job; the value returned is its result: a {@code byte[]} as it is, a
 * {@link String} as UTF-8, {@code null} for none (or what {@link JobContext#setResult} set), and
 * anything else as JSON ({@link Json}). Throwing fails the attempt with the exception's text,
 * retried after the queue's backoff; throw {@link PermanentError} for a failure no retry can fix,
 * {@link RetryAfter} to choose the delay before the next attempt, or {@link Snooze} to run later
 * without spending an attempt.
 *
 * <p>Cancellation (operator cancel, lost lease, time-out, end of a graceful stop's grace)
 * interrupts the handler's thread and turns {@link JobContext#isCancelled()} true; a handler that
 * ignores both keeps its thread, and its slot of the worker's {@code concurrency}, until it
 * returns. After an operator cancel, returning normally still acks (the job completes); throwing
 * leaves it cancelled.
 */
@FunctionalInterface
public interface JobHandler {
  Object handle(JobContext job) throws Exception;
}
