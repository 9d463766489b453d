package dev.jobbroker.client;

import com.google.protobuf.ByteString;
import dev.jobbroker.v1.AdminGrpc;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.EnqueueBatchRequest;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import dev.jobbroker.v1.GetJobRequest;
import dev.jobbroker.v1.Job;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ForwardingClientCall;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A connection to one broker: the generated stubs plus a few conveniences.
 *
 * <pre>{@code
 * try (JobBrokerClient client = JobBrokerClient.connect("127.0.0.1:7070")) {
 *   EnqueueResponse r = client.enqueue("emails", "alice@example.com");
 *   Job job = client.getJob(r.getJobId());
 * }
 * }</pre>
 *
 * <p>Thread-safe: one client (one channel) serves the whole process. Every call throws
 * {@link io.grpc.StatusRuntimeException} on failure; its {@code getStatus().getCode()} is the
 * broker's code (INVALID_ARGUMENT for a malformed field, FAILED_PRECONDITION for a stale lease,
 * ALREADY_EXISTS for a dedup key held with another payload, ...).
 */
public final class JobBrokerClient implements AutoCloseable {
  /** The address used when neither an argument nor $JOBBROKER_ADDRESS names one. */
  public static final String DEFAULT_ADDRESS = "127.0.0.1:7070";

  /** This library's version, sent with every call (see {@link #CLIENT_HEADER}). */
  public static final String VERSION = "0.1.0";

  /**
   * The call metadata that names the library to the broker ("jobbroker-java/VERSION"), which
   * Admin.ListWorkers shows for each worker.
   */
  public static final Metadata.Key<String> CLIENT_HEADER =
      Metadata.Key.of("jobbroker-client", Metadata.ASCII_STRING_MARSHALLER);

  private final ManagedChannel channel;
  private final Channel calls; // channel with CLIENT_HEADER on every call
  private final boolean ownsChannel;

  private JobBrokerClient(ManagedChannel channel, boolean ownsChannel) {
    this.channel = channel;
    this.calls = ClientInterceptors.intercept(channel, new NamesTheLibrary());
    this.ownsChannel = ownsChannel;
  }

  /** Adds CLIENT_HEADER to the metadata of every call. */
  private static final class NamesTheLibrary implements ClientInterceptor {
    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          headers.put(CLIENT_HEADER, "jobbroker-java/" + VERSION);
          super.start(listener, headers);
        }
      };
    }
  }

  /** Dials {@code target} ("host:port", plaintext). The connection is made lazily. */
  public static JobBrokerClient connect(String target) {
    return new JobBrokerClient(
        Grpc.newChannelBuilder(target, InsecureChannelCredentials.create()).build(), true);
  }

  /** Dials {@code host:port} (plaintext). */
  public static JobBrokerClient connect(String host, int port) {
    return connect(host + ":" + port);
  }

  /** Dials $JOBBROKER_ADDRESS, else {@link #DEFAULT_ADDRESS}. */
  public static JobBrokerClient connectFromEnv() {
    return connect(addressFromEnv());
  }

  /** Uses a channel the caller owns; {@link #close()} leaves it open. */
  public static JobBrokerClient wrap(ManagedChannel channel) {
    return new JobBrokerClient(channel, false);
  }

  /** $JOBBROKER_ADDRESS, else {@link #DEFAULT_ADDRESS}. */
  public static String addressFromEnv() {
    String env = System.getenv("JOBBROKER_ADDRESS");
    return env == null || env.isEmpty() ? DEFAULT_ADDRESS : env;
  }

  /** The underlying channel (calls made on it directly do not carry CLIENT_HEADER). */
  public ManagedChannel channel() {
    return channel;
  }

  /** The producer and worker API, blocking. */
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

  /** Enqueues {@code payload} (UTF-8) to {@code queue} with the queue's defaults. */
  public EnqueueResponse enqueue(String queue, String payload) {
    return enqueue(queue, payload.getBytes(StandardCharsets.UTF_8));
  }

  /** Enqueues {@code payload} to {@code queue} with the queue's defaults. */
  public EnqueueResponse enqueue(String queue, byte[] payload) {
    return enqueue(
        EnqueueRequest.newBuilder().setQueue(queue).setPayload(ByteString.copyFrom(payload)).build());
  }

  /**
   * Enqueues one job with every option of {@link EnqueueRequest} (headers, priority, delay or
   * run_at, dedup_key, dedup_ttl, max_attempts, lease_duration, concurrency_key).
   */
  public EnqueueResponse enqueue(EnqueueRequest request) {
    return broker().enqueue(request);
  }

  /** Enqueues 1 to 1000 jobs, all or nothing; results come in the order of {@code requests}. */
  public List<EnqueueResponse> enqueueBatch(List<EnqueueRequest> requests) {
    return broker()
        .enqueueBatch(EnqueueBatchRequest.newBuilder().addAllJobs(requests).build())
        .getResultsList();
  }

  /** The job as the Admin service shows it. NOT_FOUND for an unknown id. */
  public Job getJob(String jobId) {
    return admin().getJob(GetJobRequest.newBuilder().setJobId(jobId).build());
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

  /** Closes the channel if this client opened it, waiting up to 5 s for calls to finish. */
  @Override
  public void close() {
    if (!ownsChannel) {
      return;
    }
    channel.shutdown();
    try {
      if (!channel.awaitTermination(5, TimeUnit.SECONDS)) {
        channel.shutdownNow();
      }
    } catch (InterruptedException e) {
      channel.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }
}
