package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.OptionalInt;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * The client against a real 3-node cluster of 4 partitions: each call goes straight to its
 * partition's leader, and calls and the Worker follow a leader that dies. The test that kills a
 * node runs last.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class ClusterRoutingTest {
  private static final int PARTITIONS = 4;
  private static final Duration GIVE_UP = Duration.ofSeconds(60);

  private static ClusterProcess cluster;

  private JobBrokerClient client;
  // The node address of the latest call of each method ("jobbroker.v1.Broker/Enqueue").
  private final Map<String, String> sentTo = new ConcurrentHashMap<>();

  @BeforeAll
  static void startCluster() throws Exception {
    cluster = ClusterProcess.start(PARTITIONS);
  }

  @AfterAll
  static void stopCluster() throws Exception {
    if (cluster != null) {
      cluster.close();
    }
  }

  @AfterEach
  void closeClient() {
    if (client != null) {
      client.close();
    }
  }

  private JobBrokerClient connect() {
    client =
        JobBrokerClient.connect(
            ClientOptions.builder()
                .addresses(cluster.addresses)
                .retries(5, Duration.ofMillis(100))
                .defaultDeadline(Duration.ofSeconds(10))
                .build());
    client.onCallSentForTest(sentTo::put);
    return client;
  }

  /** A queue name that lives in {@code partition}. */
  private static String queueOf(int partition, String prefix) {
    for (int i = 0; ; i++) {
      if (Partitions.ofQueue(prefix + i, PARTITIONS) == partition) {
        return prefix + i;
      }
    }
  }

  @Test
  @Order(1)
  void eachCallGoesToTheLeaderOfItsPartition() {
    JobBrokerClient client = connect();
    ClusterInfo info = client.getCluster();
    for (int p = 0; p < PARTITIONS; p++) {
      String leader = ClusterProcess.leaderAddress(info, p);
      String queue = queueOf(p, "routed-");

      String id = client.enqueue(queue, "x").getJobId();
      assertEquals(leader, sentTo.get("jobbroker.v1.Broker/Enqueue"), "enqueue to " + queue);
      assertEquals(OptionalInt.of(p), Partitions.ofJobId(id, PARTITIONS), "the id of " + id);

      assertEquals(JobState.JOB_STATE_READY, client.getJob(id).getState());
      assertEquals(leader, sentTo.get("jobbroker.v1.Admin/GetJob"), "get of " + id);

      client.pauseQueue(queue);
      assertEquals(leader, sentTo.get("jobbroker.v1.Admin/PauseQueue"), "pause of " + queue);
      assertEquals(1L, client.getQueue(queue).getCountsOrDefault("JOB_STATE_READY", 0));
      assertEquals(leader, sentTo.get("jobbroker.v1.Admin/GetQueue"), "get of " + queue);
    }
  }

  @Test
  @Order(2)
  void callsAndTheWorkerFollowALeaderThatDies() throws Exception {
    JobBrokerClient client = connect();
    String queue = queueOf(1, "failover-");
    Worker worker = Worker.builder(client).handle(queue, job -> "done").build();
    worker.start();
    try {
      List<String> acked = new ArrayList<>();
      for (int i = 0; i < 3; i++) {
        String id =
            client
                .enqueue(queue, "before", new EnqueueOptions().dedupKey("before-" + i))
                .getJobId();
        assertEquals(JobState.JOB_STATE_COMPLETED, client.awaitJob(id, GIVE_UP).getState());
        acked.add(id);
      }
      String leader = ClusterProcess.leaderAddress(client.getCluster(), 1);
      assertEquals(leader, sentTo.get("jobbroker.v1.Broker/Work"), "the worker's stream");

      cluster.kill9(leader);

      // Until the enqueue succeeds and went to the partition's leader as the cluster names it
      // (while the partition has no leader, the call goes to a node that forwards it).
      long giveUp = System.nanoTime() + GIVE_UP.toNanos();
      String id = null;
      String newLeader = "";
      while (id == null || !newLeader.equals(sentTo.get("jobbroker.v1.Broker/Enqueue"))) {
        if (System.nanoTime() > giveUp) {
          throw new AssertionError(
              "no enqueue reached the new leader within 60 s; last sent to "
                  + sentTo.get("jobbroker.v1.Broker/Enqueue")
                  + ", leader "
                  + newLeader);
        }
        try {
          id = client.enqueue(queue, "after", new EnqueueOptions().dedupKey("after")).getJobId();
          newLeader = ClusterProcess.leaderAddress(client.getCluster(), 1);
        } catch (StatusRuntimeException e) {
          TimeUnit.MILLISECONDS.sleep(200); // between leaders: UNAVAILABLE until one takes over
        }
      }
      assertNotEquals(leader, newLeader);
      assertFalse(newLeader.isEmpty());

      for (String before : acked) {
        assertEquals(JobState.JOB_STATE_COMPLETED, client.getJob(before).getState(), before);
      }
      Job after = client.awaitJob(id, GIVE_UP);
      assertEquals("done", after.getResult().toStringUtf8());
    } finally {
      worker.stop(Duration.ofSeconds(5));
    }
  }
}
