package dev.jobbroker.examples;

import com.google.protobuf.ByteString;
import dev.jobbroker.client.ClientOptions;
import dev.jobbroker.client.JobBrokerClient;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import io.grpc.StatusRuntimeException;
import java.nio.file.Path;
import java.time.Duration;

/**
 * Enqueues one welcome email per argument (a recipient address) to $EMAIL_QUEUE ("emails"), with
 * a dedup key per address so that running it twice sends nothing twice.
 *
 * <p>Run (in client/java/examples): {@code mvn -q compile exec:java
 * -Dexec.mainClass=dev.jobbroker.examples.EnqueueEmails
 * -Dexec.args="alice@example.com flaky-bob@example.com not-an-address"}. The broker and its
 * credentials come from JOBBROKER_ADDRESS, JOBBROKER_TOKEN and JOBBROKER_CA (as for EmailWorker).
 */
public final class EnqueueEmails {
  public static void main(String[] args) {
    String queue = System.getenv().getOrDefault("EMAIL_QUEUE", "emails");
    try (JobBrokerClient client = JobBrokerClient.connect(optionsFromEnv())) {
      for (String to : args) {
        EnqueueRequest request =
            EnqueueRequest.newBuilder()
                .setQueue(queue)
                .setPayload(ByteString.copyFromUtf8(to))
                .putHeaders("content-type", "text/plain")
                .setDedupKey("welcome:" + to)
                .setDedupTtl(JobBrokerClient.toProto(Duration.ofHours(1)))
                .build();
        try {
          EnqueueResponse r = client.enqueue(request);
          System.out.printf(
              "%s %s%s%n", r.getJobId(), to, r.getDeduplicated() ? " (already queued)" : "");
        } catch (StatusRuntimeException e) {
          System.err.printf("%s: %s%n", to, e.getStatus());
          System.exit(1);
        }
      }
    }
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
