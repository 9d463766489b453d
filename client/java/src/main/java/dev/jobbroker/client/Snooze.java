package dev.jobbroker.client;

import java.time.Duration;

/**
 * Thrown by a handler: give the job back to run again after {@link #delay()}, without spending
 * an attempt (the broker counts it in {@code Job.snoozes}; beyond the queue's {@code max_snoozes}
 * the job fails). For "not now" rather than "it failed": a resource is busy, a time window has
 * not opened.
 */
public class Snooze extends Exception {
  private static final long serialVersionUID = 1L;
  private final Duration delay;

  public Snooze(Duration delay) {
    super("snoozed for " + delay);
    this.delay = delay;
  }

  public Duration delay() {
    return delay;
  }
}
