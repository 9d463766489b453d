// OpenTelemetry tracing for jobbroker, as a producer and a worker middleware
// (docs/worker-contract.md §9). A module of its own ("@jobbroker/client/tracing") so that the
// main entry point never loads @opentelemetry/api, an optional peer dependency: only a program
// that imports this module needs it installed.
import {
  SpanKind,
  SpanStatusCode,
  context,
  defaultTextMapGetter,
  defaultTextMapSetter,
  propagation,
  trace,
  type Attributes,
  type TextMapPropagator,
  type Tracer,
  type TracerProvider,
} from "@opentelemetry/api";
import { clientName } from "./client.js";
import { SnoozeError } from "./errors.js";
import type { ProducerMiddleware } from "./middleware.js";
import type { WorkerMiddleware } from "./worker.js";

export interface TracingOptions {
  /** Where spans go; default the global provider (`trace.setGlobalTracerProvider`, NodeSDK). */
  tracerProvider?: TracerProvider;
  /**
   * Writes and reads the trace context in the job's headers; default the global propagator
   * (`propagation.setGlobalPropagator`; NodeSDK registers W3C trace context and baggage). With
   * W3C trace context the headers are `traceparent` and `tracestate`.
   */
  propagator?: TextMapPropagator;
}

const instrumentationName = "@jobbroker/client";
const instrumentationVersion = clientName.slice(clientName.indexOf("/") + 1);

function tracerOf(o: TracingOptions): Tracer {
  return (o.tracerProvider ?? trace.getTracerProvider()).getTracer(instrumentationName, instrumentationVersion);
}

function errorText(e: unknown): string {
  return e instanceof Error ? e.message || e.name : String(e);
}

/**
 * Producer middleware (`client.use(tracingProducer())`): each enqueue runs in a PRODUCER span
 * "<queue> publish", child of the active span, whose context goes into the job's headers
 * (`traceparent`, `tracestate`) for the worker's consumer span. The span ends when the broker
 * answered; it records the job id, or the error.
 */
export function tracingProducer(options: TracingOptions = {}): ProducerMiddleware {
  const propagator = options.propagator ?? propagation;
  return async (request, next) => {
    const attributes: Attributes = {
      "messaging.system": "jobbroker",
      "messaging.operation.type": "send",
      "messaging.destination.name": request.queue,
    };
    const span = tracerOf(options).startSpan(`${request.queue} publish`, { kind: SpanKind.PRODUCER, attributes }, context.active());
    const withSpan = trace.setSpan(context.active(), span);
    propagator.inject(withSpan, request.headers, defaultTextMapSetter);
    try {
      const result = await context.with(withSpan, () => next(request));
      span.setAttribute("messaging.message.id", result.jobId);
      return result;
    } catch (e) {
      span.recordException(e instanceof Error ? e : errorText(e));
      span.setStatus({ code: SpanStatusCode.ERROR, message: errorText(e) });
      throw e;
    } finally {
      span.end();
    }
  };
}

/**
 * Worker middleware (`worker.use(tracingWorker())`): each handler call runs in a CONSUMER span
 * "<queue> process" whose parent is the producer's span, read from the job's headers (a job
 * enqueued without one starts a trace of its own). The span is active while the handler runs
 * (with a context manager registered, as NodeSDK does, the handler's own spans are its
 * children) and ends with an error status when the handler fails; a snooze is not a failure.
 */
export function tracingWorker(options: TracingOptions = {}): WorkerMiddleware {
  const propagator = options.propagator ?? propagation;
  return async (job, next) => {
    const parent = propagator.extract(context.active(), job.headers, defaultTextMapGetter);
    const attributes: Attributes = {
      "messaging.system": "jobbroker",
      "messaging.operation.type": "process",
      "messaging.destination.name": job.queue,
      "messaging.message.id": job.jobId,
      "jobbroker.attempt": job.attempt,
    };
    const span = tracerOf(options).startSpan(`${job.queue} process`, { kind: SpanKind.CONSUMER, attributes }, parent);
    try {
      return await context.with(trace.setSpan(parent, span), next);
    } catch (e) {
      if (!(e instanceof SnoozeError)) {
        span.recordException(e instanceof Error ? e : errorText(e));
        span.setStatus({ code: SpanStatusCode.ERROR, message: errorText(e) });
      }
      throw e;
    } finally {
      span.end();
    }
  };
}
