package dev.jobbroker.client;

import com.google.protobuf.ByteString;
import dev.jobbroker.v1.AckRequest;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.FailRequest;
import dev.jobbroker.v1.FlowRequest;
import dev.jobbroker.v1.HeartbeatRequest;
import dev.jobbroker.v1.HeartbeatResponse;
import dev.jobbroker.v1.LeasedJob;
import dev.jobbroker.v1.ReleaseRequest;
import dev.jobbroker.v1.SubscribeRequest;
import dev.jobbroker.v1.WorkRequest;
import dev.jobbroker.v1.WorkResponse;
import dev.jobbroker.v1.WorkResult;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * Runs a handler for jobs pushed over one {@code Broker.Work} stream: {@code concurrency} jobs at
 * a time, heartbeats while they run (every third of the lease), acks or fails them when the
 * handler returns, reconnects with backoff when the stream breaks, and stops gracefully.
 *
 * <pre>{@code
 * Worker worker = Worker.builder(client)
 *     .queues("emails")
 *     .concurrency(4)
 *     .handler(job -> send(job.payloadText(), job.idempotencyKey()))
 *     .build();
 * worker.start();
 * worker.stopOnSignal(Duration.ofSeconds(30)); // SIGTERM/SIGINT -> stop(grace)
 * worker.awaitTermination();
 * }</pre>
 *
 * <p>Thread-safe. Handlers run on the worker's own threads. The client must outlive the worker.
 */
public final class Worker {
  private static final Logger log = Logger.getLogger(Worker.class.getName());
  private static final Duration RESULT_TIMEOUT = Duration.ofSeconds(30);

  private final JobBrokerClient client;
  private final BrokerGrpc.BrokerStub stub;
  private final List<String> queues;
  private final JobHandler handler;
  private final int concurrency;
  private final int prefetch;
  private final Duration leaseDuration;
  private final String workerId;
  private final Duration reconnectInitial;
  private final Duration reconnectMax;

  private final ExecutorService handlerThreads;
  private final ScheduledExecutorService timers;
  private final Thread supervisor;

  // Jobs received but not started, and the attempts running now (by job id).
  private final LinkedBlockingQueue<Delivery> ready = new LinkedBlockingQueue<>();
  private final Map<String, Running> running = new ConcurrentHashMap<>();
  private final CompletableFuture<Void> firstSubscribe = new CompletableFuture<>();
  private final CompletableFuture<Void> terminated = new CompletableFuture<>();

  // Guards `stopping`, `busy` and `session` changes; handlers and stop() wait on it.
  private final Object lock = new Object();
  private boolean started;
  private boolean stopping;
  private int busy; // handler threads running a job or releasing one
  private volatile Session session;
  private volatile Status refusal;

  private final AtomicLong acked = new AtomicLong();
  private final AtomicLong failed = new AtomicLong();
  private final AtomicLong released = new AtomicLong();
  private final AtomicLong lost = new AtomicLong();
  private final AtomicLong reconnects = new AtomicLong();

  /** Attempts this worker finished, by outcome (for tests and logs). */
  public record Stats(long acked, long failed, long released, long leasesLost, long reconnects) {}

  private Worker(Builder b) {
    this.client = b.client;
    this.stub = b.client.brokerAsync();
    this.queues = List.copyOf(b.queues);
    this.handler = b.handler;
    this.concurrency = b.concurrency;
    this.prefetch = b.prefetch;
    this.leaseDuration = b.leaseDuration;
    this.workerId = b.workerId;
    this.reconnectInitial = b.reconnectInitial;
    this.reconnectMax = b.reconnectMax;
    this.handlerThreads =
        Executors.newFixedThreadPool(concurrency, daemonThreads("jobbroker-handler"));
    this.timers = Executors.newSingleThreadScheduledExecutor(daemonThreads("jobbroker-timer"));
    this.supervisor = new Thread(this::superviseStream, "jobbroker-stream");
    this.supervisor.setDaemon(true);
  }

  public static Builder builder(JobBrokerClient client) {
    return new Builder(client);
  }

  /** Options of a {@link Worker}. */
  public static final class Builder {
    private final JobBrokerClient client;
    private final List<String> queues = new ArrayList<>();
    private JobHandler handler;
    private int concurrency = 1;
    private int prefetch = 0;
    private Duration leaseDuration = Duration.ZERO;
    private String workerId = defaultWorkerId();
    private Duration reconnectInitial = Duration.ofMillis(100);
    private Duration reconnectMax = Duration.ofSeconds(5);

    private Builder(JobBrokerClient client) {
      this.client = Objects.requireNonNull(client);
    }

    /** Queues to take jobs from (at least one). */
    public Builder queues(String... names) {
      queues.addAll(Arrays.asList(names));
      return this;
    }

    /** Runs each job; required. */
    public Builder handler(JobHandler h) {
      handler = h;
      return this;
    }

    /** Jobs run at once (handler threads). Default 1. */
    public Builder concurrency(int n) {
      if (n < 1) {
        throw new IllegalArgumentException("concurrency must be at least 1");
      }
      concurrency = n;
      return this;
    }

    /**
     * Jobs held ready beyond {@code concurrency} so a freed handler need not wait for a push.
     * They hold leases while they wait; a graceful stop gives them back unstarted. Default 0.
     */
    public Builder prefetch(int n) {
      if (n < 0) {
        throw new IllegalArgumentException("prefetch must not be negative");
      }
      prefetch = n;
      return this;
    }

    /** Lease asked for each job; zero (default) = the job's, else the queue's. */
    public Builder leaseDuration(Duration d) {
      leaseDuration = d;
      return this;
    }

    /** Names this worker in attempt histories; default "host-pid". */
    public Builder workerId(String id) {
      workerId = id;
      return this;
    }

    /** Reconnect backoff: doubles from {@code initial} up to {@code max}. Default 100 ms, 5 s. */
    public Builder reconnectBackoff(Duration initial, Duration max) {
      reconnectInitial = initial;
      reconnectMax = max;
      return this;
    }

    public Worker build() {
      if (handler == null) {
        throw new IllegalStateException("a handler is required");
      }
      if (queues.isEmpty()) {
        throw new IllegalStateException("at least one queue is required");
      }
      return new Worker(this);
    }
  }

  /**
   * Connects and starts taking jobs. Throws {@link StatusRuntimeException} with the broker's code
   * when it refuses the subscription (e.g. INVALID_ARGUMENT for a bad queue name). A broker that
   * cannot be reached is not an error: the worker keeps reconnecting with backoff.
   */
  public void start() throws InterruptedException {
    synchronized (lock) {
      if (started) {
        throw new IllegalStateException("already started");
      }
      started = true;
    }
    for (int i = 0; i < concurrency; i++) {
      handlerThreads.execute(this::handlerLoop);
    }
    supervisor.start();
    try {
      firstSubscribe.get();
    } catch (ExecutionException e) {
      stop(Duration.ZERO);
      throw (StatusRuntimeException) e.getCause();
    }
  }

  /**
   * Graceful stop: sends Flow{0} (no new jobs), releases the jobs received but not started, lets
   * running handlers finish for up to {@code grace} (then marks them cancelled and waits a little
   * more), waits for their acks' results and closes the stream. Idempotent; safe from any thread
   * except a handler.
   */
  public void stop(Duration grace) throws InterruptedException {
    boolean owner;
    boolean neverStarted;
    synchronized (lock) {
      owner = !stopping; // the first call does the work; later calls wait for it
      stopping = true;
      neverStarted = !started;
    }
    if (neverStarted) {
      handlerThreads.shutdownNow();
      timers.shutdownNow();
      terminated.complete(null);
      return;
    }
    if (!owner) {
      awaitTermination();
      return;
    }
    Session s = session;
    if (s != null && !s.broken()) {
      try {
        WorkResult r =
            s.call(WorkRequest.newBuilder().setFlow(FlowRequest.newBuilder().setMaxInFlight(0)))
                .get(RESULT_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
        if (r.getCode() != 0) {
          log.warning("drain refused: " + r.getMessage());
        }
      } catch (ExecutionException | TimeoutException e) {
        log.fine("drain not answered: " + e);
      }
    }
    // Jobs that arrive from here on are released as they come (see onJob).
    List<Delivery> unstarted = new ArrayList<>();
    ready.drainTo(unstarted);
    for (Delivery d : unstarted) {
      release(d);
    }
    long deadline = System.nanoTime() + grace.toNanos();
    if (!waitIdle(deadline)) {
      for (Running r : running.values()) {
        r.ctx.cancel("shutdown");
      }
      waitIdle(System.nanoTime() + Duration.ofSeconds(5).toNanos());
    }
    Session last = session;
    if (last != null) {
      last.close();
    }
    supervisor.interrupt();
    handlerThreads.shutdownNow();
    timers.shutdownNow();
    firstSubscribe.complete(null); // a start() still waiting returns
    terminated.complete(null);
  }

  /** Blocks until {@link #stop} has finished. */
  public void awaitTermination() throws InterruptedException {
    try {
      terminated.get();
    } catch (ExecutionException e) {
      throw new IllegalStateException(e);
    }
  }

  /** True once {@link #stop} has finished. */
  public boolean isTerminated() {
    return terminated.isDone();
  }

  /**
   * The broker's refusal of a re-subscription after a reconnect (the worker then stops), or null.
   */
  public Status refusal() {
    return refusal;
  }

  /**
   * Stops gracefully (with {@code grace}) on SIGTERM or SIGINT, so that the process can then exit
   * 0 from main, and also from a JVM shutdown hook (System.exit, or where signals cannot be
   * caught) as a backstop.
   */
  public void stopOnSignal(Duration grace) {
    Runnable stopper =
        () -> {
          try {
            stop(grace);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
          }
        };
    Signals.onTermination(() -> new Thread(stopper, "jobbroker-stop").start());
    Runtime.getRuntime().addShutdownHook(new Thread(stopper, "jobbroker-shutdown"));
  }

  public Stats stats() {
    return new Stats(acked.get(), failed.get(), released.get(), lost.get(), reconnects.get());
  }

  // ---- the stream ----

  private void superviseStream() {
    Duration backoff = reconnectInitial;
    boolean first = true;
    while (!isStopping()) {
      Session s = new Session();
      synchronized (lock) {
        session = s;
      }
      SubscribeRequest.Builder sub =
          SubscribeRequest.newBuilder()
              .addAllQueues(queues)
              .setWorkerId(workerId)
              .setMaxInFlight(concurrency + prefetch);
      if (!leaseDuration.isZero()) {
        sub.setLeaseDuration(JobBrokerClient.toProto(leaseDuration));
      }
      s.open();
      WorkResult result = null;
      Status error = null;
      try {
        result =
            s.call(WorkRequest.newBuilder().setSubscribe(sub))
                .get(RESULT_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
      } catch (ExecutionException e) {
        error = Status.fromThrowable(e.getCause());
      } catch (TimeoutException e) {
        error = Status.DEADLINE_EXCEEDED.withDescription("subscribe not answered");
      } catch (InterruptedException e) {
        s.close();
        return;
      }
      if (result != null && result.getCode() != 0) {
        error = Status.fromCodeValue(result.getCode()).withDescription(result.getMessage());
      }
      if (error != null && !retriable(error.getCode())) {
        s.close();
        refusal = error;
        log.severe("subscription refused: " + error);
        if (first) {
          firstSubscribe.completeExceptionally(error.asRuntimeException());
        } else {
          new Thread(() -> stopQuietly(Duration.ZERO), "jobbroker-stop").start();
        }
        return;
      }
      if (first) {
        first = false;
        firstSubscribe.complete(null); // reachable or not, start() returns
      }
      if (error == null) {
        backoff = reconnectInitial;
        try {
          s.closed.get();
        } catch (InterruptedException e) {
          return;
        } catch (ExecutionException e) {
          // closed never fails
        }
        if (isStopping()) {
          return;
        }
        log.info("work stream ended: " + s.endStatus + "; reconnecting");
      } else {
        s.close();
        log.fine("broker unreachable: " + error);
      }
      try {
        Thread.sleep(backoff.toMillis());
      } catch (InterruptedException e) {
        return;
      }
      // Our backoff, not the channel's (which grows to minutes): try the broker again now.
      client.channel().resetConnectBackoff();
      backoff = backoff.multipliedBy(2);
      if (backoff.compareTo(reconnectMax) > 0) {
        backoff = reconnectMax;
      }
      reconnects.incrementAndGet();
    }
  }

  private static boolean retriable(Status.Code code) {
    switch (code) {
      case UNAVAILABLE:
      case DEADLINE_EXCEEDED:
      case CANCELLED:
      case UNKNOWN:
      case INTERNAL:
      case ABORTED:
      case RESOURCE_EXHAUSTED:
        return true;
      default:
        return false;
    }
  }

  /** One Work stream. Requests are numbered; each gets one WorkResult. */
  private final class Session implements StreamObserver<WorkResponse> {
    private final Map<Long, CompletableFuture<WorkResult>> pending = new ConcurrentHashMap<>();
    private final AtomicLong nextId = new AtomicLong(1);
    final CompletableFuture<Void> closed = new CompletableFuture<>();
    private StreamObserver<WorkRequest> requests;
    private boolean ended; // guarded by this
    volatile Status endStatus;

    synchronized void open() {
      requests = stub.work(this);
    }

    boolean broken() {
      return closed.isDone();
    }

    /** Sends a request; the future completes with its result, or fails if the stream ends. */
    CompletableFuture<WorkResult> call(WorkRequest.Builder request) {
      long id = nextId.getAndIncrement();
      CompletableFuture<WorkResult> f = new CompletableFuture<>();
      pending.put(id, f);
      synchronized (this) {
        if (ended) {
          pending.remove(id);
          f.completeExceptionally(
              Status.UNAVAILABLE.withDescription("work stream closed").asRuntimeException());
          return f;
        }
        try {
          requests.onNext(request.setRequestId(id).build());
        } catch (RuntimeException e) {
          pending.remove(id);
          f.completeExceptionally(e);
        }
      }
      return f;
    }

    synchronized void close() {
      if (!ended) {
        ended = true;
        try {
          requests.onCompleted();
        } catch (RuntimeException ignored) {
          // already cancelled
        }
      }
      finish(Status.CANCELLED.withDescription("closed by the worker"));
    }

    private void finish(Status status) {
      synchronized (this) {
        ended = true;
        if (endStatus == null) {
          endStatus = status;
        }
      }
      StatusRuntimeException e = status.asRuntimeException();
      for (Long id : new ArrayList<>(pending.keySet())) {
        CompletableFuture<WorkResult> f = pending.remove(id);
        if (f != null) {
          f.completeExceptionally(e);
        }
      }
      closed.complete(null);
    }

    @Override
    public void onNext(WorkResponse response) {
      switch (response.getResponseCase()) {
        case JOB -> onJob(this, response.getJob());
        case RESULT -> {
          CompletableFuture<WorkResult> f = pending.remove(response.getResult().getRequestId());
          if (f != null) {
            f.complete(response.getResult());
          }
        }
        case LEASE_LOST -> onLeaseLost(response.getLeaseLost().getJobId());
        case CANCEL_REQUESTED -> {
          Running r = running.get(response.getCancelRequested().getJobId());
          if (r != null) {
            r.ctx.cancel("cancelled");
          }
        }
        default -> {}
      }
    }

    @Override
    public void onError(Throwable t) {
      finish(Status.fromThrowable(t));
      dropUnstarted(this);
    }

    @Override
    public void onCompleted() {
      finish(Status.UNAVAILABLE.withDescription("the broker ended the work stream"));
      dropUnstarted(this);
    }
  }

  private record Delivery(Session session, LeasedJob job, long arrivedMillis) {}

  private record Running(Delivery delivery, JobContext ctx) {}

  private void onJob(Session s, LeasedJob job) {
    Delivery d = new Delivery(s, job, System.currentTimeMillis());
    synchronized (lock) {
      if (!stopping) {
        ready.add(d);
        return;
      }
    }
    // Arrived after the drain began: give it back unstarted (off the gRPC thread).
    try {
      timers.execute(() -> release(d));
    } catch (RuntimeException e) {
      log.fine("job " + job.getJobId() + " not released (worker stopped); its lease runs out");
    }
  }

  private void onLeaseLost(String jobId) {
    Running r = running.get(jobId);
    if (r != null) {
      r.ctx.markLeaseLost();
    }
    ready.removeIf(d -> d.job().getJobId().equals(jobId));
  }

  /** The stream broke: unstarted jobs go back through the unary API (best effort). */
  private void dropUnstarted(Session s) {
    List<Delivery> mine = new ArrayList<>();
    for (Delivery d : ready) {
      if (d.session() == s && ready.remove(d)) {
        mine.add(d);
      }
    }
    if (!mine.isEmpty()) {
      try {
        timers.execute(() -> mine.forEach(this::release));
      } catch (RuntimeException ignored) {
        // shutting down: the leases run out
      }
    }
  }

  // ---- handlers ----

  private void handlerLoop() {
    while (!terminated.isDone()) {
      Delivery d;
      try {
        d = ready.poll(100, TimeUnit.MILLISECONDS);
      } catch (InterruptedException e) {
        return;
      }
      if (d == null) {
        continue;
      }
      boolean start;
      synchronized (lock) {
        busy++;
        start = !stopping;
      }
      try {
        if (start) {
          runAttempt(d);
        } else {
          release(d);
        }
      } finally {
        synchronized (lock) {
          busy--;
          lock.notifyAll();
        }
      }
    }
  }

  private void runAttempt(Delivery d) {
    LeasedJob job = d.job();
    JobContext ctx = new JobContext(job, this::saveCheckpoint);
    Running r = new Running(d, ctx);
    running.put(job.getJobId(), r);
    long leaseMillis =
        job.getLeaseDeadline().getSeconds() * 1000
            + job.getLeaseDeadline().getNanos() / 1_000_000
            - d.arrivedMillis();
    if (leaseMillis <= 0) {
      leaseMillis = 1000;
    }
    long every = Math.max(50, leaseMillis / 3);
    ScheduledFuture<?> beats =
        timers.scheduleAtFixedRate(() -> heartbeat(r), every, every, TimeUnit.MILLISECONDS);
    WorkRequest.Builder answer = WorkRequest.newBuilder();
    try {
      handler.handle(ctx);
      answer.setAck(
          AckRequest.newBuilder()
              .setJobId(job.getJobId())
              .setLeaseId(job.getLeaseId())
              .setResult(ByteString.copyFrom(ctx.result())));
    } catch (PermanentError e) {
      answer.setFail(failOf(job, e).setPermanent(true));
    } catch (RetryAfter e) {
      answer.setFail(failOf(job, e).setRetryAfter(JobBrokerClient.toProto(e.delay())));
    } catch (Exception | Error e) {
      answer.setFail(failOf(job, e));
    } finally {
      beats.cancel(false);
    }
    try {
      if (ctx.leaseLost()) {
        lost.incrementAndGet();
        log.info("job " + job.getJobId() + ": lease lost, not answering");
        return;
      }
      WorkResult result = answer(d.session(), answer);
      if (result.getCode() != 0) {
        log.warning(
            "job " + job.getJobId() + ": " + answer.getRequestCase() + " refused: "
                + result.getMessage());
      } else if (answer.hasAck()) {
        acked.incrementAndGet();
      } else {
        failed.incrementAndGet();
      }
    } catch (RuntimeException e) {
      log.warning("job " + job.getJobId() + ": " + answer.getRequestCase() + " failed: " + e);
    } finally {
      running.remove(job.getJobId());
    }
  }

  private static FailRequest.Builder failOf(LeasedJob job, Throwable e) {
    String text = e.getMessage() == null ? e.toString() : e.getMessage();
    return FailRequest.newBuilder()
        .setJobId(job.getJobId())
        .setLeaseId(job.getLeaseId())
        .setError(text);
  }

  private void heartbeat(Running r) {
    LeasedJob job = r.delivery().job();
    HeartbeatRequest.Builder hb =
        HeartbeatRequest.newBuilder().setJobId(job.getJobId()).setLeaseId(job.getLeaseId());
    Session s = r.delivery().session();
    if (!s.broken()) {
      s.call(WorkRequest.newBuilder().setHeartbeat(hb))
          .whenComplete(
              (result, error) -> {
                if (result != null) {
                  onHeartbeat(r, result.getCode(), result.getCancelRequested());
                }
              });
      return;
    }
    try {
      HeartbeatResponse resp =
          client.broker().withDeadlineAfter(10, TimeUnit.SECONDS).heartbeat(hb.build());
      onHeartbeat(r, 0, resp.getCancelRequested());
    } catch (StatusRuntimeException e) {
      onHeartbeat(r, e.getStatus().getCode().value(), false);
    }
  }

  private void onHeartbeat(Running r, int code, boolean cancelRequested) {
    if (code == Status.Code.FAILED_PRECONDITION.value() || code == Status.Code.NOT_FOUND.value()) {
      r.ctx.markLeaseLost();
    } else if (cancelRequested) {
      r.ctx.cancel("cancelled");
    }
  }

  private void saveCheckpoint(JobContext ctx, byte[] data) throws InterruptedException {
    Running r = running.get(ctx.jobId());
    if (r == null || ctx.leaseLost()) {
      throw new LeaseLostException("job " + ctx.jobId() + ": lease no longer held");
    }
    LeasedJob job = r.delivery().job();
    WorkResult result =
        answer(
            r.delivery().session(),
            WorkRequest.newBuilder()
                .setHeartbeat(
                    HeartbeatRequest.newBuilder()
                        .setJobId(job.getJobId())
                        .setLeaseId(job.getLeaseId())
                        .setCheckpoint(ByteString.copyFrom(data))));
    if (Thread.interrupted()) {
      throw new InterruptedException();
    }
    if (result.getCode() != 0) {
      ctx.markLeaseLost();
      throw new LeaseLostException(
          "job " + ctx.jobId() + ": checkpoint refused: " + result.getMessage());
    }
    if (result.getCancelRequested()) {
      ctx.cancel("cancelled");
    }
  }

  /**
   * Sends a heartbeat, ack, fail or release on the job's stream and waits for its result; if that
   * stream is gone, uses the unary RPC (the lease outlives the stream).
   */
  private WorkResult answer(Session s, WorkRequest.Builder request) {
    if (!s.broken()) {
      try {
        return s.call(request).get(RESULT_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return WorkResult.newBuilder().setCode(Status.Code.CANCELLED.value()).build();
      } catch (ExecutionException | TimeoutException e) {
        // the stream broke meanwhile: fall through to the unary call
      }
    }
    BrokerGrpc.BrokerBlockingStub unary = client.broker().withDeadlineAfter(10, TimeUnit.SECONDS);
    try {
      switch (request.getRequestCase()) {
        case ACK -> unary.ack(request.getAck());
        case FAIL -> unary.fail(request.getFail());
        case RELEASE -> unary.release(request.getRelease());
        case HEARTBEAT -> {
          HeartbeatResponse r = unary.heartbeat(request.getHeartbeat());
          return WorkResult.newBuilder()
              .setLeaseDeadline(r.getLeaseDeadline())
              .setCancelRequested(r.getCancelRequested())
              .build();
        }
        default -> throw new IllegalArgumentException(request.getRequestCase().toString());
      }
      return WorkResult.getDefaultInstance();
    } catch (StatusRuntimeException e) {
      return WorkResult.newBuilder()
          .setCode(e.getStatus().getCode().value())
          .setMessage(String.valueOf(e.getStatus().getDescription()))
          .build();
    }
  }

  private void release(Delivery d) {
    LeasedJob job = d.job();
    WorkResult r =
        answer(
            d.session(),
            WorkRequest.newBuilder()
                .setRelease(
                    ReleaseRequest.newBuilder()
                        .setJobId(job.getJobId())
                        .setLeaseId(job.getLeaseId())));
    if (r.getCode() == 0) {
      released.incrementAndGet();
    } else {
      log.info("job " + job.getJobId() + ": release refused: " + r.getMessage());
    }
  }

  // ---- helpers ----

  private boolean isStopping() {
    synchronized (lock) {
      return stopping;
    }
  }

  /** Waits until no handler is busy; false if {@code deadlineNanos} passed first. */
  private boolean waitIdle(long deadlineNanos) throws InterruptedException {
    synchronized (lock) {
      while (busy > 0) {
        long left = deadlineNanos - System.nanoTime();
        if (left <= 0) {
          return false;
        }
        TimeUnit.NANOSECONDS.timedWait(lock, left);
      }
      return true;
    }
  }

  private void stopQuietly(Duration grace) {
    try {
      stop(grace);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (RuntimeException e) {
      log.log(Level.WARNING, "stop failed", e);
    }
  }

  private static String defaultWorkerId() {
    // "pid@host" on HotSpot; shown in attempt histories.
    String name = ManagementFactory.getRuntimeMXBean().getName();
    int at = name.indexOf('@');
    return at > 0 ? name.substring(at + 1) + "-" + name.substring(0, at) : name;
  }

  private static java.util.concurrent.ThreadFactory daemonThreads(String prefix) {
    AtomicLong n = new AtomicLong();
    return r -> {
      Thread t = new Thread(r, prefix + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }
}
