package dev.jobbroker.client;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

/**
 * How a {@link JobBrokerClient} (and so every {@link Worker} built on it) reaches the broker:
 * where, over what transport, with which credentials, deadlines and keepalive pings. Immutable;
 * made with {@link #builder()}.
 *
 * <pre>{@code
 * ClientOptions options = ClientOptions.builder()
 *     .addresses("10.0.0.1:7070", "10.0.0.2:7070")     // a cluster's nodes
 *     .tlsCaFile(Path.of("ca.pem"))                     // TLS, trusting this CA
 *     .clientCertificate(Path.of("me.pem"), Path.of("me.key"))   // mutual TLS
 *     .token(System.getenv("JOBBROKER_TOKEN"))          // authorization: Bearer ...
 *     .defaultDeadline(Duration.ofSeconds(5))
 *     .build();
 * try (JobBrokerClient client = JobBrokerClient.connect(options)) { ... }
 * }</pre>
 *
 * <p>Unset, the address comes from $JOBBROKER_ADDRESS (else {@link #DEFAULT_ADDRESS}) and the
 * token from $JOBBROKER_TOKEN (else none), so a program configured by its environment needs no
 * code for it.
 */
public final class ClientOptions {
  /** The address used when neither the options nor $JOBBROKER_ADDRESS name one. */
  public static final String DEFAULT_ADDRESS = "127.0.0.1:7070";
  /** The deadline of a unary call that names none: long enough for a synced write. */
  public static final Duration DEFAULT_DEADLINE = Duration.ofSeconds(10);
  /** Attempts of a call that is safe to repeat, the first included, when it meets UNAVAILABLE. */
  public static final int DEFAULT_RETRY_ATTEMPTS = 3;
  /** A coalesced batch is sent once it holds this many jobs. */
  public static final int DEFAULT_BATCH_MAX_JOBS = 100;
  /** ... or once its jobs' payload and header bytes reach this (1 MiB). */
  public static final long DEFAULT_BATCH_MAX_BYTES = 1L << 20;
  /** Batches of one key (partition, dedup key or not) in flight at once. */
  public static final int DEFAULT_BATCH_MAX_IN_FLIGHT = 4;
  /** The broker's limit on the jobs of one EnqueueBatch. */
  static final int MAX_BATCH_JOBS = 1000;
  /** How long a channel goes without a frame from the broker before it pings it. */
  public static final Duration DEFAULT_KEEPALIVE_TIME = Duration.ofSeconds(10);
  /** How long a ping waits for its answer before the connection is given up. */
  public static final Duration DEFAULT_KEEPALIVE_TIMEOUT = Duration.ofSeconds(5);

  private final List<String> addresses;
  private final boolean tls;
  private final byte[] caPem;
  private final byte[] certPem;
  private final byte[] keyPem;
  private final String token;
  private final Duration defaultDeadline;
  private final int retryAttempts;
  private final Duration retryBackoff;
  private final boolean batching;
  private final int batchMaxJobs;
  private final long batchMaxBytes;
  private final Duration batchLinger;
  private final int batchMaxInFlight;
  private final boolean keepalive;
  private final Duration keepaliveTime;
  private final Duration keepaliveTimeout;

  /** "a:1, b:2" as [a:1, b:2]: one setting names every node of a cluster. */
  static List<String> splitAddresses(String list) {
    List<String> out = new ArrayList<>();
    for (String a : list.split(",")) {
      if (!a.isBlank()) {
        out.add(a.strip());
      }
    }
    if (out.isEmpty()) {
      out.add(list);
    }
    return out;
  }

  private ClientOptions(Builder b) {
    List<String> addrs = new ArrayList<>(b.addresses);
    if (addrs.isEmpty()) {
      addrs.addAll(splitAddresses(envOr("JOBBROKER_ADDRESS", DEFAULT_ADDRESS)));
    }
    this.addresses = List.copyOf(addrs);
    this.tls = b.tls || b.caPem != null || b.certPem != null;
    this.caPem = b.caPem;
    this.certPem = b.certPem;
    this.keyPem = b.keyPem;
    this.token = b.token != null ? b.token : envOr("JOBBROKER_TOKEN", null);
    this.defaultDeadline = b.defaultDeadline;
    this.retryAttempts = b.retryAttempts;
    this.retryBackoff = b.retryBackoff;
    this.batching = b.batching;
    this.batchMaxJobs = b.batchMaxJobs;
    this.batchMaxBytes = b.batchMaxBytes;
    this.batchLinger = b.batchLinger;
    this.batchMaxInFlight = b.batchMaxInFlight;
    this.keepalive = b.keepalive;
    this.keepaliveTime = b.keepaliveTime;
    this.keepaliveTimeout = b.keepaliveTimeout;
  }

  public static Builder builder() {
    return new Builder();
  }

  /** Options from the environment alone: $JOBBROKER_ADDRESS, $JOBBROKER_TOKEN, plaintext. */
  public static ClientOptions fromEnv() {
    return builder().build();
  }

  /** The brokers to try, in order; never empty. */
  public List<String> addresses() {
    return addresses;
  }

  /** True for TLS (with a CA or client certificate, or {@link Builder#tls()}). */
  public boolean tls() {
    return tls;
  }

  /** The trusted CA certificates (PEM), or null for the system's roots. */
  public byte[] caPem() {
    return caPem == null ? null : caPem.clone();
  }

  /** The client certificate chain (PEM) of mutual TLS, or null. */
  public byte[] certPem() {
    return certPem == null ? null : certPem.clone();
  }

  /** The client certificate's private key (PEM, PKCS#8), or null. */
  public byte[] keyPem() {
    return keyPem == null ? null : keyPem.clone();
  }

  /** The bearer token sent with every call, or null. */
  public String token() {
    return token;
  }

  /** The deadline of unary calls that set none; zero = none. */
  public Duration defaultDeadline() {
    return defaultDeadline;
  }

  /** Attempts of a call safe to repeat (1 = no retry). */
  public int retryAttempts() {
    return retryAttempts;
  }

  /** The pause before the first retry; doubles for each next one. */
  public Duration retryBackoff() {
    return retryBackoff;
  }

  /**
   * True (the default) when concurrent single enqueues are merged into EnqueueBatch calls, each
   * caller still answered on its own ({@link JobBrokerClient}, "Enqueue coalescing").
   */
  public boolean batching() {
    return batching;
  }

  /** A coalesced batch is sent once it holds this many jobs (1 to 1000). */
  public int batchMaxJobs() {
    return batchMaxJobs;
  }

  /** ... or once its jobs' payload and header (name and value) bytes reach this. */
  public long batchMaxBytes() {
    return batchMaxBytes;
  }

  /** How long a batch that could be sent waits for more jobs; zero: not at all. */
  public Duration batchLinger() {
    return batchLinger;
  }

  /** Batches of one key in flight at once; later jobs wait in the open batch. */
  public int batchMaxInFlight() {
    return batchMaxInFlight;
  }

  /**
   * True (the default) when the client's channels ping the broker: see {@link
   * Builder#keepalive(Duration, Duration)}.
   */
  public boolean keepalive() {
    return keepalive;
  }

  /** How long a channel goes without a frame from the broker before it pings it. */
  public Duration keepaliveTime() {
    return keepaliveTime;
  }

  /** How long a ping waits for its answer before the connection is given up. */
  public Duration keepaliveTimeout() {
    return keepaliveTimeout;
  }

  private static String envOr(String name, String fallback) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? fallback : v;
  }

  /** Options of a client; every setter returns the builder. */
  public static final class Builder {
    private final List<String> addresses = new ArrayList<>();
    private boolean tls;
    private byte[] caPem;
    private byte[] certPem;
    private byte[] keyPem;
    private String token;
    private Duration defaultDeadline = DEFAULT_DEADLINE;
    private int retryAttempts = DEFAULT_RETRY_ATTEMPTS;
    private Duration retryBackoff = Duration.ofMillis(100);
    private boolean batching = true;
    private int batchMaxJobs = DEFAULT_BATCH_MAX_JOBS;
    private long batchMaxBytes = DEFAULT_BATCH_MAX_BYTES;
    private Duration batchLinger = Duration.ZERO;
    private int batchMaxInFlight = DEFAULT_BATCH_MAX_IN_FLIGHT;
    private boolean keepalive = true;
    private Duration keepaliveTime = DEFAULT_KEEPALIVE_TIME;
    private Duration keepaliveTimeout = DEFAULT_KEEPALIVE_TIMEOUT;

    private Builder() {}

    /**
     * The broker, "host:port"; a comma-separated list is taken as {@link #addresses(List)}, as
     * the other clients and the CLI take it. Replaces earlier addresses. Default
     * $JOBBROKER_ADDRESS (the same form).
     */
    public Builder address(String address) {
      addresses.clear();
      addresses.addAll(splitAddresses(Objects.requireNonNull(address, "address")));
      return this;
    }

    /**
     * Several brokers (a cluster's nodes), asked in order which node leads each partition: in a
     * cluster each call then goes to its partition's leader ({@link JobBrokerClient}). Outside a
     * cluster a call or Work stream that meets UNAVAILABLE goes to the next one that answers, and
     * later calls stay there. Replaces earlier addresses.
     */
    public Builder addresses(String... addresses) {
      return addresses(List.of(addresses));
    }

    /** As {@link #addresses(String...)}. */
    public Builder addresses(List<String> addresses) {
      if (addresses.isEmpty()) {
        throw new IllegalArgumentException("addresses must not be empty");
      }
      this.addresses.clear();
      this.addresses.addAll(addresses);
      return this;
    }

    /** TLS trusting the system's roots (implied by a CA or a client certificate). */
    public Builder tls() {
      tls = true;
      return this;
    }

    /** TLS trusting the CA certificates of this PEM file (the broker's --tls-cert issuer). */
    public Builder tlsCaFile(Path caFile) {
      caPem = read(caFile);
      return this;
    }

    /** TLS trusting these CA certificates (PEM text). */
    public Builder tlsCaPem(String pem) {
      caPem = pem.getBytes(StandardCharsets.UTF_8);
      return this;
    }

    /**
     * Mutual TLS: present this certificate chain (PEM) and its private key (PEM, PKCS#8: "BEGIN
     * PRIVATE KEY", what {@code openssl genpkey} writes) to a broker started with
     * --tls-client-ca.
     */
    public Builder clientCertificate(Path certFile, Path keyFile) {
      certPem = read(certFile);
      keyPem = read(keyFile);
      return this;
    }

    /** As {@link #clientCertificate(Path, Path)}, from PEM text. */
    public Builder clientCertificatePem(String certPem, String keyPem) {
      this.certPem = certPem.getBytes(StandardCharsets.UTF_8);
      this.keyPem = keyPem.getBytes(StandardCharsets.UTF_8);
      return this;
    }

    /** Sends "authorization: Bearer TOKEN" with every call. Default $JOBBROKER_TOKEN, else none. */
    public Builder token(String token) {
      this.token = token;
      return this;
    }

    /**
     * The deadline of every unary call that sets none (streams have none). Default 10 s; zero
     * for none. {@link JobBrokerClient#withDeadline} overrides it for some calls.
     */
    public Builder defaultDeadline(Duration d) {
      if (d.isNegative()) {
        throw new IllegalArgumentException("defaultDeadline must not be negative");
      }
      defaultDeadline = d;
      return this;
    }

    /**
     * How a call that is safe to repeat is retried on UNAVAILABLE: {@code attempts} in all (the
     * first included; 1 = never), pausing {@code backoff}, then twice that, ... Default 3,
     * 100 ms. Which calls are safe: {@link JobBrokerClient}.
     */
    public Builder retries(int attempts, Duration backoff) {
      if (attempts < 1) {
        throw new IllegalArgumentException("attempts must be at least 1");
      }
      retryAttempts = attempts;
      retryBackoff = Objects.requireNonNull(backoff);
      return this;
    }

    /**
     * Whether concurrent {@code enqueue()} calls are merged into EnqueueBatch calls (default
     * true). False: every enqueue is one unary Enqueue, as {@link EnqueueOptions#batch(boolean)}
     * makes it for one call.
     */
    public Builder batching(boolean on) {
      batching = on;
      return this;
    }

    /** A coalesced batch is sent once it holds this many jobs: 1 to 1000, default 100. */
    public Builder batchMaxJobs(int jobs) {
      if (jobs < 1 || jobs > MAX_BATCH_JOBS) {
        throw new IllegalArgumentException(
            "batchMaxJobs must be 1 to " + MAX_BATCH_JOBS + ", got " + jobs);
      }
      batchMaxJobs = jobs;
      return this;
    }

    /**
     * ... or once its jobs' payload and header (name and value) bytes reach this: at least 1,
     * default 1 MiB.
     */
    public Builder batchMaxBytes(long bytes) {
      if (bytes < 1) {
        throw new IllegalArgumentException("batchMaxBytes must be at least 1, got " + bytes);
      }
      batchMaxBytes = bytes;
      return this;
    }

    /**
     * How long a batch that could be sent waits for more jobs (default zero: it goes at once
     * from the caller's thread, and jobs gather only while earlier batches are in flight).
     */
    public Builder batchLinger(Duration linger) {
      Objects.requireNonNull(linger, "batchLinger");
      if (linger.isNegative()) {
        throw new IllegalArgumentException("batchLinger must not be negative, got " + linger);
      }
      batchLinger = linger;
      return this;
    }

    /**
     * Batches of one key (partition, with or without a dedup key) in flight at once; later jobs
     * wait in the open batch until one ends. At least 1, default 4.
     */
    public Builder batchMaxInFlight(int batches) {
      if (batches < 1) {
        throw new IllegalArgumentException("batchMaxInFlight must be at least 1, got " + batches);
      }
      batchMaxInFlight = batches;
      return this;
    }

    /**
     * Keepalive pings (HTTP/2 PING) on every channel the client makes, its workers' Work streams
     * included, so that a broker that froze, lost power or sits behind a firewall that drops
     * packets is noticed (TCP alone does not notice it): a ping goes out after {@code time}
     * without a frame from the broker, also while no call is open, and when its answer has not
     * come {@code timeout} later the connection is closed, its calls and streams end UNAVAILABLE,
     * and a {@link Worker} reconnects after its backoff (in a cluster, to another node). Both
     * positive; default 10 s and 5 s. gRPC raises a {@code time} below 10 s to 10 s. The broker
     * accepts pings as often as once a second. Turns the pings on if {@link #keepalive(boolean)}
     * turned them off.
     */
    public Builder keepalive(Duration time, Duration timeout) {
      Objects.requireNonNull(time, "keepaliveTime");
      Objects.requireNonNull(timeout, "keepaliveTimeout");
      if (time.isNegative() || time.isZero()) {
        throw new IllegalArgumentException("keepaliveTime must be positive, got " + time);
      }
      if (timeout.isNegative() || timeout.isZero()) {
        throw new IllegalArgumentException("keepaliveTimeout must be positive, got " + timeout);
      }
      keepalive = true;
      keepaliveTime = time;
      keepaliveTimeout = timeout;
      return this;
    }

    /**
     * Whether the client's channels send keepalive pings (default true, see {@link
     * #keepalive(Duration, Duration)}). False: none, gRPC's own default; a silent broker is then
     * noticed only when TCP gives up, if ever.
     */
    public Builder keepalive(boolean on) {
      keepalive = on;
      return this;
    }

    public ClientOptions build() {
      if ((certPem == null) != (keyPem == null)) {
        throw new IllegalArgumentException("a client certificate needs its key");
      }
      return new ClientOptions(this);
    }

    private static byte[] read(Path file) {
      try {
        return Files.readAllBytes(file);
      } catch (IOException e) {
        throw new UncheckedIOException("cannot read " + file, e);
      }
    }
  }
}
