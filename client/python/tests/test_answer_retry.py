"""Answers the broker gives only while a cluster hands a partition to a new leader (worker
contract §4 and §5, found in the cluster_leader_kill scenario): an ack, fail, release or step
save answered UNAVAILABLE ("retry"), and a subscription answered with an error while the stream
stays open.

A real broker cannot be made to answer so on demand (it does only in the moment between a
leader's death and its successor's election), so these tests run the Worker against a stand-in
Broker service, an in-process grpc.aio server that answers as that broker does. Everything else
the worker does is tested against the real broker in the other modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from conftest import running_worker

import jobbroker
from jobbroker.v1 import broker_pb2, broker_pb2_grpc

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
RETRY = "partition 0: node-2 leads it but does not serve it at this moment; retry"
NO_LEADER = "partition 0 of queue q has no leader yet; retry"

# What the stand-in does with one request of a stream: (stream number, request) -> the results
# to answer it with (none: no answer), or an awaitable of them.
Answer = Callable[[int, broker_pb2.WorkRequest], Any]


def leased(n: int) -> broker_pb2.LeasedJob:
    job = broker_pb2.LeasedJob(job_id=f"job-{n}", lease_id=f"lease-{n}", queue="q", attempt=1,
                               max_attempts=3)
    job.lease_deadline.FromDatetime(dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=1))
    return job


def ok(req: broker_pb2.WorkRequest) -> list[broker_pb2.WorkResult]:
    return [broker_pb2.WorkResult(request_id=req.request_id)]


class StandIn(broker_pb2_grpc.BrokerServicer):
    """A Broker service whose Work stream pushes `jobs` after an accepted subscription and
    answers each request with `answer`. It records every request with its stream's number and
    the time it came, and leaves the stream open until the worker ends it."""

    def __init__(self, answer: Answer, jobs: int = 1) -> None:
        self.answer = answer
        self.jobs = jobs
        self.streams = 0
        self.seen: list[tuple[int, float, broker_pb2.WorkRequest]] = []
        self.changed = asyncio.Event()

    async def Work(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        self.streams += 1
        stream = self.streams
        self.changed.set()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            while True:
                req = await context.read()
                if req is grpc.aio.EOF:
                    return
                self.seen.append((stream, time.monotonic(), req))
                self.changed.set()
                results = self.answer(stream, req)
                if inspect.isawaitable(results):
                    results = await results
                for result in results:
                    await context.write(broker_pb2.WorkResponse(result=result))
                if (req.WhichOneof("request") == "subscribe" and results
                        and results[0].code == 0):
                    batch = broker_pb2.JobBatch(jobs=[leased(n) for n in range(1, self.jobs + 1)])
                    await context.write(broker_pb2.WorkResponse(job_batch=batch))

    def requests(self, kind: str) -> list[tuple[int, float, broker_pb2.WorkRequest]]:
        return [s for s in self.seen if s[2].WhichOneof("request") == kind]

    async def until(self, what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"gave up waiting for {what}; requests seen: "
                                     f"{[(s, r.WhichOneof('request')) for s, _, r in self.seen]}")
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.1))


@contextlib.asynccontextmanager
async def serving(fake: StandIn) -> AsyncIterator[str]:
    server = grpc.aio.server()
    broker_pb2_grpc.add_BrokerServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def worker_for(address: str, **kw: Any) -> jobbroker.Worker:
    return jobbroker.Worker(address, handle_signals=False, grace=2.0, reconnect_initial=0.05,
                            reconnect_max=0.2, **kw)


def is_checkpoint(req: broker_pb2.WorkRequest) -> bool:
    return req.WhichOneof("request") == "heartbeat" and bool(req.heartbeat.checkpoint)


def refuse_first(watched: Callable[[broker_pb2.WorkRequest], bool]) -> Answer:
    """Answers the first request `watched` picks UNAVAILABLE ("retry"), everything else OK."""
    refused = []

    def answer(stream: int, req: broker_pb2.WorkRequest) -> list[broker_pb2.WorkResult]:
        if watched(req) and not refused:
            refused.append(req)
            return [broker_pb2.WorkResult(request_id=req.request_id, code=UNAVAILABLE,
                                          message=RETRY)]
        return ok(req)

    return answer


async def ack(job: jobbroker.JobContext) -> str:
    return "done"


async def fail(job: jobbroker.JobContext) -> None:
    raise jobbroker.PermanentError("bad input")


async def snooze(job: jobbroker.JobContext) -> None:
    raise jobbroker.Snooze(5)  # a release with a delay


async def step_then_ack(job: jobbroker.JobContext) -> str:
    await job.step("charge", lambda: {"charged": True})
    return "done"


CASES: dict[str, tuple[Callable[[jobbroker.JobContext], Awaitable[Any]],
                       Callable[[broker_pb2.WorkRequest], bool]]] = {
    "ack": (ack, lambda r: r.WhichOneof("request") == "ack"),
    "fail": (fail, lambda r: r.WhichOneof("request") == "fail"),
    "release": (snooze, lambda r: r.WhichOneof("request") == "release"),
    "step save": (step_then_ack, is_checkpoint),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_an_answer_refused_with_unavailable_is_sent_again_on_the_same_stream(
        case: str) -> None:
    """Contract §4: an ack, fail, release or step save answered UNAVAILABLE is not final. It goes out
    again (the same lease) about 250 ms later on the same stream; before the rule it waited for
    the stream to end, which in a cluster it need not do, and the job ran again once its lease
    ran out."""
    handler, watched = CASES[case]
    fake = StandIn(refuse_first(watched))
    async with serving(fake) as address:
        worker = worker_for(address)
        worker.handle("q", handler)
        async with running_worker(worker):
            await fake.until(f"the refused {case} to be sent again",
                             lambda: sum(1 for s in fake.seen if watched(s[2])) >= 2)
            if case == "step save":  # the step returned once its save was applied: then the ack
                await fake.until("the ack after the step", lambda: bool(fake.requests("ack")))
    sent = [(stream, at, req) for stream, at, req in fake.seen if watched(req)]
    assert [stream for stream, _, _ in sent] == [1, 1], "sent again on the same stream"
    first, again = sent[0][2], sent[1][2]
    kind = first.WhichOneof("request")
    assert getattr(again, kind) == getattr(first, kind), "the same request, the same lease"
    assert getattr(again, kind).lease_id == "lease-1"
    assert sent[1][1] - sent[0][1] >= 0.2, "after the retry delay, not at once"
    assert fake.streams == 1 and worker.stats.reconnects == 0
    assert worker.stats.acks_refused == 0


async def test_an_ack_batch_item_refused_with_unavailable_is_sent_again() -> None:
    """Contract §4 for one ack of an AckBatch: the item answered UNAVAILABLE goes out again;
    the batch's other acks were applied and are not repeated."""
    refused: list[str] = []

    async def answer(stream: int, req: broker_pb2.WorkRequest) -> list[broker_pb2.WorkResult]:
        kind = req.WhichOneof("request")
        if kind == "ack" and not fake.requests("ack_batch"):
            await asyncio.sleep(0.3)  # the first ack's answer comes late: the others form a batch
        if kind == "ack_batch" and not refused:
            refused.append(req.ack_batch.acks[0].lease_id)
            return [broker_pb2.WorkResult(
                request_id=req.request_id,
                item_errors=[broker_pb2.ItemError(index=0, code=UNAVAILABLE, message=RETRY)])]
        return ok(req)

    fake = StandIn(answer, jobs=3)

    def acked() -> list[str]:
        leases = [r.ack.lease_id for _, _, r in fake.requests("ack")]
        for _, _, r in fake.requests("ack_batch"):
            leases += [a.lease_id for a in r.ack_batch.acks]
        return leases

    async with serving(fake) as address:
        worker = worker_for(address, concurrency=3)
        worker.handle("q", ack)
        async with running_worker(worker):
            await fake.until("the refused item to be sent again",
                             lambda: bool(refused) and acked().count(refused[0]) >= 2)
    assert len(fake.requests("ack_batch")) >= 1, "the stand-in saw no AckBatch"
    assert sorted(acked()) == sorted(["lease-1", "lease-2", "lease-3", refused[0]])
    assert fake.streams == 1 and worker.stats.acks_refused == 0


async def test_a_subscription_refused_unavailable_on_an_open_stream_reconnects() -> None:
    """Contract §5: a subscribe answered UNAVAILABLE (a queue's partition has no leader yet)
    while the broker keeps the stream open is a stream that ended UNAVAILABLE: the worker ends
    it and subscribes again on a new stream after its backoff, instead of waiting forever on a
    stream that will never push."""

    def answer(stream: int, req: broker_pb2.WorkRequest) -> list[broker_pb2.WorkResult]:
        if req.WhichOneof("request") == "subscribe" and stream == 1:
            return [broker_pb2.WorkResult(request_id=req.request_id, code=UNAVAILABLE,
                                          message=NO_LEADER)]
        return ok(req)

    fake = StandIn(answer)
    async with serving(fake) as address:
        worker = worker_for(address)
        worker.handle("q", ack)
        async with running_worker(worker) as task:
            await fake.until("the job to be acked on a new stream",
                             lambda: bool(fake.requests("ack")))
            assert not task.done()
    assert [s for s, _, _ in fake.requests("subscribe")] == [1, 2]
    assert [s for s, _, _ in fake.requests("ack")] == [2]
    assert worker.stats.reconnects >= 1


async def test_a_subscription_refused_invalid_argument_on_an_open_stream_ends_run() -> None:
    """Contract §5: any other code answering the subscription (the caller's mistake) ends run()
    with that error, even though the stream stays open."""

    def answer(stream: int, req: broker_pb2.WorkRequest) -> list[broker_pb2.WorkResult]:
        if req.WhichOneof("request") == "subscribe":
            return [broker_pb2.WorkResult(request_id=req.request_id, code=INVALID_ARGUMENT,
                                          message="bad queue name")]
        return ok(req)

    fake = StandIn(answer)
    async with serving(fake) as address:
        worker = worker_for(address)
        worker.handle("q", ack)
        with pytest.raises(jobbroker.InvalidArgumentError, match="bad queue name"):
            await asyncio.wait_for(worker.run(), 15)
    assert fake.streams == 1
