package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.jobbroker.v1.AckRequest;
import dev.jobbroker.v1.AttemptOutcome;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import dev.jobbroker.v1.FailReason;
import dev.jobbroker.v1.FailRequest;
import dev.jobbroker.v1.FailResponse;
import dev.jobbroker.v1.HeartbeatRequest;
import dev.jobbroker.v1.HeartbeatResponse;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import dev.jobbroker.v1.LeaseRequest;
import dev.jobbroker.v1.LeasedJob;
import dev.jobbroker.v1.SubscribeRequest;
import dev.jobbroker.v1.WorkRequest;
import dev.jobbroker.v1.WorkResponse;
import dev.jobbroker.v1.WorkResult;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The generated stubs against the real broker: the unary API and the raw Work stream. */
class BrokerApiTest {
  // "retries": 3 attempts, 50 ms between them, no jitter.
  static final String CONFIG =
      """
      {"queues": {"retries": {"retry": {"maxAttempts": 3, "initialBackoff": "0.05s",
        "jitter": "JITTER_NONE"}, "leaseDuration": "1s"}}}
      """;

  static BrokerProcess broker;
  static BrokerGrpc.BrokerBlockingStub stub;

  @BeforeAll
  static void startBroker() throws Exception {
    broker = BrokerProcess.start(CONFIG);
    stub = broker.client.broker();
  }

  @AfterAll
  static void stopBroker() throws Exception {
    broker.close();
  }

  private static LeasedJob leaseOne(String queue) {
    List<LeasedJob> jobs =
        stub.lease(
                LeaseRequest.newBuilder()
                    .setQueue(queue)
                    .setWorkerId("java-test")
                    .setWait(JobBrokerClient.toProto(Duration.ofSeconds(10)))
                    .build())
            .getJobsList();
    assertEquals(1, jobs.size(), "one job leased from " + queue);
    return jobs.get(0);
  }

  @Test
  void enqueueLeaseHeartbeatAck() throws Exception {
    EnqueueResponse enq =
        broker.client.enqueue(
            EnqueueRequest.newBuilder()
                .setQueue("api-basic")
                .setPayload(ByteString.copyFromUtf8("hello"))
                .putHeaders("trace-id", "t-1")
                .build());
    assertFalse(enq.getDeduplicated());
    assertEquals(JobState.JOB_STATE_READY, broker.client.getJob(enq.getJobId()).getState());

    LeasedJob job = leaseOne("api-basic");
    assertEquals(enq.getJobId(), job.getJobId());
    assertEquals("hello", job.getPayload().toStringUtf8());
    assertEquals("t-1", job.getHeadersMap().get("trace-id"));
    assertEquals(1, job.getAttempt());
    assertEquals(JobState.JOB_STATE_ACTIVE, broker.client.getJob(job.getJobId()).getState());

    HeartbeatResponse hb =
        stub.heartbeat(
            HeartbeatRequest.newBuilder()
                .setJobId(job.getJobId())
                .setLeaseId(job.getLeaseId())
                .setExtendBy(JobBrokerClient.toProto(Duration.ofSeconds(60)))
                .build());
    assertTrue(hb.getLeaseDeadline().getSeconds() > job.getLeaseDeadline().getSeconds());
    assertFalse(hb.getCancelRequested());

    stub.ack(
        AckRequest.newBuilder()
            .setJobId(job.getJobId())
            .setLeaseId(job.getLeaseId())
            .setResult(ByteString.copyFromUtf8("done"))
            .build());
    Job done = broker.client.getJob(job.getJobId());
    assertEquals(JobState.JOB_STATE_COMPLETED, done.getState());
    assertEquals("done", done.getResult().toStringUtf8());
    assertEquals(1, done.getAttempt());
  }

  @Test
  void failWithRetryIsLeasedAgainAsAttemptTwo() throws Exception {
    String id = broker.client.enqueue("retries", "flaky").getJobId();
    LeasedJob first = leaseOne("retries");
    assertEquals(id, first.getJobId());
    FailResponse fail =
        stub.fail(
            FailRequest.newBuilder()
                .setJobId(id)
                .setLeaseId(first.getLeaseId())
                .setError("provider timed out")
                .build());
    assertEquals(JobState.JOB_STATE_SCHEDULED, fail.getState());
    assertTrue(fail.hasNextAttemptAt());

    LeasedJob second = leaseOne("retries");
    assertEquals(id, second.getJobId());
    assertEquals(2, second.getAttempt());
    assertEquals(3, second.getMaxAttempts());
    assertEquals(first.getIdempotencyKey(), second.getIdempotencyKey());
    assertNotEquals(first.getLeaseId(), second.getLeaseId());

    // The first lease is fenced off now.
    StatusRuntimeException stale =
        assertThrows(
            StatusRuntimeException.class,
            () ->
                stub.ack(
                    AckRequest.newBuilder().setJobId(id).setLeaseId(first.getLeaseId()).build()));
    assertEquals(Status.Code.FAILED_PRECONDITION, stale.getStatus().getCode());

    stub.ack(AckRequest.newBuilder().setJobId(id).setLeaseId(second.getLeaseId()).build());
    Job done = broker.client.getJob(id);
    assertEquals(JobState.JOB_STATE_COMPLETED, done.getState());
    assertEquals(2, done.getAttempt());
    assertEquals(AttemptOutcome.ATTEMPT_OUTCOME_ERROR, done.getAttempts(0).getOutcome());
    assertEquals("provider timed out", done.getAttempts(0).getError());
  }

  @Test
  void permanentFailKillsTheJobAfterOneAttempt() throws Exception {
    String id = broker.client.enqueue("api-permanent", "bad address").getJobId();
    LeasedJob job = leaseOne("api-permanent");
    FailResponse fail =
        stub.fail(
            FailRequest.newBuilder()
                .setJobId(id)
                .setLeaseId(job.getLeaseId())
                .setError("invalid address")
                .setPermanent(true)
                .build());
    assertEquals(JobState.JOB_STATE_FAILED, fail.getState());
    Job dead = broker.client.getJob(id);
    assertEquals(JobState.JOB_STATE_FAILED, dead.getState());
    assertEquals(FailReason.FAIL_REASON_PERMANENT, dead.getFailReason());
    assertEquals(1, dead.getAttempt());
    assertEquals(1, dead.getAttemptsCount());
    assertEquals(AttemptOutcome.ATTEMPT_OUTCOME_PERMANENT_ERROR, dead.getAttempts(0).getOutcome());
    assertEquals("invalid address", dead.getLastError());
  }

  @Test
  void dedupKeyReturnsTheSameJob() {
    EnqueueRequest req =
        EnqueueRequest.newBuilder()
            .setQueue("api-dedup")
            .setPayload(ByteString.copyFromUtf8("welcome user_7"))
            .setDedupKey("welcome:user_7")
            .build();
    EnqueueResponse first = broker.client.enqueue(req);
    EnqueueResponse second = broker.client.enqueue(req);
    assertFalse(first.getDeduplicated());
    assertTrue(second.getDeduplicated());
    assertEquals(first.getJobId(), second.getJobId());
    assertEquals("welcome:user_7", broker.client.getJob(first.getJobId()).getIdempotencyKey());

    // The same key with another payload is a caller bug.
    StatusRuntimeException e =
        assertThrows(
            StatusRuntimeException.class,
            () ->
                broker.client.enqueue(
                    req.toBuilder().setPayload(ByteString.copyFromUtf8("other")).build()));
    assertEquals(Status.Code.ALREADY_EXISTS, e.getStatus().getCode());
  }

  @Test
  void emptyQueueNameIsInvalidArgument() {
    StatusRuntimeException e =
        assertThrows(StatusRuntimeException.class, () -> broker.client.enqueue("", "x"));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
    assertTrue(
        e.getStatus().getDescription().contains("queue"),
        "message names the field: " + e.getStatus().getDescription());
  }

  @Test
  void batchEnqueueKeepsOrder() {
    List<EnqueueResponse> results =
        broker.client.enqueueBatch(
            List.of(
                EnqueueRequest.newBuilder().setQueue("api-batch").setPriority(1).build(),
                EnqueueRequest.newBuilder().setQueue("api-batch").setPriority(2).build(),
                EnqueueRequest.newBuilder().setQueue("api-batch").setPriority(3).build()));
    assertEquals(3, results.size());
    for (int i = 0; i < 3; i++) {
      assertEquals(i + 1, broker.client.getJob(results.get(i).getJobId()).getPriority());
    }
    // All or nothing: one bad job refuses the batch.
    StatusRuntimeException e =
        assertThrows(
            StatusRuntimeException.class,
            () ->
                broker.client.enqueueBatch(
                    List.of(
                        EnqueueRequest.newBuilder().setQueue("api-batch").build(),
                        EnqueueRequest.newBuilder().setQueue("").build())));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
  }

  /** The raw Work stream through the async stub: subscribe, a pushed job, heartbeat, ack. */
  @Test
  void workStreamPushesAJobThatIsHeartbeatAndAcked() throws Exception {
    LinkedBlockingQueue<Object> events = new LinkedBlockingQueue<>();
    StreamObserver<WorkRequest> requests =
        broker
            .client
            .brokerAsync()
            .work(
                new StreamObserver<>() {
                  @Override
                  public void onNext(WorkResponse r) {
                    events.add(r);
                  }

                  @Override
                  public void onError(Throwable t) {
                    events.add(t);
                  }

                  @Override
                  public void onCompleted() {
                    events.add("completed");
                  }
                });
    try {
      requests.onNext(
          WorkRequest.newBuilder()
              .setRequestId(1)
              .setSubscribe(
                  SubscribeRequest.newBuilder()
                      .addQueues("api-stream")
                      .setWorkerId("java-stream-test")
                      .setMaxInFlight(1))
              .build());
      WorkResult subscribed = nextResponse(events).getResult();
      assertEquals(1, subscribed.getRequestId());
      assertEquals(0, subscribed.getCode(), subscribed.getMessage());

      String id = broker.client.enqueue("api-stream", "pushed").getJobId();
      WorkResponse pushed = nextResponse(events);
      assertTrue(pushed.hasJob(), "a job is pushed: " + pushed);
      LeasedJob job = pushed.getJob();
      assertEquals(id, job.getJobId());
      assertEquals("pushed", job.getPayload().toString(StandardCharsets.UTF_8));

      requests.onNext(
          WorkRequest.newBuilder()
              .setRequestId(2)
              .setHeartbeat(
                  HeartbeatRequest.newBuilder()
                      .setJobId(id)
                      .setLeaseId(job.getLeaseId())
                      .setCheckpoint(ByteString.copyFromUtf8("half way")))
              .build());
      WorkResult beat = nextResponse(events).getResult();
      assertEquals(2, beat.getRequestId());
      assertEquals(0, beat.getCode(), beat.getMessage());
      assertTrue(beat.hasLeaseDeadline());
      assertEquals("half way", broker.client.getJob(id).getCheckpoint().toStringUtf8());

      requests.onNext(
          WorkRequest.newBuilder()
              .setRequestId(3)
              .setAck(AckRequest.newBuilder().setJobId(id).setLeaseId(job.getLeaseId()))
              .build());
      WorkResult ack = nextResponse(events).getResult();
      assertEquals(3, ack.getRequestId());
      assertEquals(0, ack.getCode(), ack.getMessage());
      assertEquals(JobState.JOB_STATE_COMPLETED, broker.client.getJob(id).getState());

      // A stale lease is refused on the stream too, as a result carrying the code.
      requests.onNext(
          WorkRequest.newBuilder()
              .setRequestId(4)
              .setHeartbeat(HeartbeatRequest.newBuilder().setJobId(id).setLeaseId("no-such"))
              .build());
      WorkResult stale = nextResponse(events).getResult();
      assertEquals(4, stale.getRequestId());
      assertNotEquals(0, stale.getCode());
    } finally {
      requests.onCompleted();
    }
  }

  private static WorkResponse nextResponse(LinkedBlockingQueue<Object> events)
      throws InterruptedException {
    Object e = events.poll(30, TimeUnit.SECONDS);
    if (e instanceof WorkResponse r) {
      return r;
    }
    throw new AssertionError("expected a WorkResponse, got " + e);
  }
}
