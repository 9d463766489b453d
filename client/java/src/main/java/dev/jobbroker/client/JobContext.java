package dev.jobbroker.client;

import com.google.protobuf.ByteString;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Timestamp;
import dev.jobbroker.v1.CompletedStep;
import dev.jobbroker.v1.LeasedJob;
import dev.jobbroker.v1.StepCheckpoint;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * What a handler sees of the attempt it runs: the job, its cancellation, durable steps and
 * progress. Made by {@link Worker}. Thread-safe, except {@link #step}, which one thread calls at a
 * time (the handler's).
 */
public final class JobContext {
  /** Why {@link #isCancelled()} turned true. */
  public enum Cancellation {
    /** Not cancelled. */
    NONE,
    /**
     * An operator cancelled the job (Admin.CancelJob): a handler that then throws (or is ended by
     * the interrupt) leaves it CANCELLED; one that returns normally did the work, and its ack
     * completes the job with the result.
     */
    OPERATOR,
    /** The lease ran out or a heartbeat was refused; another attempt may run the job. */
    LEASE_LOST,
    /** The attempt reached its time-out ({@link #timeoutAt()}); the broker ended it. */
    TIMED_OUT,
    /** The worker is stopping and the grace ran out; the job is released (no attempt spent). */
    SHUTDOWN
  }

  /** The worker's side of one attempt: saving checkpoints and sending progress. */
  interface Attempt {
    /** Sends a heartbeat carrying {@code checkpoint} and waits for the broker to store it. */
    void saveCheckpoint(byte[] checkpoint) throws InterruptedException;

    /** Sends a heartbeat carrying {@code progress} now (or the newest after the one in flight). */
    void sendProgress(byte[] progress);
  }

  private final LeasedJob job;
  private final Attempt attempt;
  private final CountDownLatch cancelled = new CountDownLatch(1);
  private volatile Cancellation cancellation = Cancellation.NONE;
  private volatile byte[] result = new byte[0];
  // The handler's thread while the handler runs (interrupted on cancellation); guarded by this.
  private Thread handlerThread;

  // Durable steps: the checkpoint as saved so far, and the names used by this attempt.
  private StepCheckpoint.Builder steps;
  private Map<String, ByteString> stepResults;
  private final Set<String> stepNamesUsed = new HashSet<>();

  JobContext(LeasedJob job, Attempt attempt) {
    this.job = job;
    this.attempt = attempt;
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

  /**
   * The payload decoded as JSON (see {@link Json} for the Java types); {@link
   * IllegalArgumentException} if it is not JSON.
   */
  public Object payloadJson() {
    return Json.decode(payload());
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

  /** When the broker accepted the job. */
  public Instant enqueuedAt() {
    return toInstant(job.getEnqueuedAt());
  }

  /** The lease's deadline when the job arrived (heartbeats extend it). */
  public Instant leaseDeadline() {
    return toInstant(job.getLeaseDeadline());
  }

  /** When this attempt times out whatever its heartbeats; empty if it has no time-out. */
  public Optional<Instant> timeoutAt() {
    return job.hasTimeoutAt() ? Optional.of(toInstant(job.getTimeoutAt())) : Optional.empty();
  }

  /** The results of the jobs this one depended on, by job id. */
  public Map<String, byte[]> dependencyResults() {
    Map<String, byte[]> out = new LinkedHashMap<>();
    job.getDependencyResultsMap().forEach((id, r) -> out.put(id, r.toByteArray()));
    return out;
  }

  /**
   * What an earlier attempt saved (a serialized {@code StepCheckpoint} when it used {@link
   * #step}); empty if none.
   */
  public byte[] checkpoint() {
    return job.getCheckpoint().toByteArray();
  }

  /** The job as the broker pushed it. */
  public LeasedJob leasedJob() {
    return job;
  }

  /**
   * Runs {@code body} once per job, across attempts and workers: an attempt that finds {@code
   * name} in the job's checkpoint returns the saved result without running it; otherwise the
   * body runs, its result is saved in the checkpoint (JSON, a {@code StepCheckpoint} that workers
   * in other languages read too) and the broker has stored it before this returns.
   *
   * <p>Returns the result as JSON decodes it (see {@link Json}), so a first run and a replay
   * return the same thing. An exception of {@code body} propagates (the attempt fails; finished
   * steps stay saved). {@link IllegalArgumentException} for an empty name, a name used twice in
   * the job, or a result JSON cannot encode; {@link IllegalStateException} for a checkpoint that
   * is not a {@code StepCheckpoint}; {@link LeaseLostException} when the broker refused the save.
   */
  public Object step(String name, Callable<?> body) throws Exception {
    if (name == null || name.isEmpty()) {
      throw new IllegalArgumentException("a durable step needs a non-empty name");
    }
    if (!stepNamesUsed.add(name)) {
      throw new IllegalArgumentException(
          "durable step \"" + name + "\" was used twice: step names are unique within a job");
    }
    loadSteps();
    ByteString saved = stepResults.get(name);
    if (saved != null) {
      return Json.decode(saved.toByteArray());
    }
    byte[] encoded = Json.encode(body.call());
    steps.addSteps(
        CompletedStep.newBuilder().setName(name).setResult(ByteString.copyFrom(encoded)));
    stepResults.put(name, ByteString.copyFrom(encoded));
    attempt.saveCheckpoint(steps.build().toByteArray());
    return Json.decode(encoded);
  }

  /** Reads the job's checkpoint by the rules of steps.proto, once per attempt. */
  private void loadSteps() {
    if (steps != null) {
      return;
    }
    StepCheckpoint.Builder parsed = StepCheckpoint.newBuilder();
    Map<String, ByteString> results = new LinkedHashMap<>();
    ByteString data = job.getCheckpoint();
    if (!data.isEmpty()) {
      String why = null;
      try {
        parsed.mergeFrom(data);
        if (parsed.getStepsCount() == 0) {
          why = "it holds no step";
        }
        for (CompletedStep s : parsed.getStepsList()) {
          if (why != null) {
            break;
          }
          if (s.getName().isEmpty() || results.containsKey(s.getName())) {
            why = "bad or repeated step name \"" + s.getName() + "\"";
          } else {
            try {
              Json.decode(s.getResult().toByteArray());
              results.put(s.getName(), s.getResult());
            } catch (IllegalArgumentException e) {
              why = "step \"" + s.getName() + "\" has a result that is not JSON";
            }
          }
        }
      } catch (InvalidProtocolBufferException e) {
        why = e.getMessage();
      }
      if (why != null) {
        // Written by something other than durable steps: running the steps again could repeat
        // side effects, so the attempt fails instead.
        throw new IllegalStateException(
            "job " + jobId() + ": its checkpoint (" + data.size() + " bytes) is not a "
                + "jobbroker.v1.StepCheckpoint (" + why + "), so durable steps cannot resume it");
      }
    }
    steps = parsed;
    stepResults = results;
  }

  /**
   * Reports progress, shown by Admin.WatchJob and the dashboard: sent at once as a heartbeat
   * (when one is in flight, the newest value goes out when it is answered). {@code value} is
   * encoded as JSON (a {@code byte[]} is sent as it is and must be JSON), e.g. {@code
   * Map.of("percent", 40)}.
   */
  public void progress(Object value) {
    attempt.sendProgress(value instanceof byte[] b ? b.clone() : Json.encode(value));
  }

  /**
   * Saves raw bytes as the job's checkpoint (handed to every later attempt): sends a heartbeat
   * carrying it and waits for the answer. Do not mix with {@link #step}, which owns the
   * checkpoint. Throws {@link LeaseLostException} if the broker refused it.
   */
  public void saveCheckpoint(byte[] data) throws InterruptedException {
    attempt.saveCheckpoint(data.clone());
  }

  /** Kept with the completed job when the handler returns {@code null}. */
  public void setResult(byte[] data) {
    result = data.clone();
  }

  /**
   * True once the job was cancelled (see {@link #cancellation()}): stop soon. The handler's thread
   * is interrupted at the same moment, so blocking calls throw {@link InterruptedException}.
   */
  public boolean isCancelled() {
    return cancelled.getCount() == 0;
  }

  /** Why the job was cancelled; {@link Cancellation#NONE} if it was not. */
  public Cancellation cancellation() {
    return cancellation;
  }

  /**
   * Sleeps up to {@code millis}, waking early when the job is cancelled. Returns true if it was
   * cancelled (a convenient way to wait between steps of a long job).
   */
  public boolean sleepUnlessCancelled(long millis) throws InterruptedException {
    try {
      return cancelled.await(millis, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      return cancelledBy(e);
    }
  }

  /**
   * Blocks until the job is cancelled. Throws {@link InterruptedException} only for an interrupt
   * that is not the cancellation's.
   */
  public void awaitCancellation() throws InterruptedException {
    try {
      cancelled.await();
    } catch (InterruptedException e) {
      cancelledBy(e);
    }
  }

  /**
   * The wait was interrupted: by the cancellation, which the caller was waiting for (the thread
   * stays interrupted, so the next blocking call sees it too), or by something else: rethrown.
   */
  private boolean cancelledBy(InterruptedException e) throws InterruptedException {
    if (!isCancelled()) {
      throw e;
    }
    Thread.currentThread().interrupt();
    return true;
  }

  /** True when the lease ran out, a heartbeat was refused or the attempt timed out. */
  public boolean leaseLost() {
    Cancellation c = cancellation;
    return c == Cancellation.LEASE_LOST || c == Cancellation.TIMED_OUT;
  }

  byte[] result() {
    return result;
  }

  /**
   * Fires the cancellation with {@code why}. The first reason stays, except that a lost lease or
   * time-out overrides an earlier one: then nothing may be answered for the attempt.
   */
  void cancel(Cancellation why) {
    synchronized (this) {
      Cancellation now = cancellation;
      boolean lost = why == Cancellation.LEASE_LOST || why == Cancellation.TIMED_OUT;
      if (now != Cancellation.NONE && !(lost && !leaseLost())) {
        return;
      }
      cancellation = why;
      // Flag first, then interrupt: code woken by the interrupt finds isCancelled() true.
      cancelled.countDown();
      if (handlerThread != null) {
        handlerThread.interrupt();
      }
    }
  }

  /** The handler starts on the calling thread; a cancellation that came first interrupts it. */
  synchronized void enterHandler() {
    handlerThread = Thread.currentThread();
    if (isCancelled()) {
      handlerThread.interrupt();
    }
  }

  /** The handler returned: later cancellations leave the (pooled) thread alone. */
  void leaveHandler() {
    synchronized (this) {
      handlerThread = null;
    }
    Thread.interrupted(); // an interrupt aimed at this attempt must not reach the next one
  }

  private static Instant toInstant(Timestamp t) {
    return Instant.ofEpochSecond(t.getSeconds(), t.getNanos());
  }
}
