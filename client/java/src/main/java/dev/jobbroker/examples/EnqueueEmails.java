package dev.jobbroker.examples;

import com.google.protobuf.ByteString;
import dev.jobbroker.client.JobBrokerClient;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import io.grpc.StatusRuntimeException;
import java.time.Duration;

/**
 * Enqueues one welcome email per argument (a recipient address) to $EMAIL_QUEUE ("emails"), with
 * a dedup key per address so that running it twice sends nothing twice.
 *
 * <p>Run: {@code mvn -q exec:java -Dexec.mainClass=dev.jobbroker.examples.EnqueueEmails
 * -Dexec.args="alice@example.com flaky-bob@example.com not-an-address"}
 */
public final class EnqueueEmails {
  public static void main(String[] args) {
    String queue = System.getenv().getOrDefault("EMAIL_QUEUE", "emails");
    try (JobBrokerClient client = JobBrokerClient.connectFromEnv()) {
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
}
