package dev.jobbroker.client;

import com.google.protobuf.ByteString;
import com.google.protobuf.Timestamp;
import dev.jobbroker.v1.AckBatchRequest;
import dev.jobbroker.v1.AckRequest;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.FailRequest;
import dev.jobbroker.v1.FlowRequest;
import dev.jobbroker.v1.HeartbeatRequest;
import dev.jobbroker.v1.ItemError;
import dev.jobbroker.v1.LeasedJob;
import dev.jobbroker.v1.ReleaseRequest;
import dev.jobbroker.v1.SubscribeRequest;
import dev.jobbroker.v1.WorkRequest;
import dev.jobbroker.v1.WorkResponse;
import dev.jobbroker.v1.WorkResult;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Runs one handler per queue for jobs pushed over a {@code Broker.Work} stream, as {@code
 * docs/worker-contract.md} defines it for every client library.
 *
 * <pre>{@code
 * Worker worker = Worker.builder(client).concurrency(4).build();
 * worker.handle("emails", job -> send(job.payloadText(), job.idempotencyKey()));
 * worker.handle("reports", job -> job.step("render", () -> render(job.payloadJson())));
 * worker.stopOnSignal();   // SIGTERM/SIGINT -> graceful stop
 * worker.run();            // until stopped
 * }</pre>
 *
 * <p>What it does: at most {@code concurrency} handlers at once, up to {@code prefetch} more jobs
 * held (leased, heartbeated) and started in arrival order; heartbeats every third of each lease;
 * the handler's thread interrupted and {@link JobContext#isCancelled()} true on an operator
 * cancel, a lost lease, the job's time-out or the end of a graceful stop's grace (after an operator
 * cancel, a handler that throws fails the attempt "cancelled" and one that returns normally is
 * acked: the broker completes the cancelled job); acks coalesced (one ack message in flight per
 * stream, the acks that end meanwhile go out together as one {@code ack_batch}); acks, fails and
 * releases not answered when the stream breaks sent again on the next one (or another open one),
 * and those (and step saves) answered UNAVAILABLE (a partition between leaders) sent again after
 * 250 ms; reconnects with backoff (100 ms doubling to 5 s, full jitter), also when a subscription
 * is answered UNAVAILABLE on a stream that stays open. The streams go over the client's channels,
 * whose keepalive pings ({@link ClientOptions.Builder#keepalive(Duration, Duration)}, default
 * 10 s and 5 s) end a stream to a broker that froze or went silent UNAVAILABLE, so the worker
 * reconnects then too.
 *
 * <p>{@code concurrency} is a hard bound. A handler that ignores its cancellation keeps its thread
 * until it returns (Java cannot stop it), and it keeps its slot too: after a lost lease or a
 * time-out the attempt is forgotten at once (no heartbeats, no answer: the broker already ended
 * it), but no other handler starts in its place until it returns. The broker counts the attempt
 * as ended, so it may push another job meanwhile: that one waits, leased and heartbeated, like a
 * prefetched job. A worker whose slots are all held by stuck handlers takes no new work (visible
 * in {@code Admin.ListWorkers} and the dashboard).
 *
 * <p>In a cluster the worker holds one Work stream per leading node (contract §5): the handled
 * queues are grouped by their partition's leader as Admin.GetCluster names it, each group
 * subscribed on its leader's node with the same worker id and a share of {@code concurrency +
 * prefetch} ({@link WorkGroup}); queues whose partition has no leader go to any node, which
 * relays them. A job is answered on the stream that pushed it while that one is open, else on
 * any open one. When a stream ends the worker waits its backoff, asks for the cluster's layout
 * again and groups anew: streams whose group is unchanged keep running, the others are ended and
 * the missing ones opened, so it follows a leader that moved or died. While some queues go to any
 * node, it also asks again after each backoff delay (no stream need end), so that a relayed
 * stream moves to its leader once the layout names one. Without a layout (a broker
 * older than cluster mode, a token without the admin role) it holds one stream, as on one node.
 *
 * <p>Thread-safe. Handlers run on the worker's own threads, reused across jobs (at most {@code
 * concurrency} of them; one idle for a minute ends): a thread whose handler returned starts the
 * next waiting job itself. The client must outlive the worker.
 */
public final class Worker {
  private static final Logger log = LoggerFactory.getLogger(Worker.class);
  /** How long start() waits for the first subscription's answer before it returns anyway. */
  private static final Duration SUBSCRIBE_WAIT = Duration.ofSeconds(30);
  /** How long a stop waits for the broker to answer Flow{0} before releasing jobs anyway. */
  private static final Duration FLOW_WAIT = Duration.ofSeconds(2);
  /** Answers get this long past the grace (contract §6 step 5). */
  private static final Duration ANSWERS_PAST_GRACE = Duration.ofSeconds(1);
  /** A half-closed stream is cancelled after this long (contract §6 step 6). */
  private static final Duration CLOSE_WAIT = Duration.ofSeconds(2);
  /** An ack, fail, release or step save answered UNAVAILABLE is sent again after this (§4). */
  private static final Duration ANSWER_RETRY = Duration.ofMillis(250);
  /** The broker's limit on the acks of one ack_batch. */
  private static final int MAX_ACK_BATCH = 1000;
  /** An idle handler thread ends after this long without a job. */
  private static final Duration RUNNER_KEEP_ALIVE = Duration.ofSeconds(60);

  // Constant after construction.
  private final JobBrokerClient client;
  private final int concurrency;
  private final int prefetch;
  private final Duration leaseDuration;
  private final Duration grace;
  private final String workerId;
  private final Duration reconnectInitial;
  private final Duration reconnectMax;
  private final AtomicLong runnerNames = new AtomicLong();
  private final ScheduledThreadPoolExecutor timers;
  private final Thread supervisor;
  private final CompletableFuture<Void> firstSubscribe = new CompletableFuture<>();
  private final CompletableFuture<Void> terminated = new CompletableFuture<>();
  private final AtomicLong nextRequestId = new AtomicLong(1);
  /** Streams that ended on their own (not by a regrouping or the stop), for the supervisor. */
  private final LinkedBlockingQueue<Session> streamEnds = new LinkedBlockingQueue<>();

  // State below is guarded by lock; stop() waits on it.
  private final Object lock = new Object();
  private final Map<String, JobHandler> handlers = new LinkedHashMap<>();
  private final List<WorkerMiddleware> middleware = new ArrayList<>();
  private boolean started;
  private boolean stopping; // a stop began: no job starts, every new push is released
  private boolean closing; // the stop is closing the streams
  private final List<Session> sessions = new ArrayList<>(); // open streams, one per group
  private Duration backoff; // the wait before the next regrouping; one for all streams
  private final Map<String, Held> held = new LinkedHashMap<>(); // by lease id
  private final ArrayDeque<Held> waiting = new ArrayDeque<>(); // held, not started, in order
  private int slotsInUse; // handlers holding a slot: a lost attempt's too, until it returns
  private int handlersRunning; // threads inside a handler (a lost attempt's too)
  // Handler threads (runners), reused across jobs: a runner whose handler returned starts the
  // next waiting job itself, and parks among the idle ones when there is none. One runner at a
  // time is woken (or made) for the jobs that wait, and it wakes the next if jobs still wait
  // once it took its own: a push of many jobs does not wake a thread for each, yet a job that
  // waits while a slot is free always has a runner on the way to it.
  private final ArrayDeque<Runner> idleRunners = new ArrayDeque<>(); // most recently idle first
  private boolean runnerOnTheWay; // a runner woken (or made) for a job has not taken it yet
  private boolean runnersClosed; // the worker is done: runners end instead of parking
  private final ArrayDeque<Request> toSend = new ArrayDeque<>(); // fails, releases, checkpoints
  private final ArrayDeque<Request> acksWaiting = new ArrayDeque<>();
  private int answersOutstanding; // acks, fails and releases not yet answered
  private Status fatal; // the non-retryable status that ended the run

  private final AtomicLong acked = new AtomicLong();
  private final AtomicLong failed = new AtomicLong();
  private final AtomicLong released = new AtomicLong();
  private final AtomicLong lost = new AtomicLong();
  private final AtomicLong reconnects = new AtomicLong();

  /** Attempts this worker finished, by outcome (for tests and logs). */
  public record Stats(long acked, long failed, long released, long leasesLost, long reconnects) {}

  private Worker(Builder b) {
    this.client = b.client;
    this.handlers.putAll(b.handlers);
    this.middleware.addAll(b.middleware);
    this.concurrency = b.concurrency;
    this.prefetch = b.prefetch;
    this.leaseDuration = b.leaseDuration;
    this.grace = b.grace;
    this.workerId = b.workerId;
    this.reconnectInitial = b.reconnectInitial;
    this.reconnectMax = b.reconnectMax;
    this.backoff = b.reconnectInitial;
    this.timers = new ScheduledThreadPoolExecutor(1, daemonThreads("jobbroker-timer"));
    this.timers.setRemoveOnCancelPolicy(true);
    this.supervisor = new Thread(this::superviseStreams, "jobbroker-stream");
    this.supervisor.setDaemon(true);
  }

  public static Builder builder(JobBrokerClient client) {
    return new Builder(client);
  }

  /** Options of a {@link Worker}. */
  public static final class Builder {
    private final JobBrokerClient client;
    private final Map<String, JobHandler> handlers = new LinkedHashMap<>();
    private final List<WorkerMiddleware> middleware = new ArrayList<>();
    private int concurrency = 1;
    private int prefetch = 0;
    private Duration leaseDuration = Duration.ZERO;
    private Duration grace = Duration.ofSeconds(30);
    private String workerId = defaultWorkerId();
    private Duration reconnectInitial = Duration.ofMillis(100);
    private Duration reconnectMax = Duration.ofSeconds(5);

    private Builder(JobBrokerClient client) {
      this.client = Objects.requireNonNull(client);
    }

    /** Runs the jobs of {@code queue} with {@code handler}; see {@link Worker#handle}. */
    public Builder handle(String queue, JobHandler handler) {
      putHandler(handlers, queue, handler);
      return this;
    }

    /** Wraps every handler call in {@code m}; see {@link Worker#use}. */
    public Builder use(WorkerMiddleware m) {
      middleware.add(Objects.requireNonNull(m, "middleware"));
      return this;
    }

    /** Handlers at once. Default 1. */
    public Builder concurrency(int n) {
      if (n < 1) {
        throw new IllegalArgumentException("concurrency must be at least 1");
      }
      concurrency = n;
      return this;
    }

    /**
     * Jobs held beyond {@code concurrency} so a freed handler need not wait for a push. They hold
     * leases (heartbeated) while they wait; a graceful stop gives them back unstarted. Default 0.
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
      leaseDuration = Objects.requireNonNull(d);
      return this;
    }

    /** How long running handlers may finish after a signal's graceful stop. Default 30 s. */
    public Builder grace(Duration d) {
      grace = Objects.requireNonNull(d);
      return this;
    }

    /** Names this worker in attempt histories and ListWorkers; default "host-pid". */
    public Builder workerId(String id) {
      workerId = Objects.requireNonNull(id);
      return this;
    }

    /** Reconnect backoff: doubles from {@code initial} up to {@code max}. Default 100 ms, 5 s. */
    public Builder reconnectBackoff(Duration initial, Duration max) {
      reconnectInitial = initial;
      reconnectMax = max;
      return this;
    }

    public Worker build() {
      return new Worker(this);
    }
  }

  /**
   * Registers {@code handler} for the jobs of {@code queue}; the worker subscribes to the queues
   * that have one. Before {@link #start} only ({@link IllegalStateException} after);
   * {@link IllegalArgumentException} if the queue already has a handler.
   */
  public Worker handle(String queue, JobHandler handler) {
    synchronized (lock) {
      if (started) {
        throw new IllegalStateException("handlers are registered before start()");
      }
      putHandler(handlers, queue, handler);
    }
    return this;
  }

  /**
   * Wraps every handler call in {@code m} ({@link WorkerMiddleware}): middleware runs in the
   * order it was added, the first outermost. Before {@link #start} only
   * ({@link IllegalStateException} after).
   */
  public Worker use(WorkerMiddleware m) {
    Objects.requireNonNull(m, "middleware");
    synchronized (lock) {
      if (started) {
        throw new IllegalStateException("middleware is added before start()");
      }
      middleware.add(m);
    }
    return this;
  }

  private static void putHandler(Map<String, JobHandler> into, String queue, JobHandler h) {
    Objects.requireNonNull(queue, "queue");
    Objects.requireNonNull(h, "handler");
    if (into.putIfAbsent(queue, h) != null) {
      throw new IllegalArgumentException("queue \"" + queue + "\" already has a handler");
    }
  }

  /**
   * Connects and starts taking jobs; returns once the broker answered the subscription (or could
   * not be reached: the worker then keeps reconnecting). {@link IllegalStateException} if no
   * handler is registered; {@link StatusRuntimeException} with the broker's code when it refuses
   * the subscription (INVALID_ARGUMENT for a bad queue name, UNAUTHENTICATED, ...).
   */
  public void start() throws InterruptedException {
    synchronized (lock) {
      if (started) {
        throw new IllegalStateException("already started");
      }
      if (handlers.isEmpty()) {
        throw new IllegalStateException("no handler registered: call handle(queue, handler)");
      }
      started = true;
    }
    supervisor.start();
    try {
      firstSubscribe.get(SUBSCRIBE_WAIT.toMillis(), TimeUnit.MILLISECONDS);
    } catch (TimeoutException e) {
      // Not answered yet: the stream keeps trying; jobs come when it does.
    } catch (ExecutionException e) {
      awaitTermination();
      throw (StatusRuntimeException) e.getCause();
    }
  }

  /**
   * {@link #start}, then blocks until the worker stopped ({@link #stop}, or a signal after
   * {@link #stopOnSignal}). Throws {@link StatusRuntimeException} when the broker refused the
   * stream with a code that retrying would not fix (contract §5).
   */
  public void run() throws InterruptedException {
    start();
    awaitTermination();
    Status refused = refusal();
    if (refused != null) {
      throw refused.asRuntimeException();
    }
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

  /** The broker's refusal that ended the worker (a non-retryable code), or null. */
  public Status refusal() {
    synchronized (lock) {
      return fatal;
    }
  }

  public Stats stats() {
    return new Stats(acked.get(), failed.get(), released.get(), lost.get(), reconnects.get());
  }

  /** Stops gracefully with the builder's grace on SIGTERM or SIGINT; see {@link #stop}. */
  public void stopOnSignal() {
    stopOnSignal(grace);
  }

  /**
   * Stops gracefully (with {@code grace}) on SIGTERM or SIGINT, so that main can then return 0,
   * and from a JVM shutdown hook (System.exit, or where signals cannot be caught) as a backstop.
   * A second signal does not shorten the stop; SIGKILL does.
   */
  public void stopOnSignal(Duration grace) {
    Runnable stopper = () -> stopQuietly(grace);
    Signals.onTermination(() -> new Thread(stopper, "jobbroker-stop").start());
    Runtime.getRuntime().addShutdownHook(new Thread(stopper, "jobbroker-shutdown"));
  }

  // ---- graceful stop ----

  /**
   * Graceful stop (contract §6): Flow{0} (no new jobs); releases the held jobs not started (and
   * any pushed later); gives running handlers {@code grace} to finish (their acks and fails go out
   * as usual); then cancels the rest, whose jobs are released whatever they end with; waits for
   * every answer up to 1 s past the grace; closes the streams. Steps 1, 2, 5 and 6 are done on
   * every stream of the worker. A stream that ends before they are closed is reopened (regrouped)
   * after the usual backoff, so that the answers still to come reach the broker; what a reopened
   * stream is pushed is released at once. If none can be reopened, the stop still ends within its
   * bounds and the answers not sent are dropped (their leases run out). Idempotent: a later call
   * waits for the first. Not from a handler's thread.
   */
  public void stop(Duration grace) throws InterruptedException {
    boolean owner;
    boolean neverStarted;
    synchronized (lock) {
      owner = !stopping;
      stopping = true;
      neverStarted = !started;
    }
    if (neverStarted) {
      shutDownThreads();
      return;
    }
    if (!owner) {
      awaitTermination();
      return;
    }
    long graceEnd = System.nanoTime() + grace.toNanos();
    long answersEnd = graceEnd + ANSWERS_PAST_GRACE.toNanos();

    // 1. Stop taking, on every stream (a stream subscribed later sends Flow{0} first).
    List<CompletableFuture<WorkResult>> flows = new ArrayList<>();
    synchronized (lock) {
      for (Session s : sessions) {
        if (s.usableLocked()) {
          CompletableFuture<WorkResult> flow = new CompletableFuture<>();
          s.sendLocked(new Request(flowRequest(0), Kind.CONTROL, null, flow::complete));
          flows.add(flow);
        }
      }
    }
    try {
      CompletableFuture.allOf(flows.toArray(CompletableFuture[]::new))
          .get(FLOW_WAIT.toMillis(), TimeUnit.MILLISECONDS);
    } catch (ExecutionException | TimeoutException e) {
      log.debug("Flow{0} not answered: {}", e.toString());
    }
    // 2. Release what has not started.
    synchronized (lock) {
      for (Held h : new ArrayList<>(waiting)) {
        forgetLocked(h);
        answerLocked(h, releaseOf(h.job, Duration.ZERO));
      }
      pumpLocked();
      // 3. Grace.
      waitLocked(() -> handlersRunning == 0, graceEnd);
      // 4. Cancel: the answer of each is a release (see finishAttempt).
      for (Held h : held.values()) {
        h.ctx.cancel(JobContext.Cancellation.SHUTDOWN);
      }
      // 5. Wait for the answers.
      waitLocked(() -> handlersRunning == 0 && answersOutstanding == 0, answersEnd);
      if (handlersRunning > 0 || answersOutstanding > 0) {
        log.warn(
            "stopping with {} handler(s) still running and {} answer(s) not confirmed; their"
                + " leases run out",
            handlersRunning,
            answersOutstanding);
      }
      closing = true; // from now on no stream is opened again
    }
    // 6. Close every stream: half-close, then cancel.
    List<Session> last;
    synchronized (lock) {
      last = List.copyOf(sessions);
      last.forEach(Session::halfCloseLocked);
    }
    supervisor.interrupt();
    long closeEnd = System.nanoTime() + CLOSE_WAIT.toNanos();
    for (Session s : last) {
      try {
        s.closed.get(Math.max(0, closeEnd - System.nanoTime()), TimeUnit.NANOSECONDS);
      } catch (ExecutionException | TimeoutException e) {
        s.cancel("the worker stopped");
      }
    }
    supervisor.join(CLOSE_WAIT.toMillis());
    shutDownThreads();
  }

  private void shutDownThreads() {
    synchronized (lock) {
      runnersClosed = true;
      for (Runner r : idleRunners) {
        LockSupport.unpark(r.thread);
      }
      idleRunners.clear();
    }
    timers.shutdownNow();
    firstSubscribe.complete(null); // a start() still waiting returns
    terminated.complete(null);
  }

  private void stopQuietly(Duration grace) {
    try {
      stop(grace);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (RuntimeException e) {
      log.warn("stop failed", e);
    }
  }

  private interface Condition {
    boolean holds();
  }

  /** Waits on lock until {@code done} holds or {@code deadlineNanos}; true if it holds. */
  private boolean waitLocked(Condition done, long deadlineNanos) throws InterruptedException {
    while (!done.holds()) {
      long left = deadlineNanos - System.nanoTime();
      if (left <= 0) {
        return false;
      }
      TimeUnit.NANOSECONDS.timedWait(lock, left);
    }
    return true;
  }

  // ---- streams ----

  /**
   * Opens one stream per group of queues (contract §5), and regroups after a backoff each time
   * one ends, until the stop closes the streams (its step 6). A stream that ends during the stop's
   * earlier steps is reopened as usual, so that the answers of the handlers finishing in the grace
   * reach the broker (contract §6); the reopened stream sends Flow{0} once subscribed and releases
   * what it is pushed. While a group goes to any node in a cluster ({@link
   * WorkGroup#refreshesTable}), the table is also fetched again after each backoff delay though
   * no stream ended, and the worker regroups: a relayed stream moves to its queues' leader once
   * the table names it.
   */
  private void superviseStreams() {
    List<String> queues = List.copyOf(handlers.keySet()); // fixed since start()
    while (true) {
      // Outside the lock: it may ask the cluster where the queues' leaders are.
      RoutingTable table = client.routingTable();
      List<WorkGroup> groups = WorkGroup.of(table, queues, concurrency + prefetch);
      Map<WorkGroup, BrokerGrpc.BrokerStub> stubs = new HashMap<>();
      groups.forEach(g -> stubs.put(g, client.workStub(g.address())));
      synchronized (lock) {
        if (closing) {
          return;
        }
        regroupLocked(stubs, groups);
      }
      List<Session> ended = new ArrayList<>();
      try {
        if (WorkGroup.refreshesTable(table, groups)) {
          Session s = streamEnds.poll(jittered(nextBackoff()), TimeUnit.MILLISECONDS);
          if (s == null) {
            // No stream ended: ask where the leaderless queues' leaders are now, and regroup.
            log.debug("work streams to any node: fetching the cluster's layout again");
            client.routingTableStale();
            continue;
          }
          ended.add(s); // a stream ended meanwhile: as below
        } else {
          ended.add(streamEnds.take());
        }
        if (endRefused(ended)) {
          return;
        }
        // Full jitter: workers cut off together do not come back together.
        Thread.sleep(jittered(nextBackoff()));
      } catch (InterruptedException e) {
        return; // the stop is closing the streams (step 6)
      }
      // Those that ended during the wait are regrouped by the same fetch of the table.
      ended.clear();
      streamEnds.drainTo(ended);
      if (endRefused(ended)) {
        return;
      }
      // Our backoff, not the channel's (which grows to minutes): try the brokers again now, at
      // the queues' leaders as the cluster names them now.
      client.streamEnded();
      reconnects.incrementAndGet();
    }
  }

  /** The backoff to wait now; the next one is twice as long, up to the maximum. */
  private Duration nextBackoff() {
    synchronized (lock) {
      Duration wait = backoff;
      backoff = backoff.multipliedBy(2);
      if (backoff.compareTo(reconnectMax) > 0) {
        backoff = reconnectMax;
      }
      return wait;
    }
  }

  /** Full jitter: a random wait in [0, {@code wait}], in milliseconds. */
  private static long jittered(Duration wait) {
    return ThreadLocalRandom.current().nextLong(wait.toMillis() + 1);
  }

  /**
   * The streams that keep their group keep running; the others are ended (their jobs stay held,
   * answered on another stream: the leases stay valid); the missing groups are opened.
   */
  private void regroupLocked(Map<WorkGroup, BrokerGrpc.BrokerStub> stubs, List<WorkGroup> groups) {
    Set<WorkGroup> kept = new HashSet<>();
    for (Session s : new ArrayList<>(sessions)) {
      if (groups.contains(s.group) && kept.add(s.group)) {
        continue;
      }
      log.info("work stream to {} ends: its group changed", describe(s.group));
      sessions.remove(s);
      s.retired = true;
      s.halfCloseLocked();
      later(CLOSE_WAIT, () -> s.cancel("regrouped"));
    }
    for (WorkGroup g : groups) {
      if (kept.contains(g)) {
        continue;
      }
      Session s = new Session(g);
      sessions.add(s);
      if (groups.size() > 1 || !g.address().equals(WorkGroup.ANY_NODE)) {
        log.info("opening a work stream to {}", describe(g));
      }
      stubs.get(g).work(s);
      s.sendLocked(
          new Request(subscribeRequest(g), Kind.CONTROL, null, r -> onSubscribeAnswered(s, r)));
    }
  }

  private static String describe(WorkGroup g) {
    String where = g.address().equals(WorkGroup.ANY_NODE) ? "any node" : g.address();
    return where + " for " + g.queues() + " (max_in_flight " + g.maxInFlight() + ")";
  }

  private void onSubscribeAnswered(Session s, WorkResult r) {
    if (r.getCode() == 0) {
      synchronized (lock) {
        backoff = reconnectInitial;
        onSubscribedLocked(s);
      }
      firstSubscribe.complete(null);
    } else if (r != STREAM_ENDED) {
      // Refused on a stream that stays open (contract §5): a stream that ended with that code.
      // UNAVAILABLE (a partition without a leader yet) regroups after the backoff, anything else
      // ends the run; the helper ends this stream itself either way.
      synchronized (lock) {
        s.refusal = Status.fromCodeValue(r.getCode()).withDescription(r.getMessage());
      }
      s.cancel("subscription refused");
    }
    // STREAM_ENDED: the stream's own end tells the supervisor.
  }

  /**
   * Whether one of {@code ended} ended with a code a reconnect does not cure (contract §5): the
   * run ends with it, whichever stream it came from.
   */
  private boolean endRefused(List<Session> ended) {
    for (Session s : ended) {
      Status status = s.endStatus;
      if (!retriable(status.getCode())) {
        log.error("work stream refused: {}", status);
        synchronized (lock) {
          fatal = status;
        }
        firstSubscribe.completeExceptionally(status.asRuntimeException());
        new Thread(() -> stopQuietly(Duration.ZERO), "jobbroker-stop").start();
        return true;
      }
      log.info("work stream to {} ended: {}; regrouping", describe(s.group), status);
    }
    // Not reachable now: start() returns and the worker keeps trying.
    firstSubscribe.complete(null);
    return false;
  }

  private WorkRequest.Builder subscribeRequest(WorkGroup group) {
    SubscribeRequest.Builder sub =
        SubscribeRequest.newBuilder()
            .addAllQueues(group.queues())
            .setWorkerId(workerId)
            .setMaxInFlight(group.maxInFlight())
            .setBatchPushes(true);
    if (!leaseDuration.isZero()) {
      sub.setLeaseDuration(JobBrokerClient.toProto(leaseDuration));
    }
    return WorkRequest.newBuilder().setSubscribe(sub);
  }

  private static WorkRequest.Builder flowRequest(int maxInFlight) {
    return WorkRequest.newBuilder().setFlow(FlowRequest.newBuilder().setMaxInFlight(maxInFlight));
  }

  /** A new stream is subscribed: what waited for one goes out on it. */
  private void onSubscribedLocked(Session s) {
    if (s.ended) {
      return;
    }
    s.subscribed = true;
    if (stopping) {
      s.sendLocked(new Request(flowRequest(0), Kind.CONTROL, null, r -> {}));
    }
    for (Held h : held.values()) {
      if (h.progressWaiting != null && !h.progressInFlight) {
        sendProgressLocked(h);
      }
    }
    pumpLocked();
  }

  /** Codes of a stream's end that a reconnect may cure (contract §5). */
  private static boolean retriable(Status.Code code) {
    switch (code) {
      case OK:
      case UNAVAILABLE:
      case UNKNOWN:
      case INTERNAL:
      case DEADLINE_EXCEEDED:
      case CANCELLED:
      case ABORTED:
      case RESOURCE_EXHAUSTED:
        return true;
      default:
        return false;
    }
  }

  private enum Kind {
    /** Subscribe, flow, heartbeat, progress: answered on this stream or dropped with it. */
    CONTROL,
    /** Fail, release, a step's checkpoint: sent again on the next stream until answered. */
    REPLAYED,
    /** One ack message (ack or ack_batch) carrying the acks in {@code acks}. */
    ACKS
  }

  /** One WorkRequest and what to do with its answer. */
  private static final class Request {
    final WorkRequest.Builder body;
    final Kind kind;
    final Held held; // the attempt it is about, or null
    final Consumer<WorkResult> onResult;
    List<Request> acks = List.of();

    Request(WorkRequest.Builder body, Kind kind, Held held, Consumer<WorkResult> onResult) {
      this.body = body;
      this.kind = kind;
      this.held = held;
      this.onResult = onResult;
    }
  }

  /** The answer a request gets when its stream ended first (compared by identity). */
  private static final WorkResult STREAM_ENDED =
      WorkResult.newBuilder()
          .setCode(Status.Code.UNAVAILABLE.value())
          .setMessage("the work stream ended")
          .build();

  /** One Work stream, of one group: its requests waiting for answers, by request id. */
  private final class Session implements ClientResponseObserver<WorkRequest, WorkResponse> {
    final WorkGroup group;
    private ClientCallStreamObserver<WorkRequest> requests;
    // Guarded by lock.
    private final Map<Long, Request> pending = new HashMap<>();
    boolean subscribed;
    boolean ended;
    private boolean halfClosed;
    boolean retired; // ended by a regrouping: its end is no news for the supervisor
    boolean ackMessageInFlight; // acks are coalesced per stream
    Status refusal; // the subscription's error, if it was refused on the open stream
    /** The status the stream ended with (its subscription's refusal first); set by its end. */
    volatile Status endStatus;
    /** Completes with the status the stream ended with. */
    final CompletableFuture<Status> closed = new CompletableFuture<>();

    Session(WorkGroup group) {
      this.group = group;
    }

    @Override
    public void beforeStart(ClientCallStreamObserver<WorkRequest> requestStream) {
      requests = requestStream;
    }

    /** Sends {@code r}; if the stream is over, does what its end does to it. */
    void sendLocked(Request r) {
      if (ended || halfClosed) {
        onStreamEndLocked(r);
        return;
      }
      long id = nextRequestId.getAndIncrement();
      pending.put(id, r);
      try {
        requests.onNext(r.body.setRequestId(id).build());
      } catch (RuntimeException e) {
        // The call is already over; its onError follows and handles what is pending.
        log.debug("send on a finished stream: {}", e.toString());
      }
    }

    /** Subscribed and still taking requests. */
    boolean usableLocked() {
      return subscribed && !ended && !halfClosed;
    }

    void halfCloseLocked() {
      if (!ended && !halfClosed) {
        halfClosed = true;
        try {
          requests.onCompleted();
        } catch (RuntimeException e) {
          log.debug("half-close of a finished stream: {}", e.toString());
        }
      }
    }

    void cancel(String why) {
      try {
        requests.cancel(why, null);
      } catch (RuntimeException e) {
        log.debug("cancel of a finished stream: {}", e.toString());
      }
    }

    @Override
    public void onNext(WorkResponse response) {
      switch (response.getResponseCase()) {
        case JOB -> onJobs(this, List.of(response.getJob()));
        case JOB_BATCH -> onJobs(this, response.getJobBatch().getJobsList());
        case RESULT -> {
          Request r;
          synchronized (lock) {
            r = pending.remove(response.getResult().getRequestId());
          }
          if (r != null) {
            r.onResult.accept(response.getResult());
          }
        }
        case LEASE_LOST -> {
          boolean timedOut =
              response.getLeaseLost().getOutcome()
                  == dev.jobbroker.v1.AttemptOutcome.ATTEMPT_OUTCOME_TIMED_OUT;
          onLeaseLost(
              response.getLeaseLost().getJobId(),
              timedOut ? JobContext.Cancellation.TIMED_OUT : JobContext.Cancellation.LEASE_LOST);
        }
        case CANCEL_REQUESTED -> onCancelRequested(response.getCancelRequested().getJobId());
        default -> {}
      }
    }

    @Override
    public void onError(Throwable t) {
      end(Status.fromThrowable(t));
    }

    @Override
    public void onCompleted() {
      end(Status.OK);
    }

    private void end(Status status) {
      List<Request> left;
      synchronized (lock) {
        if (ended) {
          return;
        }
        ended = true;
        sessions.remove(this);
        // In the order they were sent, so that replayed answers keep it.
        left = new ArrayList<>();
        pending.entrySet().stream()
            .sorted(Map.Entry.comparingByKey())
            .forEach(e -> left.add(e.getValue()));
        pending.clear();
        for (int i = left.size() - 1; i >= 0; i--) {
          Request r = left.get(i);
          if (r.kind != Kind.CONTROL) {
            onStreamEndLocked(r);
          }
        }
        endStatus = refusal != null ? refusal : status;
        if (!retired && !closing) {
          streamEnds.add(this);
        }
        pumpLocked(); // what it left goes out on another open stream, if there is one
      }
      for (Request r : left) {
        if (r.kind == Kind.CONTROL) {
          r.onResult.accept(STREAM_ENDED);
        }
      }
      closed.complete(status);
    }
  }

  /**
   * A request of a stream that ended unanswered: answers and checkpoints wait for the next stream
   * (front of the line, called newest first so the order holds), the rest learn it ended.
   */
  private void onStreamEndLocked(Request r) {
    switch (r.kind) {
      case REPLAYED -> {
        // A step's save of an attempt that was lost meanwhile is not sent again.
        if (!r.body.hasHeartbeat() || held.get(r.held.job.getLeaseId()) == r.held) {
          toSend.addFirst(r);
        }
      }
      case ACKS -> {
        for (int i = r.acks.size() - 1; i >= 0; i--) {
          acksWaiting.addFirst(r.acks.get(i));
        }
      }
      case CONTROL -> r.onResult.accept(STREAM_ENDED);
    }
  }

  /**
   * The stream {@code h}'s answers go on: the one that pushed it while it is open, else any open
   * one (a node routes a job's answer to its leader by job id); null if none is subscribed.
   */
  private Session streamForLocked(Held h) {
    if (h != null && h.pushedBy != null && h.pushedBy.usableLocked()) {
      return h.pushedBy;
    }
    for (Session s : sessions) {
      if (s.usableLocked()) {
        return s;
      }
    }
    return null;
  }

  /**
   * Sends what waits, each on its stream if one is subscribed: one ack message at a time per
   * stream.
   */
  private void pumpLocked() {
    if (streamForLocked(null) == null) {
      return; // it waits for the next stream
    }
    while (!toSend.isEmpty()) {
      Request r = toSend.poll();
      streamForLocked(r.held).sendLocked(r);
    }
    if (acksWaiting.isEmpty() || !ackMessageMayGoLocked()) {
      return;
    }
    // In arrival order; those of a stream with an ack message in flight wait for its answer.
    Map<Session, List<Request>> batches = new LinkedHashMap<>();
    for (var it = acksWaiting.iterator(); it.hasNext(); ) {
      Request a = it.next();
      Session s = streamForLocked(a.held);
      if (s.ackMessageInFlight) {
        continue;
      }
      List<Request> batch = batches.computeIfAbsent(s, k -> new ArrayList<>());
      if (batch.size() < MAX_ACK_BATCH) {
        batch.add(a);
        it.remove();
      }
    }
    batches.forEach(this::sendAcksLocked);
  }

  /**
   * Whether some subscribed stream has no ack message in flight: else no waiting ack can go now,
   * and pumpLocked need not look at each (it runs at every job's end).
   */
  private boolean ackMessageMayGoLocked() {
    for (Session s : sessions) {
      if (s.usableLocked() && !s.ackMessageInFlight) {
        return true;
      }
    }
    return false;
  }

  /** One ack message (an ack, or an ack_batch) of {@code batch} on {@code s}. */
  private void sendAcksLocked(Session s, List<Request> batch) {
    WorkRequest.Builder body;
    if (batch.size() == 1) {
      body = batch.get(0).body;
    } else {
      AckBatchRequest.Builder acks = AckBatchRequest.newBuilder();
      for (Request a : batch) {
        acks.addAcks(a.body.getAck());
      }
      body = WorkRequest.newBuilder().setAckBatch(acks);
    }
    Request message = new Request(body, Kind.ACKS, null, r -> onAckMessageAnswered(s, batch, r));
    message.acks = batch;
    s.ackMessageInFlight = true;
    s.sendLocked(message);
  }

  /** Each item's error is that ack's answer; the stream's next ack message may go. */
  private void onAckMessageAnswered(Session s, List<Request> batch, WorkResult result) {
    Map<Integer, ItemError> itemErrors = new HashMap<>();
    for (ItemError e : result.getItemErrorsList()) {
      itemErrors.put(e.getIndex(), e);
    }
    int settled = 0;
    for (int i = 0; i < batch.size(); i++) {
      ItemError e = itemErrors.get(i);
      WorkResult item =
          e == null
              ? result
              : WorkResult.newBuilder().setCode(e.getCode()).setMessage(e.getMessage()).build();
      Request a = batch.get(i);
      if (settle(a.held, a.body, item)) {
        settled++;
      }
    }
    synchronized (lock) {
      answersOutstanding -= settled; // one lock for the whole message, not one per ack
      s.ackMessageInFlight = false;
      pumpLocked();
      lock.notifyAll();
    }
  }

  // ---- jobs ----

  /** One attempt this worker holds: waiting for a slot, or running. */
  private final class Held implements JobContext.Attempt {
    final LeasedJob job;
    final JobContext ctx;
    final JobHandler handler;
    final Session pushedBy; // its answers go on this stream while it is open
    ScheduledFuture<?> heartbeats;
    ScheduledFuture<?> timeout;
    // Guarded by lock.
    boolean holdsSlot;
    boolean started; // taken from waiting by a runner
    boolean progressInFlight;
    byte[] progressWaiting;

    Held(LeasedJob job, JobHandler handler, Session pushedBy) {
      this.job = job;
      this.handler = handler;
      this.pushedBy = pushedBy;
      this.ctx = new JobContext(job, this);
    }

    @Override
    public void saveCheckpoint(byte[] checkpoint) throws InterruptedException {
      saveCheckpointOf(this, checkpoint);
    }

    @Override
    public void sendProgress(byte[] progress) {
      synchronized (lock) {
        if (held.get(job.getLeaseId()) != this) {
          return; // answered or lost: nothing more goes out for it
        }
        progressWaiting = progress; // only the newest value matters
        if (!progressInFlight) {
          sendProgressLocked(this);
        }
      }
    }
  }

  private void onJobs(Session from, List<LeasedJob> jobs) {
    long arrived = System.currentTimeMillis();
    synchronized (lock) {
      for (LeasedJob job : jobs) {
        Held h = new Held(job, handlers.get(job.getQueue()), from);
        if (stopping) {
          // Pushed after the stop began: back at once, unstarted.
          answersOutstanding++;
          toSend.add(replayed(h, releaseOf(job, Duration.ZERO)));
          continue;
        }
        held.put(job.getLeaseId(), h);
        waiting.add(h);
        long leaseMillis = millis(job.getLeaseDeadline()) - arrived;
        long every = Math.max(50, (leaseMillis > 0 ? leaseMillis : 1000) / 3);
        h.heartbeats =
            timers.scheduleAtFixedRate(() -> heartbeat(h), every, every, TimeUnit.MILLISECONDS);
        if (job.hasTimeoutAt()) {
          // The broker ends the attempt TIMED_OUT at this moment; the handler hears it now rather
          // than when the broker's lease_lost arrives.
          h.timeout =
              timers.schedule(
                  () -> onLost(h, JobContext.Cancellation.TIMED_OUT),
                  Math.max(0, millis(job.getTimeoutAt()) - System.currentTimeMillis()),
                  TimeUnit.MILLISECONDS);
        }
      }
      pumpLocked();
      dispatchLocked();
    }
  }

  /** Whether a waiting job may start now: a slot is free (concurrency is a hard bound). */
  private boolean canStartLocked() {
    return !stopping && slotsInUse < concurrency && !waiting.isEmpty();
  }

  /** Takes the next waiting job (canStartLocked() held): it holds a slot from now on. */
  private Held takeLocked() {
    Held h = waiting.poll();
    h.started = true;
    h.holdsSlot = true;
    slotsInUse++;
    handlersRunning++;
    return h;
  }

  /**
   * Sends a runner to the first waiting job, if one may start and no runner is on the way
   * already: an idle one, the most recently parked (else a new thread). The runners busy with
   * handlers take the other waiting jobs as they return, and the runner on the way sends the
   * next one if jobs still wait once it started.
   */
  private void dispatchLocked() {
    if (runnerOnTheWay || !canStartLocked()) {
      return;
    }
    Held h = takeLocked();
    runnerOnTheWay = true;
    Runner r = idleRunners.pollFirst();
    if (r != null) {
      r.next = h;
      LockSupport.unpark(r.thread);
      return;
    }
    r = new Runner(h);
    r.thread.start();
  }

  /** A handler thread: runs the job it was given, then the waiting ones, then parks. */
  private final class Runner implements Runnable {
    final Thread thread;
    Held next; // guarded by lock: the job it was sent to, set before it is unparked

    Runner(Held first) {
      next = first;
      thread = new Thread(this, "jobbroker-handler-" + runnerNames.incrementAndGet());
      thread.setDaemon(true);
    }

    @Override
    public void run() {
      Held h;
      synchronized (lock) {
        h = next;
        next = null;
        runnerOnTheWay = false;
        dispatchLocked(); // jobs still wait: the next runner is on its way
      }
      while (h != null) {
        h = runHandler(h); // the next job this runner takes, or null
        if (h == null) {
          h = idle();
        }
      }
    }

    /** Parks until sent to a job (which it returns), or returns null to end the thread. */
    private Held idle() {
      long deadline = System.nanoTime() + RUNNER_KEEP_ALIVE.toNanos();
      synchronized (lock) {
        if (runnersClosed) {
          return null;
        }
        idleRunners.addFirst(this);
      }
      while (true) {
        long left = deadline - System.nanoTime();
        if (left > 0) {
          LockSupport.parkNanos(Worker.this, left);
        }
        Thread.interrupted(); // an interrupt meant for a handler that returned
        synchronized (lock) {
          if (next != null) {
            Held h = next;
            next = null;
            runnerOnTheWay = false;
            dispatchLocked();
            return h;
          }
          if (runnersClosed || System.nanoTime() - deadline >= 0) {
            idleRunners.remove(this);
            return null;
          }
        }
      }
    }
  }

  /** Runs the attempt of {@code h}; returns the waiting job this thread starts next, or null. */
  private Held runHandler(Held h) {
    Object value = null;
    Throwable error = null;
    h.ctx.enterHandler();
    try {
      if (h.handler == null) {
        throw new IllegalStateException("no handler for queue " + h.job.getQueue());
      }
      value = callThrough(0, h.handler, h.ctx);
    } catch (Throwable t) { // an exception or Error is the attempt's failure, never the worker's
      error = t;
    } finally {
      h.ctx.leaveHandler();
    }
    return finishAttempt(h, value, error);
  }

  /**
   * Runs middleware {@code i} and, through its {@code next}, the rest of the chain and the
   * handler. The list no longer changes: use() refuses after start(), whose lock publishes it.
   */
  private Object callThrough(int i, JobHandler handler, JobContext job) throws Exception {
    if (i == middleware.size()) {
      return handler.handle(job);
    }
    return middleware.get(i).handle(job, j -> callThrough(i + 1, handler, j));
  }

  /**
   * The handler returned or threw: the answer its end means (contract §1). Returns the waiting
   * job the calling thread starts next, if one may start, else null.
   */
  private Held finishAttempt(Held h, Object value, Throwable error) {
    WorkRequest.Builder answer = null;
    JobContext.Cancellation why = h.ctx.cancellation();
    if (why == JobContext.Cancellation.SHUTDOWN) {
      answer = releaseOf(h.job, Duration.ZERO);
    } else if (why == JobContext.Cancellation.OPERATOR && error != null) {
      // Ended by the cancel (or failing after it): the broker cancels the job.
      answer = failOf(h.job, "cancelled");
    } else if (error == null) {
      // Also after an operator cancel: the handler returned normally, the work was done, and the
      // broker completes a cancelled job on ack.
      try {
        answer = ackOf(h.job, encodeResult(value, h.ctx));
      } catch (IllegalArgumentException e) {
        answer = failOf(h.job, "the result cannot be encoded: " + e.getMessage());
      }
    } else if (error instanceof Snooze s) {
      answer = releaseOf(h.job, s.delay());
    } else if (error instanceof PermanentError) {
      answer = failOf(h.job, textOf(error));
      answer.getFailBuilder().setPermanent(true);
    } else if (error instanceof RetryAfter r) {
      answer = failOf(h.job, textOf(error));
      answer.getFailBuilder().setRetryAfter(JobBrokerClient.toProto(r.delay()));
    } else {
      answer = failOf(h.job, textOf(error));
    }
    synchronized (lock) {
      handlersRunning--;
      freeSlotLocked(h); // only now, also for a lost attempt: concurrency is a hard bound
      // A lost lease (or time-out) removed it already: the broker ended the attempt.
      if (held.get(h.job.getLeaseId()) == h) {
        forgetLocked(h);
        answerLocked(h, answer);
        pumpLocked();
      }
      Held next = canStartLocked() && !runnersClosed ? takeLocked() : null;
      dispatchLocked();
      lock.notifyAll();
      return next;
    }
  }

  private static byte[] encodeResult(Object value, JobContext ctx) {
    if (value == null) {
      return ctx.result();
    }
    if (value instanceof byte[] b) {
      return b;
    }
    if (value instanceof String s) {
      return s.getBytes(StandardCharsets.UTF_8);
    }
    return Json.encode(value);
  }

  private static String textOf(Throwable e) {
    return e.getMessage() == null ? e.toString() : e.getMessage();
  }

  private void freeSlotLocked(Held h) {
    if (h.holdsSlot) {
      h.holdsSlot = false;
      slotsInUse--;
    }
  }

  /** Stops heartbeating {@code h} and drops it from what the worker holds. */
  private void forgetLocked(Held h) {
    held.remove(h.job.getLeaseId(), h);
    if (!h.started) {
      waiting.remove(h);
    }
    if (h.heartbeats != null) {
      h.heartbeats.cancel(false);
    }
    if (h.timeout != null) {
      h.timeout.cancel(false);
    }
  }

  /** Queues an ack, fail or release of {@code h}: sent when a stream can take it. */
  private void answerLocked(Held h, WorkRequest.Builder answer) {
    answersOutstanding++;
    if (answer.hasAck()) {
      acksWaiting.add(new Request(answer, Kind.ACKS, h, r -> onAnswered(h, answer, r)));
    } else {
      toSend.add(replayed(h, answer));
    }
  }

  private Request replayed(Held h, WorkRequest.Builder answer) {
    return new Request(answer, Kind.REPLAYED, h, r -> onAnswered(h, answer, r));
  }

  private void onAnswered(Held h, WorkRequest.Builder answer, WorkResult r) {
    if (settle(h, answer, r)) {
      synchronized (lock) {
        answersOutstanding--;
        lock.notifyAll();
      }
    }
  }

  /**
   * What the answer {@code r} to an ack, fail or release of {@code h} means; true if it is final
   * (the caller then counts it no longer outstanding, under the lock), false if it goes out again.
   */
  private boolean settle(Held h, WorkRequest.Builder answer, WorkResult r) {
    if (isRetryLater(r)) {
      String what = answer.getRequestCase().name().toLowerCase();
      // Not final (contract §4): the partition is between leaders. Sent again, same lease id,
      // after ANSWER_RETRY, on this stream or, if it ended meanwhile, on the next one. Still
      // outstanding for a graceful stop meanwhile.
      log.info(
          "job {}: {} answered UNAVAILABLE ({}); sending it again in {} ms",
          h.job.getJobId(),
          what,
          r.getMessage(),
          ANSWER_RETRY.toMillis());
      later(
          ANSWER_RETRY,
          () -> {
            synchronized (lock) {
              answersOutstanding--; // answerLocked counts it again
              answerLocked(h, answer);
              pumpLocked();
            }
          });
      return false;
    }
    if (r.getCode() == 0) {
      switch (answer.getRequestCase()) {
        case ACK -> acked.incrementAndGet();
        case FAIL -> failed.incrementAndGet();
        default -> released.incrementAndGet();
      }
    } else if (isStale(r.getCode())) {
      // Final: the broker ended the attempt already (a lost lease, a cancel, a time-out).
      log.info(
          "job {}: {} refused as stale: {}",
          h.job.getJobId(),
          answer.getRequestCase().name().toLowerCase(),
          r.getMessage());
    } else {
      log.warn(
          "job {}: {} refused: {}",
          h.job.getJobId(),
          answer.getRequestCase().name().toLowerCase(),
          r.getMessage());
    }
    return true;
  }

  /** An answer saying "retry": UNAVAILABLE from the broker (not a stream that ended). */
  private static boolean isRetryLater(WorkResult r) {
    return r != STREAM_ENDED && r.getCode() == Status.Code.UNAVAILABLE.value();
  }

  /** Runs {@code task} on the timer thread after {@code delay}; nothing once the worker is done. */
  private void later(Duration delay, Runnable task) {
    try {
      timers.schedule(task, delay.toMillis(), TimeUnit.MILLISECONDS);
    } catch (java.util.concurrent.RejectedExecutionException e) {
      log.debug("the worker is stopped: {}", e.toString());
    }
  }

  private static boolean isStale(int code) {
    return code == Status.Code.FAILED_PRECONDITION.value()
        || code == Status.Code.NOT_FOUND.value();
  }

  /**
   * The lease of {@code h} ended (lost, or timed out): nothing more is sent for it. A running
   * handler keeps its slot until it returns (finishAttempt frees it): concurrency is a hard bound.
   */
  private void onLost(Held h, JobContext.Cancellation why) {
    synchronized (lock) {
      if (held.get(h.job.getLeaseId()) != h) {
        return;
      }
      forgetLocked(h); // a waiting one leaves the line; it held no slot
      toSend.removeIf(r -> r.held == h && r.body.hasHeartbeat()); // a step's save: refused below
      lost.incrementAndGet();
      lock.notifyAll();
    }
    h.ctx.cancel(why);
    log.info("job {} attempt {}: {}", h.job.getJobId(), h.job.getAttempt(), why);
  }

  private void onLeaseLost(String jobId, JobContext.Cancellation why) {
    for (Held h : heldWithJobId(jobId)) {
      onLost(h, why);
    }
  }

  private void onCancelRequested(String jobId) {
    for (Held h : heldWithJobId(jobId)) {
      synchronized (lock) {
        if (!h.started && held.get(h.job.getLeaseId()) == h) {
          // Not started: nothing to interrupt, the answer is the cancelled attempt's.
          forgetLocked(h);
          answerLocked(h, failOf(h.job, "cancelled"));
          pumpLocked();
          continue;
        }
      }
      h.ctx.cancel(JobContext.Cancellation.OPERATOR);
    }
  }

  private List<Held> heldWithJobId(String jobId) {
    List<Held> out = new ArrayList<>();
    synchronized (lock) {
      for (Held h : held.values()) {
        if (h.job.getJobId().equals(jobId)) {
          out.add(h);
        }
      }
    }
    return out;
  }

  // ---- heartbeats, progress, checkpoints ----

  private HeartbeatRequest.Builder heartbeatOf(Held h) {
    return HeartbeatRequest.newBuilder()
        .setJobId(h.job.getJobId())
        .setLeaseId(h.job.getLeaseId());
  }

  /** The periodic heartbeat of a held job; skipped while no stream is subscribed. */
  private void heartbeat(Held h) {
    synchronized (lock) {
      Session s = streamForLocked(h);
      if (held.get(h.job.getLeaseId()) != h || s == null) {
        return;
      }
      s.sendLocked(
          new Request(
              WorkRequest.newBuilder().setHeartbeat(heartbeatOf(h)),
              Kind.CONTROL,
              h,
              r -> onHeartbeatAnswered(h, r)));
    }
  }

  /** What any heartbeat's answer says about the attempt: lost, or cancelled by an operator. */
  private void onHeartbeatAnswered(Held h, WorkResult r) {
    if (isStale(r.getCode())) {
      onLost(h, JobContext.Cancellation.LEASE_LOST);
    } else if (r.getCode() == 0 && r.getCancelRequested()) {
      onCancelRequested(h.job.getJobId());
    }
  }

  private void sendProgressLocked(Held h) {
    Session s = streamForLocked(h);
    if (s == null) {
      return; // progressWaiting goes out once a stream is subscribed
    }
    byte[] value = h.progressWaiting;
    h.progressWaiting = null;
    h.progressInFlight = true;
    s.sendLocked(
        new Request(
            WorkRequest.newBuilder()
                .setHeartbeat(heartbeatOf(h).setProgress(ByteString.copyFrom(value))),
            Kind.CONTROL,
            h,
            r -> {
              synchronized (lock) {
                h.progressInFlight = false;
                if (r == STREAM_ENDED && h.progressWaiting == null) {
                  h.progressWaiting = value; // the stream ended: the newest goes out on the next
                }
                if (h.progressWaiting != null && held.get(h.job.getLeaseId()) == h) {
                  sendProgressLocked(h);
                }
              }
              onHeartbeatAnswered(h, r);
            }));
  }

  /** A step's save: a heartbeat with the checkpoint, at once, waited for (contract §7). */
  private void saveCheckpointOf(Held h, byte[] checkpoint) throws InterruptedException {
    WorkResult r = sendCheckpoint(h, checkpoint);
    while (isRetryLater(r)) {
      // Not final (contract §4): the partition is between leaders; saved again after
      // ANSWER_RETRY, on this stream or the next. The cancellation interrupts the wait.
      log.info(
          "job {}: checkpoint answered UNAVAILABLE ({}); saving it again in {} ms",
          h.job.getJobId(),
          r.getMessage(),
          ANSWER_RETRY.toMillis());
      Thread.sleep(ANSWER_RETRY.toMillis());
      r = sendCheckpoint(h, checkpoint);
    }
    if (r.getCode() != 0) {
      onHeartbeatAnswered(h, r);
      throw new LeaseLostException(
          "job " + h.job.getJobId() + ": checkpoint refused: " + r.getMessage());
    }
    if (r.getCancelRequested()) {
      onCancelRequested(h.job.getJobId());
    }
  }

  /** Sends one save of {@code checkpoint} (a heartbeat) and waits for its answer. */
  private WorkResult sendCheckpoint(Held h, byte[] checkpoint) throws InterruptedException {
    CompletableFuture<WorkResult> answered = new CompletableFuture<>();
    Request save =
        new Request(
            WorkRequest.newBuilder()
                .setHeartbeat(heartbeatOf(h).setCheckpoint(ByteString.copyFrom(checkpoint))),
            Kind.REPLAYED,
            h,
            answered::complete);
    synchronized (lock) {
      if (held.get(h.job.getLeaseId()) != h) {
        throw new LeaseLostException("job " + h.job.getJobId() + ": the lease is no longer held");
      }
      toSend.add(save);
      pumpLocked();
    }
    try {
      // A lost lease drops the save from the line; the cancellation interrupts this wait.
      return answered.get();
    } catch (ExecutionException e) {
      throw new IllegalStateException(e);
    }
  }

  // ---- requests ----

  private static WorkRequest.Builder ackOf(LeasedJob job, byte[] result) {
    return WorkRequest.newBuilder()
        .setAck(
            AckRequest.newBuilder()
                .setJobId(job.getJobId())
                .setLeaseId(job.getLeaseId())
                .setResult(ByteString.copyFrom(result)));
  }

  private static WorkRequest.Builder failOf(LeasedJob job, String error) {
    return WorkRequest.newBuilder()
        .setFail(
            FailRequest.newBuilder()
                .setJobId(job.getJobId())
                .setLeaseId(job.getLeaseId())
                .setError(error));
  }

  private static WorkRequest.Builder releaseOf(LeasedJob job, Duration delay) {
    ReleaseRequest.Builder release =
        ReleaseRequest.newBuilder().setJobId(job.getJobId()).setLeaseId(job.getLeaseId());
    if (!delay.isZero()) {
      release.setDelay(JobBrokerClient.toProto(delay));
    }
    return WorkRequest.newBuilder().setRelease(release);
  }

  // ---- helpers ----

  private static long millis(Timestamp t) {
    return t.getSeconds() * 1000 + t.getNanos() / 1_000_000;
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
