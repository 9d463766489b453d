package dev.jobbroker.client;

/**
 * Wraps each handler call of a {@link Worker} ({@link Worker#use}), like asynq's {@code Use} or
 * Sidekiq's server middleware: the first registered is the outermost. It gets the job context
 * and {@code next} (the rest of the chain, in the end the queue's handler); what it returns or
 * throws is what the handler did, with the meanings of {@link JobHandler}. Not calling
 * {@code next} skips the handler. Runs on the handler's thread, inside its slot.
 *
 * <pre>{@code
 * worker.use((job, next) -> {
 *   long started = System.nanoTime();
 *   try {
 *     return next.handle(job);
 *   } finally {
 *     metrics.record(job.queue(), System.nanoTime() - started);
 *   }
 * });
 * }</pre>
 */
@FunctionalInterface
public interface WorkerMiddleware {
  Object handle(JobContext job, JobHandler next) throws Exception;
}
