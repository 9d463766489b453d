package dev.jobbroker.client;

import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import io.grpc.Deadline;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Merges concurrent single enqueues into EnqueueBatch calls and answers each caller on its own
 * (docs/worker-contract.md §10). It sits where a {@link JobBrokerClient} sent the unary Enqueue,
 * below the producer middleware.
 *
 * <p>A job joins the open batch of its {@link Key}. A batch is <em>due</em> once it is full
 * (jobs or bytes), once its linger has passed (at once with a linger of zero), or when the
 * client closes; the due batches of a key are sent in order while fewer than maxInFlight of the
 * key are in flight. The caller's thread sends what its job made sendable; the thread that ends
 * an in-flight batch (a gRPC callback) sends what waited for it; a linger timer sends a batch
 * whose linger passed. Nothing else runs a thread: with a linger of zero there are no timers.
 *
 * <p>Thread-safe. One lock guards every key's batches; it is held only to move jobs and
 * batches, never across a send.
 */
final class EnqueueCoalescer {
  /** One attempt of a call to the broker: unary Enqueue for one job, EnqueueBatch for more. */
  interface Transport {
    /**
     * Starts the call and returns; {@code done} runs once, on any thread, with the results (one
     * per job, in order) or the error. {@code deadline} null: none.
     */
    void send(List<EnqueueRequest> jobs, Deadline deadline, Done done);
  }

  /** The end of one {@link Transport#send}. */
  interface Done {
    void done(List<EnqueueResponse> results, StatusRuntimeException error);
  }

  /**
   * Which jobs may share a batch: one partition (the queue's name when the client knows no
   * cluster, so the queue stands for its partition), and all with a dedup key or all without,
   * so that a batch is retried on UNAVAILABLE exactly when each of its jobs would be alone.
   */
  record Key(String queue, int partition, boolean dedupKeyed) {
    static Key ofPartition(int partition, boolean dedupKeyed) {
      return new Key(null, partition, dedupKeyed);
    }

    static Key ofQueue(String queue, boolean dedupKeyed) {
      return new Key(queue, -1, dedupKeyed);
    }
  }

  // The statuses of a batch that refused it whole and applied nothing: each job is sent again
  // alone, so that only a bad job fails, with the message a unary call gives.
  private static boolean refusedWhole(Status.Code code) {
    return switch (code) {
      case INVALID_ARGUMENT,
          RESOURCE_EXHAUSTED,
          ALREADY_EXISTS,
          FAILED_PRECONDITION,
          NOT_FOUND,
          OUT_OF_RANGE,
          PERMISSION_DENIED -> true;
      default -> false;
    };
  }

  /** One caller: its job, its deadline, and where its answer goes. */
  private static final class Caller {
    final EnqueueRequest request;
    final Deadline deadline; // null: none
    final CompletableFuture<EnqueueResponse> answer = new CompletableFuture<>();

    Caller(EnqueueRequest request, Deadline deadline) {
      this.request = request;
      this.deadline = deadline;
    }
  }

  private static final class Batch {
    final Key key;
    final List<Caller> callers = new ArrayList<>();
    long bytes;
    boolean sealed; // full: later jobs open the next batch
    boolean due; // may be sent once the in-flight limit allows

    Batch(Key key) {
      this.key = key;
    }
  }

  private static final class KeyState {
    final ArrayDeque<Batch> waiting = new ArrayDeque<>(); // the open batch is the last
    int inFlight;
  }

  private final Transport transport;
  private final int maxJobs;
  private final long maxBytes;
  private final long lingerNanos;
  private final int maxInFlight;
  private final int retryAttempts;
  private final Duration retryBackoff;

  private final Object lock = new Object();
  // Guarded by lock.
  private final Map<Key, KeyState> keys = new HashMap<>();
  private int unfinished; // batches waiting or in flight, for close()
  private long joined; // jobs that joined a batch, ever (tests)
  private boolean closing;
  private ScheduledExecutorService timers; // made at the first linger or retry

  EnqueueCoalescer(ClientOptions options, Transport transport) {
    this.transport = transport;
    this.maxJobs = options.batchMaxJobs();
    this.maxBytes = options.batchMaxBytes();
    this.lingerNanos = options.batchLinger().toNanos();
    this.maxInFlight = options.batchMaxInFlight();
    this.retryAttempts = options.retryAttempts();
    this.retryBackoff = options.retryBackoff();
  }

  /**
   * Sends {@code request} in a batch of {@code key} and waits for its answer. Throws the
   * batch's {@link StatusRuntimeException} (or the one of the job's own unary call when the
   * batch was refused whole); CANCELLED when the thread is interrupted while it waits (the job
   * stays in its batch and may be created, as a unary call cancelled in flight may).
   */
  EnqueueResponse enqueue(EnqueueRequest request, Key key, Deadline deadline) {
    Caller caller = new Caller(request, deadline);
    List<Batch> ready;
    long size = bytesOf(request);
    synchronized (lock) {
      KeyState state = keys.computeIfAbsent(key, k -> new KeyState());
      Batch open = state.waiting.peekLast();
      if (open != null && !open.sealed && open.bytes + size > maxBytes) {
        // This job would take the batch past its bytes: the batch goes as it is.
        seal(open);
      }
      if (open == null || open.sealed) {
        open = new Batch(key);
        state.waiting.addLast(open);
        unfinished++;
        if (lingerNanos == 0 || closing) {
          open.due = true;
        } else {
          scheduleLinger(open);
        }
      }
      open.callers.add(caller);
      open.bytes += size;
      joined++;
      if (open.callers.size() >= maxJobs || open.bytes >= maxBytes) {
        seal(open);
      }
      ready = takeReady(state);
    }
    sendAll(ready);
    return await(caller);
  }

  /**
   * Sends every waiting batch (the in-flight limit still applies) and waits until each batch
   * has been answered. Enqueues that arrive meanwhile are sent at once.
   */
  void close() {
    List<Batch> ready = new ArrayList<>();
    synchronized (lock) {
      closing = true;
      for (KeyState state : keys.values()) {
        state.waiting.forEach(b -> b.due = true);
        ready.addAll(takeReady(state));
      }
    }
    sendAll(ready);
    synchronized (lock) {
      try {
        while (unfinished > 0) {
          lock.wait();
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      if (timers != null) {
        timers.shutdown();
      }
    }
  }

  /** Batches of every key waiting or in flight (tests). */
  int unfinishedBatches() {
    synchronized (lock) {
      return unfinished;
    }
  }

  /** Jobs that have joined a batch since the start (tests: callers' order). */
  long joinedJobs() {
    synchronized (lock) {
      return joined;
    }
  }

  /** The bytes a job counts for batchMaxBytes: its payload and its headers' names and values. */
  static long bytesOf(EnqueueRequest request) {
    long n = request.getPayload().size();
    for (Map.Entry<String, String> h : request.getHeadersMap().entrySet()) {
      n += utf8Length(h.getKey()) + utf8Length(h.getValue());
    }
    return n;
  }

  private static long utf8Length(String s) {
    long n = 0;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c < 0x80) {
        n += 1;
      } else if (c < 0x800) {
        n += 2;
      } else if (Character.isHighSurrogate(c)
          && i + 1 < s.length()
          && Character.isLowSurrogate(s.charAt(i + 1))) {
        n += 4;
        i++;
      } else {
        n += 3;
      }
    }
    return n;
  }

  private static void seal(Batch b) {
    b.sealed = true;
    b.due = true;
  }

  /** The due batches at the head of {@code state} that the in-flight limit lets go; under lock. */
  private List<Batch> takeReady(KeyState state) {
    List<Batch> ready = null;
    while (state.inFlight < maxInFlight
        && !state.waiting.isEmpty()
        && state.waiting.peekFirst().due) {
      if (ready == null) {
        ready = new ArrayList<>(2);
      }
      ready.add(state.waiting.pollFirst());
      state.inFlight++;
    }
    return ready == null ? List.of() : ready;
  }

  private void scheduleLinger(Batch b) {
    try {
      timers().schedule(() -> lingerPassed(b), lingerNanos, TimeUnit.NANOSECONDS);
    } catch (RejectedExecutionException e) {
      b.due = true; // closed: there is nothing to wait for
    }
  }

  private void lingerPassed(Batch b) {
    List<Batch> ready;
    synchronized (lock) {
      b.due = true;
      KeyState state = keys.get(b.key);
      ready = state == null ? List.of() : takeReady(state);
    }
    sendAll(ready);
  }

  /** Under lock. */
  private ScheduledExecutorService timers() {
    if (timers == null) {
      ScheduledThreadPoolExecutor t =
          new ScheduledThreadPoolExecutor(
              1,
              r -> {
                Thread thread = new Thread(r, "jobbroker-enqueue-coalescer");
                thread.setDaemon(true);
                return thread;
              });
      // A linger timer left at close belongs to a batch already sent: drop it.
      t.setExecuteExistingDelayedTasksAfterShutdownPolicy(false);
      timers = t;
    }
    return timers;
  }

  private void sendAll(List<Batch> batches) {
    for (Batch b : batches) {
      List<EnqueueRequest> jobs = new ArrayList<>(b.callers.size());
      Deadline deadline = null;
      for (Caller c : b.callers) {
        jobs.add(c.request);
        if (c.deadline != null && (deadline == null || c.deadline.isBefore(deadline))) {
          deadline = c.deadline;
        }
      }
      attempt(b, jobs, deadline, 1);
    }
  }

  private void attempt(Batch b, List<EnqueueRequest> jobs, Deadline deadline, int attempt) {
    send(
        jobs,
        deadline,
        (results, error) -> {
          if (error == null) {
            answer(b, results);
            return;
          }
          Status.Code code = error.getStatus().getCode();
          if (refusedWhole(code) && b.callers.size() > 1) {
            split(b);
            return;
          }
          // Only a dedup-keyed batch is sent again: a repeat finds the jobs it already created.
          if (code == Status.Code.UNAVAILABLE
              && b.key.dedupKeyed()
              && attempt < retryAttempts
              && retryLater(
                  () -> attempt(b, jobs, deadline, attempt + 1), pauseBefore(attempt + 1))) {
            return;
          }
          failAll(b, error);
        });
  }

  /** Each job of a batch refused whole, sent again alone, all at once. */
  private void split(Batch b) {
    AtomicInteger left = new AtomicInteger(b.callers.size());
    for (Caller c : b.callers) {
      sendAlone(
          c,
          1,
          () -> {
            if (left.decrementAndGet() == 0) {
              finished(b);
            }
          });
    }
  }

  private void sendAlone(Caller c, int attempt, Runnable then) {
    send(
        List.of(c.request),
        c.deadline,
        (results, error) -> {
          if (error == null) {
            c.answer.complete(results.get(0));
          } else if (error.getStatus().getCode() == Status.Code.UNAVAILABLE
              && !c.request.getDedupKey().isEmpty()
              && attempt < retryAttempts
              && retryLater(() -> sendAlone(c, attempt + 1, then), pauseBefore(attempt + 1))) {
            return; // the retry runs `then`
          } else {
            c.answer.completeExceptionally(error);
          }
          then.run();
        });
  }

  /** One transport call; a throw from it, or a wrong number of results, is its error. */
  private void send(List<EnqueueRequest> jobs, Deadline deadline, Done done) {
    try {
      transport.send(
          jobs,
          deadline,
          (results, error) -> {
            if (error == null && (results == null || results.size() != jobs.size())) {
              error =
                  Status.INTERNAL
                      .withDescription(
                          "the broker answered "
                              + (results == null ? 0 : results.size())
                              + " results for "
                              + jobs.size()
                              + " jobs")
                      .asRuntimeException();
            }
            done.done(results, error);
          });
    } catch (RuntimeException e) {
      done.done(null, asStatusException(e));
    }
  }

  private Duration pauseBefore(int attempt) {
    return retryBackoff.multipliedBy(1L << Math.min(attempt - 2, 30));
  }

  /** Runs {@code retry} after {@code pause}; false if it cannot (closed). */
  private boolean retryLater(Runnable retry, Duration pause) {
    try {
      synchronized (lock) {
        timers().schedule(retry, pause.toNanos(), TimeUnit.NANOSECONDS);
      }
      return true;
    } catch (RejectedExecutionException e) {
      return false;
    }
  }

  private void answer(Batch b, List<EnqueueResponse> results) {
    for (int i = 0; i < b.callers.size(); i++) {
      b.callers.get(i).answer.complete(results.get(i));
    }
    finished(b);
  }

  private void failAll(Batch b, StatusRuntimeException error) {
    for (Caller c : b.callers) {
      c.answer.completeExceptionally(error);
    }
    finished(b);
  }

  /** The batch's callers are answered: the next due batch of its key may go. */
  private void finished(Batch b) {
    List<Batch> ready;
    synchronized (lock) {
      KeyState state = keys.get(b.key);
      state.inFlight--;
      ready = takeReady(state);
      if (state.inFlight == 0 && state.waiting.isEmpty()) {
        keys.remove(b.key); // keys come and go with queues; keep only the busy ones
      }
      if (--unfinished == 0) {
        lock.notifyAll();
      }
    }
    sendAll(ready);
  }

  private static EnqueueResponse await(Caller c) {
    try {
      return c.answer.get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw Status.CANCELLED
          .withDescription("interrupted while the enqueue's batch was under way")
          .withCause(e)
          .asRuntimeException();
    } catch (ExecutionException e) {
      // A fresh exception per caller: each gets its own stack, and may add suppressed ones.
      StatusRuntimeException cause = asStatusException(e.getCause());
      Metadata trailers = cause.getTrailers();
      throw new StatusRuntimeException(cause.getStatus(), trailers);
    }
  }

  private static StatusRuntimeException asStatusException(Throwable t) {
    if (t instanceof StatusRuntimeException e) {
      return e;
    }
    return Status.fromThrowable(t).asRuntimeException(Status.trailersFromThrowable(t));
  }
}
