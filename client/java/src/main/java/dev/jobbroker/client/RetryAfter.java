package dev.jobbroker.client;

import java.time.Duration;

/**
 * Thrown by a handler: fail this attempt and run the next one after {@link #delay()} instead of
 * the queue's computed backoff (e.g. a provider's Retry-After). The attempt still counts.
 */
public class RetryAfter extends Exception {
  private static final long serialVersionUID = 1L;
  private final Duration delay;

  public RetryAfter(Duration delay, String message) {
    super(message);
    this.delay = delay;
  }

  public Duration delay() {
    return delay;
  }
}
