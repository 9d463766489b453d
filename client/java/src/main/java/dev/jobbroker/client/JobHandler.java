package dev.jobbroker.client;

/**
 * Runs one attempt of a job. Returning normally acks the job (with {@link JobContext#setResult}
 * if set). Throwing fails the attempt with the exception's text, and the broker retries it after
 * the queue's backoff; throw {@link PermanentError} for a failure no retry can fix, or {@link
 * RetryAfter} to choose the delay before the next attempt.
 */
@FunctionalInterface
public interface JobHandler {
  void handle(JobContext job) throws Exception;
}
