package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.v1.AdminGrpc;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.GetClusterRequest;
import dev.jobbroker.v1.NodeInfo;
import dev.jobbroker.v1.PartitionInfo;
import dev.jobbroker.v1.WorkRequest;
import dev.jobbroker.v1.WorkResponse;
import dev.jobbroker.v1.WorkResult;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.Server;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Contract §5, "One stream per leading node": while the worker has a group for any node (queues
 * whose partition had no leader in its table), it fetches the table again after each backoff
 * delay and regroups, though no stream ends. The case it is for: after a leader died, a node
 * that already knows the new leader relays the any-node stream instead of refusing it, and no
 * leader change comes to end that relay. A real cluster cannot be held in that moment on demand,
 * so this runs the Worker against two stand-in nodes in this JVM whose GetCluster first names no
 * leader for one queue's partition, then names one; their Work streams take every subscription
 * (as a relaying node does). The real-process cluster tests are {@link
 * ClusterStreamPerLeaderTest}.
 */
class AnyNodeRefreshTest {
  private static final int PARTITIONS = 4;
  /** A give-up deadline, never a measure of speed. */
  private static final Duration GIVE_UP = Duration.ofSeconds(20);

  private final List<Server> servers = new ArrayList<>();
  private JobBrokerClient client;
  private Worker worker;

  @AfterEach
  void tearDown() throws Exception {
    if (worker != null) {
      worker.stop(Duration.ofSeconds(1));
    }
    if (client != null) {
      client.close();
    }
    for (Server s : servers) {
      s.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }

  /** One Work stream a stand-in node took: its node, its subscription, whether it ended. */
  static final class Stream {
    final String node;
    volatile List<String> queues = List.of();
    volatile int maxInFlight;
    volatile boolean endedByTheClient;

    Stream(String node) {
      this.node = node;
    }

    @Override
    public String toString() {
      return node + queues + "/" + maxInFlight + (endedByTheClient ? " ended" : " open");
    }
  }

  /** Both nodes answer GetCluster with {@code cluster}; every Work stream is kept in streams. */
  private final AtomicReference<ClusterInfo> cluster = new AtomicReference<>();
  private final AtomicInteger getClusters = new AtomicInteger();
  private final List<Stream> streams = new ArrayList<>(); // guarded by itself

  private Server standInNode(String name) throws Exception {
    Server server =
        Grpc.newServerBuilderForPort(0, InsecureServerCredentials.create())
            .addService(
                new AdminGrpc.AdminImplBase() {
                  @Override
                  public void getCluster(GetClusterRequest r, StreamObserver<ClusterInfo> o) {
                    getClusters.incrementAndGet();
                    o.onNext(cluster.get());
                    o.onCompleted();
                  }
                })
            .addService(
                new BrokerGrpc.BrokerImplBase() {
                  @Override
                  public StreamObserver<WorkRequest> work(StreamObserver<WorkResponse> out) {
                    Stream stream = new Stream(name);
                    synchronized (streams) {
                      streams.add(stream);
                    }
                    return new StreamObserver<>() {
                      @Override
                      public void onNext(WorkRequest req) {
                        if (req.hasSubscribe()) {
                          stream.maxInFlight = req.getSubscribe().getMaxInFlight();
                          stream.queues = List.copyOf(req.getSubscribe().getQueuesList());
                        }
                        // Every request taken (a relaying node that knows the leader).
                        out.onNext(
                            WorkResponse.newBuilder()
                                .setResult(
                                    WorkResult.newBuilder().setRequestId(req.getRequestId()))
                                .build());
                      }

                      @Override
                      public void onError(Throwable t) {
                        stream.endedByTheClient = true; // cancelled
                      }

                      @Override
                      public void onCompleted() {
                        stream.endedByTheClient = true; // half-closed
                        out.onCompleted();
                      }
                    };
                  }
                })
            .build()
            .start();
    servers.add(server);
    return server;
  }

  private static ClusterInfo clusterInfo(String a, String b, boolean partition1Led) {
    ClusterInfo.Builder info =
        ClusterInfo.newBuilder()
            .setClusterName("stand-in")
            .setPartitionCount(PARTITIONS)
            .addNodes(NodeInfo.newBuilder().setNodeId("node-a").setAddress(a).setAlive(true))
            .addNodes(NodeInfo.newBuilder().setNodeId("node-b").setAddress(b).setAlive(true))
            .addPartitions(
                PartitionInfo.newBuilder()
                    .setPartition(0)
                    .setLeaderNodeId("node-a")
                    .setLeaderAddress(a));
    if (partition1Led) {
      info.addPartitions(
          PartitionInfo.newBuilder().setPartition(1).setLeaderNodeId("node-b").setLeaderAddress(b));
    }
    return info.build();
  }

  private static String queueOf(int partition, String prefix) {
    for (int i = 0; ; i++) {
      if (Partitions.ofQueue(prefix + i, PARTITIONS) == partition) {
        return prefix + i;
      }
    }
  }

  private List<Stream> streams() {
    synchronized (streams) {
      return List.copyOf(streams);
    }
  }

  private List<Stream> open(String node, String queue) {
    return streams().stream()
        .filter(s -> !s.endedByTheClient && s.node.equals(node) && s.queues.equals(List.of(queue)))
        .toList();
  }

  private void await(String what, BooleanSupplier done) throws InterruptedException {
    long end = System.nanoTime() + GIVE_UP.toNanos();
    while (!done.getAsBoolean()) {
      if (System.nanoTime() > end) {
        throw new AssertionError("not within " + GIVE_UP + ": " + what + "; streams " + streams());
      }
      Thread.sleep(20);
    }
  }

  @Test
  void aRelayedAnyNodeStreamMovesToTheLeaderOnceTheTableNamesIt() throws Exception {
    String a = "127.0.0.1:" + standInNode("a").getPort();
    String b = "127.0.0.1:" + standInNode("b").getPort();
    cluster.set(clusterInfo(a, b, false));
    String led = queueOf(0, "led"); // partition 0: node a leads it
    String orphan = queueOf(1, "orphan"); // partition 1: no leader in the first tables

    client = JobBrokerClient.connect(ClientOptions.builder().address(a).build());
    worker =
        Worker.builder(client)
            .concurrency(4)
            .reconnectBackoff(Duration.ofMillis(20), Duration.ofMillis(100))
            .handle(led, job -> null)
            .handle(orphan, job -> null)
            .build();
    assertTimeoutPreemptively(
        GIVE_UP.multipliedBy(3),
        () -> {
          worker.start();
          // One stream on a for its queue; the leaderless one on any node (a answered), relayed.
          await(
              "a stream for each group",
              () -> open("a", led).size() == 1 && open("a", orphan).size() == 1);
          Stream ledStream = open("a", led).get(0);
          Stream relayed = open("a", orphan).get(0);
          assertEquals(List.of(2, 2), List.of(ledStream.maxInFlight, relayed.maxInFlight));

          // No stream ends, yet the table is fetched again (and again), keeping both streams.
          int asked = getClusters.get();
          await("the table fetched again twice", () -> getClusters.get() >= asked + 2);
          assertEquals(2, streams().size(), "unchanged groups keep their streams: " + streams());

          // The table now names b as partition 1's leader: the queue moves to b's own stream.
          cluster.set(clusterInfo(a, b, true));
          await("the leaderless queue's stream on b", () -> open("b", orphan).size() == 1);
          await("the relayed stream ended", () -> relayed.endedByTheClient);
          assertFalse(ledStream.endedByTheClient, "the unchanged stream keeps running");
          assertEquals(2, open("b", orphan).get(0).maxInFlight);

          // No group for any node now: no more fetches while no stream ends. (A window, not a
          // speed: with the refresh still on, the 100 ms backoff would fetch several times.)
          int after = getClusters.get();
          Thread.sleep(1000);
          assertEquals(after, getClusters.get(), "the table is not fetched without a reason");
          assertTrue(open("a", led).contains(ledStream));
        });
  }
}
