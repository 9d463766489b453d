package dev.jobbroker.client;

/**
 * Thrown by a handler: fail the job with no retry. It dies at once (JOB_STATE_FAILED,
 * FAIL_REASON_PERMANENT): a bad address, a validation error, something another attempt cannot fix.
 */
public class PermanentError extends Exception {
  private static final long serialVersionUID = 1L;

  public PermanentError(String message) {
    super(message);
  }

  public PermanentError(String message, Throwable cause) {
    super(message, cause);
  }
}
