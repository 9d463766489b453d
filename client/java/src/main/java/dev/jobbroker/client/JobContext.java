package dev.jobbroker.client;

import dev.jobbroker.v1.LeasedJob;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * What a handler sees of the attempt it runs. Made by {@link Worker}. Thread-safe.
 */
public final class JobContext {
  /** Sends a heartbeat carrying a checkpoint and waits for the broker's answer. */
  interface CheckpointSender {
    void save(JobContext job, byte[] checkpoint) throws InterruptedException;
  }

  private final LeasedJob job;
  private final CheckpointSender checkpoints;
  private final CountDownLatch cancelled = new CountDownLatch(1);
  private volatile String cancelReason = "";
  private volatile boolean leaseLost;
  private volatile byte[] result = new byte[0];

  JobContext(LeasedJob job, CheckpointSender checkpoints) {
    this.job = job;
    this.checkpoints = checkpoints;
  }

  public String jobId() {
    return job.getJobId();
  }

  public String queue() {
    return job.getQueue();
  }

  /** The payload as enqueued. */
  public byte[] payload() {
    return job.getPayload().toByteArray();
  }

  /** The payload decoded as UTF-8 (JSON or plain text). */
  public String payloadText() {
    return job.getPayload().toString(StandardCharsets.UTF_8);
  }

  public Map<String, String> headers() {
    return job.getHeadersMap();
  }

  /** 1 for the first attempt; {@code attempt() == maxAttempts()} is the last chance. */
  public int attempt() {
    return job.getAttempt();
  }

  public int maxAttempts() {
    return job.getMaxAttempts();
  }

  /**
   * The same for every attempt of the job (the dedup key, else the job id): pass it to side
   * effects' providers so that a repeated attempt is harmless.
   */
  public String idempotencyKey() {
    return job.getIdempotencyKey();
  }

  /** What an earlier attempt saved with {@link #saveCheckpoint}; empty if none. */
  public byte[] checkpoint() {
    return job.getCheckpoint().toByteArray();
  }

  /** The job as the broker pushed it. */
  public LeasedJob leasedJob() {
    return job;
  }

  /**
   * Saves progress durably with the job (handed to every later attempt): sends a heartbeat
   * carrying it and waits for the answer. Throws {@link LeaseLostException} if the broker refused
   * it because the lease is gone.
   */
  public void saveCheckpoint(byte[] data) throws InterruptedException {
    checkpoints.save(this, data);
  }

  /** Kept with the completed job when the handler returns normally. */
  public void setResult(byte[] data) {
    result = data.clone();
  }

  /**
   * True once the operator cancelled the job, its lease was lost, or the worker is stopping past
   * its grace period: stop soon. What the handler returns then is still reported, except after a
   * lost lease.
   */
  public boolean isCancelled() {
    return cancelled.getCount() == 0;
  }

  /** Why {@link #isCancelled()} is true: "cancelled", "lease lost" or "shutdown"; else "". */
  public String cancelReason() {
    return cancelReason;
  }

  /**
   * Sleeps up to {@code millis}, waking early when the job is cancelled. Returns true if it was
   * cancelled (a convenient way to wait between steps of a long job).
   */
  public boolean sleepUnlessCancelled(long millis) throws InterruptedException {
    return cancelled.await(millis, TimeUnit.MILLISECONDS);
  }

  /** True when the lease ran out or a heartbeat was refused; the job is not acked then. */
  public boolean leaseLost() {
    return leaseLost;
  }

  byte[] result() {
    return result;
  }

  void cancel(String reason) {
    synchronized (this) {
      if (cancelled.getCount() == 0) {
        return;
      }
      cancelReason = reason;
    }
    cancelled.countDown();
  }

  void markLeaseLost() {
    leaseLost = true;
    cancel("lease lost");
  }
}
