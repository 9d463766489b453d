package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.v1.AttemptOutcome;
import dev.jobbroker.v1.FailReason;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import dev.jobbroker.v1.WorkerInfo;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;

/** The Worker helper in this JVM against the real broker. */
class WorkerTest extends WorkerTestBase {
  @Test
  void heartbeatsKeepAShortLeaseOverALongJob() throws Exception {
    String id = broker.client.enqueue("worker-long", "3 seconds of work").getJobId();
    start(
        Worker.builder(broker.client)
            .leaseDuration(Duration.ofSeconds(1))
            .handle(
                "worker-long",
                job -> {
                  Thread.sleep(3000);
                  return null;
                }));
    Job done = broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
    assertEquals(1, done.getAttempt(), "no lease ran out: " + done);
    assertEquals(1, done.getAttemptsCount());
    assertEquals(AttemptOutcome.ATTEMPT_OUTCOME_COMPLETED, done.getAttempts(0).getOutcome());
  }

  @Test
  void handlerResultAndAckAndErrorRetry() throws Exception {
    String id = broker.client.enqueue("retries", "fails once").getJobId();
    start(
        Worker.builder(broker.client)
            .handle(
                "retries",
                job -> {
                  if (job.attempt() == 1) {
                    throw new IOException("provider timed out");
                  }
                  return "ok";
                }));
    Job done = broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
    assertEquals(2, done.getAttempt());
    assertEquals(AttemptOutcome.ATTEMPT_OUTCOME_ERROR, done.getAttempts(0).getOutcome());
    assertEquals("provider timed out", done.getAttempts(0).getError());
    assertEquals("ok", done.getResult().toStringUtf8());
    // The broker commits the ack before the worker reads its answer, so the job can be COMPLETED
    // while the worker's counter is not yet bumped; stop() waits for every answer.
    worker.stop(Duration.ofSeconds(10));
    Worker.Stats stats = worker.stats();
    assertEquals(1, stats.acked());
    assertEquals(1, stats.failed());
  }

  @Test
  void permanentErrorKillsTheJob() throws Exception {
    String id = broker.client.enqueue("worker-permanent", "no-at-sign").getJobId();
    AtomicInteger runs = new AtomicInteger();
    start(
        Worker.builder(broker.client)
            .handle(
                "worker-permanent",
                job -> {
                  runs.incrementAndGet();
                  throw new PermanentError("invalid address");
                }));
    Job dead = broker.awaitState(id, JobState.JOB_STATE_FAILED);
    assertEquals(FailReason.FAIL_REASON_PERMANENT, dead.getFailReason());
    assertEquals(1, dead.getAttempt());
    assertEquals("invalid address", dead.getLastError());
    assertEquals(1, runs.get());
  }

  @Test
  void retryAfterChoosesTheDelay() throws Exception {
    String id = broker.client.enqueue("worker-retry-after", "rate limited").getJobId();
    start(
        Worker.builder(broker.client)
            .handle(
                "worker-retry-after",
                job -> {
                  if (job.attempt() == 1) {
                    throw new RetryAfter(Duration.ofMillis(100), "429 from provider");
                  }
                  return null;
                }));
    // The queue's default backoff is 1 s with full jitter; retry_after replaces it.
    Job done = broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
    assertEquals(2, done.getAttempt());
    assertEquals("429 from provider", done.getAttempts(0).getError());
  }

  @Test
  void checkpointIsHandedToTheNextAttempt() throws Exception {
    String id = broker.client.enqueue("retries", "resumable").getJobId();
    List<String> seen = new java.util.concurrent.CopyOnWriteArrayList<>();
    start(
        Worker.builder(broker.client)
            .handle(
                "retries",
                job -> {
                  seen.add(new String(job.checkpoint()));
                  if (job.attempt() == 1) {
                    job.saveCheckpoint("step 1 done".getBytes());
                    throw new IOException("crash after step 1");
                  }
                  return null;
                }));
    broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
    assertEquals(List.of("", "step 1 done"), seen);
  }

  @Test
  void refusedSubscriptionIsReported() {
    Worker bad =
        Worker.builder(broker.client).handle("not a valid name!", job -> null).build();
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, bad::start);
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
    assertTrue(bad.isTerminated());
  }

  @Test
  void stopFinishesTheRunningJobAndReleasesTheRest() throws Exception {
    String first = broker.client.enqueue("worker-drain", "1").getJobId();
    String second = broker.client.enqueue("worker-drain", "2").getJobId();
    String third = broker.client.enqueue("worker-drain", "3").getJobId();
    CountDownLatch running = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    AtomicInteger started = new AtomicInteger();
    start(
        Worker.builder(broker.client)
            .concurrency(1)
            .prefetch(2) // the other two wait here, leased but not started
            .handle(
                "worker-drain",
                job -> {
                  started.incrementAndGet();
                  running.countDown();
                  assertTrue(release.await(30, TimeUnit.SECONDS));
                  return null;
                }));
    assertTrue(running.await(30, TimeUnit.SECONDS));
    // All three are leased by this worker once the prefetch is full.
    for (String id : List.of(second, third)) {
      broker.awaitState(id, JobState.JOB_STATE_ACTIVE);
    }
    Thread stopper =
        new Thread(
            () -> {
              try {
                worker.stop(Duration.ofSeconds(30));
              } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
              }
            });
    stopper.start();
    // The unstarted ones go back while the running one still runs.
    broker.awaitState(second, JobState.JOB_STATE_READY);
    broker.awaitState(third, JobState.JOB_STATE_READY);
    assertEquals(JobState.JOB_STATE_ACTIVE, broker.client.getJob(first).getState());
    release.countDown();
    stopper.join(60_000);
    assertTrue(worker.isTerminated());
    assertEquals(JobState.JOB_STATE_COMPLETED, broker.client.getJob(first).getState());
    assertEquals(1, started.get());
    assertEquals(new Worker.Stats(1, 0, 2, 0, 0), worker.stats());
    // A released job counts no attempt: its next lease is attempt 1.
    List<dev.jobbroker.v1.LeasedJob> again =
        broker
            .client
            .broker()
            .lease(
                dev.jobbroker.v1.LeaseRequest.newBuilder()
                    .setQueue("worker-drain")
                    .setWorkerId("java-test")
                    .setMaxJobs(2)
                    .setWait(JobBrokerClient.toProto(Duration.ofSeconds(10)))
                    .build())
            .getJobsList();
    assertEquals(2, again.size());
    for (dev.jobbroker.v1.LeasedJob j : again) {
      assertEquals(1, j.getAttempt(), j.getJobId());
    }
  }

  @Test
  void reconnectsAfterTheBrokerRestarts() throws Exception {
    try (BrokerProcess own = BrokerProcess.start(null)) {
      AtomicInteger handled = new AtomicInteger();
      worker =
          Worker.builder(own.client)
              .reconnectBackoff(Duration.ofMillis(50), Duration.ofMillis(400))
              .handle("worker-reconnect", job -> handled.incrementAndGet())
              .build();
      worker.start();
      String before = own.client.enqueue("worker-reconnect", "before").getJobId();
      own.awaitState(before, JobState.JOB_STATE_COMPLETED);

      own.restart();
      String after =
          own.client
              .broker()
              .withWaitForReady() // the channel reconnects too
              .withDeadlineAfter(30, TimeUnit.SECONDS)
              .enqueue(
                  dev.jobbroker.v1.EnqueueRequest.newBuilder()
                      .setQueue("worker-reconnect")
                      .build())
              .getJobId();
      Job done = own.awaitState(after, JobState.JOB_STATE_COMPLETED);
      assertEquals(1, done.getAttempt());
      assertEquals(2, handled.get());
      assertTrue(worker.stats().reconnects() >= 1, worker.stats().toString());
      worker.stop(Duration.ofSeconds(10));
    }
  }

  /**
   * Keepalive: a broker frozen by SIGSTOP (its kernel keeps the connection open, so only a ping
   * without an answer shows it) is given up while it stays frozen: the worker's connection leaves
   * ESTABLISHED and its stream ends. Once the broker runs again the worker comes back by itself
   * and runs the next job. 10 s is gRPC's shortest keepalive time; with a 1 s timeout the freeze
   * shows about 11 s after the broker's last frame.
   */
  @Test
  void givesUpAFrozenBrokerAndComesBack() throws Exception {
    ClientOptions.Builder keepalive =
        ClientOptions.builder().keepalive(Duration.ofSeconds(10), Duration.ofSeconds(1));
    try (BrokerProcess own = BrokerProcess.start(null, List.of(), keepalive)) {
      String queue = "worker-keepalive";
      List<String> ran = new CopyOnWriteArrayList<>();
      worker =
          Worker.builder(own.client)
              .workerId("keepalive-worker")
              // 2 s leases: should the job after the thaw go to a connection the worker tried
              // while the broker was frozen, and closed just as the broker answered it, it comes
              // back in seconds.
              .leaseDuration(Duration.ofSeconds(2))
              .reconnectBackoff(Duration.ofMillis(50), Duration.ofMillis(500))
              .handle(
                  queue,
                  job -> {
                    ran.add(job.payloadText());
                    return null;
                  })
              .build();
      worker.start();
      own.awaitState(own.client.enqueue(queue, "before").getJobId(), JobState.JOB_STATE_COMPLETED);
      // The worker's end of its connection: the port of ListWorkers' peer ("ipv4:127.0.0.1:PORT").
      List<WorkerInfo> workers = own.client.listWorkers(queue);
      assertEquals(1, workers.size(), workers.toString());
      int workerPort = port(workers.get(0).getPeer());
      int brokerPort = port(own.target());
      assertTrue(
          established(workerPort, brokerPort),
          "no ESTABLISHED connection from port " + workerPort + " to the broker's " + brokerPort);

      own.freeze();
      awaitWithin(
          Duration.ofSeconds(40),
          "the worker to give the frozen broker's connection up",
          () -> !established(workerPort, brokerPort) && worker.stats().reconnects() >= 1);

      own.thaw();
      String after =
          own.client
              .broker()
              .withWaitForReady() // the channel connects again too
              .withDeadlineAfter(30, TimeUnit.SECONDS)
              .enqueue(
                  dev.jobbroker.v1.EnqueueRequest.newBuilder()
                      .setQueue(queue)
                      .setPayload(com.google.protobuf.ByteString.copyFromUtf8("after"))
                      .build())
              .getJobId();
      Job done = own.awaitState(after, JobState.JOB_STATE_COMPLETED);
      assertEquals(
          "keepalive-worker",
          done.getAttempts(done.getAttemptsCount() - 1).getWorkerId(),
          done.toString());
      assertEquals(List.of("before", "after"), ran);
      worker.stop(Duration.ofSeconds(10));
    }
  }

  @Test
  void keepaliveOptionsAreChecked() {
    ClientOptions defaults = ClientOptions.builder().build();
    assertTrue(defaults.keepalive());
    assertEquals(ClientOptions.DEFAULT_KEEPALIVE_TIME, defaults.keepaliveTime());
    assertEquals(ClientOptions.DEFAULT_KEEPALIVE_TIMEOUT, defaults.keepaliveTimeout());
    assertTrue(!ClientOptions.builder().keepalive(false).build().keepalive());
    for (Duration bad : List.of(Duration.ZERO, Duration.ofSeconds(-1))) {
      IllegalArgumentException time =
          assertThrows(
              IllegalArgumentException.class,
              () -> ClientOptions.builder().keepalive(bad, Duration.ofSeconds(1)));
      assertTrue(time.getMessage().contains("keepaliveTime"), time.getMessage());
      IllegalArgumentException timeout =
          assertThrows(
              IllegalArgumentException.class,
              () -> ClientOptions.builder().keepalive(Duration.ofSeconds(10), bad));
      assertTrue(timeout.getMessage().contains("keepaliveTimeout"), timeout.getMessage());
    }
    // Below gRPC's 10 s minimum is allowed (gRPC raises it); the client still connects and calls.
    try (JobBrokerClient c =
        JobBrokerClient.connect(
            ClientOptions.builder()
                .address(broker.target())
                .keepalive(Duration.ofSeconds(1), Duration.ofSeconds(1))
                .build())) {
      c.listQueues();
    }
    try (JobBrokerClient c =
        JobBrokerClient.connect(
            ClientOptions.builder().address(broker.target()).keepalive(false).build())) {
      c.listQueues();
    }
  }

  /** The port of "host:port" or "ipv4:host:port". */
  private static int port(String address) {
    return Integer.parseInt(address.substring(address.lastIndexOf(':') + 1));
  }

  /**
   * Whether /proc/net/tcp or tcp6 (the JVM's sockets are IPv6 ones, IPv4 addresses mapped) has a
   * connection from local port {@code from} to remote port {@code to} in state ESTABLISHED (01).
   */
  private static boolean established(int from, int to) {
    List<String> lines = new java.util.ArrayList<>();
    try {
      lines.addAll(Files.readAllLines(Path.of("/proc/net/tcp")));
      lines.addAll(Files.readAllLines(Path.of("/proc/net/tcp6")));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    String local = String.format(":%04X", from);
    String remote = String.format(":%04X", to);
    for (String line : lines) {
      // "sl local_address rem_address st ...", addresses as HEXIP:HEXPORT.
      String[] f = line.trim().split("\\s+");
      if (f.length >= 4 && f[1].endsWith(local) && f[2].endsWith(remote) && f[3].equals("01")) {
        return true;
      }
    }
    return false;
  }

  private static void awaitWithin(Duration limit, String what, BooleanSupplier done)
      throws InterruptedException {
    long end = System.nanoTime() + limit.toNanos();
    while (!done.getAsBoolean()) {
      if (System.nanoTime() > end) {
        throw new AssertionError("not within " + limit.toSeconds() + " s: " + what);
      }
      Thread.sleep(50);
    }
  }
}
