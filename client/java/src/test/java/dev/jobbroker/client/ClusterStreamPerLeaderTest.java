package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.JobState;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The Worker against a real 3-node cluster of 2 partitions led by different nodes: one Work
 * stream per leading node, none relayed (the nodes' {@code jobbroker_work_streams_relaying}
 * gauge), and after one leader dies the worker regroups onto the new leader without losing a
 * job (contract §5, "One stream per leading node").
 */
class ClusterStreamPerLeaderTest {
  private static final int PARTITIONS = 2;
  /** A give-up deadline, never a measure of speed. */
  private static final Duration GIVE_UP = Duration.ofSeconds(60);

  private static final String RELAYING = "jobbroker_work_streams_relaying";
  private static final String OPEN = "jobbroker_work_streams_open";

  private static ClusterProcess cluster;

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

  private static JobBrokerClient connect(List<String> addresses) {
    return JobBrokerClient.connect(
        ClientOptions.builder()
            .addresses(addresses)
            .retries(5, Duration.ofMillis(100))
            .defaultDeadline(Duration.ofSeconds(10))
            .build());
  }

  /** A queue name that lives in {@code partition}. */
  private static String queueOf(int partition, String prefix) {
    for (int i = 0; ; i++) {
      if (Partitions.ofQueue(prefix + i, PARTITIONS) == partition) {
        return prefix + i;
      }
    }
  }

  /**
   * The leaders' addresses by partition, once both partitions have one and on different nodes
   * (the controller moves leaders to their preferred nodes after a start).
   */
  private static List<String> differentLeaders(JobBrokerClient client) throws Exception {
    long giveUp = System.nanoTime() + GIVE_UP.toNanos();
    String last = "no answer";
    while (System.nanoTime() < giveUp) {
      try {
        ClusterInfo info = client.getCluster();
        last = info.toString();
        String a = ClusterProcess.leaderAddress(info, 0);
        String b = ClusterProcess.leaderAddress(info, 1);
        if (!a.isEmpty() && !b.isEmpty() && !a.equals(b)) {
          return List.of(a, b);
        }
      } catch (StatusRuntimeException e) {
        last = e.toString();
      }
      TimeUnit.MILLISECONDS.sleep(200);
    }
    throw new AssertionError("the partitions never had leaders on different nodes: " + last);
  }

  /** Enqueues {@code n} jobs on {@code queue}, retrying while its partition is between leaders. */
  private static List<String> enqueue(JobBrokerClient client, String queue, String tag, int n)
      throws InterruptedException {
    List<String> ids = new ArrayList<>();
    long giveUp = System.nanoTime() + GIVE_UP.toNanos();
    for (int i = 0; i < n; i++) {
      while (true) {
        try {
          // The dedup key makes a retry of a stored-but-unanswered enqueue the same job.
          ids.add(
              client
                  .enqueue(queue, "x", new EnqueueOptions().dedupKey(tag + "-" + i))
                  .getJobId());
          break;
        } catch (StatusRuntimeException e) {
          if (System.nanoTime() > giveUp) {
            throw e;
          }
          TimeUnit.MILLISECONDS.sleep(200);
        }
      }
    }
    return ids;
  }

  /** Waits for each job to complete, riding out a partition between leaders. */
  private static void awaitCompleted(JobBrokerClient client, List<String> ids)
      throws InterruptedException {
    long giveUp = System.nanoTime() + GIVE_UP.toNanos();
    for (String id : ids) {
      while (true) {
        try {
          assertEquals(
              JobState.JOB_STATE_COMPLETED,
              client.awaitJob(id, Duration.ofNanos(giveUp - System.nanoTime())).getState(),
              id);
          break;
        } catch (StatusRuntimeException e) {
          if (System.nanoTime() > giveUp) {
            throw new AssertionError("job " + id + " did not complete within 60 s", e);
          }
          TimeUnit.MILLISECONDS.sleep(200);
        }
      }
    }
  }

  @Test
  void oneStreamPerLeaderNoneRelayedAndRegroupedAfterALeaderDies() throws Exception {
    try (JobBrokerClient client = connect(cluster.addresses)) {
      List<String> leaders = differentLeaders(client);
      String leaderA = leaders.get(0);
      String leaderB = leaders.get(1);
      String neither =
          cluster.addresses.stream()
              .filter(a -> !leaders.contains(a))
              .findFirst()
              .orElseThrow();
      String queueA = queueOf(0, "per-leader-a-");
      String queueB = queueOf(1, "per-leader-b-");

      // The node that leads neither partition first: it would be the stream's node if the
      // worker held one stream for both queues.
      try (JobBrokerClient workerClient = connect(List.of(neither, leaderA, leaderB))) {
        Worker worker =
            Worker.builder(workerClient)
                .concurrency(4)
                .handle(queueA, job -> "a")
                .handle(queueB, job -> "b")
                .build();
        worker.start();
        try {
          List<String> first = new ArrayList<>(enqueue(client, queueA, "first", 10));
          first.addAll(enqueue(client, queueB, "first", 10));
          awaitCompleted(client, first);

          for (String node : cluster.addresses) {
            assertEquals(0.0, cluster.metric(node, RELAYING), "streams relayed by " + node);
          }
          assertTrue(cluster.metric(leaderA, OPEN) >= 1, "streams open on " + leaderA);
          assertTrue(cluster.metric(leaderB, OPEN) >= 1, "streams open on " + leaderB);
          assertEquals(0.0, cluster.metric(neither, OPEN), "streams open on " + neither);

          cluster.kill9(leaderA);

          List<String> later = new ArrayList<>(enqueue(client, queueA, "later", 10));
          later.addAll(enqueue(client, queueB, "later", 10));
          awaitCompleted(client, later);

          // Regrouped: queue A's stream is on its new leader, relayed by no node.
          List<String> alive = cluster.addresses.stream().filter(a -> !a.equals(leaderA)).toList();
          long giveUp = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
          while (true) {
            List<Double> relaying = new ArrayList<>();
            for (String node : alive) {
              relaying.add(cluster.metric(node, RELAYING));
            }
            if (relaying.stream().allMatch(v -> v == 0)) {
              break;
            }
            if (System.nanoTime() > giveUp) {
              throw new AssertionError(
                  "nodes " + alive + " still relay streams 30 s after the leader died: "
                      + relaying);
            }
            TimeUnit.MILLISECONDS.sleep(200);
          }
        } finally {
          worker.stop(Duration.ofSeconds(5));
        }
      }
    }
  }
}
