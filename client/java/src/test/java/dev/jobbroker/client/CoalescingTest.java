package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.v1.EnqueueResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.IntFunction;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Enqueue coalescing (contract §10) against the real broker, counted by the broker's own
 * /metrics: how many Enqueue and EnqueueBatch calls the concurrent enqueue() calls became.
 */
class CoalescingTest {
  private static final String ENQUEUE = "/jobbroker.v1.Broker/Enqueue";
  private static final String ENQUEUE_BATCH = "/jobbroker.v1.Broker/EnqueueBatch";

  static BrokerProcess broker;

  @BeforeAll
  static void startBroker() throws Exception {
    broker = BrokerProcess.start(null);
  }

  @AfterAll
  static void stopBroker() throws Exception {
    broker.close();
  }

  /** An enqueue()'s outcome: its answer, or what it threw. */
  record Outcome(EnqueueResponse response, RuntimeException error) {}

  /**
   * Runs {@code call(0..n-1)} on n threads released together by a latch; the outcomes by i.
   */
  static List<Outcome> concurrently(int n, IntFunction<EnqueueResponse> call)
      throws InterruptedException {
    CountDownLatch ready = new CountDownLatch(n);
    CountDownLatch go = new CountDownLatch(1);
    Outcome[] outcomes = new Outcome[n];
    List<Thread> threads = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      int index = i;
      Thread t =
          new Thread(
              () -> {
                ready.countDown();
                try {
                  go.await();
                  outcomes[index] = new Outcome(call.apply(index), null);
                } catch (RuntimeException e) {
                  outcomes[index] = new Outcome(null, e);
                } catch (InterruptedException e) {
                  outcomes[index] = new Outcome(null, new IllegalStateException(e));
                }
              });
      t.start();
      threads.add(t);
    }
    assertTrue(ready.await(30, TimeUnit.SECONDS));
    go.countDown();
    for (Thread t : threads) {
      t.join(TimeUnit.SECONDS.toMillis(60));
      assertFalse(t.isAlive(), "an enqueue never returned");
    }
    return List.of(outcomes);
  }

  /** A client of the test broker with these batch options. */
  private static JobBrokerClient client(ClientOptions.Builder options) {
    JobBrokerClient c = JobBrokerClient.connect(options.address(broker.target()).build());
    c.listQueues(); // the routing table fetched: not counted among the enqueues
    return c;
  }

  private static long calls() throws Exception {
    return broker.rpcCount(ENQUEUE) + broker.rpcCount(ENQUEUE_BATCH);
  }

  /** Asserts every outcome succeeded with a distinct job the broker has; returns the ids. */
  private static Set<String> assertAllCreated(List<Outcome> outcomes) {
    Set<String> ids = new HashSet<>();
    for (Outcome o : outcomes) {
      assertNull(o.error(), () -> "an enqueue failed: " + o.error());
      ids.add(o.response().getJobId());
    }
    assertEquals(outcomes.size(), ids.size(), "one distinct job per call");
    for (String id : ids) {
      assertEquals(id, broker.client.getJob(id).getId());
    }
    return ids;
  }

  @Test
  void concurrentEnqueuesWithALingerShareBatches() throws Exception {
    try (JobBrokerClient c = client(ClientOptions.builder().batchLinger(Duration.ofMillis(50)))) {
      long before = calls();
      long batchesBefore = broker.rpcCount(ENQUEUE_BATCH);
      List<Outcome> outcomes = concurrently(200, i -> c.enqueue("coalesce.linger", "job " + i));
      assertAllCreated(outcomes);
      long used = calls() - before;
      assertTrue(used <= 100, "200 enqueues took " + used + " calls");
      assertTrue(broker.rpcCount(ENQUEUE_BATCH) > batchesBefore, "no EnqueueBatch was sent");
    }
  }

  @Test
  void concurrentEnqueuesWithTheDefaultsTakeFewerCallsThanJobs() throws Exception {
    try (JobBrokerClient c = client(ClientOptions.builder())) {
      long before = calls();
      List<Outcome> outcomes = concurrently(200, i -> c.enqueue("coalesce.default", "job " + i));
      assertAllCreated(outcomes);
      long used = calls() - before;
      assertTrue(used < 200, "200 enqueues took " + used + " calls");
    }
  }

  @Test
  void aBadJobFailsOnlyItsOwnCallWithTheUnaryMessage() throws Exception {
    try (JobBrokerClient c = client(ClientOptions.builder().batchLinger(Duration.ofMillis(50)))) {
      long refusedBefore = broker.rpcCount(ENQUEUE_BATCH, "INVALID_ARGUMENT");
      int bad = 17;
      List<Outcome> outcomes =
          concurrently(
              50,
              i ->
                  c.enqueue(
                      "coalesce.bad",
                      "job " + i,
                      i == bad ? new EnqueueOptions().header("", "x") : new EnqueueOptions()));
      RuntimeException error = outcomes.get(bad).error();
      assertNotNull(error, "the bad job was created");
      StatusRuntimeException s = (StatusRuntimeException) error;
      assertEquals(Status.Code.INVALID_ARGUMENT, s.getStatus().getCode());
      String message = s.getStatus().getDescription();
      assertTrue(message.contains("headers"), message);
      assertFalse(message.contains("jobs["), message);
      List<Outcome> good = new ArrayList<>(outcomes);
      good.remove(bad);
      assertEquals(49, assertAllCreated(good).size());
      assertTrue(
          broker.rpcCount(ENQUEUE_BATCH, "INVALID_ARGUMENT") > refusedBefore,
          "no batch was refused: the split path did not run");
    }
  }

  @Test
  void batchingCanBeTurnedOffForOneCallOrForTheClient() throws Exception {
    try (JobBrokerClient c = client(ClientOptions.builder())) {
      long unary = broker.rpcCount(ENQUEUE);
      long batches = broker.rpcCount(ENQUEUE_BATCH);
      c.enqueue("coalesce.off", "alone", new EnqueueOptions().batch(false));
      assertEquals(unary + 1, broker.rpcCount(ENQUEUE));
      assertEquals(batches, broker.rpcCount(ENQUEUE_BATCH));
    }
    try (JobBrokerClient c = client(ClientOptions.builder().batching(false))) {
      long unary = broker.rpcCount(ENQUEUE);
      long batches = broker.rpcCount(ENQUEUE_BATCH);
      assertAllCreated(concurrently(20, i -> c.enqueue("coalesce.off", "job " + i)));
      assertEquals(unary + 20, broker.rpcCount(ENQUEUE));
      assertEquals(batches, broker.rpcCount(ENQUEUE_BATCH));
    }
  }

  @Test
  void concurrentEnqueuesOfOneDedupKeyAnswerOneJob() throws Exception {
    try (JobBrokerClient c = client(ClientOptions.builder().batchLinger(Duration.ofMillis(50)))) {
      List<Outcome> outcomes =
          concurrently(
              20,
              i -> c.enqueue("coalesce.dedup", "same", new EnqueueOptions().dedupKey("one")));
      Set<String> ids = new HashSet<>();
      int created = 0;
      for (Outcome o : outcomes) {
        assertNull(o.error(), () -> "an enqueue failed: " + o.error());
        ids.add(o.response().getJobId());
        created += o.response().getDeduplicated() ? 0 : 1;
      }
      assertEquals(1, ids.size(), ids.toString());
      assertEquals(1, created, "exactly one answer is not deduplicated");
    }
  }

  @Test
  void batchesNeverSpanPartitions() throws Exception {
    try (BrokerProcess partitioned =
        BrokerProcess.start(null, List.of("--partitions", "4"), ClientOptions.builder())) {
      // Two queues of each of the 4 partitions.
      List<String> queues = new ArrayList<>();
      int[] perPartition = new int[4];
      for (int i = 0; queues.size() < 8; i++) {
        String q = "coalesce.part-" + i;
        int p = Partitions.ofQueue(q, 4);
        if (perPartition[p] < 2) {
          perPartition[p]++;
          queues.add(q);
        }
      }
      JobBrokerClient c = partitioned.client;
      List<Outcome> outcomes =
          concurrently(200, i -> c.enqueue(queues.get(i % 8), "job " + i));
      Set<String> ids = new HashSet<>();
      for (Outcome o : outcomes) {
        assertNull(o.error(), () -> "an enqueue failed: " + o.error());
        ids.add(o.response().getJobId());
      }
      assertEquals(200, ids.size());
      for (String q : queues) {
        assertEquals(25, c.getQueue(q).getEnqueuedTotal(), q);
      }
    }
  }
}
