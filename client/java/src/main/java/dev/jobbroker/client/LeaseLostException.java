package dev.jobbroker.client;

/**
 * The worker no longer holds the job's lease (it ran out, or the broker refused a heartbeat):
 * stop working on the job; another attempt may already run it. The worker does not ack it.
 */
public class LeaseLostException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public LeaseLostException(String message) {
    super(message);
  }
}
