package dev.jobbroker.client;

import dev.jobbroker.v1.Job;

/**
 * A job {@link JobBrokerClient#enqueueAndWait} waited for ended FAILED or CANCELLED. The message
 * names the state (and the fail reason and last error); {@link #job()} is the job as it ended.
 */
public final class JobFailedException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private final transient Job job;

  JobFailedException(Job job) {
    super(describe(job));
    this.job = job;
  }

  /** The job in its terminal state. */
  public Job job() {
    return job;
  }

  private static String describe(Job job) {
    StringBuilder s = new StringBuilder("job ").append(job.getId()).append(" ended ");
    s.append(job.getState().name());
    if (job.getFailReasonValue() != 0) {
      s.append(" (").append(job.getFailReason().name()).append(')');
    }
    if (!job.getLastError().isEmpty()) {
      s.append(": ").append(job.getLastError());
    }
    return s.toString();
  }
}
