package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.client.tracing.JobBrokerTracing;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.Job;
import dev.jobbroker.v1.JobState;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.StatusCode;
import io.opentelemetry.sdk.OpenTelemetrySdk;
import io.opentelemetry.sdk.testing.exporter.InMemorySpanExporter;
import io.opentelemetry.sdk.trace.SdkTracerProvider;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Worker and producer middleware (contract §9) and the OpenTelemetry pair, on the real broker. */
class MiddlewareTest {
  static BrokerProcess broker;
  private JobBrokerClient client; // a client of this test's own, so middleware stays here
  private Worker worker;

  @BeforeAll
  static void startBroker() throws Exception {
    broker = BrokerProcess.start(null);
  }

  @AfterAll
  static void stopBroker() throws Exception {
    broker.close();
  }

  @AfterEach
  void stop() throws Exception {
    if (worker != null) {
      worker.stop(Duration.ofSeconds(5));
    }
    if (client != null) {
      client.close();
    }
  }

  private void startWorker(Worker.Builder b) throws InterruptedException {
    worker = b.build();
    worker.start();
  }

  @Test
  void workerMiddlewareRunsInTheOrderAddedTheFirstOutermost() throws Exception {
    client = JobBrokerClient.connect(broker.target());
    List<String> calls = new CopyOnWriteArrayList<>();
    WorkerMiddleware a =
        (job, next) -> {
          calls.add("a in");
          Object r = next.handle(job);
          calls.add("a out");
          return r;
        };
    WorkerMiddleware b =
        (job, next) -> {
          calls.add("b in");
          return "b saw " + next.handle(job);
        };
    startWorker(
        Worker.builder(client)
            .use(a)
            .use(b)
            .handle(
                "mw.order",
                job -> {
                  calls.add("handler");
                  return "result";
                }));
    Job done = client.enqueueAndWait("mw.order", "x", Duration.ofSeconds(30));
    assertEquals(List.of("a in", "b in", "handler", "a out"), calls);
    assertEquals("b saw result", done.getResult().toStringUtf8());
  }

  @Test
  void workerMiddlewareThatSkipsNextAnswersForTheHandler() throws Exception {
    client = JobBrokerClient.connect(broker.target());
    startWorker(
        Worker.builder(client)
            .use(
                (job, next) -> {
                  throw new PermanentError("refused by middleware");
                })
            .handle("mw.skip", job -> "never"));
    JobFailedException e =
        assertThrows(
            JobFailedException.class,
            () -> client.enqueueAndWait("mw.skip", "x", Duration.ofSeconds(30)));
    assertTrue(e.getMessage().contains("refused by middleware"), e.getMessage());
  }

  @Test
  void producerMiddlewareCanAddHeadersToSingleAndBatchEnqueues() {
    client = JobBrokerClient.connect(broker.target());
    client.use(
        (request, next) ->
            next.enqueue(request.toBuilder().putHeaders("tenant", "acme").build()));
    String one = client.enqueue("mw.headers", "x").getJobId();
    List<String> batch =
        client
            .enqueueBatch(
                List.of(
                    EnqueueRequest.newBuilder().setQueue("mw.headers").build(),
                    EnqueueRequest.newBuilder().setQueue("mw.headers").build()))
            .stream()
            .map(r -> r.getJobId())
            .toList();
    for (String id : List.of(one, batch.get(0), batch.get(1))) {
      assertEquals(Map.of("tenant", "acme"), client.getJob(id).getHeadersMap());
    }
  }

  @Test
  void tracedEnqueueAndTracedWorkShareOneTrace() throws Exception {
    InMemorySpanExporter spans = InMemorySpanExporter.create();
    try (OpenTelemetrySdk otel =
        OpenTelemetrySdk.builder()
            .setTracerProvider(
                SdkTracerProvider.builder()
                    .addSpanProcessor(SimpleSpanProcessor.create(spans))
                    .build())
            .build()) {
      JobBrokerTracing tracing = JobBrokerTracing.create(otel);
      client = JobBrokerClient.connect(broker.target()).use(tracing.producerMiddleware());
      startWorker(
          Worker.builder(client)
              .use(tracing.workerMiddleware())
              .handle(
                  "traced",
                  job -> {
                    if (job.payloadText().equals("fail")) {
                      throw new PermanentError("broken");
                    }
                    return "ok";
                  }));

      Job done = client.enqueueAndWait("traced", "work", Duration.ofSeconds(30));
      assertTrue(done.getHeadersMap().containsKey("traceparent"), done.getHeadersMap().toString());

      List<SpanData> ended = spans.getFinishedSpanItems();
      SpanData producer = only(ended, SpanKind.PRODUCER);
      SpanData consumer = only(ended, SpanKind.CONSUMER);
      assertEquals("traced publish", producer.getName());
      assertEquals("traced process", consumer.getName());
      assertEquals(producer.getTraceId(), consumer.getTraceId());
      assertEquals(producer.getSpanId(), consumer.getParentSpanId());
      assertEquals(done.getId(), consumer.getAttributes().asMap().entrySet().stream()
          .filter(e -> e.getKey().getKey().equals("messaging.message.id"))
          .findFirst().orElseThrow().getValue());
      assertFalse(consumer.getStatus().getStatusCode() == StatusCode.ERROR);

      spans.reset();
      assertThrows(
          JobFailedException.class,
          () -> client.enqueueAndWait("traced", "fail", Duration.ofSeconds(30)));
      SpanData failed = only(spans.getFinishedSpanItems(), SpanKind.CONSUMER);
      assertEquals(StatusCode.ERROR, failed.getStatus().getStatusCode());
      assertEquals(
          only(spans.getFinishedSpanItems(), SpanKind.PRODUCER).getSpanId(),
          failed.getParentSpanId());
    }
  }

  private static SpanData only(List<SpanData> spans, SpanKind kind) {
    List<SpanData> of = spans.stream().filter(s -> s.getKind() == kind).toList();
    assertEquals(1, of.size(), spans.toString());
    return of.get(0);
  }

  @Test
  void aTracedBatchGivesEachJobItsOwnProducerSpan() {
    InMemorySpanExporter spans = InMemorySpanExporter.create();
    try (OpenTelemetrySdk otel =
        OpenTelemetrySdk.builder()
            .setTracerProvider(
                SdkTracerProvider.builder()
                    .addSpanProcessor(SimpleSpanProcessor.create(spans))
                    .build())
            .build()) {
      client =
          JobBrokerClient.connect(broker.target())
              .use(JobBrokerTracing.create(otel).producerMiddleware());
      List<String> ids =
          client
              .enqueueBatch(
                  List.of(
                      EnqueueRequest.newBuilder().setQueue("traced.batch").build(),
                      EnqueueRequest.newBuilder().setQueue("traced.batch").build()))
              .stream()
              .map(r -> r.getJobId())
              .toList();
      List<SpanData> producers = spans.getFinishedSpanItems();
      assertEquals(2, producers.size(), producers.toString());
      for (int i = 0; i < 2; i++) {
        SpanData span = producers.get(i);
        assertEquals(SpanKind.PRODUCER, span.getKind());
        assertEquals("traced.batch publish", span.getName());
        String traceparent = client.getJob(ids.get(i)).getHeadersOrThrow("traceparent");
        assertTrue(traceparent.contains(span.getSpanId()), traceparent + " vs " + span);
      }
    }
  }

  @Test
  void aJobWithoutTraceHeadersGetsARootConsumerSpan() throws Exception {
    InMemorySpanExporter spans = InMemorySpanExporter.create();
    try (OpenTelemetrySdk otel =
        OpenTelemetrySdk.builder()
            .setTracerProvider(
                SdkTracerProvider.builder()
                    .addSpanProcessor(SimpleSpanProcessor.create(spans))
                    .build())
            .build()) {
      client = JobBrokerClient.connect(broker.target()); // not traced
      startWorker(
          Worker.builder(client)
              .use(JobBrokerTracing.create(otel).workerMiddleware())
              .handle("untraced", job -> null));
      assertEquals(
          JobState.JOB_STATE_COMPLETED,
          client.enqueueAndWait("untraced", "x", Duration.ofSeconds(30)).getState());
      SpanData consumer = only(spans.getFinishedSpanItems(), SpanKind.CONSUMER);
      assertFalse(consumer.getParentSpanContext().isValid());
    }
  }
}
