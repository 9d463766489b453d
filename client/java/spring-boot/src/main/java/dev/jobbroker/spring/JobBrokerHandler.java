package dev.jobbroker.spring;

import dev.jobbroker.client.JobContext;
import dev.jobbroker.client.JobHandler;
import java.util.Objects;

/**
 * A bean that runs the jobs of one queue. When the application context has at least one, the
 * auto-configuration builds a {@link dev.jobbroker.client.Worker} with each registered for its
 * {@link #queue()}, starts it once the context is refreshed and stops it gracefully when the
 * context closes. Two handlers of the same queue fail the context's start.
 *
 * <p>{@link #handle} is the client's {@link JobHandler}: its return value is the job's result, a
 * throw fails the attempt (see {@link JobHandler} for the result and error types).
 */
public interface JobBrokerHandler extends JobHandler {

  /** The queue whose jobs this handler runs. */
  String queue();

  /**
   * A handler of {@code queue} from a lambda or method reference, e.g. {@code
   * JobBrokerHandler.of("emails", job -> "sent to " + job.payloadText())}.
   */
  static JobBrokerHandler of(String queue, JobHandler handler) {
    Objects.requireNonNull(queue, "queue");
    Objects.requireNonNull(handler, "handler");
    return new JobBrokerHandler() {
      @Override
      public String queue() {
        return queue;
      }

      @Override
      public Object handle(JobContext job) throws Exception {
        return handler.handle(job);
      }

      @Override
      public String toString() {
        return "JobBrokerHandler[" + queue + "]";
      }
    };
  }
}
