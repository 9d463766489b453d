package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.v1.FailReason;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Runs examples/EmailWorker as its own process (java -cp) against the real broker. The examples
 * are not in the library jar: they are compiled here, from client/java/examples, against the
 * test classpath.
 */
class EmailWorkerExampleTest {
  static final String CONFIG =
      """
      {"queues": {
        "emails": {"retry": {"maxAttempts": 3, "initialBackoff": "0.05s", "jitter": "JITTER_NONE"}},
        "emails-drain": {"leaseDuration": "1s"}}}
      """;

  static BrokerProcess broker;
  static Path exampleClasses;

  @BeforeAll
  static void startBroker() throws Exception {
    exampleClasses = compileExamples();
    broker = BrokerProcess.start(CONFIG);
  }

  @AfterAll
  static void stopBroker() throws Exception {
    broker.close();
  }

  /** javac of examples/src/main/java into a temp directory; returns that directory. */
  static Path compileExamples() throws IOException {
    Path src = Path.of(System.getProperty("jobbroker.examples.dir", "examples/src/main/java"));
    List<String> files;
    try (Stream<Path> walk = Files.walk(src)) {
      files = walk.filter(f -> f.toString().endsWith(".java")).map(Path::toString).toList();
    }
    assertFalse(files.isEmpty(), "no examples under " + src.toAbsolutePath());
    Path out = Files.createTempDirectory("jobbroker-examples");
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    List<String> args = new ArrayList<>(List.of(
        "-d", out.toString(), "-cp", System.getProperty("java.class.path"), "-Xlint:all",
        "-implicit:none"));
    args.addAll(files);
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = javac.run(null, err, err, args.toArray(String[]::new));
    assertEquals(0, rc, "javac of the examples failed:\n" + err);
    return out;
  }

  /** The example in a child JVM, its output in a file. */
  private static final class ExampleProcess implements AutoCloseable {
    final Process process;
    final Path output;

    ExampleProcess(Map<String, String> env) throws IOException {
      output = Files.createTempFile("email-worker", ".log");
      String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
      ProcessBuilder pb =
          new ProcessBuilder(
                  java,
                  "-cp",
                  exampleClasses + File.pathSeparator + System.getProperty("java.class.path"),
                  "dev.jobbroker.examples.EmailWorker")
              .redirectErrorStream(true)
              .redirectOutput(output.toFile());
      pb.environment().put("JOBBROKER_ADDRESS", broker.target());
      pb.environment().putAll(env);
      process = pb.start();
    }

    String output() throws IOException {
      return Files.readString(output);
    }

    void awaitOutput(String text) throws Exception {
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
      while (!output().contains(text)) {
        assertTrue(process.isAlive(), "example exited early:\n" + output());
        assertTrue(System.nanoTime() < deadline, "no \"" + text + "\" in:\n" + output());
        Thread.sleep(50);
      }
    }

    /** SIGTERM, then the exit code. */
    int terminate() throws Exception {
      process.destroy(); // SIGTERM
      assertTrue(process.waitFor(60, TimeUnit.SECONDS), "example did not exit:\n" + output());
      return process.exitValue();
    }

    @Override
    public void close() throws IOException {
      process.destroyForcibly();
      Files.deleteIfExists(output);
    }
  }

  @Test
  void completesJobsRetriesFailuresAndExitsZeroOnSigterm() throws Exception {
    List<String> good = new ArrayList<>();
    for (String to : List.of("alice@example.com", "bob@example.com", "carol@example.com")) {
      good.add(broker.client.enqueue("emails", to).getJobId());
    }
    String flaky = broker.client.enqueue("emails", "flaky-dave@example.com").getJobId();
    String invalid = broker.client.enqueue("emails", "not-an-address").getJobId();

    try (ExampleProcess worker = new ExampleProcess(Map.of("EMAIL_QUEUE", "emails"))) {
      worker.awaitOutput("email-worker: ready");
      for (String id : good) {
        Job job = broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
        assertEquals(1, job.getAttempt());
        assertTrue(job.getResult().toStringUtf8().startsWith("sent to "));
      }
      Job retried = broker.awaitState(flaky, JobState.JOB_STATE_COMPLETED);
      assertEquals(2, retried.getAttempt());
      assertTrue(retried.getAttempts(0).getError().contains("provider timed out"));
      Job dead = broker.awaitState(invalid, JobState.JOB_STATE_FAILED);
      assertEquals(FailReason.FAIL_REASON_PERMANENT, dead.getFailReason());
      assertEquals(1, dead.getAttempt());

      assertEquals(0, worker.terminate(), worker.output());
      assertTrue(worker.output().contains("email-worker: stopped"), worker.output());
    }
  }

  @Test
  void sigtermDrainsFinishesTheRunningJobAndReleasesTheRest() throws Exception {
    List<String> ids = new ArrayList<>();
    for (int i = 1; i <= 3; i++) {
      ids.add(broker.client.enqueue("emails-drain", "user" + i + "@example.com").getJobId());
    }
    // One job at a time, two more held unstarted; each send outlasts the 1 s lease.
    try (ExampleProcess worker =
        new ExampleProcess(
            Map.of(
                "EMAIL_QUEUE", "emails-drain",
                "EMAIL_CONCURRENCY", "1",
                "EMAIL_PREFETCH", "2",
                "EMAIL_SEND_MILLIS", "4000"))) {
      worker.awaitOutput("email-worker: sending job=" + ids.get(0));
      for (String id : ids) {
        broker.awaitState(id, JobState.JOB_STATE_ACTIVE);
      }
      assertEquals(0, worker.terminate(), worker.output());
      String out = worker.output();
      assertTrue(out.contains("email-worker: sent job=" + ids.get(0)), out);
      assertTrue(out.contains("released=2"), out);
    }
    Job first = broker.client.getJob(ids.get(0));
    assertEquals(JobState.JOB_STATE_COMPLETED, first.getState());
    assertEquals(1, first.getAttempt(), "heartbeats kept the 1 s lease: " + first);
    for (String id : ids.subList(1, 3)) {
      assertEquals(JobState.JOB_STATE_READY, broker.client.getJob(id).getState(), id);
    }
  }
}
