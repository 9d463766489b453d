package dev.jobbroker.spring;

import java.time.Duration;
import org.springframework.boot.context.properties.ConfigurationProperties;

/**
 * The {@code jobbroker.*} properties. Each one left unset keeps the client's default (for the
 * address and the token: $JOBBROKER_ADDRESS and $JOBBROKER_TOKEN, as
 * {@link dev.jobbroker.client.ClientOptions} reads them).
 */
@ConfigurationProperties("jobbroker")
public class JobBrokerProperties {

  /**
   * The broker, "host:port"; a comma-separated list is a cluster's nodes. Unset:
   * $JOBBROKER_ADDRESS, else 127.0.0.1:7070.
   */
  private String address;

  /** Sent as "authorization: Bearer TOKEN" with every call. Unset: $JOBBROKER_TOKEN, else none. */
  private String token;

  /** The deadline of every unary call that sets none; zero for none. Client default: 10 s. */
  private Duration defaultDeadline;

  private final Tls tls = new Tls();

  private final Batch batch = new Batch();

  private final Keepalive keepalive = new Keepalive();

  private final Worker worker = new Worker();

  public String getAddress() {
    return address;
  }

  public void setAddress(String address) {
    this.address = address;
  }

  public String getToken() {
    return token;
  }

  public void setToken(String token) {
    this.token = token;
  }

  public Duration getDefaultDeadline() {
    return defaultDeadline;
  }

  public void setDefaultDeadline(Duration defaultDeadline) {
    this.defaultDeadline = defaultDeadline;
  }

  public Tls getTls() {
    return tls;
  }

  public Batch getBatch() {
    return batch;
  }

  public Keepalive getKeepalive() {
    return keepalive;
  }

  public Worker getWorker() {
    return worker;
  }

  /** TLS: a CA to trust, and for mutual TLS a client certificate with its key (PEM files). */
  public static class Tls {

    /** PEM file of the CA certificates to trust (the issuer of the broker's --tls-cert). */
    private String ca;

    /** PEM file of the client certificate chain presented to a broker with --tls-client-ca. */
    private String cert;

    /** PEM file (PKCS#8) of the client certificate's private key. */
    private String key;

    public String getCa() {
      return ca;
    }

    public void setCa(String ca) {
      this.ca = ca;
    }

    public String getCert() {
      return cert;
    }

    public void setCert(String cert) {
      this.cert = cert;
    }

    public String getKey() {
      return key;
    }

    public void setKey(String key) {
      this.key = key;
    }
  }

  /**
   * Enqueue coalescing: concurrent {@code enqueue()} calls merged into EnqueueBatch calls. Each
   * number left unset keeps the client's default.
   */
  public static class Batch {

    /** False: every enqueue is its own unary Enqueue call. */
    private boolean enabled = true;

    /** A batch is sent once it holds this many jobs, 1 to 1000. Client default: 100. */
    private Integer maxJobs;

    /** ... or once its jobs' payload and header bytes reach this. Client default: 1 MiB. */
    private Long maxBytes;

    /** How long a batch that could be sent waits for more jobs. Client default: 0. */
    private Duration linger;

    /** Batches of one partition in flight at once. Client default: 4. */
    private Integer maxInFlight;

    public boolean isEnabled() {
      return enabled;
    }

    public void setEnabled(boolean enabled) {
      this.enabled = enabled;
    }

    public Integer getMaxJobs() {
      return maxJobs;
    }

    public void setMaxJobs(Integer maxJobs) {
      this.maxJobs = maxJobs;
    }

    public Long getMaxBytes() {
      return maxBytes;
    }

    public void setMaxBytes(Long maxBytes) {
      this.maxBytes = maxBytes;
    }

    public Duration getLinger() {
      return linger;
    }

    public void setLinger(Duration linger) {
      this.linger = linger;
    }

    public Integer getMaxInFlight() {
      return maxInFlight;
    }

    public void setMaxInFlight(Integer maxInFlight) {
      this.maxInFlight = maxInFlight;
    }
  }

  /**
   * Keepalive pings on the client's channels (the worker's Work streams included), by which a
   * broker that froze or went silent is noticed and its connection given up. Each duration left
   * unset keeps the client's default.
   */
  public static class Keepalive {

    /** False: no pings. */
    private boolean enabled = true;

    /**
     * A ping after this long without a frame from the broker (gRPC raises less than 10 s to
     * 10 s). Client default: 10 s.
     */
    private Duration time;

    /**
     * How long a ping waits for its answer before the connection is given up. Client default:
     * 5 s.
     */
    private Duration timeout;

    public boolean isEnabled() {
      return enabled;
    }

    public void setEnabled(boolean enabled) {
      this.enabled = enabled;
    }

    public Duration getTime() {
      return time;
    }

    public void setTime(Duration time) {
      this.time = time;
    }

    public Duration getTimeout() {
      return timeout;
    }

    public void setTimeout(Duration timeout) {
      this.timeout = timeout;
    }
  }

  /** The worker that runs the context's {@link JobBrokerHandler} beans. */
  public static class Worker {

    /** False: no worker even when handler beans exist. */
    private boolean enabled = true;

    /** Handlers running at once. */
    private int concurrency = 1;

    /** Jobs held beyond the concurrency so a freed handler need not wait for a push. */
    private int prefetch = 0;

    /** How long running handlers may finish when the context closes. */
    private Duration grace = Duration.ofSeconds(30);

    public boolean isEnabled() {
      return enabled;
    }

    public void setEnabled(boolean enabled) {
      this.enabled = enabled;
    }

    public int getConcurrency() {
      return concurrency;
    }

    public void setConcurrency(int concurrency) {
      this.concurrency = concurrency;
    }

    public int getPrefetch() {
      return prefetch;
    }

    public void setPrefetch(int prefetch) {
      this.prefetch = prefetch;
    }

    public Duration getGrace() {
      return grace;
    }

    public void setGrace(Duration grace) {
      this.grace = grace;
    }
  }
}
