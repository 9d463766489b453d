package dev.jobbroker.client.tracing;

import dev.jobbroker.client.JobBrokerClient;
import dev.jobbroker.client.JobContext;
import dev.jobbroker.client.JobHandler;
import dev.jobbroker.client.ProducerMiddleware;
import dev.jobbroker.client.Snooze;
import dev.jobbroker.client.WorkerMiddleware;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import io.opentelemetry.api.OpenTelemetry;
import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.StatusCode;
import io.opentelemetry.api.trace.Tracer;
import io.opentelemetry.api.trace.propagation.W3CTraceContextPropagator;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.Scope;
import io.opentelemetry.context.propagation.TextMapGetter;
import io.opentelemetry.context.propagation.TextMapPropagator;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * OpenTelemetry tracing for jobbroker, as a pair of middleware (worker contract §9): the
 * producer's starts a PRODUCER span "{@code <queue> publish}" around each enqueue and writes its
 * W3C {@code traceparent} (and {@code tracestate}) into the job's headers; the worker's reads
 * them back and runs the handler inside a CONSUMER span "{@code <queue> process}", the producer
 * span's child, ended with an error status when the handler fails. The trace thus crosses the
 * broker, also into workers of the other languages, which read the same headers.
 *
 * <pre>{@code
 * JobBrokerTracing tracing = JobBrokerTracing.create(openTelemetry);
 * client.use(tracing.producerMiddleware());
 * worker.use(tracing.workerMiddleware());
 * }</pre>
 *
 * <p>Needs {@code io.opentelemetry:opentelemetry-api} on the class path (an optional dependency
 * of this library: only this package uses it). Spans follow OpenTelemetry's messaging
 * conventions ({@code messaging.system = jobbroker}, {@code messaging.destination.name}, {@code
 * messaging.message.id}, {@code messaging.operation.type}). Thread-safe.
 */
public final class JobBrokerTracing {
  /** The instrumentation scope of the spans. */
  public static final String INSTRUMENTATION_NAME = "dev.jobbroker.client";

  private static final AttributeKey<String> SYSTEM = AttributeKey.stringKey("messaging.system");
  private static final AttributeKey<String> DESTINATION =
      AttributeKey.stringKey("messaging.destination.name");
  private static final AttributeKey<String> MESSAGE_ID =
      AttributeKey.stringKey("messaging.message.id");
  private static final AttributeKey<String> OPERATION_TYPE =
      AttributeKey.stringKey("messaging.operation.type");
  private static final AttributeKey<String> OPERATION_NAME =
      AttributeKey.stringKey("messaging.operation.name");
  private static final AttributeKey<Long> ATTEMPT =
      AttributeKey.longKey("messaging.jobbroker.attempt");
  private static final AttributeKey<Long> BATCH_SIZE =
      AttributeKey.longKey("messaging.batch.message_count");

  private final Tracer tracer;
  private final TextMapPropagator propagator;

  private JobBrokerTracing(Tracer tracer, TextMapPropagator propagator) {
    this.tracer = tracer;
    this.propagator = propagator;
  }

  /**
   * Spans from {@code openTelemetry}'s tracer; the context travels as W3C trace context
   * (traceparent, tracestate), what every jobbroker client reads, whatever propagators the
   * application configured for HTTP.
   */
  public static JobBrokerTracing create(OpenTelemetry openTelemetry) {
    return create(openTelemetry, W3CTraceContextPropagator.getInstance());
  }

  /** As {@link #create(OpenTelemetry)}, with another propagator for the job headers. */
  public static JobBrokerTracing create(OpenTelemetry openTelemetry, TextMapPropagator propagator) {
    Tracer tracer =
        openTelemetry
            .tracerBuilder(INSTRUMENTATION_NAME)
            .setInstrumentationVersion(JobBrokerClient.VERSION)
            .build();
    return new JobBrokerTracing(tracer, Objects.requireNonNull(propagator));
  }

  /**
   * For {@link JobBrokerClient#use}: a PRODUCER span per enqueued job, its context in the job's
   * headers.
   */
  public ProducerMiddleware producerMiddleware() {
    return new ProducerMiddleware() {
      @Override
      public EnqueueResponse enqueue(EnqueueRequest request, Next next) {
        Span span = publishSpan(request.getQueue());
        try (Scope ignored = span.makeCurrent()) {
          EnqueueResponse r = next.enqueue(withTraceHeaders(request, span));
          span.setAttribute(MESSAGE_ID, r.getJobId());
          return r;
        } catch (RuntimeException e) {
          failed(span, e);
          throw e;
        } finally {
          span.end();
        }
      }

      @Override
      public List<EnqueueResponse> enqueueBatch(List<EnqueueRequest> requests, NextBatch next) {
        // One span per job, so each job's consumer span has its own parent; they end together,
        // with the batch's answer.
        List<Span> spans = new ArrayList<>(requests.size());
        List<EnqueueRequest> traced = new ArrayList<>(requests.size());
        for (EnqueueRequest r : requests) {
          Span span = publishSpan(r.getQueue());
          span.setAttribute(BATCH_SIZE, (long) requests.size());
          spans.add(span);
          traced.add(withTraceHeaders(r, span));
        }
        try {
          List<EnqueueResponse> results = next.enqueueBatch(traced);
          for (int i = 0; i < results.size() && i < spans.size(); i++) {
            spans.get(i).setAttribute(MESSAGE_ID, results.get(i).getJobId());
          }
          return results;
        } catch (RuntimeException e) {
          spans.forEach(s -> failed(s, e));
          throw e;
        } finally {
          spans.forEach(Span::end);
        }
      }
    };
  }

  /**
   * For {@link dev.jobbroker.client.Worker#use}: the handler runs inside a CONSUMER span, the
   * child of the context in the job's headers (a root span when there is none). A handler that
   * throws ends it with an error status; a {@link Snooze} is no error (the job runs later).
   */
  public WorkerMiddleware workerMiddleware() {
    return (JobContext job, JobHandler next) -> {
      Context parent = propagator.extract(Context.root(), job.headers(), HEADERS);
      Span span =
          tracer
              .spanBuilder(job.queue() + " process")
              .setParent(parent)
              .setSpanKind(SpanKind.CONSUMER)
              .setAttribute(SYSTEM, "jobbroker")
              .setAttribute(DESTINATION, job.queue())
              .setAttribute(MESSAGE_ID, job.jobId())
              .setAttribute(OPERATION_TYPE, "process")
              .setAttribute(OPERATION_NAME, "process")
              .setAttribute(ATTEMPT, (long) job.attempt())
              .startSpan();
      try (Scope ignored = span.makeCurrent()) {
        return next.handle(job);
      } catch (Snooze s) {
        span.addEvent("snoozed");
        throw s;
      } catch (Exception | Error e) {
        failed(span, e);
        throw e;
      } finally {
        span.end();
      }
    };
  }

  private Span publishSpan(String queue) {
    return tracer
        .spanBuilder(queue + " publish")
        .setSpanKind(SpanKind.PRODUCER)
        .setAttribute(SYSTEM, "jobbroker")
        .setAttribute(DESTINATION, queue)
        .setAttribute(OPERATION_TYPE, "send")
        .setAttribute(OPERATION_NAME, "publish")
        .startSpan();
  }

  private EnqueueRequest withTraceHeaders(EnqueueRequest request, Span span) {
    EnqueueRequest.Builder b = request.toBuilder();
    propagator.inject(Context.current().with(span), b, EnqueueRequest.Builder::putHeaders);
    return b.build();
  }

  private static void failed(Span span, Throwable t) {
    span.recordException(t);
    span.setStatus(StatusCode.ERROR, String.valueOf(t.getMessage()));
  }

  /** Reads trace headers from a job's headers. */
  private static final TextMapGetter<Map<String, String>> HEADERS =
      new TextMapGetter<>() {
        @Override
        public Iterable<String> keys(Map<String, String> carrier) {
          return carrier.keySet();
        }

        @Override
        public String get(Map<String, String> carrier, String key) {
          return carrier == null ? null : carrier.get(key);
        }
      };
}
