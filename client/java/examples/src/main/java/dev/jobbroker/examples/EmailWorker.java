package dev.jobbroker.examples;

import dev.jobbroker.client.ClientOptions;
import dev.jobbroker.client.JobBrokerClient;
import dev.jobbroker.client.JobContext;
import dev.jobbroker.client.PermanentError;
import dev.jobbroker.client.Worker;
import java.io.IOException;
import java.nio.file.Path;
import java.time.Duration;

/**
 * A worker that "sends" welcome emails. Each job's payload is a recipient address.
 *
 * <ul>
 *   <li>An address without '@' can never be sent: the job fails permanently.
 *   <li>An address starting with "flaky" times out on its first attempt: the attempt fails and the
 *       broker retries it after the queue's backoff.
 *   <li>Sending takes EMAIL_SEND_MILLIS; the worker heartbeats meanwhile, so a long send keeps a
 *       short lease.
 *   <li>SIGTERM or SIGINT: take no new jobs, give back those not started, finish the running ones
 *       (up to 30 s), exit 0.
 * </ul>
 *
 * <p>Run (in client/java/examples): {@code JOBBROKER_ADDRESS=127.0.0.1:7070 mvn -q compile
 * exec:java} (or {@code java -cp ... dev.jobbroker.examples.EmailWorker}). Settings come from the
 * environment: JOBBROKER_ADDRESS, JOBBROKER_TOKEN, JOBBROKER_CA (a CA certificate: TLS),
 * EMAIL_QUEUE (default "emails"), EMAIL_CONCURRENCY (2), EMAIL_PREFETCH (0), EMAIL_SEND_MILLIS
 * (200).
 */
public final class EmailWorker {
  private final long sendMillis;

  private EmailWorker(long sendMillis) {
    this.sendMillis = sendMillis;
  }

  /** Runs one attempt: returning acks the job (the text is its result), throwing fails it. */
  private String send(JobContext job) throws Exception {
    String to = job.payloadText().trim();
    if (!to.contains("@")) {
      throw new PermanentError("invalid address: \"" + to + "\"");
    }
    log("sending job=%s to=%s attempt=%d", job.jobId(), to, job.attempt());
    if (job.sleepUnlessCancelled(sendMillis)) {
      throw new IOException("send interrupted: " + job.cancellation());
    }
    if (to.startsWith("flaky") && job.attempt() == 1) {
      throw new IOException("provider timed out sending to " + to);
    }
    // A real provider gets job.idempotencyKey() so that a repeated attempt sends nothing twice.
    log("sent job=%s to=%s key=%s", job.jobId(), to, job.idempotencyKey());
    return "sent to " + to;
  }

  public static void main(String[] args) throws Exception {
    String queue = env("EMAIL_QUEUE", "emails");
    int concurrency = Integer.parseInt(env("EMAIL_CONCURRENCY", "2"));
    int prefetch = Integer.parseInt(env("EMAIL_PREFETCH", "0"));
    EmailWorker emails = new EmailWorker(Long.parseLong(env("EMAIL_SEND_MILLIS", "200")));

    try (JobBrokerClient client = JobBrokerClient.connect(optionsFromEnv())) {
      Worker worker =
          Worker.builder(client)
              .handle(queue, emails::send)
              .concurrency(concurrency)
              .prefetch(prefetch)
              .grace(Duration.ofSeconds(30))
              .build();
      worker.stopOnSignal();
      worker.start(); // throws StatusRuntimeException if the broker refuses the subscription
      log("ready queue=%s concurrency=%d client=jobbroker-java/%s", queue, concurrency,
          JobBrokerClient.VERSION);
      worker.awaitTermination();
      log("stopped %s", worker.stats());
    }
  }

  private static String env(String name, String fallback) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? fallback : v;
  }

  private static synchronized void log(String format, Object... args) {
    System.out.println("email-worker: " + String.format(format, args));
    System.out.flush();
  }

  /**
   * $JOBBROKER_ADDRESS and $JOBBROKER_TOKEN (read by the options themselves), plus TLS trusting
   * the CA certificate of $JOBBROKER_CA when it is set.
   */
  static ClientOptions optionsFromEnv() {
    ClientOptions.Builder options = ClientOptions.builder();
    String ca = System.getenv("JOBBROKER_CA");
    if (ca != null && !ca.isEmpty()) {
      options.tlsCaFile(Path.of(ca));
    }
    return options.build();
  }
}
