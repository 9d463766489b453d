package dev.jobbroker.spring;

import dev.jobbroker.client.Worker;
import java.time.Duration;
import java.util.Objects;
import org.springframework.context.SmartLifecycle;

/**
 * Starts the auto-configured {@link Worker} once the application context is refreshed (every
 * other bean is ready, so handlers never see a half-built context) and stops it gracefully when
 * the context closes: no new jobs, held ones given back, running handlers given {@code grace} to
 * finish, then cancelled (their jobs released for another worker).
 *
 * <p>It is in the last phase to start and so the first to stop: the handlers' collaborators (data
 * sources, clients) are still open while running jobs finish. The stop blocks the closing thread
 * for up to the grace and one second more. A worker is not restartable: a context stopped and
 * started again ({@code ConfigurableApplicationContext#stop}, then {@code start}) fails the second
 * start.
 */
public class JobBrokerWorkerLifecycle implements SmartLifecycle {
  private final Worker worker;
  private final Duration grace;
  private volatile boolean running;

  public JobBrokerWorkerLifecycle(Worker worker, Duration grace) {
    this.worker = Objects.requireNonNull(worker, "worker");
    this.grace = Objects.requireNonNull(grace, "grace");
  }

  /**
   * Subscribes to the handlers' queues; returns once the broker answered, or after the worker's
   * own short wait when it cannot be reached yet (it keeps reconnecting, so an application can
   * start before its broker). A refusal (a bad queue name, UNAUTHENTICATED) fails the context.
   */
  @Override
  public void start() {
    try {
      worker.start();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while starting the jobbroker worker", e);
    }
    running = true;
  }

  @Override
  public void stop() {
    try {
      worker.stop(grace);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      running = false;
    }
  }

  @Override
  public boolean isRunning() {
    return running;
  }

  /** The worker this lifecycle starts and stops. */
  public Worker worker() {
    return worker;
  }
}
