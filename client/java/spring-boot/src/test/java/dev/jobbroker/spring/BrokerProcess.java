package dev.jobbroker.spring;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * The real broker binary, started on free ports with a fresh data directory. A trimmed copy of
 * the client's test helper of the same name (client/java/src/test/.../BrokerProcess.java): test
 * classes are not in the client's jar, so this module cannot share it.
 */
final class BrokerProcess implements AutoCloseable {
  private static final Pattern READY =
      Pattern.compile("jobbroker: serving grpc=(\\S+) http=(\\S+)");

  private final Path dataDir;
  private final Process process;
  private final String grpcTarget;

  private BrokerProcess(Path dataDir, Process process, String grpcTarget) {
    this.dataDir = dataDir;
    this.process = process;
    this.grpcTarget = grpcTarget;
  }

  static BrokerProcess start() throws IOException {
    Path dataDir = Files.createTempDirectory("jobbroker-spring-test");
    Path stderr = dataDir.resolve("stderr.log");
    List<String> cmd =
        List.of(
            brokerBinary().toString(),
            "--listen", "127.0.0.1:0",
            "--http-listen", "127.0.0.1:0",
            "--data-dir", dataDir.resolve("data").toString(),
            "--log-level", "warn");
    Process p =
        new ProcessBuilder(cmd)
            .redirectError(ProcessBuilder.Redirect.appendTo(stderr.toFile()))
            .start();
    // Never leave a broker behind, even when the test JVM is stopped early.
    Runtime.getRuntime().addShutdownHook(new Thread(p::destroyForcibly));
    // Read stdout until the ready line, then keep draining it so the pipe never fills.
    CompletableFuture<String> target = new CompletableFuture<>();
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
                    target.complete(m.group(1));
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
      return new BrokerProcess(dataDir, p, target.get(30, TimeUnit.SECONDS));
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

  /** The gRPC address, "127.0.0.1:PORT". */
  String target() {
    return grpcTarget;
  }

  @Override
  public void close() throws Exception {
    process.destroy(); // SIGTERM: graceful
    if (!process.waitFor(15, TimeUnit.SECONDS)) {
      process.destroyForcibly();
      process.waitFor(15, TimeUnit.SECONDS);
    }
    try (Stream<Path> files = Files.walk(dataDir)) {
      files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    }
  }
}
