package dev.jobbroker.client;

import java.time.Duration;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;

/**
 * What the worker test classes share: one real broker per class, and the worker a test started,
 * stopped after it.
 */
abstract class WorkerTestBase {
  static BrokerProcess broker;
  Worker worker;

  @BeforeAll
  static void startBroker() throws Exception {
    broker = BrokerProcess.start(BrokerApiTest.CONFIG);
  }

  @AfterAll
  static void stopBroker() throws Exception {
    broker.close();
  }

  @AfterEach
  void stopWorker() throws Exception {
    if (worker != null) {
      worker.stop(Duration.ofSeconds(10));
    }
  }

  Worker start(Worker.Builder b) throws InterruptedException {
    worker = b.build();
    worker.start();
    return worker;
  }
}
