package dev.jobbroker.client;

import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.PartitionInfo;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * A real cluster on loopback, as tests/lib/cluster.sh runs one: Debian's etcd and three nodes of
 * the broker binary ({@link BrokerProcess#brokerBinary()}), every partition replicated on all
 * three. Started once per test class; {@link #close()} kills the nodes, then etcd, by their
 * process, and removes the data.
 */
final class ClusterProcess implements AutoCloseable {
  static final int NODES = 3;

  private final Path dir;
  private final Process etcd;
  private final List<Process> nodes;
  /** The nodes' gRPC addresses ("127.0.0.1:PORT"), node-0 first: what a client is given. */
  final List<String> addresses;
  /** The nodes' HTTP addresses (their /metrics), in the same order. */
  final List<String> httpAddresses = new ArrayList<>();

  private ClusterProcess(Path dir, Process etcd, List<Process> nodes, List<String> addresses) {
    this.dir = dir;
    this.etcd = etcd;
    this.nodes = nodes;
    this.addresses = addresses;
  }

  /**
   * Starts etcd and the three nodes with {@code partitions} partitions, and returns once every
   * partition has a leader and all three nodes in sync (60 s at most).
   */
  static ClusterProcess start(int partitions) throws Exception {
    Path dir = Files.createTempDirectory("jobbroker-java-cluster");
    // All of the cluster's ports at once, so that no two are the same.
    List<String> ports = freePorts(2 * NODES + 2);
    String etcdUrl = "http://" + ports.get(0);
    Process etcd =
        new ProcessBuilder(
                "etcd",
                "--data-dir", dir.resolve("etcd").toString(),
                "--listen-client-urls", etcdUrl,
                "--advertise-client-urls", etcdUrl,
                "--listen-peer-urls", "http://" + ports.get(1))
            .redirectErrorStream(true)
            .redirectOutput(dir.resolve("etcd.log").toFile())
            .start();
    List<Process> nodes = new ArrayList<>();
    List<String> addresses = new ArrayList<>();
    ClusterProcess cluster = new ClusterProcess(dir, etcd, nodes, addresses);
    // Never leave a process behind, even when the test JVM is stopped early.
    Runtime.getRuntime().addShutdownHook(new Thread(cluster::killAll));
    try {
      addresses.addAll(ports.subList(2, 2 + NODES));
      cluster.httpAddresses.addAll(ports.subList(2 + NODES, 2 + 2 * NODES));
      for (int n = 0; n < NODES; n++) {
        nodes.add(
            new ProcessBuilder(
                    BrokerProcess.brokerBinary().toString(),
                    "--listen", addresses.get(n),
                    "--http-listen", cluster.httpAddresses.get(n),
                    "--data-dir", dir.resolve("node-" + n).toString(),
                    "--partitions", Integer.toString(partitions),
                    "--cluster-etcd", etcdUrl,
                    "--node-id", "node-" + n,
                    "--cluster-initial-nodes", Integer.toString(NODES),
                    "--log-level", "warn")
                .redirectErrorStream(true)
                .redirectOutput(dir.resolve("node-" + n + ".log").toFile())
                .start());
      }
      cluster.awaitReady(partitions);
      return cluster;
    } catch (Exception | AssertionError e) {
      cluster.close();
      throw e;
    }
  }

  private void awaitReady(int partitions) throws Exception {
    ClientOptions options =
        ClientOptions.builder().addresses(addresses).defaultDeadline(Duration.ofSeconds(5)).build();
    long giveUp = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
    String last = "no answer";
    try (JobBrokerClient client = JobBrokerClient.connect(options)) {
      while (System.nanoTime() < giveUp) {
        try {
          ClusterInfo info = client.getCluster();
          last = info.toString();
          if (info.getPartitionsCount() == partitions
              && info.getPartitionsList().stream()
                  .allMatch(p -> !p.getLeaderNodeId().isEmpty() && p.getInSyncCount() == NODES)
              && everyPartitionServes(client, partitions)) {
            return;
          }
        } catch (StatusRuntimeException e) {
          last = e.toString();
        }
        Thread.sleep(200);
      }
    }
    throw new AssertionError(
        "the cluster did not get a leader and 3 nodes in sync for every partition within 60 s;"
            + " last answer:\n" + last + logTails());
  }

  /**
   * Whether a call for each partition gets past "its leader does not serve it at this moment":
   * a leader named in etcd may still be starting its partition (UNAVAILABLE until it serves).
   * GetQueue of a queue there answers NOT_FOUND or the queue once it does.
   */
  private static boolean everyPartitionServes(JobBrokerClient client, int partitions) {
    for (int p = 0; p < partitions; p++) {
      String queue = null;
      for (int i = 0; queue == null; i++) {
        if (Partitions.ofQueue("ready." + i, partitions) == p) {
          queue = "ready." + i;
        }
      }
      try {
        client.getQueue(queue);
      } catch (StatusRuntimeException e) {
        Status.Code code = e.getStatus().getCode();
        if (code == Status.Code.UNAVAILABLE || code == Status.Code.DEADLINE_EXCEEDED) {
          return false;
        }
      }
    }
    return true;
  }

  /** The end of every process's log, for a failure's message (close() removes them). */
  private String logTails() throws IOException {
    StringBuilder out = new StringBuilder();
    try (Stream<Path> logs = Files.list(dir)) {
      for (Path log : logs.filter(f -> f.toString().endsWith(".log")).sorted().toList()) {
        List<String> lines = Files.readAllLines(log);
        out.append("\n--- ").append(log.getFileName()).append(":\n");
        lines.subList(Math.max(0, lines.size() - 10), lines.size())
            .forEach(l -> out.append(l).append('\n'));
      }
    }
    return out.toString();
  }

  /** The address of {@code partition}'s leader in {@code info}, "" if it has none. */
  static String leaderAddress(ClusterInfo info, int partition) {
    for (PartitionInfo p : info.getPartitionsList()) {
      if (p.getPartition() == partition) {
        return p.getLeaderAddress();
      }
    }
    return "";
  }

  /**
   * The value of gauge {@code name} in the /metrics of the node at gRPC address {@code address}
   * (a line "name value").
   */
  double metric(String address, String name) throws IOException, InterruptedException {
    HttpResponse<String> answer =
        HttpClient.newHttpClient()
            .send(
                HttpRequest.newBuilder(
                        URI.create(
                            "http://" + httpAddresses.get(addresses.indexOf(address)) + "/metrics"))
                    .timeout(Duration.ofSeconds(5))
                    .build(),
                HttpResponse.BodyHandlers.ofString());
    for (String line : answer.body().split("\n")) {
      if (line.startsWith(name + " ")) {
        return Double.parseDouble(line.substring(name.length() + 1).trim());
      }
    }
    throw new AssertionError("the node at " + address + " has no " + name + " in its /metrics");
  }

  /** kill -9 of the node at {@code address}: a dead machine. */
  void kill9(String address) throws InterruptedException {
    Process node = nodes.get(addresses.indexOf(address));
    node.destroyForcibly();
    node.waitFor(30, TimeUnit.SECONDS);
  }

  private void killAll() {
    for (Process p : nodes) {
      p.destroyForcibly();
    }
    etcd.destroyForcibly();
  }

  @Override
  public void close() throws Exception {
    for (Process p : nodes) {
      p.destroyForcibly();
      p.waitFor(30, TimeUnit.SECONDS);
    }
    etcd.destroyForcibly();
    etcd.waitFor(30, TimeUnit.SECONDS);
    try (Stream<Path> files = Files.walk(dir)) {
      files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    }
  }

  /**
   * {@code count} distinct loopback addresses ("127.0.0.1:PORT") whose ports are free right now,
   * below the kernel's ephemeral range (as the C++ harnesses pick theirs,
   * tests/testing/process_util.h). A port that binding port 0 handed out is released at once, so
   * it can be handed out again (two processes of one cluster were once given the same port, and a
   * node exited "cannot listen") or become an outgoing connection's local port before the process
   * given it binds.
   */
  private static List<String> freePorts(int count) {
    int low = 32768;
    try {
      // Not Files.readString: on JDK 17 it returned only "3" of this /proc file's "32768 60999".
      String range = Files.readAllLines(Path.of("/proc/sys/net/ipv4/ip_local_port_range")).get(0);
      low = Integer.parseInt(range.trim().split("\\s+")[0]);
    } catch (IOException | RuntimeException notLinux) {
      // the default range
    }
    int hi = Math.min(low, 32768) - 1;
    int lo = Math.max(1024, hi - 12000);
    List<String> picked = new ArrayList<>();
    for (int i = 0; i < 100 * count && picked.size() < count; i++) {
      int port = ThreadLocalRandom.current().nextInt(lo, hi + 1);
      String address = "127.0.0.1:" + port;
      if (picked.contains(address)) continue;
      try (ServerSocket s = new ServerSocket(port, 1, InetAddress.getLoopbackAddress())) {
        picked.add(address);
      } catch (IOException taken) {
        // in use: another
      }
    }
    if (picked.size() < count) {
      throw new IllegalStateException("no " + count + " free ports in " + lo + ".." + hi);
    }
    return picked;
  }
}
