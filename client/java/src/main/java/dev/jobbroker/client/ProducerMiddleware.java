package dev.jobbroker.client;

import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import java.util.List;

/**
 * Wraps every enqueue of a {@link JobBrokerClient} ({@link JobBrokerClient#use}), like Sidekiq's
 * client middleware: it may change the request (add headers, say), look at the answer or the
 * error, or not call {@code next} at all (its answer is then the enqueue's). The first added is
 * the outermost. Runs on the caller's thread.
 *
 * <pre>{@code
 * client.use((request, next) ->
 *     next.enqueue(request.toBuilder().putHeaders("tenant", currentTenant()).build()));
 * }</pre>
 */
@FunctionalInterface
public interface ProducerMiddleware {
  /** The rest of the chain for one job: the next middleware, in the end the broker. */
  @FunctionalInterface
  interface Next {
    EnqueueResponse enqueue(EnqueueRequest request);
  }

  /** The rest of the chain for a batch. */
  @FunctionalInterface
  interface NextBatch {
    List<EnqueueResponse> enqueueBatch(List<EnqueueRequest> requests);
  }

  /** Wraps {@link JobBrokerClient#enqueue(EnqueueRequest)}. */
  EnqueueResponse enqueue(EnqueueRequest request, Next next);

  /**
   * Wraps {@link JobBrokerClient#enqueueBatch}: still one call to the broker, all or nothing.
   * The default runs {@link #enqueue} over each job to learn what it changes (so a middleware
   * that only edits requests needs nothing more), then sends the edited batch once; a middleware
   * that must see the batch's answer or error (tracing, timing) overrides it.
   */
  default List<EnqueueResponse> enqueueBatch(List<EnqueueRequest> requests, NextBatch next) {
    List<EnqueueRequest> edited = new java.util.ArrayList<>(requests.size());
    for (EnqueueRequest r : requests) {
      enqueue(
          r,
          changed -> {
            edited.add(changed);
            return EnqueueResponse.getDefaultInstance();
          });
    }
    if (edited.size() != requests.size()) {
      throw new IllegalStateException(
          getClass().getName() + " skips next for some jobs: override enqueueBatch");
    }
    return next.enqueueBatch(edited);
  }
}
