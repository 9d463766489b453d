package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.jobbroker.v1.AttemptOutcome;
import dev.jobbroker.v1.CancelJobRequest;
import dev.jobbroker.v1.CompletedStep;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.FailRequest;
import dev.jobbroker.v1.HeartbeatRequest;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import dev.jobbroker.v1.LeaseRequest;
import dev.jobbroker.v1.LeasedJob;
import dev.jobbroker.v1.ListWorkersRequest;
import dev.jobbroker.v1.StepCheckpoint;
import dev.jobbroker.v1.WorkRequest;
import dev.jobbroker.v1.WorkResponse;
import dev.jobbroker.v1.WorkerInfo;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/**
 * The parts of docs/worker-contract.md that the conformance harness does not reach, and the Java
 * idioms of the rest (interrupts, {@link JobContext#cancellation()}), against the real broker.
 */
class WorkerContractTest extends WorkerTestBase {
  private static String enqueue(String queue, String payload) {
    return broker.client.enqueue(queue, payload).getJobId();
  }

  @Test
  void eachQueueRunsItsOwnHandler() throws Exception {
    String a = enqueue("contract-a", "x");
    String b = enqueue("contract-b", "y");
    start(
        Worker.builder(broker.client)
            .handle("contract-a", job -> "a saw " + job.queue())
            .handle("contract-b", job -> Map.of("b saw", job.queue())));
    assertEquals(
        "a saw contract-a",
        broker.awaitState(a, JobState.JOB_STATE_COMPLETED).getResult().toStringUtf8());
    assertEquals(
        "{\"b saw\":\"contract-b\"}",
        broker.awaitState(b, JobState.JOB_STATE_COMPLETED).getResult().toStringUtf8());
  }

  @Test
  void startingWithoutAHandlerIsAnErrorBeforeConnecting() {
    Worker none = Worker.builder(broker.client).build();
    assertThrows(IllegalStateException.class, none::start);
  }

  @Test
  void aQueueTakesOneHandler() {
    Worker w = Worker.builder(broker.client).handle("contract-dup", job -> null).build();
    assertThrows(IllegalArgumentException.class, () -> w.handle("contract-dup", job -> null));
  }

  @Test
  void everyCallNamesTheLibraryToTheBroker() throws Exception {
    CountDownLatch running = new CountDownLatch(1);
    CountDownLatch finish = new CountDownLatch(1);
    String id = enqueue("contract-identify", "x");
    start(
        Worker.builder(broker.client)
            .workerId("java-identify")
            .handle(
                "contract-identify",
                job -> {
                  running.countDown();
                  finish.await();
                  return null;
                }));
    assertTrue(running.await(30, TimeUnit.SECONDS));
    List<WorkerInfo> workers =
        broker.client.admin().listWorkers(ListWorkersRequest.getDefaultInstance()).getWorkersList();
    WorkerInfo me =
        workers.stream().filter(w -> w.getWorkerId().equals("java-identify")).findFirst().get();
    assertEquals("jobbroker-java/" + JobBrokerClient.VERSION, me.getClient());
    finish.countDown();
    broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
  }

  @Test
  void snoozeRunsTheJobAgainWithoutSpendingAnAttempt() throws Exception {
    String id = enqueue("contract-snooze", "x");
    List<Integer> attempts = new CopyOnWriteArrayList<>();
    start(
        Worker.builder(broker.client)
            .handle(
                "contract-snooze",
                job -> {
                  attempts.add(job.attempt());
                  if (attempts.size() == 1) {
                    throw new Snooze(Duration.ofMillis(100));
                  }
                  return null;
                }));
    Job done = broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
    assertEquals(1, done.getSnoozes());
    assertEquals(List.of(1, 1), attempts);
  }

  @Test
  void operatorCancelInterruptsTheHandlerAndTheJobStaysCancelled() throws Exception {
    String id = enqueue("contract-cancel", "x");
    CountDownLatch running = new CountDownLatch(1);
    AtomicReference<JobContext.Cancellation> seen = new AtomicReference<>();
    start(
        Worker.builder(broker.client)
            .handle(
                "contract-cancel",
                job -> {
                  running.countDown();
                  try {
                    Thread.sleep(60_000);
                  } catch (InterruptedException e) {
                    seen.set(job.cancellation());
                    throw e;
                  }
                  return null;
                }));
    assertTrue(running.await(30, TimeUnit.SECONDS));
    broker.client.admin().cancelJob(CancelJobRequest.newBuilder().setJobId(id).build());
    broker.awaitState(id, JobState.JOB_STATE_CANCELLED);
    worker.stop(Duration.ofSeconds(10)); // waits for the handler's answer
    assertEquals(JobContext.Cancellation.OPERATOR, seen.get());
    assertEquals(JobState.JOB_STATE_CANCELLED, broker.client.getJob(id).getState());
  }

  @Test
  void aHandlerThatReturnsAfterAnOperatorCancelIsAckedAndTheJobCompletes() throws Exception {
    String id = enqueue("contract-cancel-done", "x");
    CountDownLatch running = new CountDownLatch(1);
    AtomicReference<JobContext.Cancellation> seen = new AtomicReference<>();
    start(
        Worker.builder(broker.client)
            .handle(
                "contract-cancel-done",
                job -> {
                  running.countDown();
                  job.awaitCancellation();
                  seen.set(job.cancellation());
                  return "finished anyway"; // the work was done: an ack completes a cancelled job
                }));
    assertTrue(running.await(30, TimeUnit.SECONDS));
    broker.client.admin().cancelJob(CancelJobRequest.newBuilder().setJobId(id).build());
    Job done = broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
    assertEquals("finished anyway", done.getResult().toStringUtf8());
    assertEquals(1, done.getAttempt());
    worker.stop(Duration.ofSeconds(10)); // waits for the ack's answer
    assertEquals(JobContext.Cancellation.OPERATOR, seen.get());
    assertEquals(1, worker.stats().acked());
    assertEquals(0, worker.stats().failed());
  }

  @Test
  void aTimedOutHandlerThatIgnoresItKeepsItsSlotUntilItReturns() throws Exception {
    // concurrency is a hard bound: the stuck handler's attempt is over (the broker timed it out,
    // the helper forgot it), but the next job, pushed meanwhile, waits until the handler returns.
    String stuck =
        broker
            .client
            .enqueue(
                EnqueueRequest.newBuilder()
                    .setQueue("contract-stuck")
                    .setPayload(ByteString.copyFromUtf8("stuck"))
                    .setTimeout(JobBrokerClient.toProto(Duration.ofMillis(300)))
                    .build())
            .getJobId();
    CountDownLatch stuckRunning = new CountDownLatch(1);
    CountDownLatch unstick = new CountDownLatch(1);
    AtomicInteger running = new AtomicInteger();
    AtomicInteger most = new AtomicInteger();
    List<String> order = new CopyOnWriteArrayList<>();
    AtomicReference<JobContext.Cancellation> seen = new AtomicReference<>();
    start(
        Worker.builder(broker.client)
            .concurrency(1)
            .handle(
                "contract-stuck",
                job -> {
                  most.accumulateAndGet(running.incrementAndGet(), Math::max);
                  try {
                    order.add("start " + job.payloadText() + " " + job.attempt());
                    if (job.payloadText().equals("stuck") && job.attempt() == 1) {
                      stuckRunning.countDown();
                      // A blocking call that ignores the interrupt of the time-out.
                      while (true) {
                        try {
                          unstick.await();
                          break;
                        } catch (InterruptedException ignored) {
                          // not looking at it
                        }
                      }
                      seen.set(job.cancellation());
                      order.add("stuck returned");
                    }
                    return "ok " + job.attempt();
                  } finally {
                    running.decrementAndGet();
                  }
                }));
    assertTrue(stuckRunning.await(30, TimeUnit.SECONDS));
    String next = enqueue("contract-stuck", "next");
    // The broker ended attempt 1 and, its in-flight slot free, pushed the next job: the helper
    // holds it (leased, heartbeated) without starting it.
    broker.awaitJob(
        stuck,
        j -> j.getAttemptsCount() >= 1
            && j.getAttempts(0).getOutcome() == AttemptOutcome.ATTEMPT_OUTCOME_TIMED_OUT,
        Duration.ofSeconds(30));
    broker.awaitState(next, JobState.JOB_STATE_ACTIVE);
    Thread.sleep(300); // time for a wrongly freed slot to start it
    assertEquals(List.of("start stuck 1"), order);
    assertEquals(JobState.JOB_STATE_ACTIVE, broker.client.getJob(next).getState());
    unstick.countDown();
    Job nextDone = broker.awaitState(next, JobState.JOB_STATE_COMPLETED);
    assertEquals(1, nextDone.getAttempt());
    Job stuckDone = broker.awaitState(stuck, JobState.JOB_STATE_COMPLETED);
    assertEquals("ok 2", stuckDone.getResult().toStringUtf8()); // attempt 1's return sent nothing
    assertEquals(JobContext.Cancellation.TIMED_OUT, seen.get());
    assertEquals(1, most.get(), "handlers at once");
    assertTrue(
        order.indexOf("stuck returned") < order.indexOf("start next 1"), order.toString());
    worker.stop(Duration.ofSeconds(10));
    assertEquals(new Worker.Stats(2, 0, 0, 1, 0), worker.stats());
  }

  @Test
  void aTimeOutInterruptsTheHandlerAndTheNextAttemptRuns() throws Exception {
    String id =
        broker
            .client
            .enqueue(
                EnqueueRequest.newBuilder()
                    .setQueue("retries")
                    .setPayload(ByteString.copyFromUtf8("slow"))
                    .setTimeout(JobBrokerClient.toProto(Duration.ofSeconds(1)))
                    .build())
            .getJobId();
    AtomicReference<JobContext.Cancellation> seen = new AtomicReference<>();
    start(
        Worker.builder(broker.client)
            .handle(
                "retries",
                job -> {
                  if (job.attempt() == 1) {
                    assertTrue(job.timeoutAt().isPresent());
                    job.awaitCancellation();
                    seen.set(job.cancellation());
                    throw new InterruptedException("gave up");
                  }
                  return "second";
                }));
    Job done = broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
    assertEquals(JobContext.Cancellation.TIMED_OUT, seen.get());
    assertEquals(AttemptOutcome.ATTEMPT_OUTCOME_TIMED_OUT, done.getAttempts(0).getOutcome());
    assertEquals("second", done.getResult().toStringUtf8());
  }

  @Test
  void theEndOfGraceCancelsTheHandlerAndReleasesItsJob() throws Exception {
    String id = enqueue("contract-grace", "x");
    CountDownLatch running = new CountDownLatch(1);
    AtomicReference<JobContext.Cancellation> seen = new AtomicReference<>();
    start(
        Worker.builder(broker.client)
            .handle(
                "contract-grace",
                job -> {
                  running.countDown();
                  job.awaitCancellation();
                  seen.set(job.cancellation());
                  return "finished anyway"; // still released: the stop was not the job's fault
                }));
    assertTrue(running.await(30, TimeUnit.SECONDS));
    worker.stop(Duration.ofMillis(200));
    assertEquals(JobContext.Cancellation.SHUTDOWN, seen.get());
    Job job = broker.client.getJob(id);
    assertEquals(JobState.JOB_STATE_READY, job.getState());
    assertEquals(1, worker.stats().released());
  }

  @Test
  void progressIsSentAtOnce() throws Exception {
    String id = enqueue("contract-progress", "x");
    CountDownLatch seenByBroker = new CountDownLatch(1);
    start(
        Worker.builder(broker.client)
            .handle(
                "contract-progress",
                job -> {
                  job.progress(Map.of("percent", 50));
                  assertTrue(seenByBroker.await(30, TimeUnit.SECONDS));
                  return null;
                }));
    Job job =
        broker.awaitJob(
            id, j -> j.getProgress().toStringUtf8().equals("{\"percent\":50}"), Duration.ofSeconds(30));
    assertEquals(JobState.JOB_STATE_ACTIVE, job.getState());
    seenByBroker.countDown();
    broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
  }

  @Test
  void stepsResumeFromACheckpointAnotherLanguageWrote() throws Exception {
    String id = enqueue("retries", "steps");
    // Attempt 1 as another language's helper leaves it: step "a" done, then the worker died.
    LeasedJob first = leaseOne("retries");
    assertEquals(id, first.getJobId());
    String foreign = "{\"by\":\"go\",\"n\":1,\"nested\":{\"half\":1.5,\"list\":[1,\"x\",true,null],"
        + "\"text\":\"h\u00e9llo \u2713\"}}";
    StepCheckpoint written =
        StepCheckpoint.newBuilder()
            .addSteps(
                CompletedStep.newBuilder()
                    .setName("a")
                    .setResult(ByteString.copyFrom(foreign, StandardCharsets.UTF_8)))
            .build();
    broker.client.broker().heartbeat(
        HeartbeatRequest.newBuilder()
            .setJobId(id)
            .setLeaseId(first.getLeaseId())
            .setCheckpoint(written.toByteString())
            .build());
    broker.client.broker().fail(
        FailRequest.newBuilder().setJobId(id).setLeaseId(first.getLeaseId()).setError("died").build());

    List<String> ran = new CopyOnWriteArrayList<>();
    start(
        Worker.builder(broker.client)
            .handle(
                "retries",
                job -> {
                  Object a = job.step("a", () -> ran.add("a"));
                  Object b =
                      job.step(
                          "b",
                          () -> {
                            ran.add("b");
                            return List.of(2, 2.5, "b");
                          });
                  return Map.of("a", a, "b", b);
                }));
    Job done = broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
    assertEquals(List.of("b"), ran);
    assertEquals(
        Json.parse("{\"a\":" + foreign + ",\"b\":[2,2.5,\"b\"]}"),
        Json.decode(done.getResult().toByteArray()));
    StepCheckpoint saved = StepCheckpoint.parseFrom(done.getCheckpoint());
    assertEquals(2, saved.getStepsCount());
    assertEquals("a", saved.getSteps(0).getName());
    assertEquals(foreign, saved.getSteps(0).getResult().toStringUtf8()); // kept byte for byte
    assertEquals("b", saved.getSteps(1).getName());
    assertEquals("[2,2.5,\"b\"]", saved.getSteps(1).getResult().toStringUtf8());
  }

  @Test
  void aStepNameUsedTwiceFailsTheAttempt() throws Exception {
    String id =
        broker
            .client
            .enqueue(
                EnqueueRequest.newBuilder()
                    .setQueue("contract-steps-twice")
                    .setMaxAttempts(1)
                    .build())
            .getJobId();
    start(
        Worker.builder(broker.client)
            .handle(
                "contract-steps-twice",
                job -> {
                  job.step("same", () -> 1);
                  job.step("same", () -> 2);
                  return null;
                }));
    Job dead = broker.awaitState(id, JobState.JOB_STATE_FAILED);
    assertTrue(dead.getLastError().contains("used twice"), dead.getLastError());
  }

  @Test
  void aCheckpointThatIsNotStepsFailsTheAttemptInsteadOfRunningStepsAgain() throws Exception {
    String id =
        broker
            .client
            .enqueue(
                EnqueueRequest.newBuilder().setQueue("retries").setMaxAttempts(2).build())
            .getJobId();
    LeasedJob first = leaseOne("retries");
    broker.client.broker().heartbeat(
        HeartbeatRequest.newBuilder()
            .setJobId(id)
            .setLeaseId(first.getLeaseId())
            .setCheckpoint(ByteString.copyFromUtf8("page=7"))
            .build());
    broker.client.broker().fail(
        FailRequest.newBuilder().setJobId(id).setLeaseId(first.getLeaseId()).setError("x").build());
    AtomicInteger ran = new AtomicInteger();
    start(
        Worker.builder(broker.client)
            .handle("retries", job -> job.step("a", ran::incrementAndGet)));
    Job dead = broker.awaitState(id, JobState.JOB_STATE_FAILED);
    assertTrue(dead.getLastError().contains("not a jobbroker.v1.StepCheckpoint"), dead.getLastError());
    assertEquals(0, ran.get());
  }

  @Test
  void acksAreCoalescedWithOneAckMessageInFlight() throws Exception {
    WorkStreamRecorder recorder = new WorkStreamRecorder();
    ManagedChannel channel =
        Grpc.newChannelBuilder(broker.target(), InsecureChannelCredentials.create())
            .intercept(recorder)
            .build();
    int jobs = 200;
    List<EnqueueRequest> batch = new ArrayList<>();
    for (int i = 0; i < jobs; i++) {
      batch.add(EnqueueRequest.newBuilder().setQueue("contract-acks").build());
    }
    Set<String> ids = new HashSet<>();
    broker.client.enqueueBatch(batch).forEach(r -> ids.add(r.getJobId()));
    try (JobBrokerClient client = JobBrokerClient.wrap(channel)) {
      worker =
          Worker.builder(client).concurrency(8).handle("contract-acks", job -> null).build();
      worker.start();
      for (String id : ids) {
        broker.awaitState(id, JobState.JOB_STATE_COMPLETED);
      }
      worker.stop(Duration.ofSeconds(10));
      worker = null;
    } finally {
      channel.shutdownNow();
    }
    assertEquals(jobs, recorder.acked.get(), "acks sent (alone or in batches)");
    assertFalse(recorder.overlapped.get(), "a second ack message went out before the answer");
  }

  /** Watches the Work stream: the acks sent, and whether two ack messages were ever unanswered. */
  private static final class WorkStreamRecorder implements ClientInterceptor {
    final AtomicInteger acked = new AtomicInteger();
    final java.util.concurrent.atomic.AtomicBoolean overlapped =
        new java.util.concurrent.atomic.AtomicBoolean();
    private final Set<Long> ackMessagesUnanswered = java.util.concurrent.ConcurrentHashMap.newKeySet();

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          super.start(
              new ForwardingClientCallListener.SimpleForwardingClientCallListener<>(listener) {
                @Override
                public void onMessage(RespT message) {
                  if (message instanceof WorkResponse r && r.hasResult()) {
                    ackMessagesUnanswered.remove(r.getResult().getRequestId());
                  }
                  super.onMessage(message);
                }
              },
              headers);
        }

        @Override
        public void sendMessage(ReqT message) {
          if (message instanceof WorkRequest r && (r.hasAck() || r.hasAckBatch())) {
            acked.addAndGet(r.hasAck() ? 1 : r.getAckBatch().getAcksCount());
            if (!ackMessagesUnanswered.isEmpty()) {
              overlapped.set(true);
            }
            ackMessagesUnanswered.add(r.getRequestId());
          }
          super.sendMessage(message);
        }
      };
    }
  }

  @Test
  void anAnswerNotConfirmedBeforeABrokerRestartIsSentOnTheNextStream() throws Exception {
    try (BrokerProcess own = BrokerProcess.start(null)) {
      String id =
          own.client
              .enqueue(
                  EnqueueRequest.newBuilder()
                      .setQueue("contract-restart")
                      .setLeaseDuration(JobBrokerClient.toProto(Duration.ofSeconds(30)))
                      .build())
              .getJobId();
      CountDownLatch running = new CountDownLatch(1);
      CountDownLatch finish = new CountDownLatch(1);
      worker =
          Worker.builder(own.client)
              .reconnectBackoff(Duration.ofMillis(50), Duration.ofMillis(400))
              .handle(
                  "contract-restart",
                  job -> {
                    running.countDown();
                    finish.await();
                    return "done after the restart";
                  })
              .build();
      worker.start();
      assertTrue(running.await(30, TimeUnit.SECONDS));
      own.restart();
      finish.countDown(); // the ack waits for a stream, then goes out on it
      Job done = awaitCompletedAcrossRestart(own, id);
      assertEquals(1, done.getAttemptsCount());
      assertEquals("done after the restart", done.getResult().toStringUtf8());
      worker.stop(Duration.ofSeconds(10));
      worker = null;
    }
  }

  /**
   * Contract §6, last paragraph: a stream that ends during a graceful stop (here the broker
   * restarts in the grace) is reopened after the backoff, and the ack of a handler that returns
   * in the grace goes out on it: the job ends COMPLETED and the stop returns as soon as that ack
   * is answered, not at the end of its grace.
   */
  @Test
  void aStreamThatEndsDuringAGracefulStopIsReopenedForTheAnswersStillToCome() throws Exception {
    try (BrokerProcess own = BrokerProcess.start(null)) {
      String id =
          own.client
              .enqueue(
                  EnqueueRequest.newBuilder()
                      .setQueue("contract-stop-restart")
                      .setLeaseDuration(JobBrokerClient.toProto(Duration.ofSeconds(60)))
                      .build())
              .getJobId();
      CountDownLatch finish = new CountDownLatch(1);
      Worker w = startWithItsHandlerHeld(own, "contract-stop-restart", finish, "acked during the stop");

      Duration grace = Duration.ofSeconds(30);
      long began = System.nanoTime();
      CompletableFuture<Void> stopped = stopInBackground(w, grace);
      TimeUnit.MILLISECONDS.sleep(500); // steps 1 and 2 done: the handler is in its grace
      assertFalse(stopped.isDone(), "the stop did not wait for the running handler");
      own.restart(); // the stream ends during the grace
      finish.countDown(); // its ack waits for the reopened stream
      stopped.get(grace.toSeconds() + 10, TimeUnit.SECONDS);
      Duration took = Duration.ofNanos(System.nanoTime() - began);

      assertTrue(
          took.compareTo(grace) < 0,
          "the stop took " + took + ", its whole grace: the ack was never answered");
      Job done = awaitCompletedAcrossRestart(own, id);
      assertEquals(1, done.getAttemptsCount());
      assertEquals("acked during the stop", done.getResult().toStringUtf8());
      assertEquals(1, w.stats().acked(), w.stats().toString());
      assertTrue(w.stats().reconnects() >= 1, w.stats().toString());
      assertTrue(w.isTerminated());
      worker = null;
    }
  }

  /**
   * Contract §6 step 5's bounds: when the stream ends during a graceful stop and no broker comes
   * back, the stop still returns within grace + 1 s + the close's 2 s (and some slack); the ack
   * it could not send is dropped, and the job comes back when its lease runs out.
   */
  @Test
  void aGracefulStopWhoseStreamCannotBeReopenedStillEndsWithinItsBounds() throws Exception {
    try (BrokerProcess own = BrokerProcess.start(null)) {
      own.client.enqueue("contract-stop-dead", "x");
      CountDownLatch finish = new CountDownLatch(1);
      Worker w = startWithItsHandlerHeld(own, "contract-stop-dead", finish, "never confirmed");

      Duration grace = Duration.ofSeconds(3);
      long began = System.nanoTime();
      CompletableFuture<Void> stopped = stopInBackground(w, grace);
      TimeUnit.MILLISECONDS.sleep(500);
      own.kill9(); // the stream ends during the grace, and nothing answers again
      finish.countDown();
      stopped.get(30, TimeUnit.SECONDS);
      Duration took = Duration.ofNanos(System.nanoTime() - began);

      // grace, then 1 s for the answers, then up to 2 s for the close; 2 s of slack.
      assertTrue(took.compareTo(grace.plusSeconds(5)) < 0, "the stop took " + took);
      assertTrue(took.compareTo(grace) >= 0, "the stop did not wait for the ack: " + took);
      assertEquals(0, w.stats().acked(), w.stats().toString());
      assertTrue(w.isTerminated());
      worker = null;
    }
  }

  /**
   * Starts a worker on {@code own} whose handler of {@code queue} runs until {@code finish} is
   * counted down and then returns {@code result}; returns once that handler is running.
   */
  private Worker startWithItsHandlerHeld(
      BrokerProcess own, String queue, CountDownLatch finish, String result) throws Exception {
    CountDownLatch running = new CountDownLatch(1);
    Worker w =
        start(
            Worker.builder(own.client)
                .reconnectBackoff(Duration.ofMillis(50), Duration.ofMillis(400))
                .handle(
                    queue,
                    job -> {
                      running.countDown();
                      finish.await();
                      return result;
                    }));
    assertTrue(running.await(30, TimeUnit.SECONDS));
    return w;
  }

  private static CompletableFuture<Void> stopInBackground(Worker w, Duration grace) {
    CompletableFuture<Void> stopped = new CompletableFuture<>();
    Thread t =
        new Thread(
            () -> {
              try {
                w.stop(grace);
                stopped.complete(null);
              } catch (Throwable e) {
                stopped.completeExceptionally(e);
              }
            },
            "test-stop");
    t.setDaemon(true);
    t.start();
    return stopped;
  }

  /** Polls GetJob, waiting for the restarted broker to be reachable again. */
  private static Job awaitCompletedAcrossRestart(BrokerProcess own, String id)
      throws InterruptedException {
    long giveUp = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (true) {
      Job job =
          own.client
              .admin()
              .withWaitForReady()
              .withDeadlineAfter(30, TimeUnit.SECONDS)
              .getJob(dev.jobbroker.v1.GetJobRequest.newBuilder().setJobId(id).build());
      if (job.getState() == JobState.JOB_STATE_COMPLETED) {
        return job;
      }
      if (System.nanoTime() > giveUp) {
        throw new AssertionError("never completed; last seen:\n" + job);
      }
      Thread.sleep(50);
    }
  }

  private static LeasedJob leaseOne(String queue) {
    List<LeasedJob> jobs =
        broker
            .client
            .broker()
            .lease(
                LeaseRequest.newBuilder()
                    .setQueue(queue)
                    .setWorkerId("java-contract-test")
                    .setWait(JobBrokerClient.toProto(Duration.ofSeconds(10)))
                    .build())
            .getJobsList();
    assertEquals(1, jobs.size());
    return jobs.get(0);
  }
}
