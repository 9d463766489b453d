package dev.jobbroker.spring;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import dev.jobbroker.client.ClientOptions;
import dev.jobbroker.client.JobBrokerClient;
import dev.jobbroker.client.Worker;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.context.ApplicationEvent;
import org.springframework.context.ApplicationListener;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.context.event.ContextClosedEvent;

/** The auto-configuration in application contexts, against the real broker. */
class JobBrokerAutoConfigurationTest {
  private static final Duration GIVE_UP = Duration.ofSeconds(30);

  private static BrokerProcess broker;

  @BeforeAll
  static void startBroker() throws Exception {
    broker = BrokerProcess.start();
  }

  @AfterAll
  static void stopBroker() throws Exception {
    if (broker != null) {
      broker.close();
    }
  }

  /** A context with the auto-configuration, its client on the test's broker. */
  private ApplicationContextRunner runner() {
    return new ApplicationContextRunner()
        .withConfiguration(AutoConfigurations.of(JobBrokerAutoConfiguration.class))
        .withPropertyValues("jobbroker.address=" + broker.target());
  }

  @Test
  void propertiesBecomeTheClientsOptions() {
    runner()
        .withPropertyValues(
            "jobbroker.address=127.0.0.1:7071, 127.0.0.1:7072",
            "jobbroker.token=s3cret",
            "jobbroker.default-deadline=3s")
        .run(
            context -> {
              assertThat(context).hasNotFailed();
              ClientOptions options = context.getBean(JobBrokerClient.class).options();
              assertThat(options.addresses()).containsExactly("127.0.0.1:7071", "127.0.0.1:7072");
              assertThat(options.token()).isEqualTo("s3cret");
              assertThat(options.defaultDeadline()).isEqualTo(Duration.ofSeconds(3));
              assertThat(options.tls()).isFalse();
            });
  }

  @Test
  void batchPropertiesBecomeTheClientsCoalescingOptions() {
    runner()
        .withPropertyValues(
            "jobbroker.batch.max-jobs=10",
            "jobbroker.batch.max-bytes=4096",
            "jobbroker.batch.linger=5ms",
            "jobbroker.batch.max-in-flight=2")
        .run(
            context -> {
              assertThat(context).hasNotFailed();
              ClientOptions options = context.getBean(JobBrokerClient.class).options();
              assertThat(options.batching()).isTrue();
              assertThat(options.batchMaxJobs()).isEqualTo(10);
              assertThat(options.batchMaxBytes()).isEqualTo(4096);
              assertThat(options.batchLinger()).isEqualTo(Duration.ofMillis(5));
              assertThat(options.batchMaxInFlight()).isEqualTo(2);
            });
    runner()
        .run(
            context -> {
              ClientOptions options = context.getBean(JobBrokerClient.class).options();
              assertThat(options.batching()).isTrue();
              assertThat(options.batchMaxJobs()).isEqualTo(ClientOptions.DEFAULT_BATCH_MAX_JOBS);
              assertThat(options.batchLinger()).isEqualTo(Duration.ZERO);
            });
    runner()
        .withPropertyValues("jobbroker.batch.enabled=false")
        .run(
            context ->
                assertThat(context.getBean(JobBrokerClient.class).options().batching())
                    .isFalse());
    runner()
        .withPropertyValues("jobbroker.batch.max-jobs=0")
        .run(
            context ->
                assertThat(context)
                    .getFailure()
                    .hasStackTraceContaining("jobbroker.batch: batchMaxJobs must be 1 to 1000"));
  }

  @Test
  void keepalivePropertiesBecomeTheClientsKeepaliveOptions() {
    runner()
        .withPropertyValues("jobbroker.keepalive.time=30s", "jobbroker.keepalive.timeout=2s")
        .run(
            context -> {
              assertThat(context).hasNotFailed();
              ClientOptions options = context.getBean(JobBrokerClient.class).options();
              assertThat(options.keepalive()).isTrue();
              assertThat(options.keepaliveTime()).isEqualTo(Duration.ofSeconds(30));
              assertThat(options.keepaliveTimeout()).isEqualTo(Duration.ofSeconds(2));
            });
    runner()
        .run(
            context -> {
              ClientOptions options = context.getBean(JobBrokerClient.class).options();
              assertThat(options.keepalive()).isTrue();
              assertThat(options.keepaliveTime()).isEqualTo(ClientOptions.DEFAULT_KEEPALIVE_TIME);
              assertThat(options.keepaliveTimeout())
                  .isEqualTo(ClientOptions.DEFAULT_KEEPALIVE_TIMEOUT);
            });
    runner()
        .withPropertyValues("jobbroker.keepalive.enabled=false", "jobbroker.keepalive.time=20s")
        .run(
            context ->
                assertThat(context.getBean(JobBrokerClient.class).options().keepalive())
                    .isFalse());
    runner()
        .withPropertyValues("jobbroker.keepalive.timeout=0s")
        .run(
            context ->
                assertThat(context)
                    .getFailure()
                    .hasStackTraceContaining(
                        "jobbroker.keepalive: keepaliveTimeout must be positive"));
  }

  @Test
  void tlsPropertiesReadTheirPemFiles(@TempDir Path dir) throws Exception {
    // The files are only read here (no connection), so any bytes stand for the PEM text.
    Path ca = Files.writeString(dir.resolve("ca.pem"), "the CA");
    Path cert = Files.writeString(dir.resolve("client.pem"), "the client certificate");
    Path key = Files.writeString(dir.resolve("client.key"), "the client key");
    JobBrokerProperties properties = new JobBrokerProperties();
    properties.getTls().setCa(ca.toString());
    properties.getTls().setCert(cert.toString());
    properties.getTls().setKey(key.toString());

    ClientOptions options = JobBrokerAutoConfiguration.clientOptions(properties);
    assertThat(options.tls()).isTrue();
    assertThat(options.caPem()).isEqualTo(Files.readAllBytes(ca));
    assertThat(options.certPem()).isEqualTo(Files.readAllBytes(cert));
    assertThat(options.keyPem()).isEqualTo(Files.readAllBytes(key));

    properties.getTls().setKey(null);
    assertThatThrownBy(() -> JobBrokerAutoConfiguration.clientOptions(properties))
        .hasMessageContaining("jobbroker.tls.cert and jobbroker.tls.key");
  }

  @Test
  void withoutHandlersThereIsNoWorker() {
    runner()
        .run(
            context -> {
              assertThat(context).hasSingleBean(JobBrokerClient.class);
              assertThat(context).doesNotHaveBean(Worker.class);
              assertThat(context).doesNotHaveBean(JobBrokerWorkerLifecycle.class);
            });
  }

  @Test
  void theApplicationsOwnClientWins() {
    runner()
        .withUserConfiguration(OwnClientConfiguration.class)
        .run(
            context -> {
              assertThat(context).hasSingleBean(JobBrokerClient.class);
              assertThat(context.getBean(JobBrokerClient.class).options().token())
                  .isEqualTo("the application's");
            });
  }

  @Test
  void theApplicationsOwnWorkerReplacesTheAutoConfiguredOne() {
    runner()
        .withUserConfiguration(EmailHandlerConfiguration.class, OwnWorkerConfiguration.class)
        .run(
            context -> {
              assertThat(context).hasNotFailed();
              assertThat(context).hasSingleBean(Worker.class);
              assertThat(context).hasBean("ownWorker");
              // Not started by the context: it has no handler, and start() would say so.
              assertThat(context).doesNotHaveBean(JobBrokerWorkerLifecycle.class);
            });
  }

  @Test
  void workerEnabledFalseLeavesTheWorkerOut() {
    runner()
        .withUserConfiguration(EmailHandlerConfiguration.class)
        .withPropertyValues("jobbroker.worker.enabled=false")
        .run(
            context -> {
              assertThat(context).hasSingleBean(JobBrokerClient.class);
              assertThat(context).doesNotHaveBean(Worker.class);
            });
  }

  @Test
  void twoHandlersOfOneQueueFailTheContext() {
    runner()
        .withUserConfiguration(EmailHandlerConfiguration.class)
        .withBean(
            "secondEmails",
            JobBrokerHandler.class,
            () -> JobBrokerHandler.of("emails", job -> null))
        .run(
            context ->
                assertThat(context)
                    .getFailure()
                    .hasRootCauseMessage("queue \"emails\" already has a handler"));
  }

  @Test
  void aRefusedSubscriptionFailsTheContextsStart() {
    runner()
        .withBean(
            "badQueue",
            JobBrokerHandler.class,
            () -> JobBrokerHandler.of("not a valid name!", job -> null))
        .run(
            context -> {
              assertThat(context).hasFailed();
              assertThat(context.getStartupFailure())
                  .rootCause()
                  .isInstanceOfSatisfying(
                      StatusRuntimeException.class,
                      e ->
                          assertThat(e.getStatus().getCode())
                              .isEqualTo(Status.Code.INVALID_ARGUMENT));
            });
  }

  @Test
  void aHandlerBeanCompletesJobsAndTheWorkerStopsWithTheContext() {
    AtomicReference<Worker> worker = new AtomicReference<>();
    runner()
        .withUserConfiguration(EmailHandlerConfiguration.class)
        .withPropertyValues(
            "jobbroker.worker.concurrency=2",
            "jobbroker.worker.prefetch=1",
            "jobbroker.worker.grace=5s")
        .run(
            context -> {
              assertThat(context).hasNotFailed();
              assertThat(context).hasSingleBean(Worker.class);
              worker.set(context.getBean(Worker.class));
              assertThat(context.getBean(JobBrokerWorkerLifecycle.class).isRunning()).isTrue();

              JobBrokerClient client = context.getBean(JobBrokerClient.class);
              String id = client.enqueue("emails", "ada@example.com").getJobId();
              Job done = awaitState(client, id, JobState.JOB_STATE_COMPLETED);
              assertThat(done.getResult().toStringUtf8()).isEqualTo("sent to ada@example.com");
            });
    // The runner has closed the context: the worker's graceful stop has finished.
    assertThat(worker.get().isTerminated()).isTrue();
    assertThat(worker.get().refusal()).isNull();
    assertThat(worker.get().stats().acked()).isEqualTo(1);
    assertThat(worker.get().stats().failed()).isZero();
  }

  @Test
  void closingTheContextLetsARunningHandlerFinish() throws Exception {
    CountDownLatch started = new CountDownLatch(1);
    CountDownLatch closing = new CountDownLatch(1);
    JobBrokerHandler report =
        JobBrokerHandler.of(
            "reports",
            job -> {
              started.countDown();
              // Held until the context is closing, so the job is surely running at the close.
              closing.await();
              Thread.sleep(300); // work that goes on while the worker stops
              return "report done";
            });
    // ContextClosedEvent comes first in a close, before the lifecycle beans are stopped.
    ApplicationListener<ApplicationEvent> onClose =
        event -> {
          if (event instanceof ContextClosedEvent) {
            closing.countDown();
          }
        };
    AtomicReference<Worker> worker = new AtomicReference<>();
    try (JobBrokerClient outside =
        JobBrokerClient.connect(ClientOptions.builder().address(broker.target()).build())) {
      String id = outside.enqueue("reports", "q3").getJobId();
      runner()
          .withBean("reports", JobBrokerHandler.class, () -> report)
          .withBean("onClose", ApplicationListener.class, () -> onClose)
          .withPropertyValues("jobbroker.worker.grace=30s")
          .run(
              context -> {
                worker.set(context.getBean(Worker.class));
                assertThat(started.await(GIVE_UP.toSeconds(), TimeUnit.SECONDS)).isTrue();
              });
      // The close waited for the handler, within its grace: the job completed, not released.
      assertThat(closing.getCount()).isZero();
      Job done = awaitState(outside, id, JobState.JOB_STATE_COMPLETED);
      assertThat(done.getResult().toStringUtf8()).isEqualTo("report done");
    }
    assertThat(worker.get().isTerminated()).isTrue();
    assertThat(worker.get().stats().acked()).isEqualTo(1);
    assertThat(worker.get().stats().released()).isZero();
  }

  private static Job awaitState(JobBrokerClient client, String id, JobState state)
      throws InterruptedException {
    long giveUp = System.nanoTime() + GIVE_UP.toNanos();
    Job job = client.getJob(id);
    while (job.getState() != state) {
      if (System.nanoTime() > giveUp) {
        throw new AssertionError("job never became " + state + "; last seen:\n" + job);
      }
      Thread.sleep(50);
      job = client.getJob(id);
    }
    return job;
  }

  @Configuration(proxyBeanMethods = false)
  static class EmailHandlerConfiguration {
    @Bean
    JobBrokerHandler emails() {
      return JobBrokerHandler.of("emails", job -> "sent to " + job.payloadText());
    }
  }

  @Configuration(proxyBeanMethods = false)
  static class OwnWorkerConfiguration {
    @Bean
    Worker ownWorker(JobBrokerClient client) {
      return Worker.builder(client).build();
    }
  }

  @Configuration(proxyBeanMethods = false)
  static class OwnClientConfiguration {
    @Bean
    JobBrokerClient ownClient() {
      return JobBrokerClient.connect(
          ClientOptions.builder().address(broker.target()).token("the application's").build());
    }
  }

}
