"""Middleware on both sides (worker contract §9) and OpenTelemetry tracing through them, against
the real broker; spans are read back from the SDK's in-memory exporter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from brokerproc import BrokerProcess
from conftest import running_worker, wait_state
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import jobbroker
import jobbroker.tracing
from jobbroker import EnqueueNext, EnqueueResult, HandlerNext, JobContext, NewJob


async def test_worker_middleware_runs_first_registered_outermost(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    trail: list[str] = []

    def named(name: str) -> jobbroker.WorkerMiddleware:
        async def middleware(job: JobContext, next_: HandlerNext) -> Any:
            trail.append(f"{name} in")
            result = await next_(job)
            trail.append(f"{name} out")
            return {"wrapped_by": name, "inner": result}

        return middleware

    worker.use(named("outer"))
    worker.use(named("inner"))

    @worker.handler("mw.order")
    def handle(job: JobContext) -> str:  # a plain handler, in a thread: wrapped all the same
        trail.append("handler")
        return "done"

    res = await client.enqueue("mw.order", "x")
    async with running_worker(worker):
        job = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert trail == ["outer in", "inner in", "handler", "inner out", "outer out"]
    assert json.loads(job.result) == {
        "wrapped_by": "outer", "inner": {"wrapped_by": "inner", "inner": "done"}}


async def test_worker_middleware_may_answer_without_the_handler(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    ran: list[str] = []

    @worker.use
    async def refuse_unsigned(job: JobContext, next_: HandlerNext) -> Any:
        if "signature" not in job.headers:
            raise jobbroker.PermanentError("unsigned job")
        return await next_(job)

    worker.handle("mw.guard", lambda job: ran.append(job.job_id))
    unsigned = await client.enqueue("mw.guard", "x")
    signed = await client.enqueue("mw.guard", "y", headers={"signature": "ok"})
    async with running_worker(worker):
        dead = await wait_state(client, unsigned.job_id, jobbroker.JOB_STATE_FAILED)
        await wait_state(client, signed.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert ran == [signed.job_id]
    assert dead.last_error == "unsigned job"


async def test_producer_middleware_wraps_enqueue_and_may_add_headers(
        broker: BrokerProcess) -> None:
    trail: list[str] = []

    async with jobbroker.Client(broker.address) as c:
        @c.use
        async def tenant(jobs: list[NewJob], next_: EnqueueNext) -> list[EnqueueResult]:
            trail.append(f"tenant {len(jobs)}")
            for job in jobs:
                job.headers = {**(job.headers or {}), "tenant": "acme"}
            return await next_(jobs)

        @c.use
        async def audit(jobs: list[NewJob], next_: EnqueueNext) -> list[EnqueueResult]:
            results = await next_(jobs)
            trail.append(f"audit {len(results)}")
            return results

        one = await c.enqueue("mw.producer", "x", headers={"kind": "single"})
        batch = await c.enqueue_batch([NewJob("mw.producer", "a"), NewJob("mw.producer", "b")])
        for res in [one, *batch]:
            assert (await c.get_job(res.job_id)).headers["tenant"] == "acme"
        assert (await c.get_job(one.job_id)).headers["kind"] == "single"
    assert trail == ["tenant 1", "audit 1", "tenant 2", "audit 2"]


# --- tracing ---------------------------------------------------------------------------------


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def only(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    [span] = [s for s in spans if s.name == name]
    return span


async def test_the_consumer_span_is_the_child_of_the_producer_span(
        broker: BrokerProcess, spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = spans
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    worker.use(jobbroker.tracing.worker_tracing(provider))
    seen_headers: dict[str, str] = {}

    @worker.handler("traced")
    async def handle(job: JobContext) -> str:
        seen_headers.update(job.headers)
        return "ok"

    async with jobbroker.Client(broker.address) as c:
        c.use(jobbroker.tracing.producer_tracing(provider))
        res = await c.enqueue("traced", "x", headers={"kept": "yes"})
        async with running_worker(worker):
            await wait_state(c, res.job_id, jobbroker.JOB_STATE_COMPLETED)

    finished = tuple(exporter.get_finished_spans())
    producer = only(finished, "traced publish")
    consumer = only(finished, "traced process")
    assert producer.kind == SpanKind.PRODUCER
    assert consumer.kind == SpanKind.CONSUMER
    assert producer.context is not None and consumer.context is not None
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent is not None
    assert consumer.parent.span_id == producer.context.span_id
    assert producer.attributes is not None and consumer.attributes is not None
    assert producer.attributes["messaging.message.id"] == res.job_id
    assert consumer.attributes["messaging.message.id"] == res.job_id
    assert consumer.status.status_code != StatusCode.ERROR
    # W3C trace context in the job's headers, next to the caller's own.
    trace_id = f"{producer.context.trace_id:032x}"
    span_id = f"{producer.context.span_id:016x}"
    version, header_trace, header_span, flags = seen_headers["traceparent"].split("-")
    assert (version, header_trace, header_span) == ("00", trace_id, span_id)
    assert int(flags, 16) & 0x01  # sampled
    assert seen_headers["kept"] == "yes"


async def test_a_failed_handler_ends_its_consumer_span_with_an_error(
        broker: BrokerProcess, spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = spans
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    worker.use(jobbroker.tracing.worker_tracing(provider))

    @worker.handler("traced.fail")
    def handle(job: JobContext) -> None:  # a plain handler: the span is current in its thread
        from opentelemetry import trace

        assert trace.get_current_span().get_span_context().is_valid
        raise jobbroker.PermanentError("bad input")

    async with jobbroker.Client(broker.address) as c:
        c.use(jobbroker.tracing.producer_tracing(provider))
        res = await c.enqueue("traced.fail", "x")
        async with running_worker(worker):
            await wait_state(c, res.job_id, jobbroker.JOB_STATE_FAILED)

    finished = tuple(exporter.get_finished_spans())
    consumer = only(finished, "traced.fail process")
    assert consumer.status.status_code == StatusCode.ERROR
    assert "bad input" in (consumer.status.description or "")
    assert [e.name for e in consumer.events] == ["exception"]
    producer = only(finished, "traced.fail publish")
    assert consumer.parent is not None and producer.context is not None
    assert consumer.parent.span_id == producer.context.span_id


async def test_a_refused_enqueue_ends_its_producer_span_with_an_error(
        broker: BrokerProcess, spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = spans
    async with jobbroker.Client(broker.address) as c:
        c.use(jobbroker.tracing.producer_tracing(provider))
        with pytest.raises(jobbroker.InvalidArgumentError):
            await c.enqueue("bad queue name!", "x")
    [span] = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
