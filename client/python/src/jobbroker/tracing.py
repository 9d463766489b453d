"""OpenTelemetry tracing of jobs, from the enqueue to the handler (worker contract §9).

Needs the `tracing` extra (`pip install 'jobbroker[tracing]'`: opentelemetry-api); the rest of
the package does not import this module. Two middleware:

    client.use(jobbroker.tracing.producer_tracing())
    worker.use(jobbroker.tracing.worker_tracing())

The producer's starts a PRODUCER span "<queue> publish" per job and writes its context into the
job's headers with the configured text-map propagator (W3C `traceparent` and `tracestate` by
default); the worker's reads them back and runs the handler inside a CONSUMER span
"<queue> process" whose parent is that producer span, so one trace shows the request that
enqueued the job and every attempt that worked it. Spans go to the global TracerProvider unless
one is given.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import SpanKind, Status, StatusCode

from ._version import __version__
from .client import EnqueueNext, EnqueueResult, NewJob, ProducerMiddleware
from .worker import HandlerNext, JobContext, Snooze, WorkerMiddleware

__all__ = ["producer_tracing", "worker_tracing"]

_INSTRUMENTATION = "jobbroker"
# OpenTelemetry's messaging semantic conventions.
_SYSTEM = "messaging.system"
_DESTINATION = "messaging.destination.name"
_OPERATION = "messaging.operation.type"
_MESSAGE_ID = "messaging.message.id"


def producer_tracing(
    tracer_provider: trace.TracerProvider | None = None,
    propagator: TextMapPropagator | None = None,
) -> ProducerMiddleware:
    """Producer middleware: a PRODUCER span "<queue> publish" around each enqueued job (child
    of the current span), its context written into the job's headers. The span ends when the
    broker answered, with the job's id, or with an error status when the enqueue failed.
    `propagator`: default the global one (W3C trace context and baggage)."""
    tracer = trace.get_tracer(_INSTRUMENTATION, __version__, tracer_provider=tracer_provider)

    async def trace_enqueue(jobs: list[NewJob], next_: EnqueueNext) -> list[EnqueueResult]:
        spans = []
        for job in jobs:
            span = tracer.start_span(
                f"{job.queue} publish",
                kind=SpanKind.PRODUCER,
                attributes={_SYSTEM: "jobbroker", _DESTINATION: job.queue, _OPERATION: "send"},
            )
            headers = dict(job.headers or {})
            (propagator or propagate.get_global_textmap()).inject(
                headers, context=trace.set_span_in_context(span)
            )
            job.headers = headers
            spans.append(span)
        try:
            results = await next_(jobs)
        except BaseException as err:
            for span in spans:
                span.record_exception(err)
                span.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}: {err}"))
                span.end()
            raise
        for span, result in zip(spans, results):
            span.set_attribute(_MESSAGE_ID, result.job_id)
            span.end()
        return results

    return trace_enqueue


def worker_tracing(
    tracer_provider: trace.TracerProvider | None = None,
    propagator: TextMapPropagator | None = None,
) -> WorkerMiddleware:
    """Worker middleware: the handler runs inside a CONSUMER span "<queue> process", the child
    of the producer span whose context the job's headers carry (a new trace when they carry
    none), current while the handler runs (a plain handler's thread included). It ends with an
    error status when the handler fails (a Snooze is not a failure: an event says so)."""
    tracer = trace.get_tracer(_INSTRUMENTATION, __version__, tracer_provider=tracer_provider)

    async def trace_handler(job: JobContext, next_: HandlerNext) -> Any:
        parent = (propagator or propagate.get_global_textmap()).extract(job.headers)
        attributes: dict[str, str | int] = {
            _SYSTEM: "jobbroker",
            _DESTINATION: job.queue,
            _OPERATION: "process",
            _MESSAGE_ID: job.job_id,
            "jobbroker.attempt": job.attempt,
        }
        # Not the current span's child: the job's own trace, whatever this task was doing.
        with tracer.start_as_current_span(
            f"{job.queue} process",
            context=parent or otel_context.Context(),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                return await next_(job)
            except Snooze as snooze:
                span.add_event("jobbroker.snoozed", {"delay": str(snooze.delay)})
                raise
            except BaseException as err:  # the cancellation too: the attempt did not complete
                span.record_exception(err)
                span.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}: {err}"))
                raise

    return trace_handler
