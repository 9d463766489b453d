package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.v1.AttemptOutcome;
import dev.jobbroker.v1.FailReason;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
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
}
