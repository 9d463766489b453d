package dev.jobbroker.client;

import com.google.protobuf.ByteString;
import com.google.protobuf.Timestamp;
import dev.jobbroker.v1.EnqueueRequest;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * Every option of an enqueue (each field of {@link EnqueueRequest} but the queue and payload),
 * in java.time types. Unset options take the queue's policy. Mutable, not thread-safe: build one
 * per call, or reuse one that no thread changes.
 *
 * <pre>{@code
 * client.enqueue("emails", payload, new EnqueueOptions()
 *     .delay(Duration.ofMinutes(5))
 *     .dedupKey("welcome:" + userId)
 *     .maxAttempts(5)
 *     .header("tenant", "acme"));
 * }</pre>
 */
public final class EnqueueOptions {
  private final Map<String, String> headers = new LinkedHashMap<>();
  private int priority;
  private Duration delay;
  private Instant runAt;
  private String dedupKey = "";
  private Duration dedupTtl;
  private int maxAttempts;
  private Duration leaseDuration;
  private String concurrencyKey = "";
  private Duration timeout;
  private Instant expireAt;
  private final List<String> dependsOn = new ArrayList<>();
  private final List<Integer> dependsOnIndex = new ArrayList<>();
  private boolean batch = true;

  /** No option set: the queue's defaults. */
  public static EnqueueOptions defaults() {
    return new EnqueueOptions();
  }

  /** Handed to the worker as they are (trace context, content type, ...). */
  public EnqueueOptions header(String name, String value) {
    headers.put(Objects.requireNonNull(name), Objects.requireNonNull(value));
    return this;
  }

  /** Adds every entry of {@code headers}. */
  public EnqueueOptions headers(Map<String, String> headers) {
    headers.forEach(this::header);
    return this;
  }

  /** Higher runs first; FIFO within one priority. Default 0. */
  public EnqueueOptions priority(int priority) {
    this.priority = priority;
    return this;
  }

  /** Run no earlier than this long from now (not with {@link #runAt}). */
  public EnqueueOptions delay(Duration delay) {
    this.delay = delay;
    return this;
  }

  /** Run no earlier than this time (not with {@link #delay}). */
  public EnqueueOptions runAt(Instant runAt) {
    this.runAt = runAt;
    return this;
  }

  /**
   * While a job of the queue holds this key, an enqueue with it returns that job
   * (deduplicated). With one, an enqueue is safe to retry, and the client does on UNAVAILABLE.
   */
  public EnqueueOptions dedupKey(String key) {
    this.dedupKey = Objects.requireNonNull(key);
    return this;
  }

  /** How long the dedup key blocks duplicates; unset = the queue's dedup_ttl. */
  public EnqueueOptions dedupTtl(Duration ttl) {
    this.dedupTtl = ttl;
    return this;
  }

  /** Attempts in total, the first included; 0 = the queue's. */
  public EnqueueOptions maxAttempts(int n) {
    this.maxAttempts = n;
    return this;
  }

  /** Lease length when the worker asks none; unset = the queue's. */
  public EnqueueOptions leaseDuration(Duration d) {
    this.leaseDuration = d;
    return this;
  }

  /** Groups jobs for the queue's max_concurrency_per_key (a tenant id, say). */
  public EnqueueOptions concurrencyKey(String key) {
    this.concurrencyKey = Objects.requireNonNull(key);
    return this;
  }

  /** Run-time limit of each attempt (100 ms to 720 h); unset = the queue's. */
  public EnqueueOptions timeout(Duration d) {
    this.timeout = d;
    return this;
  }

  /** A job not started by then ends FAILED (FAIL_REASON_EXPIRED). */
  public EnqueueOptions expireAt(Instant t) {
    this.expireAt = t;
    return this;
  }

  /** Waits (JOB_STATE_WAITING) until these jobs completed; their results come with it. */
  public EnqueueOptions dependsOn(String... jobIds) {
    dependsOn.addAll(List.of(jobIds));
    return this;
  }

  /** Inside a batch only: waits for the jobs at these earlier indexes of the same batch. */
  public EnqueueOptions dependsOnIndex(int... indexes) {
    for (int i : indexes) {
      dependsOnIndex.add(i);
    }
    return this;
  }

  /**
   * False: this call is sent at once as its own unary Enqueue, never merged with other callers'
   * jobs into an EnqueueBatch (default true, when the client's {@link
   * ClientOptions.Builder#batching} is on). Not a field of the request.
   */
  public EnqueueOptions batch(boolean batch) {
    this.batch = batch;
    return this;
  }

  /** Whether this call may be coalesced ({@link #batch(boolean)}). */
  boolean batch() {
    return batch;
  }

  /** The request these options make for {@code queue} and {@code payload}. */
  public EnqueueRequest toRequest(String queue, byte[] payload) {
    EnqueueRequest.Builder b =
        EnqueueRequest.newBuilder()
            .setQueue(queue)
            .setPayload(ByteString.copyFrom(payload))
            .putAllHeaders(headers)
            .setPriority(priority)
            .setDedupKey(dedupKey)
            .setMaxAttempts(maxAttempts)
            .setConcurrencyKey(concurrencyKey)
            .addAllDependsOn(dependsOn)
            .addAllDependsOnIndex(dependsOnIndex);
    if (delay != null) {
      b.setDelay(JobBrokerClient.toProto(delay));
    }
    if (runAt != null) {
      b.setRunAt(timestamp(runAt));
    }
    if (dedupTtl != null) {
      b.setDedupTtl(JobBrokerClient.toProto(dedupTtl));
    }
    if (leaseDuration != null) {
      b.setLeaseDuration(JobBrokerClient.toProto(leaseDuration));
    }
    if (timeout != null) {
      b.setTimeout(JobBrokerClient.toProto(timeout));
    }
    if (expireAt != null) {
      b.setExpireAt(timestamp(expireAt));
    }
    return b.build();
  }

  private static Timestamp timestamp(Instant t) {
    return Timestamp.newBuilder().setSeconds(t.getEpochSecond()).setNanos(t.getNano()).build();
  }
}
