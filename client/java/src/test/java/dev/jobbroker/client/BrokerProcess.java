package dev.jobbroker.client;

import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/** The real broker binary, started on free ports with a fresh data directory. */
final class BrokerProcess implements AutoCloseable {
  private static final Pattern READY =
      Pattern.compile("jobbroker: serving grpc=(\\S+) http=(\\S+)");

  private final Path dataDir;
  private final String grpcTarget;
  private final List<String> extraArgs;
  private Process process;
  private boolean frozen; // SIGSTOP'ed by freeze(), not yet continued
  private volatile String httpTarget; // --http-listen's port, new after each restart
  final JobBrokerClient client;

  private BrokerProcess(
      Process process, Path dataDir, String grpcTarget, String httpTarget, List<String> extraArgs,
      ClientOptions.Builder clientOptions) {
    this.process = process;
    this.httpTarget = httpTarget;
    this.dataDir = dataDir;
    this.grpcTarget = grpcTarget;
    this.extraArgs = extraArgs;
    this.client = JobBrokerClient.connect(clientOptions.address(grpcTarget).build());
  }

  /** Starts the broker with {@code configJson} (proto3 JSON of ServerConfig) or none if null. */
  static BrokerProcess start(String configJson) throws IOException {
    return start(configJson, List.of(), ClientOptions.builder());
  }

  /**
   * Starts the broker with {@code extraArgs} (TLS, tokens) added to its command line; its
   * {@link #client} uses {@code clientOptions} (the address is set here).
   */
  static BrokerProcess start(
      String configJson, List<String> extraArgs, ClientOptions.Builder clientOptions)
      throws IOException {
    Path dataDir = Files.createTempDirectory("jobbroker-java-test");
    if (configJson != null) {
      Files.writeString(dataDir.resolve("config.json"), configJson);
    }
    Launched l = launch(dataDir, "127.0.0.1:0", extraArgs);
    return new BrokerProcess(l.process, dataDir, l.target, l.http, extraArgs, clientOptions);
  }

  /** A scratch directory of this broker's, removed by {@link #close()}. */
  Path dir() {
    return dataDir;
  }

  /**
   * Stops the broker (SIGTERM) and starts it again on the same port and data directory, as an
   * operator's restart would. The client reconnects by itself.
   */
  void restart() throws Exception {
    stopProcess();
    Launched l = launch(dataDir, grpcTarget, extraArgs);
    process = l.process;
    httpTarget = l.http;
  }

  /** kill -9 of the broker, not started again: a dead machine. {@link #close()} still cleans up. */
  void kill9() throws InterruptedException {
    process.destroyForcibly();
    process.waitFor(15, TimeUnit.SECONDS);
  }

  /**
   * SIGSTOP: the broker stops answering while the kernel keeps its connections open (and accepts
   * new ones): a frozen process, as a machine that hangs or a network that drops packets looks
   * to a client. {@link #thaw()} (or {@link #close()}) continues it.
   */
  void freeze() throws IOException, InterruptedException {
    signal("STOP");
    frozen = true;
  }

  /** SIGCONT after {@link #freeze()}. */
  void thaw() throws IOException, InterruptedException {
    signal("CONT");
    frozen = false;
  }

  private void signal(String name) throws IOException, InterruptedException {
    Process kill =
        new ProcessBuilder("kill", "-" + name, Long.toString(process.pid()))
            .redirectErrorStream(true)
            .start();
    String out = new String(kill.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (kill.waitFor() != 0) {
      throw new IOException("kill -" + name + " " + process.pid() + ": " + out);
    }
  }

  private record Launched(Process process, String target, String http) {}

  private static Launched launch(Path dataDir, String listen, List<String> extraArgs)
      throws IOException {
    List<String> cmd = new ArrayList<>();
    cmd.add(brokerBinary().toString());
    cmd.addAll(
        List.of(
            "--listen", listen,
            "--http-listen", "127.0.0.1:0",
            "--data-dir", dataDir.resolve("data").toString(),
            "--log-level", "warn"));
    cmd.addAll(extraArgs);
    Path config = dataDir.resolve("config.json");
    if (Files.exists(config)) {
      cmd.add("--config");
      cmd.add(config.toString());
    }
    Path stderr = dataDir.resolve("stderr.log");
    Process p =
        new ProcessBuilder(cmd)
            .redirectError(ProcessBuilder.Redirect.appendTo(stderr.toFile()))
            .start();
    // Never leave a broker behind, even when the test JVM is stopped early.
    Runtime.getRuntime().addShutdownHook(new Thread(p::destroyForcibly));
    // Read stdout until the ready line, then keep draining it so the pipe never fills.
    CompletableFuture<String[]> target = new CompletableFuture<>();
    Thread reader =
        new Thread(
            () -> {
              try (BufferedReader r =
                  new BufferedReader(
                      new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = r.readLine()) != null) {
                  Matcher m = READY.matcher(line);
                  if (m.find()) {
                    target.complete(new String[] {m.group(1), m.group(2)});
                  }
                }
              } catch (IOException ignored) {
                // the broker went away
              }
              target.completeExceptionally(new IOException("broker exited before it was ready"));
            },
            "broker-stdout");
    reader.setDaemon(true);
    reader.start();
    try {
      String[] ready = target.get(30, TimeUnit.SECONDS);
      return new Launched(p, ready[0], ready[1]);
    } catch (Exception e) {
      p.destroyForcibly();
      throw new IOException(
          "broker did not start: " + e + "\nstderr:\n" + Files.readString(stderr), e);
    }
  }

  /** $JOBBROKER_BIN, else build/server/jobbroker under the repository root. */
  static Path brokerBinary() {
    String env = System.getenv("JOBBROKER_BIN");
    if (env != null && !env.isEmpty()) {
      return Path.of(env);
    }
    return repoRoot().resolve("build/server/jobbroker");
  }

  /** The repository root, found from where this test's classes are (not from the cwd). */
  static Path repoRoot() {
    try {
      Path p =
          Path.of(BrokerProcess.class.getProtectionDomain().getCodeSource().getLocation().toURI());
      for (; p != null; p = p.getParent()) {
        if (Files.isDirectory(p.resolve("proto/jobbroker/v1"))) {
          return p;
        }
      }
    } catch (URISyntaxException e) {
      throw new IllegalStateException(e);
    }
    throw new IllegalStateException("repository root not found above the test classes");
  }

  String target() {
    return grpcTarget;
  }

  private static final Pattern RPC_COUNT =
      Pattern.compile("^jobbroker_rpc_duration_seconds_count\\{([^}]*)\\} (\\S+)$");
  private static final Pattern LABEL = Pattern.compile("(\\w+)=\"([^\"]*)\"");

  /**
   * How many unary calls of {@code method} ("/jobbroker.v1.Broker/Enqueue") the broker has
   * answered with {@code code} ("OK", "INVALID_ARGUMENT"; null: any), from its /metrics.
   */
  long rpcCount(String method, String code) throws IOException, InterruptedException {
    java.net.http.HttpResponse<String> metrics =
        java.net.http.HttpClient.newHttpClient()
            .send(
                java.net.http.HttpRequest.newBuilder(
                        java.net.URI.create("http://" + httpTarget + "/metrics"))
                    .build(),
                java.net.http.HttpResponse.BodyHandlers.ofString());
    long total = 0;
    for (String line : metrics.body().split("\n")) {
      Matcher m = RPC_COUNT.matcher(line);
      if (!m.matches()) {
        continue;
      }
      java.util.Map<String, String> labels = new java.util.HashMap<>();
      Matcher l = LABEL.matcher(m.group(1));
      while (l.find()) {
        labels.put(l.group(1), l.group(2));
      }
      if (method.equals(labels.get("method"))
          && (code == null || code.equals(labels.get("code")))) {
        total += (long) Double.parseDouble(m.group(2));
      }
    }
    return total;
  }

  /** {@link #rpcCount(String, String)} over every code. */
  long rpcCount(String method) throws IOException, InterruptedException {
    return rpcCount(method, null);
  }

  /** Polls Admin.GetJob until {@code done} holds; fails after {@code giveUp}. */
  Job awaitJob(String jobId, Predicate<Job> done, Duration giveUp) throws InterruptedException {
    long deadline = System.nanoTime() + giveUp.toNanos();
    Job job = client.getJob(jobId);
    while (!done.test(job)) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("job never reached the expected state; last seen:\n" + job);
      }
      Thread.sleep(50);
      job = client.getJob(jobId);
    }
    return job;
  }

  Job awaitState(String jobId, JobState state) throws InterruptedException {
    return awaitJob(jobId, j -> j.getState() == state, Duration.ofSeconds(30));
  }

  private void stopProcess() throws InterruptedException {
    process.destroy(); // SIGTERM: graceful
    if (!process.waitFor(15, TimeUnit.SECONDS)) {
      process.destroyForcibly();
      process.waitFor(15, TimeUnit.SECONDS);
    }
  }

  @Override
  public void close() throws Exception {
    if (frozen) {
      thaw(); // a frozen broker would not act on the SIGTERM
    }
    client.close();
    stopProcess();
    try (Stream<Path> files = Files.walk(dataDir)) {
      files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    }
  }
}
