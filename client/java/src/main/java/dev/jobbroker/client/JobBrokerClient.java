package dev.jobbroker.client;

import com.google.protobuf.ByteString;
import dev.jobbroker.v1.AckRequest;
import dev.jobbroker.v1.AckResponse;
import dev.jobbroker.v1.AdminGrpc;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.CancelJobRequest;
import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.DeleteJobRequest;
import dev.jobbroker.v1.DeleteScheduleRequest;
import dev.jobbroker.v1.EnqueueBatchRequest;
import dev.jobbroker.v1.EnqueueBatchResponse;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import dev.jobbroker.v1.FailRequest;
import dev.jobbroker.v1.FailResponse;
import dev.jobbroker.v1.GetClusterRequest;
import dev.jobbroker.v1.GetJobRequest;
import dev.jobbroker.v1.GetQueueRequest;
import dev.jobbroker.v1.GetScheduleRequest;
import dev.jobbroker.v1.HeartbeatRequest;
import dev.jobbroker.v1.HeartbeatResponse;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import dev.jobbroker.v1.LeaseRequest;
import dev.jobbroker.v1.LeaseResponse;
import dev.jobbroker.v1.ListJobsRequest;
import dev.jobbroker.v1.ListJobsResponse;
import dev.jobbroker.v1.ListQueuesRequest;
import dev.jobbroker.v1.ListSchedulesRequest;
import dev.jobbroker.v1.ListWorkersRequest;
import dev.jobbroker.v1.PauseQueueRequest;
import dev.jobbroker.v1.PurgeQueueRequest;
import dev.jobbroker.v1.QueueInfo;
import dev.jobbroker.v1.QueuePolicy;
import dev.jobbroker.v1.ReleaseRequest;
import dev.jobbroker.v1.ReleaseResponse;
import dev.jobbroker.v1.ResumeQueueRequest;
import dev.jobbroker.v1.RetryJobRequest;
import dev.jobbroker.v1.RetryJobResponse;
import dev.jobbroker.v1.Schedule;
import dev.jobbroker.v1.TriggerScheduleRequest;
import dev.jobbroker.v1.TriggerScheduleResponse;
import dev.jobbroker.v1.UpdateQueuePolicyRequest;
import dev.jobbroker.v1.WatchJobRequest;
import dev.jobbroker.v1.WorkerInfo;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.Context;
import io.grpc.Deadline;
import io.grpc.ForwardingClientCall;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Iterator;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.function.Supplier;

/**
 * A connection to the broker (one node, or a cluster's nodes): every call of the Broker and Admin
 * services, plus {@link #enqueueAndWait}. Made from {@link ClientOptions}; a {@link Worker} built
 * on the client shares its connection, credentials and metadata.
 *
 * <p><b>Cluster.</b> Before its first call the client asks Admin.GetCluster which node leads each
 * partition, and sends each call straight to the leader of its queue's partition (enqueue, lease,
 * the queue calls) or its job's (get, watch, cancel, retry, delete, ack...); the others go to the
 * node that answered. After a call fails UNAVAILABLE or DEADLINE_EXCEEDED it asks again before
 * the next call, so it follows a leader that moved or died. A broker that is not a cluster, or
 * that refuses GetCluster (older, or a token without the admin role), gets every call: a node
 * forwards what it does not lead. The given addresses are where it asks, in order.
 *
 * <pre>{@code
 * try (JobBrokerClient client = JobBrokerClient.connect(ClientOptions.fromEnv())) {
 *   EnqueueResponse r = client.enqueue("emails", "alice@example.com");
 *   Job job = client.getJob(r.getJobId());
 * }
 * }</pre>
 *
 * <p>Every call carries the metadata {@code jobbroker-client: jobbroker-java/VERSION} and, with a
 * token, {@code authorization: Bearer TOKEN}; a unary call without a deadline of its own gets
 * {@link ClientOptions#defaultDeadline()} ({@link #withDeadline} for another one).
 *
 * <p><b>Keepalive.</b> Each channel pings the broker after 10 s without a frame from it, also
 * while no call is open, and gives the connection up when the answer has not come 5 s later: a
 * broker that froze or went silent (TCP does not notice) ends the calls and Work streams on it
 * UNAVAILABLE, and the next call, or the worker's reconnect, opens a new connection ({@link
 * ClientOptions.Builder#keepalive(Duration, Duration)}, {@link
 * ClientOptions.Builder#keepalive(boolean)}).
 *
 * <p><b>Retries.</b> A call that meets UNAVAILABLE moves the client to the next address that
 * answers (when there are several), or to the partition's new leader. It is tried again (up to
 * {@link ClientOptions#retryAttempts()} in all, with a short doubling pause, through the
 * routing again) only when repeating it cannot do anything twice: the reads (GetJob,
 * ListJobs, GetQueue, ...), Ack, Fail, Release and Heartbeat (the broker answers a repeat of
 * the same lease's answer OK), the calls that set a value (PauseQueue, ResumeQueue,
 * UpdateQueuePolicy, PutSchedule), and Enqueue or EnqueueBatch <em>only when every job has a
 * dedup key</em> (a repeat finds the first job). An enqueue without one is sent once: UNAVAILABLE
 * may come after the broker stored the job, and only the caller knows whether a second copy is
 * acceptable. Lease, CancelJob, RetryJob, DeleteJob, PurgeQueue, DeleteSchedule and
 * TriggerSchedule are sent once too: a lost Lease answer would strand the jobs it leased, and the
 * others' repeat would answer differently or enqueue again.
 *
 * <p><b>Enqueue coalescing.</b> Concurrent {@code enqueue()} calls of several threads are merged
 * into EnqueueBatch calls, one per partition (and dedup key or not), and each caller still gets
 * its own answer (contract §10, {@link ClientOptions.Builder#batching}). A batch goes at once,
 * from the caller's thread, while fewer than {@link ClientOptions#batchMaxInFlight()} of its key
 * are in flight; otherwise the jobs gather until one of those ends, and its callback sends them.
 * A batch of one is a unary Enqueue, so a lone enqueue costs what it did. A batch the broker
 * refuses whole (INVALID_ARGUMENT, ALREADY_EXISTS, RESOURCE_EXHAUSTED, ...) is sent again one
 * job per call, so a bad job fails only its own caller, with a unary call's message. Producer
 * middleware runs per {@code enqueue()} before this; {@link #enqueueBatch} is sent as it is;
 * {@link EnqueueOptions#batch(boolean) batch(false)} opts one call out; {@link #close()} sends
 * what is gathering and waits for the batches in flight.
 *
 * <p>Thread-safe: one client serves the whole process. Every call throws
 * {@link StatusRuntimeException} on failure; its {@code getStatus().getCode()} is the broker's
 * code (INVALID_ARGUMENT for a malformed field, FAILED_PRECONDITION for a stale lease,
 * ALREADY_EXISTS for a dedup key held with another payload, UNAUTHENTICATED for a missing or
 * wrong token, PERMISSION_DENIED for a token without the role or queue, ...).
 */
public final class JobBrokerClient implements AutoCloseable {
  /** The address used when neither the options nor $JOBBROKER_ADDRESS name one. */
  public static final String DEFAULT_ADDRESS = ClientOptions.DEFAULT_ADDRESS;

  /**
   * This library's version, sent with every call (see {@link #CLIENT_HEADER}): the repository's
   * VERSION file, written into {@code version.properties} by the build.
   */
  public static final String VERSION = readVersion();

  /**
   * The call metadata that names the library to the broker ("jobbroker-java/VERSION"), which
   * Admin.ListWorkers shows for each worker.
   */
  public static final Metadata.Key<String> CLIENT_HEADER =
      Metadata.Key.of("jobbroker-client", Metadata.ASCII_STRING_MARSHALLER);

  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  // Constant after construction; shared with the views withDeadline makes.
  private final ClientOptions options;
  private final Router router;
  private final List<ProducerMiddleware> producerMiddleware;
  private final Channel calls; // the router, with metadata and this view's deadline
  private final Duration deadline;
  private final EnqueueCoalescer coalescer; // null with batching off
  private final boolean view; // withDeadline's: close() is the client's, not the view's
  private final boolean ownsChannels;

  private JobBrokerClient(
      ClientOptions options,
      Router router,
      List<ProducerMiddleware> producerMiddleware,
      Duration deadline,
      EnqueueCoalescer coalescer,
      boolean view,
      boolean ownsChannels) {
    this.options = options;
    this.router = router;
    this.producerMiddleware = producerMiddleware;
    this.deadline = deadline;
    this.coalescer = coalescer;
    this.view = view;
    this.ownsChannels = ownsChannels;
    this.calls =
        ClientInterceptors.intercept(
            router, new DefaultDeadline(deadline), new CallMetadata(options.token()));
  }

  /** Connects as {@code options} say. Connections are made lazily, at the first call. */
  public static JobBrokerClient connect(ClientOptions options) {
    ChannelCredentials credentials = credentials(options);
    Router router =
        new Router(
            options.addresses(),
            address -> channel(address, credentials, options),
            null,
            new CallMetadata(options.token()),
            clusterFetchTimeout(options));
    return new JobBrokerClient(
        options,
        router,
        new CopyOnWriteArrayList<>(),
        options.defaultDeadline(),
        coalescer(options, router),
        false,
        true);
  }

  /** Dials {@code target} ("host:port"), plaintext; the token from $JOBBROKER_TOKEN, if set. */
  public static JobBrokerClient connect(String target) {
    return connect(ClientOptions.builder().address(target).build());
  }

  /** Dials {@code host:port}, as {@link #connect(String)}. */
  public static JobBrokerClient connect(String host, int port) {
    return connect(host + ":" + port);
  }

  /** Connects as the environment says: {@link ClientOptions#fromEnv()}. */
  public static JobBrokerClient connectFromEnv() {
    return connect(ClientOptions.fromEnv());
  }

  /**
   * Uses a channel the caller built and owns ({@link #close()} leaves it open); the other
   * options (token, deadline, retries) come from the environment and defaults. An extra for
   * transports ClientOptions does not cover. Keepalive pings are the channel's own: set them on
   * its builder ({@code keepAliveTime}, {@code keepAliveTimeout}, {@code keepAliveWithoutCalls}).
   */
  public static JobBrokerClient wrap(ManagedChannel channel) {
    ClientOptions options = ClientOptions.builder().address(channel.authority()).build();
    Router router =
        new Router(
            options.addresses(),
            null,
            channel,
            new CallMetadata(options.token()),
            clusterFetchTimeout(options));
    return new JobBrokerClient(
        options,
        router,
        new CopyOnWriteArrayList<>(),
        options.defaultDeadline(),
        coalescer(options, router),
        false,
        false);
  }

  /** $JOBBROKER_ADDRESS, else {@link #DEFAULT_ADDRESS}. */
  public static String addressFromEnv() {
    String env = System.getenv("JOBBROKER_ADDRESS");
    return env == null || env.isEmpty() ? DEFAULT_ADDRESS : env;
  }

  /**
   * A view of this client whose unary calls get {@code deadline} when they set none (zero: no
   * deadline). It shares the connection and middleware; closing it does nothing.
   */
  public JobBrokerClient withDeadline(Duration deadline) {
    return new JobBrokerClient(
        options, router, producerMiddleware, deadline, coalescer, true, false);
  }

  /** The options this client was made with. */
  public ClientOptions options() {
    return options;
  }

  /**
   * The channel of the first address (calls made on it directly carry no metadata and are not
   * routed).
   */
  public ManagedChannel channel() {
    return router.first();
  }

  /**
   * Adds producer middleware: it wraps every enqueue of this client ({@link ProducerMiddleware});
   * the first added is the outermost.
   */
  public JobBrokerClient use(ProducerMiddleware middleware) {
    producerMiddleware.add(Objects.requireNonNull(middleware));
    return this;
  }

  /**
   * The producer and worker API, blocking (metadata and default deadline included). Its calls go
   * to any node of a cluster, which forwards them to the partition's leader; this client's own
   * methods send them straight to the leader.
   */
  public BrokerGrpc.BrokerBlockingStub broker() {
    return BrokerGrpc.newBlockingStub(calls);
  }

  /** The producer and worker API, asynchronous; its calls go to any node, as {@link #broker}. */
  public BrokerGrpc.BrokerStub brokerAsync() {
    return BrokerGrpc.newStub(calls);
  }

  /** The operator API, blocking; its calls go to any node, as {@link #broker}. */
  public AdminGrpc.AdminBlockingStub admin() {
    return AdminGrpc.newBlockingStub(calls);
  }

  private BrokerGrpc.BrokerBlockingStub broker(Router.Route route) {
    return broker().withOption(Router.ROUTE, route);
  }

  private AdminGrpc.AdminBlockingStub admin(Router.Route route) {
    return admin().withOption(Router.ROUTE, route);
  }

  /**
   * The routing table as it is now (fetched first if a stream or call ended since): what a Worker
   * groups its queues by, one Work stream per leading node. NONE without an answer.
   */
  RoutingTable routingTable() {
    return router.table();
  }

  /**
   * The stub for a Worker's Work stream to the node at {@code address}; {@link
   * WorkGroup#ANY_NODE} goes where a call any node serves goes (the first given address until a
   * broker answered, the node that answered since), which relays the queues it does not lead.
   * The node is chosen now (the table fetched first if stale), not when the stream is opened,
   * which the worker does under its lock.
   */
  BrokerGrpc.BrokerStub workStub(String address) {
    String node =
        address.equals(WorkGroup.ANY_NODE) ? router.addressFor(Router.Route.ANY) : address;
    return brokerAsync().withOption(Router.ROUTE, Router.Route.address(node));
  }

  /**
   * A Work stream ended: the node may have died or stopped leading the queues, so the next
   * stream asks where they are now; and every channel may reconnect at once (the worker keeps
   * its own backoff, not gRPC's, which grows to minutes).
   */
  void streamEnded() {
    router.markStale();
    router.resetConnectBackoff();
  }

  /**
   * A Worker with queues whose partition had no leader asks for the table again (contract §5):
   * the next {@link #routingTable()} fetches it.
   */
  void routingTableStale() {
    router.markStale();
  }

  /** Test hook: {@code methodAndAddress} is told where each call is sent as it goes. */
  void onCallSentForTest(java.util.function.BiConsumer<String, String> methodAndAddress) {
    router.onCallSentForTest(methodAndAddress);
  }

  // ---- Producer API ----

  /** Enqueues {@code payload} (UTF-8) to {@code queue} with the queue's defaults. */
  public EnqueueResponse enqueue(String queue, String payload) {
    return enqueue(queue, payload.getBytes(StandardCharsets.UTF_8), EnqueueOptions.defaults());
  }

  /** Enqueues {@code payload} to {@code queue} with the queue's defaults. */
  public EnqueueResponse enqueue(String queue, byte[] payload) {
    return enqueue(queue, payload, EnqueueOptions.defaults());
  }

  /** Enqueues {@code payload} (UTF-8) to {@code queue} with {@code options}. */
  public EnqueueResponse enqueue(String queue, String payload, EnqueueOptions options) {
    return enqueue(queue, payload.getBytes(StandardCharsets.UTF_8), options);
  }

  /**
   * Enqueues {@code payload} to {@code queue} with {@code options} ({@link
   * EnqueueOptions#batch(boolean) batch(false)}: as its own unary call).
   */
  public EnqueueResponse enqueue(String queue, byte[] payload, EnqueueOptions options) {
    return enqueueThrough(0, options.toRequest(queue, payload), options.batch());
  }

  /**
   * Enqueues one job with every field of {@link EnqueueRequest}. Goes through the producer
   * middleware, then, with {@link ClientOptions.Builder#batching} on, into a batch with other
   * threads' concurrent enqueues (see the class comment); retried on UNAVAILABLE only with a
   * dedup key.
   */
  public EnqueueResponse enqueue(EnqueueRequest request) {
    return enqueueThrough(0, request, true);
  }

  /**
   * As {@link #enqueue(EnqueueRequest)}; {@code batch} false sends this job at once as its own
   * unary Enqueue, never merged with others.
   */
  public EnqueueResponse enqueue(EnqueueRequest request, boolean batch) {
    return enqueueThrough(0, request, batch);
  }

  private EnqueueResponse enqueueThrough(int index, EnqueueRequest request, boolean batch) {
    if (index == producerMiddleware.size()) {
      boolean dedupKeyed = !request.getDedupKey().isEmpty();
      // depends_on_index points into the caller's own batch: merged with other callers' jobs it
      // would point at theirs, so such a job goes alone.
      if (batch && coalescer != null && request.getDependsOnIndexCount() == 0) {
        return coalescer.enqueue(request, coalescingKey(request, dedupKeyed), callDeadline());
      }
      Router.Route route = Router.Route.queue(request.getQueue());
      return call(dedupKeyed, () -> broker(route).enqueue(request));
    }
    return producerMiddleware
        .get(index)
        .enqueue(request, r -> enqueueThrough(index + 1, r, batch));
  }

  /**
   * The batch a job may share (contract §10): its partition in the cluster table the client
   * holds; outside a cluster (or before any table) its queue's name, which stands for its
   * partition on a broker of several partitions too.
   */
  private EnqueueCoalescer.Key coalescingKey(EnqueueRequest request, boolean dedupKeyed) {
    RoutingTable table = router.table();
    if (table.isCluster()) {
      return EnqueueCoalescer.Key.ofPartition(
          Partitions.ofQueue(request.getQueue(), table.partitionCount()), dedupKeyed);
    }
    return EnqueueCoalescer.Key.ofQueue(request.getQueue(), dedupKeyed);
  }

  /**
   * The deadline a unary call of this view would have now: its default, or the gRPC context's
   * when that is earlier; null for none.
   */
  private Deadline callDeadline() {
    Deadline d =
        deadline.isZero() ? null : Deadline.after(deadline.toNanos(), TimeUnit.NANOSECONDS);
    Deadline context = Context.current().getDeadline();
    if (context != null && (d == null || context.isBefore(d))) {
      d = context;
    }
    return d;
  }

  /** The coalescer of a client whose options turn batching on, sending through {@code router}. */
  private static EnqueueCoalescer coalescer(ClientOptions options, Router router) {
    if (!options.batching()) {
      return null;
    }
    // No DefaultDeadline here: each batch carries the earliest deadline of its callers.
    Channel channel = ClientInterceptors.intercept(router, new CallMetadata(options.token()));
    return new EnqueueCoalescer(
        options, (jobs, deadline, done) -> sendEnqueues(channel, router, jobs, deadline, done));
  }

  /** One attempt of a coalesced batch: unary Enqueue for one job, EnqueueBatch for more. */
  private static void sendEnqueues(
      Channel channel,
      Router router,
      List<EnqueueRequest> jobs,
      Deadline deadline,
      EnqueueCoalescer.Done done) {
    // All the jobs share a partition: to the leader of the first one's queue.
    BrokerGrpc.BrokerStub stub =
        BrokerGrpc.newStub(channel)
            .withOption(Router.ROUTE, Router.Route.queue(jobs.get(0).getQueue()));
    BrokerGrpc.BrokerStub withDeadline = deadline == null ? stub : stub.withDeadline(deadline);
    // Started in the root context, not the caller's: a caller that gives up (its context
    // cancelled) must not cancel the call that carries its neighbours' jobs.
    Context.ROOT.run(
        () -> {
          if (jobs.size() == 1) {
            withDeadline.enqueue(jobs.get(0), new Answer<>(router, done, List::of));
          } else {
            withDeadline.enqueueBatch(
                EnqueueBatchRequest.newBuilder().addAllJobs(jobs).build(),
                new Answer<>(router, done, EnqueueBatchResponse::getResultsList));
          }
        });
  }

  /** The answer of one coalesced call, handed to the coalescer. */
  private static final class Answer<T> implements StreamObserver<T> {
    private final Router router;
    private final EnqueueCoalescer.Done done;
    private final Function<T, List<EnqueueResponse>> results;
    private T value;

    Answer(Router router, EnqueueCoalescer.Done done, Function<T, List<EnqueueResponse>> results) {
      this.router = router;
      this.done = done;
      this.results = results;
    }

    @Override
    public void onNext(T v) {
      value = v;
    }

    @Override
    public void onError(Throwable t) {
      StatusRuntimeException e =
          t instanceof StatusRuntimeException s
              ? s
              : Status.fromThrowable(t).asRuntimeException(Status.trailersFromThrowable(t));
      if (unreachable(e.getStatus().getCode())) {
        router.markStale(); // as call() does: the leader may have moved
      }
      done.done(null, e);
    }

    @Override
    public void onCompleted() {
      done.done(value == null ? List.of() : results.apply(value), null);
    }
  }

  /**
   * Enqueues 1 to 1000 jobs, all or nothing; results come in the order of {@code requests}.
   * Retried on UNAVAILABLE only when every job has a dedup key.
   */
  public List<EnqueueResponse> enqueueBatch(List<EnqueueRequest> requests) {
    return enqueueBatchThrough(0, requests);
  }

  private List<EnqueueResponse> enqueueBatchThrough(int index, List<EnqueueRequest> requests) {
    if (index == producerMiddleware.size()) {
      boolean allKeyed = requests.stream().noneMatch(r -> r.getDedupKey().isEmpty());
      EnqueueBatchRequest batch = EnqueueBatchRequest.newBuilder().addAllJobs(requests).build();
      // All or nothing within one partition: to the leader of the first job's queue. A batch
      // whose jobs span partitions is refused there (INVALID_ARGUMENT naming them).
      Router.Route route =
          requests.isEmpty() ? Router.Route.ANY : Router.Route.queue(requests.get(0).getQueue());
      return call(allKeyed, () -> broker(route).enqueueBatch(batch).getResultsList());
    }
    return producerMiddleware
        .get(index)
        .enqueueBatch(requests, rs -> enqueueBatchThrough(index + 1, rs));
  }

  /**
   * Enqueues one job and waits until it ends: returns the job COMPLETED (its result in
   * {@code getResult()}). {@link JobFailedException} (naming the state, holding the job) when it
   * ends FAILED or CANCELLED; {@link StatusRuntimeException} DEADLINE_EXCEEDED when it has not
   * ended within {@code timeout} (zero: wait as long as it takes). The job is watched
   * (Admin.WatchJob, no polling); a watch cut by UNAVAILABLE is opened again.
   */
  public Job enqueueAndWait(EnqueueRequest request, Duration timeout) {
    EnqueueResponse r = enqueue(request);
    return awaitJob(r.getJobId(), timeout);
  }

  /** As {@link #enqueueAndWait(EnqueueRequest, Duration)} for a payload and options. */
  public Job enqueueAndWait(
      String queue, byte[] payload, EnqueueOptions options, Duration timeout) {
    return awaitJob(enqueue(queue, payload, options).getJobId(), timeout);
  }

  /** As {@link #enqueueAndWait(EnqueueRequest, Duration)} for a UTF-8 payload and no options. */
  public Job enqueueAndWait(String queue, String payload, Duration timeout) {
    return enqueueAndWait(
        EnqueueOptions.defaults().toRequest(queue, payload.getBytes(StandardCharsets.UTF_8)),
        timeout);
  }

  /**
   * Waits until job {@code jobId} ends; as {@link #enqueueAndWait(EnqueueRequest, Duration)}.
   */
  public Job awaitJob(String jobId, Duration timeout) {
    long giveUpAt = timeout.isZero() ? Long.MAX_VALUE : System.nanoTime() + timeout.toNanos();
    int unavailableInARow = 0;
    while (true) {
      AdminGrpc.AdminBlockingStub stub = admin(Router.Route.job(jobId));
      if (giveUpAt != Long.MAX_VALUE) {
        stub = stub.withDeadlineAfter(giveUpAt - System.nanoTime(), TimeUnit.NANOSECONDS);
      }
      Job last = null;
      // A cancellable context, so leaving the loop early frees the stream.
      Context.CancellableContext watch = Context.current().withCancellation();
      Context previous = watch.attach();
      try {
        Iterator<Job> updates = stub.watchJob(WatchJobRequest.newBuilder().setJobId(jobId).build());
        while (updates.hasNext()) {
          last = updates.next();
          unavailableInARow = 0;
          if (isTerminal(last.getState())) {
            return finished(last);
          }
        }
      } catch (StatusRuntimeException e) {
        if (unreachable(e.getStatus().getCode())) {
          router.markStale(); // the job's leader may have moved
        }
        if (e.getStatus().getCode() != Status.Code.UNAVAILABLE
            || ++unavailableInARow >= options.retryAttempts()) {
          throw e;
        }
        pause(options.retryBackoff().multipliedBy(1L << (unavailableInARow - 1)), e);
      } finally {
        watch.detach(previous);
        watch.cancel(null);
      }
      if (last != null && isTerminal(last.getState())) {
        return finished(last);
      }
      // The watch ended without a terminal state (a broker going away answers OK): watch again.
    }
  }

  private static boolean isTerminal(JobState s) {
    return s == JobState.JOB_STATE_COMPLETED
        || s == JobState.JOB_STATE_FAILED
        || s == JobState.JOB_STATE_CANCELLED;
  }

  private static Job finished(Job job) {
    if (job.getState() != JobState.JOB_STATE_COMPLETED) {
      throw new JobFailedException(job);
    }
    return job;
  }

  // ---- Worker API (unary; the Worker uses the Work stream) ----

  /**
   * Leases up to {@code request.max_jobs} jobs of one queue (long poll). Sent once: jobs leased
   * by a call whose answer was lost would sit unworked until their leases ran out.
   */
  public LeaseResponse lease(LeaseRequest request) {
    return call(false, () -> broker(Router.Route.queue(request.getQueue())).lease(request));
  }

  /** Extends a lease (and saves a checkpoint or progress). FAILED_PRECONDITION if stale. */
  public HeartbeatResponse heartbeat(HeartbeatRequest request) {
    return call(true, () -> broker(Router.Route.job(request.getJobId())).heartbeat(request));
  }

  /** Completes a leased job. FAILED_PRECONDITION if the lease is stale. */
  public AckResponse ack(AckRequest request) {
    return call(true, () -> broker(Router.Route.job(request.getJobId())).ack(request));
  }

  /** Fails the attempt. FAILED_PRECONDITION if the lease is stale. */
  public FailResponse fail(FailRequest request) {
    return call(true, () -> broker(Router.Route.job(request.getJobId())).fail(request));
  }

  /** Gives a leased job back unstarted (with a delay: snooze). */
  public ReleaseResponse release(ReleaseRequest request) {
    return call(true, () -> broker(Router.Route.job(request.getJobId())).release(request));
  }

  // ---- Admin API ----

  /** The job as the Admin service shows it. NOT_FOUND for an unknown id. */
  public Job getJob(String jobId) {
    GetJobRequest request = GetJobRequest.newBuilder().setJobId(jobId).build();
    return call(true, () -> admin(Router.Route.job(jobId)).getJob(request));
  }

  /**
   * The job now, then one message per change, ending after its terminal state. The iterator
   * throws {@link StatusRuntimeException} (NOT_FOUND, UNAVAILABLE: watch again). Not retried.
   */
  public Iterator<Job> watchJob(String jobId) {
    WatchJobRequest request = WatchJobRequest.newBuilder().setJobId(jobId).build();
    return admin(Router.Route.job(jobId)).watchJob(request);
  }

  /** One page of a queue's jobs (state, page size, token, order, dedup key in the request). */
  public ListJobsResponse listJobs(ListJobsRequest request) {
    return call(true, () -> admin(Router.Route.queue(request.getQueue())).listJobs(request));
  }

  /** The first page (up to 100) of {@code queue}'s jobs in {@code state} (UNSPECIFIED: all). */
  public ListJobsResponse listJobs(String queue, JobState state) {
    return listJobs(ListJobsRequest.newBuilder().setQueue(queue).setState(state).build());
  }

  /**
   * READY or SCHEDULED: CANCELLED at once; ACTIVE: cancel_requested, the worker is told. The job
   * after the call. Sent once.
   */
  public Job cancelJob(String jobId) {
    CancelJobRequest request = CancelJobRequest.newBuilder().setJobId(jobId).build();
    return call(false, () -> admin(Router.Route.job(jobId)).cancelJob(request));
  }

  /** A FAILED or CANCELLED job back to READY. Sent once. */
  public Job retryJob(String jobId) {
    return call(
            false,
            () ->
                admin(Router.Route.job(jobId))
                    .retryJob(RetryJobRequest.newBuilder().setJobId(jobId).build()))
        .getJob();
  }

  /** Any form of RetryJob, e.g. the bulk redrive of a queue's dead jobs. Sent once. */
  public RetryJobResponse retryJobs(RetryJobRequest request) {
    Router.Route route =
        request.getQueue().isEmpty()
            ? Router.Route.job(request.getJobId())
            : Router.Route.queue(request.getQueue());
    return call(false, () -> admin(route).retryJob(request));
  }

  /** Removes a job that is not ACTIVE. Sent once. */
  public void deleteJob(String jobId) {
    DeleteJobRequest request = DeleteJobRequest.newBuilder().setJobId(jobId).build();
    call(false, () -> admin(Router.Route.job(jobId)).deleteJob(request));
  }

  /** Every known queue. */
  public List<QueueInfo> listQueues() {
    return call(true, () -> admin().listQueues(ListQueuesRequest.getDefaultInstance()))
        .getQueuesList();
  }

  /** A queue's effective policy and counts. NOT_FOUND for an unknown queue. */
  public QueueInfo getQueue(String queue) {
    GetQueueRequest request = GetQueueRequest.newBuilder().setQueue(queue).build();
    return call(true, () -> admin(Router.Route.queue(queue)).getQueue(request));
  }

  /** Sets the fields of {@code policy} that are set; creates the queue if new. */
  public QueueInfo updateQueuePolicy(String queue, QueuePolicy policy) {
    return updateQueuePolicy(
        UpdateQueuePolicyRequest.newBuilder().setQueue(queue).setPolicy(policy).build());
  }

  /** Any form of UpdateQueuePolicy (with {@code reset}, say). */
  public QueueInfo updateQueuePolicy(UpdateQueuePolicyRequest request) {
    Router.Route route = Router.Route.queue(request.getQueue());
    return call(true, () -> admin(route).updateQueuePolicy(request));
  }

  /** Stops leasing from {@code queue}; enqueues are still accepted. */
  public QueueInfo pauseQueue(String queue) {
    PauseQueueRequest request = PauseQueueRequest.newBuilder().setQueue(queue).build();
    return call(true, () -> admin(Router.Route.queue(queue)).pauseQueue(request));
  }

  /** Leases from {@code queue} again. */
  public QueueInfo resumeQueue(String queue) {
    ResumeQueueRequest request = ResumeQueueRequest.newBuilder().setQueue(queue).build();
    return call(true, () -> admin(Router.Route.queue(queue)).resumeQueue(request));
  }

  /** Removes the queue's jobs in {@code states} (none: every terminal state); how many. */
  public long purgeQueue(String queue, JobState... states) {
    PurgeQueueRequest request =
        PurgeQueueRequest.newBuilder().setQueue(queue).addAllStates(List.of(states)).build();
    return call(false, () -> admin(Router.Route.queue(queue)).purgeQueue(request)).getPurged();
  }

  /** The cluster's nodes and partition leaders (a single node: a cluster of one). */
  public ClusterInfo getCluster() {
    return call(true, () -> admin().getCluster(GetClusterRequest.getDefaultInstance()));
  }

  /** Every connected worker. */
  public List<WorkerInfo> listWorkers() {
    return listWorkers("");
  }

  /** The workers of {@code queue} (empty: every worker). */
  public List<WorkerInfo> listWorkers(String queue) {
    return call(
            true,
            () -> admin().listWorkers(ListWorkersRequest.newBuilder().setQueue(queue).build()))
        .getWorkersList();
  }

  /** Creates or replaces a recurring schedule; the stored schedule (next_run_at set). */
  public Schedule putSchedule(Schedule schedule) {
    return call(
        true,
        () ->
            admin(Router.Route.queue(schedule.getTemplate().getQueue()))
                .putSchedule(
                    dev.jobbroker.v1.PutScheduleRequest.newBuilder()
                        .setSchedule(schedule)
                        .build()));
  }

  /** A schedule by id. NOT_FOUND for an unknown one. */
  public Schedule getSchedule(String scheduleId) {
    return call(
        true,
        () ->
            admin()
                .getSchedule(GetScheduleRequest.newBuilder().setScheduleId(scheduleId).build()));
  }

  /** Every schedule. */
  public List<Schedule> listSchedules() {
    return listSchedules("");
  }

  /** The schedules whose template enqueues into {@code queue} (empty: all). */
  public List<Schedule> listSchedules(String queue) {
    return call(
            true,
            () ->
                admin(queue.isEmpty() ? Router.Route.ANY : Router.Route.queue(queue))
                    .listSchedules(ListSchedulesRequest.newBuilder().setQueue(queue).build()))
        .getSchedulesList();
  }

  /** Removes a schedule; the jobs it enqueued stay. Sent once. */
  public void deleteSchedule(String scheduleId) {
    call(
        false,
        () ->
            admin()
                .deleteSchedule(
                    DeleteScheduleRequest.newBuilder().setScheduleId(scheduleId).build()));
  }

  /** Enqueues one run now. Sent once: a repeat would be a second run. */
  public TriggerScheduleResponse triggerSchedule(String scheduleId) {
    return call(
        false,
        () ->
            admin()
                .triggerSchedule(
                    TriggerScheduleRequest.newBuilder().setScheduleId(scheduleId).build()));
  }

  // ---- Helpers ----

  /**
   * Runs a unary call; on UNAVAILABLE, when {@code safeToRepeat}, tries again up to the options'
   * attempts. UNAVAILABLE or DEADLINE_EXCEEDED also makes the router ask for the cluster's layout
   * before the next call, retried or not: the node may have died or no longer lead the call's
   * partition.
   */
  private <T> T call(boolean safeToRepeat, Supplier<T> rpc) {
    int attempts = safeToRepeat ? options.retryAttempts() : 1;
    Duration pause = options.retryBackoff();
    for (int attempt = 1; ; attempt++) {
      try {
        return rpc.get();
      } catch (StatusRuntimeException e) {
        if (unreachable(e.getStatus().getCode())) {
          router.markStale();
        }
        if (e.getStatus().getCode() != Status.Code.UNAVAILABLE) {
          throw e;
        }
        if (attempt >= attempts) {
          throw e;
        }
        pause(pause, e);
        pause = pause.multipliedBy(2);
      }
    }
  }

  /** Codes that may mean the call went to a node that is gone or no longer leads. */
  private static boolean unreachable(Status.Code code) {
    return code == Status.Code.UNAVAILABLE || code == Status.Code.DEADLINE_EXCEEDED;
  }

  private static void pause(Duration d, StatusRuntimeException cause) {
    try {
      Thread.sleep(d.toMillis());
    } catch (InterruptedException ie) {
      Thread.currentThread().interrupt();
      throw cause;
    }
  }

  /** A java.time.Duration as the wire's google.protobuf.Duration. */
  public static com.google.protobuf.Duration toProto(Duration d) {
    return com.google.protobuf.Duration.newBuilder()
        .setSeconds(d.getSeconds())
        .setNanos(d.getNano())
        .build();
  }

  /** A google.protobuf.Duration as a java.time.Duration. */
  public static Duration fromProto(com.google.protobuf.Duration d) {
    return Duration.ofSeconds(d.getSeconds(), d.getNanos());
  }

  /**
   * Sends the enqueues still gathering in batches and waits for the batches in flight; then
   * closes the channels if this client opened them, waiting up to 5 s for calls to finish. A
   * view's ({@link #withDeadline}) does nothing.
   */
  @Override
  public void close() {
    if (view) {
      return;
    }
    if (coalescer != null) {
      coalescer.close();
    }
    if (ownsChannels) {
      router.shutdown();
    }
  }

  /** How long the router waits for each node's GetCluster answer. */
  private static Duration clusterFetchTimeout(ClientOptions o) {
    return o.defaultDeadline().isZero() ? Duration.ofSeconds(10) : o.defaultDeadline();
  }

  /** A channel to one node: the options' credentials and keepalive pings. */
  private static ManagedChannel channel(
      String address, ChannelCredentials credentials, ClientOptions o) {
    ManagedChannelBuilder<?> b = Grpc.newChannelBuilder(address, credentials);
    if (o.keepalive()) {
      b.keepAliveTime(o.keepaliveTime().toNanos(), TimeUnit.NANOSECONDS)
          .keepAliveTimeout(o.keepaliveTimeout().toNanos(), TimeUnit.NANOSECONDS)
          .keepAliveWithoutCalls(true); // a producer's idle channel, a worker between streams
    }
    return b.build();
  }

  private static ChannelCredentials credentials(ClientOptions o) {
    if (!o.tls()) {
      return InsecureChannelCredentials.create();
    }
    TlsChannelCredentials.Builder b = TlsChannelCredentials.newBuilder();
    try {
      if (o.caPem() != null) {
        b.trustManager(new ByteArrayInputStream(o.caPem()));
      }
      if (o.certPem() != null) {
        b.keyManager(new ByteArrayInputStream(o.certPem()), new ByteArrayInputStream(o.keyPem()));
      }
    } catch (IOException e) {
      throw new UncheckedIOException("bad TLS certificate or key", e);
    }
    return b.build();
  }

  /** Adds CLIENT_HEADER, and the bearer token when there is one, to every call. */
  private static final class CallMetadata implements ClientInterceptor {
    private final String authorization;

    CallMetadata(String token) {
      this.authorization = token == null ? null : "Bearer " + token;
    }

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          headers.put(CLIENT_HEADER, "jobbroker-java/" + VERSION);
          if (authorization != null) {
            headers.put(AUTHORIZATION, authorization);
          }
          super.start(listener, headers);
        }
      };
    }
  }

  /** Gives unary calls that set no deadline of their own this view's default one. */
  private static final class DefaultDeadline implements ClientInterceptor {
    private final Duration deadline;

    DefaultDeadline(Duration deadline) {
      this.deadline = deadline;
    }

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      if (method.getType() == MethodDescriptor.MethodType.UNARY
          && options.getDeadline() == null
          && !deadline.isZero()) {
        options = options.withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS);
      }
      return next.newCall(method, options);
    }
  }

  private static String readVersion() {
    try (java.io.InputStream in = JobBrokerClient.class.getResourceAsStream("version.properties")) {
      java.util.Properties p = new java.util.Properties();
      if (in != null) {
        p.load(in);
      }
      String v = p.getProperty("version", "");
      return v.isEmpty() || v.startsWith("${") ? "unknown" : v;
    } catch (java.io.IOException e) {
      return "unknown";
    }
  }
}
