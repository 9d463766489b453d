package dev.jobbroker.spring;

import dev.jobbroker.client.ClientOptions;
import dev.jobbroker.client.JobBrokerClient;
import dev.jobbroker.client.Worker;
import dev.jobbroker.client.WorkerMiddleware;
import java.nio.file.Path;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;

/**
 * A {@link JobBrokerClient} from the {@code jobbroker.*} properties ({@link JobBrokerProperties})
 * unless the application declares its own, closed with the context; and, when the context has
 * {@link JobBrokerHandler} beans, a {@link Worker} running them, started after the context is
 * refreshed and stopped gracefully (with {@code jobbroker.worker.grace}) when it closes.
 * {@code jobbroker.worker.enabled=false} leaves the worker out, e.g. for a producer-only process
 * that shares the handler beans' code.
 */
@AutoConfiguration
@EnableConfigurationProperties(JobBrokerProperties.class)
public class JobBrokerAutoConfiguration {

  @Bean(destroyMethod = "close")
  @ConditionalOnMissingBean
  public JobBrokerClient jobBrokerClient(JobBrokerProperties properties) {
    return JobBrokerClient.connect(clientOptions(properties));
  }

  /** The client's options: each property set replaces the client's default. */
  static ClientOptions clientOptions(JobBrokerProperties properties) {
    ClientOptions.Builder options = ClientOptions.builder();
    if (hasText(properties.getAddress())) {
      options.address(properties.getAddress());
    }
    if (hasText(properties.getToken())) {
      options.token(properties.getToken());
    }
    if (properties.getDefaultDeadline() != null) {
      options.defaultDeadline(properties.getDefaultDeadline());
    }
    JobBrokerProperties.Batch batch = properties.getBatch();
    options.batching(batch.isEnabled());
    // The builder refuses a bad value naming its option (batchMaxJobs, ...); the message adds
    // the property, so a failed context start says which line to fix.
    try {
      if (batch.getMaxJobs() != null) {
        options.batchMaxJobs(batch.getMaxJobs());
      }
      if (batch.getMaxBytes() != null) {
        options.batchMaxBytes(batch.getMaxBytes());
      }
      if (batch.getLinger() != null) {
        options.batchLinger(batch.getLinger());
      }
      if (batch.getMaxInFlight() != null) {
        options.batchMaxInFlight(batch.getMaxInFlight());
      }
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("jobbroker.batch: " + e.getMessage(), e);
    }
    JobBrokerProperties.Keepalive keepalive = properties.getKeepalive();
    if (keepalive.getTime() != null || keepalive.getTimeout() != null) {
      try {
        options.keepalive(
            keepalive.getTime() != null
                ? keepalive.getTime()
                : ClientOptions.DEFAULT_KEEPALIVE_TIME,
            keepalive.getTimeout() != null
                ? keepalive.getTimeout()
                : ClientOptions.DEFAULT_KEEPALIVE_TIMEOUT);
      } catch (IllegalArgumentException e) {
        throw new IllegalArgumentException("jobbroker.keepalive: " + e.getMessage(), e);
      }
    }
    options.keepalive(keepalive.isEnabled()); // after the durations, which turn the pings on
    JobBrokerProperties.Tls tls = properties.getTls();
    if (hasText(tls.getCa())) {
      options.tlsCaFile(Path.of(tls.getCa()));
    }
    if (hasText(tls.getCert()) || hasText(tls.getKey())) {
      if (!hasText(tls.getCert()) || !hasText(tls.getKey())) {
        throw new IllegalArgumentException("jobbroker.tls.cert and jobbroker.tls.key go together");
      }
      options.clientCertificate(Path.of(tls.getCert()), Path.of(tls.getKey()));
    }
    return options.build();
  }

  private static boolean hasText(String s) {
    return s != null && !s.isBlank();
  }

  /**
   * The worker, present only with handler beans: a Worker without handlers refuses to start.
   * Its start and stop belong to {@link JobBrokerWorkerLifecycle}, not to the Worker bean, so
   * that they follow the context's refresh and close rather than bean creation. An application's
   * own Worker bean replaces both: registering handlers on it and starting it are then its own.
   */
  @Configuration(proxyBeanMethods = false)
  @ConditionalOnBean(JobBrokerHandler.class)
  @ConditionalOnMissingBean(Worker.class)
  @ConditionalOnProperty(
      prefix = "jobbroker.worker",
      name = "enabled",
      havingValue = "true",
      matchIfMissing = true)
  static class WorkerConfiguration {

    @Bean
    Worker jobBrokerWorker(
        JobBrokerClient client,
        JobBrokerProperties properties,
        ObjectProvider<JobBrokerHandler> handlers,
        ObjectProvider<WorkerMiddleware> middleware) {
      JobBrokerProperties.Worker settings = properties.getWorker();
      Worker.Builder worker =
          Worker.builder(client)
              .concurrency(settings.getConcurrency())
              .prefetch(settings.getPrefetch())
              .grace(settings.getGrace());
      // Registering a queue twice throws, which fails the context with the queue's name.
      handlers.orderedStream().forEach(h -> worker.handle(h.queue(), h));
      middleware.orderedStream().forEach(worker::use);
      return worker.build();
    }

    @Bean
    JobBrokerWorkerLifecycle jobBrokerWorkerLifecycle(
        Worker jobBrokerWorker, JobBrokerProperties properties) {
      return new JobBrokerWorkerLifecycle(jobBrokerWorker, properties.getWorker().getGrace());
    }
  }
}
