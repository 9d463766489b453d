package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.jobbroker.v1.AdminGrpc;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.CancelJobRequest;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import dev.jobbroker.v1.GetJobRequest;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import dev.jobbroker.v1.QueueInfo;
import dev.jobbroker.v1.QueuePolicy;
import dev.jobbroker.v1.Schedule;
import dev.jobbroker.v1.TriggerScheduleResponse;
import dev.jobbroker.v1.WorkerInfo;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The client's options, retry rule, enqueueAndWait and admin calls, against the real broker. */
class ClientTest {
  static BrokerProcess broker;

  @BeforeAll
  static void startBroker() throws Exception {
    broker = BrokerProcess.start(null);
  }

  @AfterAll
  static void stopBroker() throws Exception {
    broker.close();
  }

  /** Runs {@code handler} for {@code queue} on a worker of {@code client} until closed. */
  private static AutoCloseable work(JobBrokerClient client, String queue, JobHandler handler)
      throws InterruptedException {
    Worker w = Worker.builder(client).handle(queue, handler).grace(Duration.ofSeconds(5)).build();
    w.start();
    return () -> w.stop(Duration.ofSeconds(5));
  }

  @Test
  void tlsWithAClientCertificateAndATokenCompletesAJobAndListsTheWorker() throws Exception {
    java.nio.file.Path dir = Files.createTempDirectory("jobbroker-java-tls");
    TestCertificates certs = TestCertificates.make(dir);
    java.nio.file.Path tokens = dir.resolve("tokens.json");
    Files.writeString(
        tokens,
        """
        {"tokens": [{"name": "java-test", "token": "right-token",
                     "roles": ["producer", "worker", "admin"], "queues": ["*"]}]}
        """);
    ClientOptions.Builder secure =
        ClientOptions.builder()
            .tlsCaFile(certs.ca())
            .clientCertificate(certs.clientCert(), certs.clientKey())
            .token("right-token");
    try (BrokerProcess tlsBroker =
        BrokerProcess.start(
            null,
            List.of(
                "--tls-cert", certs.serverCert().toString(),
                "--tls-key", certs.serverKey().toString(),
                "--tls-client-ca", certs.ca().toString(),
                "--auth-tokens", tokens.toString()),
            secure)) {
      JobBrokerClient client = tlsBroker.client;
      try (AutoCloseable w = work(client, "tls.q", job -> "secret work done")) {
        Job done = client.enqueueAndWait("tls.q", "x", Duration.ofSeconds(30));
        assertEquals("secret work done", done.getResult().toStringUtf8());
        List<WorkerInfo> workers = client.listWorkers("tls.q");
        assertEquals(1, workers.size(), workers.toString());
        assertTrue(workers.get(0).getClient().startsWith("jobbroker-java/"), workers.toString());
      }

      ClientOptions wrongToken =
          ClientOptions.builder()
              .address(tlsBroker.target())
              .tlsCaFile(certs.ca())
              .clientCertificate(certs.clientCert(), certs.clientKey())
              .token("wrong-token")
              .build();
      try (JobBrokerClient refused = JobBrokerClient.connect(wrongToken)) {
        StatusRuntimeException e =
            assertThrows(StatusRuntimeException.class, () -> refused.enqueue("tls.q", "x"));
        assertEquals(Status.Code.UNAUTHENTICATED, e.getStatus().getCode());
        Worker w = Worker.builder(refused).handle("tls.q", job -> null).build();
        StatusRuntimeException s = assertThrows(StatusRuntimeException.class, w::start);
        assertEquals(Status.Code.UNAUTHENTICATED, s.getStatus().getCode());
      }
    }
  }

  @Test
  void anEnqueueWithoutADedupKeyIsSentOnceButSafeCallsAreRetried() throws Exception {
    AtomicInteger enqueues = new AtomicInteger();
    AtomicInteger gets = new AtomicInteger();
    AtomicInteger cancels = new AtomicInteger();
    Server unavailable =
        Grpc.newServerBuilderForPort(0, InsecureServerCredentials.create())
            .addService(
                new BrokerGrpc.BrokerImplBase() {
                  @Override
                  public void enqueue(EnqueueRequest r, StreamObserver<EnqueueResponse> o) {
                    enqueues.incrementAndGet();
                    o.onError(Status.UNAVAILABLE.withDescription("draining").asException());
                  }
                })
            .addService(
                new AdminGrpc.AdminImplBase() {
                  @Override
                  public void getJob(GetJobRequest r, StreamObserver<Job> o) {
                    gets.incrementAndGet();
                    o.onError(Status.UNAVAILABLE.asException());
                  }

                  @Override
                  public void cancelJob(CancelJobRequest r, StreamObserver<Job> o) {
                    cancels.incrementAndGet();
                    o.onError(Status.UNAVAILABLE.asException());
                  }
                })
            .build()
            .start();
    ClientOptions options =
        ClientOptions.builder()
            .address("127.0.0.1:" + unavailable.getPort())
            .retries(3, Duration.ofMillis(10))
            .build();
    try (JobBrokerClient client = JobBrokerClient.connect(options)) {
      assertUnavailable(() -> client.enqueue("q", "no key"));
      assertEquals(1, enqueues.get(), "an enqueue without a dedup key must not be repeated");

      assertUnavailable(() -> client.enqueue("q", "keyed", new EnqueueOptions().dedupKey("k")));
      assertEquals(1 + 3, enqueues.get(), "an enqueue with a dedup key is retried");

      assertUnavailable(() -> client.getJob("j"));
      assertEquals(3, gets.get());

      assertUnavailable(() -> client.cancelJob("j"));
      assertEquals(1, cancels.get());
    } finally {
      unavailable.shutdownNow();
    }
  }

  @Test
  void anEnqueueWithoutAKeyToAStoppedBrokerFailsAtOnceWithUnavailable() throws Exception {
    ClientOptions options =
        ClientOptions.builder().address("127.0.0.1:" + closedPort()).build();
    try (JobBrokerClient client = JobBrokerClient.connect(options)) {
      assertUnavailable(() -> client.enqueue("q", "x"));
    }
  }

  @Test
  void callsMoveToTheNextAddressWhenOneIsUnavailable() throws Exception {
    ClientOptions options =
        ClientOptions.builder()
            .addresses("127.0.0.1:" + closedPort(), broker.target())
            .retries(3, Duration.ofMillis(10))
            .build();
    try (JobBrokerClient client = JobBrokerClient.connect(options)) {
      // Safe to repeat: the retry goes to the second address.
      String id =
          client.enqueue("failover", "x", new EnqueueOptions().dedupKey("failover-1")).getJobId();
      // Later calls stay on the address that answered, a keyless enqueue too.
      assertFalse(client.enqueue("failover", "y").getJobId().isEmpty());
      assertEquals(JobState.JOB_STATE_READY, client.getJob(id).getState());
    }
  }

  @Test
  void aCommaSeparatedAddressNamesSeveral() {
    ClientOptions options = ClientOptions.builder().address("n1:7070, n2:7070").build();
    assertEquals(List.of("n1:7070", "n2:7070"), options.addresses());
  }

  @Test
  void enqueueAndWaitReturnsTheCompletedJobWithItsResult() throws Exception {
    try (AutoCloseable w = work(broker.client, "wait.ok", job -> "hello " + job.payloadText())) {
      Job job = broker.client.enqueueAndWait("wait.ok", "world", Duration.ofSeconds(30));
      assertEquals(JobState.JOB_STATE_COMPLETED, job.getState());
      assertEquals("hello world", job.getResult().toStringUtf8());
    }
  }

  @Test
  void enqueueAndWaitNamesTheStateOfAFailedJob() throws Exception {
    try (AutoCloseable w =
        work(broker.client, "wait.fail", job -> {
          throw new PermanentError("no such user");
        })) {
      JobFailedException e =
          assertThrows(
              JobFailedException.class,
              () -> broker.client.enqueueAndWait("wait.fail", "x", Duration.ofSeconds(30)));
      assertTrue(e.getMessage().contains("JOB_STATE_FAILED"), e.getMessage());
      assertTrue(e.getMessage().contains("no such user"), e.getMessage());
      assertEquals(JobState.JOB_STATE_FAILED, e.job().getState());
    }
  }

  @Test
  void enqueueAndWaitNamesTheStateOfACancelledJob() throws Exception {
    // No worker: the job waits READY until it is cancelled from another thread.
    EnqueueRequest request =
        new EnqueueOptions().delay(Duration.ofHours(1)).toRequest("wait.cancel", new byte[0]);
    String id = broker.client.enqueue(request).getJobId();
    Thread canceller =
        new Thread(
            () -> {
              try {
                Thread.sleep(200);
              } catch (InterruptedException ignored) {
                return;
              }
              broker.client.cancelJob(id);
            });
    canceller.start();
    JobFailedException e =
        assertThrows(
            JobFailedException.class, () -> broker.client.awaitJob(id, Duration.ofSeconds(30)));
    canceller.join();
    assertTrue(e.getMessage().contains("JOB_STATE_CANCELLED"), e.getMessage());
  }

  @Test
  void enqueueAndWaitGivesUpAfterItsTimeout() {
    StatusRuntimeException e =
        assertThrows(
            StatusRuntimeException.class,
            () -> broker.client.enqueueAndWait("wait.nobody", "x", Duration.ofMillis(300)));
    assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getStatus().getCode());
  }

  @Test
  void enqueueOptionsReachTheJob() {
    Instant expire = Instant.now().plus(Duration.ofHours(2));
    String dep = broker.client.enqueue("opts.dep", "first").getJobId();
    String id =
        broker.client
            .enqueue(
                "opts",
                "x",
                new EnqueueOptions()
                    .header("tenant", "acme")
                    .priority(7)
                    .delay(Duration.ofMinutes(5))
                    .dedupKey("opts-1")
                    .dedupTtl(Duration.ofHours(1))
                    .maxAttempts(4)
                    .leaseDuration(Duration.ofSeconds(20))
                    .concurrencyKey("tenant-acme")
                    .timeout(Duration.ofSeconds(30))
                    .expireAt(expire)
                    .dependsOn(dep))
            .getJobId();
    Job job = broker.client.getJob(id);
    assertEquals(Map.of("tenant", "acme"), job.getHeadersMap());
    assertEquals(7, job.getPriority());
    assertEquals(4, job.getMaxAttempts());
    assertEquals("opts-1", job.getDedupKey());
    assertEquals("tenant-acme", job.getConcurrencyKey());
    assertEquals(Duration.ofSeconds(30), JobBrokerClient.fromProto(job.getTimeout()));
    assertEquals(expire.getEpochSecond(), job.getExpireAt().getSeconds());
    assertEquals(List.of(dep), job.getDependsOnList());
    assertEquals(JobState.JOB_STATE_WAITING, job.getState());
  }

  @Test
  void aScheduleRoundTrips() {
    Schedule put =
        broker.client.putSchedule(
            Schedule.newBuilder()
                .setScheduleId("java-nightly")
                .setEvery(JobBrokerClient.toProto(Duration.ofHours(1)))
                .setTemplate(
                    EnqueueRequest.newBuilder()
                        .setQueue("scheduled")
                        .setPayload(ByteString.copyFromUtf8("tick")))
                .build());
    assertTrue(put.hasNextRunAt());
    assertEquals("scheduled", broker.client.getSchedule("java-nightly").getTemplate().getQueue());
    assertTrue(
        broker.client.listSchedules("scheduled").stream()
            .anyMatch(s -> s.getScheduleId().equals("java-nightly")));

    TriggerScheduleResponse run = broker.client.triggerSchedule("java-nightly");
    Job job = broker.client.getJob(run.getJobId());
    assertEquals("tick", job.getPayload().toString(StandardCharsets.UTF_8));
    assertTrue(job.getDedupKey().startsWith("java-nightly@"), job.getDedupKey());

    broker.client.deleteSchedule("java-nightly");
    StatusRuntimeException e =
        assertThrows(
            StatusRuntimeException.class, () -> broker.client.getSchedule("java-nightly"));
    assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode());
  }

  @Test
  void listWorkersShowsARunningWorkerAndItsLibrary() throws Exception {
    try (AutoCloseable w = work(broker.client, "listed", job -> null)) {
      List<WorkerInfo> workers = broker.client.listWorkers("listed");
      assertEquals(1, workers.size(), workers.toString());
      assertEquals(List.of("listed"), workers.get(0).getQueuesList());
      assertEquals(
          "jobbroker-java/" + JobBrokerClient.VERSION, workers.get(0).getClient());
    }
  }

  @Test
  void queueAndJobAdminCallsDoWhatTheySay() {
    JobBrokerClient c = broker.client;
    String id = c.enqueue("admin.q", "x").getJobId();
    assertEquals(1, c.listJobs("admin.q", JobState.JOB_STATE_READY).getJobsCount());
    assertTrue(c.listQueues().stream().anyMatch(q -> q.getName().equals("admin.q")));

    assertTrue(c.pauseQueue("admin.q").getPolicy().getPaused());
    assertFalse(c.resumeQueue("admin.q").getPolicy().getPaused());
    QueueInfo q =
        c.updateQueuePolicy("admin.q", QueuePolicy.newBuilder().setMaxConcurrency(3).build());
    assertEquals(3, q.getPolicy().getMaxConcurrency());
    assertEquals(1, c.getQueue("admin.q").getCountsOrDefault("JOB_STATE_READY", 0));

    assertEquals(JobState.JOB_STATE_CANCELLED, c.cancelJob(id).getState());
    assertEquals(JobState.JOB_STATE_READY, c.retryJob(id).getState());
    c.cancelJob(id);
    c.deleteJob(id);
    assertThrows(StatusRuntimeException.class, () -> c.getJob(id));

    c.cancelJob(c.enqueue("admin.q", "y").getJobId());
    assertEquals(1, c.purgeQueue("admin.q"));
    assertTrue(c.getCluster().getPartitionCount() >= 1);
  }

  @Test
  void withDeadlineBoundsUnaryCalls() {
    // A long-poll Lease that outlives the view's deadline: DEADLINE_EXCEEDED, not a 5 s wait.
    StatusRuntimeException e =
        assertThrows(
            StatusRuntimeException.class,
            () ->
                broker
                    .client
                    .withDeadline(Duration.ofMillis(200))
                    .lease(
                        dev.jobbroker.v1.LeaseRequest.newBuilder()
                            .setQueue("deadline.empty")
                            .setWorkerId("t")
                            .setWait(JobBrokerClient.toProto(Duration.ofSeconds(5)))
                            .build()));
    assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getStatus().getCode());
  }

  private static void assertUnavailable(Runnable call) {
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, call::run);
    assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
  }

  /** A port nothing listens on (taken, then freed). */
  private static int closedPort() throws IOException {
    try (ServerSocket s = new ServerSocket(0)) {
      return s.getLocalPort();
    }
  }
}
