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
import io.grpc.ForwardingClientCall;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
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
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;

/**
 * A connection to the broker (one node, or a cluster's nodes tried in order): every call of the
 * Broker and Admin services, plus {@link #enqueueAndWait}. Made from {@link ClientOptions}; a
 * {@link Worker} built on the client shares its connection, credentials and metadata.
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
 * <p><b>Retries.</b> A call that meets UNAVAILABLE moves the client to the next address (when
 * there are several). It is tried again (up to {@link ClientOptions#retryAttempts()} in all, with
 * a short doubling pause) only when repeating it cannot do anything twice: the reads (GetJob,
 * ListJobs, GetQueue, ...), Ack, Fail, Release and Heartbeat (the broker answers a repeat of
 * the same lease's answer OK), the calls that set a value (PauseQueue, ResumeQueue,
 * UpdateQueuePolicy, PutSchedule), and Enqueue or EnqueueBatch <em>only when every job has a
 * dedup key</em> (a repeat finds the first job). An enqueue without one is sent once: UNAVAILABLE
 * may come after the broker stored the job, and only the caller knows whether a second copy is
 * acceptable. Lease, CancelJob, RetryJob, DeleteJob, PurgeQueue, DeleteSchedule and
 * TriggerSchedule are sent once too: a lost Lease answer would strand the jobs it leased, and the
 * others' repeat would answer differently or enqueue again.
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
  private final Endpoints endpoints;
  private final List<ProducerMiddleware> producerMiddleware;
  private final Channel calls; // the endpoints, with metadata and this view's deadline
  private final Duration deadline;
  private final boolean ownsChannels;

  private JobBrokerClient(
      ClientOptions options,
      Endpoints endpoints,
      List<ProducerMiddleware> producerMiddleware,
      Duration deadline,
      boolean ownsChannels) {
    this.options = options;
    this.endpoints = endpoints;
    this.producerMiddleware = producerMiddleware;
    this.deadline = deadline;
    this.ownsChannels = ownsChannels;
    this.calls =
        ClientInterceptors.intercept(
            endpoints, new DefaultDeadline(deadline), new CallMetadata(options.token()));
  }

  /** Connects as {@code options} say. Connections are made lazily, at the first call. */
  public static JobBrokerClient connect(ClientOptions options) {
    return new JobBrokerClient(
        options,
        new Endpoints(options.addresses(), credentials(options), null),
        new CopyOnWriteArrayList<>(),
        options.defaultDeadline(),
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
   * transports ClientOptions does not cover.
   */
  public static JobBrokerClient wrap(ManagedChannel channel) {
    ClientOptions options = ClientOptions.builder().address(channel.authority()).build();
    return new JobBrokerClient(
        options,
        new Endpoints(options.addresses(), null, channel),
        new CopyOnWriteArrayList<>(),
        options.defaultDeadline(),
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
    return new JobBrokerClient(options, endpoints, producerMiddleware, deadline, false);
  }

  /** The options this client was made with. */
  public ClientOptions options() {
    return options;
  }

  /** The channel of the address in use now (calls made on it directly carry no metadata). */
  public ManagedChannel channel() {
    return endpoints.current();
  }

  /**
   * Adds producer middleware: it wraps every enqueue of this client ({@link ProducerMiddleware});
   * the first added is the outermost.
   */
  public JobBrokerClient use(ProducerMiddleware middleware) {
    producerMiddleware.add(Objects.requireNonNull(middleware));
    return this;
  }

  /** The producer and worker API, blocking (metadata and default deadline included). */
  public BrokerGrpc.BrokerBlockingStub broker() {
    return BrokerGrpc.newBlockingStub(calls);
  }

  /** The producer and worker API, asynchronous (needed for the Work stream). */
  public BrokerGrpc.BrokerStub brokerAsync() {
    return BrokerGrpc.newStub(calls);
  }

  /** The operator API, blocking. */
  public AdminGrpc.AdminBlockingStub admin() {
    return AdminGrpc.newBlockingStub(calls);
  }

  /**
   * A stream ended with {@code status}: on UNAVAILABLE move to the next address, and let every
   * channel reconnect now (the caller keeps its own backoff, not gRPC's, which grows to minutes).
   */
  void streamEnded(Status status) {
    if (status.getCode() == Status.Code.UNAVAILABLE) {
      endpoints.failover(endpoints.index());
    }
    endpoints.resetConnectBackoff();
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

  /** Enqueues {@code payload} to {@code queue} with {@code options}. */
  public EnqueueResponse enqueue(String queue, byte[] payload, EnqueueOptions options) {
    return enqueue(options.toRequest(queue, payload));
  }

  /**
   * Enqueues one job with every field of {@link EnqueueRequest}. Goes through the producer
   * middleware; retried on UNAVAILABLE only with a dedup key (see the class comment).
   */
  public EnqueueResponse enqueue(EnqueueRequest request) {
    return enqueueThrough(0, request);
  }

  private EnqueueResponse enqueueThrough(int index, EnqueueRequest request) {
    if (index == producerMiddleware.size()) {
      return call(!request.getDedupKey().isEmpty(), () -> broker().enqueue(request));
    }
    return producerMiddleware.get(index).enqueue(request, r -> enqueueThrough(index + 1, r));
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
      return call(allKeyed, () -> broker().enqueueBatch(batch).getResultsList());
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
    return enqueueAndWait(options.toRequest(queue, payload), timeout);
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
      AdminGrpc.AdminBlockingStub stub = admin();
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
        if (e.getStatus().getCode() != Status.Code.UNAVAILABLE
            || ++unavailableInARow >= options.retryAttempts()) {
          throw e;
        }
        endpoints.failover(endpoints.index());
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
    return call(false, () -> broker().lease(request));
  }

  /** Extends a lease (and saves a checkpoint or progress). FAILED_PRECONDITION if stale. */
  public HeartbeatResponse heartbeat(HeartbeatRequest request) {
    return call(true, () -> broker().heartbeat(request));
  }

  /** Completes a leased job. FAILED_PRECONDITION if the lease is stale. */
  public AckResponse ack(AckRequest request) {
    return call(true, () -> broker().ack(request));
  }

  /** Fails the attempt. FAILED_PRECONDITION if the lease is stale. */
  public FailResponse fail(FailRequest request) {
    return call(true, () -> broker().fail(request));
  }

  /** Gives a leased job back unstarted (with a delay: snooze). */
  public ReleaseResponse release(ReleaseRequest request) {
    return call(true, () -> broker().release(request));
  }

  // ---- Admin API ----

  /** The job as the Admin service shows it. NOT_FOUND for an unknown id. */
  public Job getJob(String jobId) {
    return call(true, () -> admin().getJob(GetJobRequest.newBuilder().setJobId(jobId).build()));
  }

  /**
   * The job now, then one message per change, ending after its terminal state. The iterator
   * throws {@link StatusRuntimeException} (NOT_FOUND, UNAVAILABLE: watch again). Not retried.
   */
  public Iterator<Job> watchJob(String jobId) {
    return admin().watchJob(WatchJobRequest.newBuilder().setJobId(jobId).build());
  }

  /** One page of a queue's jobs (state, page size, token, order, dedup key in the request). */
  public ListJobsResponse listJobs(ListJobsRequest request) {
    return call(true, () -> admin().listJobs(request));
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
    return call(
        false, () -> admin().cancelJob(CancelJobRequest.newBuilder().setJobId(jobId).build()));
  }

  /** A FAILED or CANCELLED job back to READY. Sent once. */
  public Job retryJob(String jobId) {
    return call(
            false, () -> admin().retryJob(RetryJobRequest.newBuilder().setJobId(jobId).build()))
        .getJob();
  }

  /** Any form of RetryJob, e.g. the bulk redrive of a queue's dead jobs. Sent once. */
  public RetryJobResponse retryJobs(RetryJobRequest request) {
    return call(false, () -> admin().retryJob(request));
  }

  /** Removes a job that is not ACTIVE. Sent once. */
  public void deleteJob(String jobId) {
    call(false, () -> admin().deleteJob(DeleteJobRequest.newBuilder().setJobId(jobId).build()));
  }

  /** Every known queue. */
  public List<QueueInfo> listQueues() {
    return call(true, () -> admin().listQueues(ListQueuesRequest.getDefaultInstance()))
        .getQueuesList();
  }

  /** A queue's effective policy and counts. NOT_FOUND for an unknown queue. */
  public QueueInfo getQueue(String queue) {
    return call(true, () -> admin().getQueue(GetQueueRequest.newBuilder().setQueue(queue).build()));
  }

  /** Sets the fields of {@code policy} that are set; creates the queue if new. */
  public QueueInfo updateQueuePolicy(String queue, QueuePolicy policy) {
    return updateQueuePolicy(
        UpdateQueuePolicyRequest.newBuilder().setQueue(queue).setPolicy(policy).build());
  }

  /** Any form of UpdateQueuePolicy (with {@code reset}, say). */
  public QueueInfo updateQueuePolicy(UpdateQueuePolicyRequest request) {
    return call(true, () -> admin().updateQueuePolicy(request));
  }

  /** Stops leasing from {@code queue}; enqueues are still accepted. */
  public QueueInfo pauseQueue(String queue) {
    return call(
        true, () -> admin().pauseQueue(PauseQueueRequest.newBuilder().setQueue(queue).build()));
  }

  /** Leases from {@code queue} again. */
  public QueueInfo resumeQueue(String queue) {
    return call(
        true, () -> admin().resumeQueue(ResumeQueueRequest.newBuilder().setQueue(queue).build()));
  }

  /** Removes the queue's jobs in {@code states} (none: every terminal state); how many. */
  public long purgeQueue(String queue, JobState... states) {
    PurgeQueueRequest request =
        PurgeQueueRequest.newBuilder().setQueue(queue).addAllStates(List.of(states)).build();
    return call(false, () -> admin().purgeQueue(request)).getPurged();
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
            admin()
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
            () -> admin().listSchedules(ListSchedulesRequest.newBuilder().setQueue(queue).build()))
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
   * Runs a unary call; on UNAVAILABLE moves to the next address and, when {@code safeToRepeat},
   * tries again up to the options' attempts.
   */
  private <T> T call(boolean safeToRepeat, Supplier<T> rpc) {
    int attempts = safeToRepeat ? options.retryAttempts() : 1;
    Duration pause = options.retryBackoff();
    for (int attempt = 1; ; attempt++) {
      int at = endpoints.index();
      try {
        return rpc.get();
      } catch (StatusRuntimeException e) {
        if (e.getStatus().getCode() != Status.Code.UNAVAILABLE) {
          throw e;
        }
        endpoints.failover(at);
        if (attempt >= attempts) {
          throw e;
        }
        pause(pause, e);
        pause = pause.multipliedBy(2);
      }
    }
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

  /** Closes the channels if this client opened them, waiting up to 5 s for calls to finish. */
  @Override
  public void close() {
    if (ownsChannels) {
      endpoints.shutdown();
    }
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

  /**
   * The addresses of the options, one channel each (made at first use), and which one calls go
   * to now. A Channel itself, so stubs and the Work stream follow a failover without knowing it.
   */
  private static final class Endpoints extends Channel {
    private final List<String> addresses;
    private final ChannelCredentials credentials;
    private final ManagedChannel[] channels; // guarded by this
    private final AtomicInteger index = new AtomicInteger();

    Endpoints(List<String> addresses, ChannelCredentials credentials, ManagedChannel given) {
      this.addresses = addresses;
      this.credentials = credentials;
      this.channels = new ManagedChannel[addresses.size()];
      if (given != null) {
        channels[0] = given;
      }
    }

    int index() {
      return index.get();
    }

    synchronized ManagedChannel current() {
      int i = index.get();
      if (channels[i] == null) {
        channels[i] = Grpc.newChannelBuilder(addresses.get(i), credentials).build();
      }
      return channels[i];
    }

    /** Calls that used address {@code from} met UNAVAILABLE: the next one, once per failure. */
    void failover(int from) {
      if (addresses.size() > 1) {
        index.compareAndSet(from, (from + 1) % addresses.size());
      }
    }

    synchronized void resetConnectBackoff() {
      for (ManagedChannel c : channels) {
        if (c != null) {
          c.resetConnectBackoff();
        }
      }
    }

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> newCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions options) {
      return current().newCall(method, options);
    }

    @Override
    public String authority() {
      return current().authority();
    }

    synchronized void shutdown() {
      for (ManagedChannel c : channels) {
        if (c != null) {
          c.shutdown();
        }
      }
      try {
        for (ManagedChannel c : channels) {
          if (c != null && !c.awaitTermination(5, TimeUnit.SECONDS)) {
            c.shutdownNow();
          }
        }
      } catch (InterruptedException e) {
        for (ManagedChannel c : channels) {
          if (c != null) {
            c.shutdownNow();
          }
        }
        Thread.currentThread().interrupt();
      }
    }
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
