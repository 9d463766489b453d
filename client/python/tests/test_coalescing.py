"""Enqueue coalescing (worker contract §10): concurrent enqueue() calls merged into EnqueueBatch
calls, each caller answered on its own. Against the real broker, counting the calls it served
by its /metrics; and the flush rules, deterministically, with a stubbed sender."""

from __future__ import annotations

import asyncio
import collections
import datetime
import re
import socket
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from brokerproc import BrokerProcess

import jobbroker
from jobbroker import ClientOptions, EnqueueResult, NewJob
from jobbroker._coalescer import Coalescer, request_bytes
from jobbroker._partition import partition_of_queue
from jobbroker.v1 import broker_pb2

ENQUEUE = "/jobbroker.v1.Broker/Enqueue"
ENQUEUE_BATCH = "/jobbroker.v1.Broker/EnqueueBatch"
_COUNT = re.compile(r"^jobbroker_rpc_duration_seconds_count\{([^}]*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def rpc_counts(broker: BrokerProcess) -> collections.Counter[tuple[str, str]]:
    """The unary calls the broker served, by (method, code), from its /metrics."""
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in text.splitlines():
        m = _COUNT.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(1)))
            counts[(labels.get("method", ""), labels.get("code", ""))] += int(float(m.group(2)))
    return counts


class Calls:
    """The broker's Enqueue and EnqueueBatch calls since it was made."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.before = rpc_counts(broker)

    def delta(self) -> collections.Counter[tuple[str, str]]:
        after = rpc_counts(self.broker)
        return collections.Counter({k: after[k] - self.before[k] for k in after
                                    if after[k] != self.before[k]})

    def of(self, method: str, code: str | None = None) -> int:
        return sum(n for (m, c), n in self.delta().items()
                   if m == method and (code is None or c == code))


def client_of(broker: BrokerProcess, **options: object) -> jobbroker.Client:
    return jobbroker.Client(options=ClientOptions(address=broker.address, deadline=60,
                                                  **options))  # type: ignore[arg-type]


async def total_jobs(client: jobbroker.Client, queue: str) -> int:
    return sum((await client.get_queue(queue)).counts.values())


# --- against the broker ----------------------------------------------------------------------


async def test_concurrent_enqueues_with_a_linger_share_batches(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    async with client_of(broker, batch_linger=0.05) as c:
        results = await asyncio.gather(*(c.enqueue("co.linger", {"n": i}) for i in range(200)))
        ids = {r.job_id for r in results}
        assert len(ids) == 200
        assert not any(r.deduplicated for r in results)
        assert await total_jobs(c, "co.linger") == 200
        jobs = await asyncio.gather(*(c.get_job(r.job_id) for r in results))
        assert len(jobs) == 200
    assert calls.of(ENQUEUE) + calls.of(ENQUEUE_BATCH) <= 100
    assert calls.of(ENQUEUE_BATCH) >= 1


async def test_each_caller_gets_its_own_job(broker: BrokerProcess) -> None:
    async with client_of(broker, batch_linger=0.05) as c:
        results = await asyncio.gather(*(c.enqueue("co.own", f"job-{i}") for i in range(50)))
        jobs = await asyncio.gather(*(c.get_job(r.job_id) for r in results))
    assert [j.payload for j in jobs] == [f"job-{i}".encode() for i in range(50)]


async def test_default_options_coalesce_concurrent_enqueues(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    async with jobbroker.Client(broker.address) as c:
        assert c.options.batching and c.options.batch_linger == 0
        results = await asyncio.gather(*(c.enqueue("co.default", i) for i in range(200)))
        assert len({r.job_id for r in results}) == 200
        assert await total_jobs(c, "co.default") == 200
    assert calls.of(ENQUEUE) + calls.of(ENQUEUE_BATCH) < 200


async def test_a_lone_enqueue_is_one_unary_call(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    async with jobbroker.Client(broker.address) as c:
        await c.enqueue("co.lone", "only")
    assert (calls.of(ENQUEUE), calls.of(ENQUEUE_BATCH)) == (1, 0)


async def test_one_bad_job_fails_only_its_own_call(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    bad = 17

    async def one(c: jobbroker.Client, i: int) -> EnqueueResult:
        headers = {"": "no name"} if i == bad else {"n": str(i)}
        return await c.enqueue("co.bad", i, headers=headers)

    async with client_of(broker, batch_linger=0.05) as c:
        outcomes = await asyncio.gather(*(one(c, i) for i in range(50)), return_exceptions=True)
        err = outcomes[bad]
        assert isinstance(err, jobbroker.InvalidArgumentError), err
        assert "headers" in err.message and "jobs[" not in err.message, err.message
        good = [r for i, r in enumerate(outcomes) if i != bad]
        assert all(isinstance(r, EnqueueResult) for r in good), good
        for r in good:
            assert isinstance(r, EnqueueResult)
            await c.get_job(r.job_id)
        assert await total_jobs(c, "co.bad") == 49
    # The batch was refused whole, then its jobs sent again one by one.
    assert calls.of(ENQUEUE_BATCH, "INVALID_ARGUMENT") >= 1
    assert calls.of(ENQUEUE, "INVALID_ARGUMENT") == 1


async def test_one_call_can_opt_out(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    async with client_of(broker, batch_linger=0.05) as c:
        await c.enqueue("co.optout", "alone", batch=False)
    assert (calls.of(ENQUEUE), calls.of(ENQUEUE_BATCH)) == (1, 0)


async def test_a_client_without_batching_sends_one_call_per_enqueue(
        broker: BrokerProcess) -> None:
    calls = Calls(broker)
    async with client_of(broker, batching=False) as c:
        results = await asyncio.gather(*(c.enqueue("co.off", i) for i in range(20)))
    assert len({r.job_id for r in results}) == 20
    assert (calls.of(ENQUEUE), calls.of(ENQUEUE_BATCH)) == (20, 0)


async def test_enqueue_and_wait_opts_out_too(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    async with client_of(broker) as c:
        with pytest.raises(TimeoutError):
            await c.enqueue_and_wait("co.wait", "x", batch=False, wait_timeout=0.01)
    assert (calls.of(ENQUEUE), calls.of(ENQUEUE_BATCH)) == (1, 0)


async def test_enqueue_batch_is_sent_as_it_is(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    async with client_of(broker, batch_linger=0.05) as c:
        await asyncio.gather(
            c.enqueue_batch([NewJob("co.asis", 1), NewJob("co.asis", 2)]),
            c.enqueue_batch([NewJob("co.asis", 3)]),
        )
    assert (calls.of(ENQUEUE), calls.of(ENQUEUE_BATCH)) == (0, 2)


async def test_concurrent_enqueues_with_one_dedup_key_make_one_job(
        broker: BrokerProcess) -> None:
    async with jobbroker.Client(broker.address) as c:
        results = await asyncio.gather(
            *(c.enqueue("co.dedup", "same", dedup_key="co-dedup-1") for _ in range(20)))
        assert len({r.job_id for r in results}) == 1
        assert [r.deduplicated for r in results].count(False) == 1
        assert await total_jobs(c, "co.dedup") == 1


async def test_keyed_and_unkeyed_jobs_go_in_different_batches(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    async with client_of(broker, batch_linger=0.05) as c:
        results = await asyncio.gather(
            *(c.enqueue("co.mixed", i, dedup_key=f"co-mixed-{i}" if i % 2 else "")
              for i in range(20)))
        assert len({r.job_id for r in results}) == 20
    # 10 keyed, 10 not: one batch of each.
    assert (calls.of(ENQUEUE), calls.of(ENQUEUE_BATCH)) == (0, 2)


async def test_middleware_runs_per_enqueue_above_the_coalescer(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    seen: list[int] = []
    async with client_of(broker, batch_linger=0.05) as c:

        @c.use
        async def stamp(jobs: list[NewJob], nxt: jobbroker.EnqueueNext) -> list[EnqueueResult]:
            seen.append(len(jobs))
            for job in jobs:
                job.headers = {**(job.headers or {}), "stamped": str(job.payload)}
            return await nxt(jobs)

        results = await asyncio.gather(*(c.enqueue("co.mw", str(i)) for i in range(10)))
        jobs = await asyncio.gather(*(c.get_job(r.job_id) for r in results))
    assert seen == [1] * 10
    assert [dict(j.headers)["stamped"] for j in jobs] == [str(i) for i in range(10)]
    assert (calls.of(ENQUEUE), calls.of(ENQUEUE_BATCH)) == (0, 1)


async def test_an_enqueue_without_middleware_keeps_every_field(broker: BrokerProcess) -> None:
    """enqueue() with no middleware goes to the coalescer without a NewJob: each field it takes
    must arrive as it does through the middleware's path."""
    calls = Calls(broker)
    async with client_of(broker, batch_linger=0.05) as plain, client_of(broker) as wrapped:

        @wrapped.use
        async def passthrough(
            jobs: list[NewJob], nxt: jobbroker.EnqueueNext
        ) -> list[EnqueueResult]:
            return await nxt(jobs)

        # Completed before the jobs that name it, so that they are SCHEDULED at once by their
        # delay (a job still waiting for a dependency has no run_at yet).
        dependency = (await plain.enqueue("co.fields.dep", b"first")).job_id
        [leased] = await plain.lease("co.fields.dep")
        await plain.ack(leased)
        expire_at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
        fields: dict[str, Any] = {
            "headers": {"trace": "t-1"}, "priority": 7, "delay": 30, "dedup_ttl": 600,
            "max_attempts": 4, "lease_duration": 45, "concurrency_key": "tenant-9",
            "timeout": 20, "expire_at": expire_at, "depends_on": [dependency],
        }
        fast = await asyncio.gather(
            plain.enqueue("co.fields", b"job", dedup_key="fast-0", **fields),
            plain.enqueue("co.fields", b"job", dedup_key="fast-1", **fields),
        )
        slow = await wrapped.enqueue("co.fields", b"job", dedup_key="slow", **fields)
        jobs = [await plain.get_job(r.job_id) for r in (*fast, slow)]
    assert calls.of(ENQUEUE_BATCH) == 1, "the two plain enqueues went as one batch"

    def seen(job: Any) -> tuple[object, ...]:
        delayed = job.run_at.ToDatetime() - job.created_at.ToDatetime()
        return (job.queue, job.payload, dict(job.headers), job.priority, job.max_attempts,
                job.concurrency_key, job.timeout.seconds, job.expire_at.seconds,
                list(job.depends_on), round(delayed.total_seconds()))

    assert [j.dedup_key for j in jobs] == ["fast-0", "fast-1", "slow"]
    assert seen(jobs[0]) == seen(jobs[1]) == seen(jobs[2])
    assert seen(jobs[2]) == ("co.fields", b"job", {"trace": "t-1"}, 7, 4, "tenant-9", 20,
                             int(expire_at.timestamp()), [dependency], 30)


async def test_close_sends_the_open_batch(broker: BrokerProcess) -> None:
    c = client_of(broker, batch_linger=3600)
    tasks = [asyncio.create_task(c.enqueue("co.close", i)) for i in range(5)]
    await asyncio.sleep(0)  # they join the open batch, which would wait an hour
    await asyncio.wait_for(c.close(), 60)
    results = [t.result() for t in tasks]
    async with jobbroker.Client(broker.address) as check:
        assert await total_jobs(check, "co.close") == 5
        await check.get_job(results[0].job_id)


def test_the_sync_client_coalesces_calls_from_several_threads(broker: BrokerProcess) -> None:
    calls = Calls(broker)
    threads_n = 40
    barrier = threading.Barrier(threads_n)
    results: list[EnqueueResult] = []
    errors: list[BaseException] = []
    with jobbroker.SyncClient(options=ClientOptions(address=broker.address,
                                                    batch_linger=0.05)) as c:

        def run(i: int) -> None:
            barrier.wait()
            try:
                results.append(c.enqueue("co.sync", i))
            except BaseException as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert len({r.job_id for r in results}) == threads_n
    assert calls.of(ENQUEUE) + calls.of(ENQUEUE_BATCH) < threads_n
    assert calls.of(ENQUEUE_BATCH) >= 1


class AttemptCounter(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Counts the attempts of each unary method but GetCluster (the client's own)."""

    def __init__(self) -> None:
        self.attempts: collections.Counter[str] = collections.Counter()

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        name = method.rsplit("/", 1)[-1]
        if name != "GetCluster":
            self.attempts[name] += 1
        return await continuation(details, request)


async def test_a_batch_is_retried_only_when_all_its_jobs_have_a_dedup_key() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:  # bound, not listening
        held.bind(("127.0.0.1", 0))
        calls = AttemptCounter()
        options = ClientOptions(address=f"127.0.0.1:{held.getsockname()[1]}",
                                interceptors=[calls], retry_backoff=0.001)
        async with jobbroker.Client(options=options) as c:
            outcomes = await asyncio.gather(
                *(c.enqueue("co.retry", i, dedup_key=f"k{i}" if i < 5 else "")
                  for i in range(10)), return_exceptions=True)
    assert all(isinstance(o, jobbroker.UnavailableError) for o in outcomes), outcomes
    # The keyed batch three times (retry_attempts), the other once; neither split.
    assert calls.attempts == {"EnqueueBatch": 3 + 1}


@pytest.fixture(scope="module")
def partitioned_broker() -> Iterator[BrokerProcess]:
    with BrokerProcess(extra_args=["--partitions", "4"]) as b:
        yield b


def queues_covering(partitions: int, per_partition: int) -> list[str]:
    chosen: dict[int, list[str]] = collections.defaultdict(list)
    for i in range(10_000):
        q = f"co.part.{i}"
        p = partition_of_queue(q, partitions)
        if len(chosen[p]) < per_partition:
            chosen[p].append(q)
        if all(len(chosen[k]) == per_partition for k in range(partitions)):
            break
    return [q for k in range(partitions) for q in chosen[k]]


async def test_batches_never_span_partitions(partitioned_broker: BrokerProcess) -> None:
    queues = queues_covering(4, 2)
    assert {partition_of_queue(q, 4) for q in queues} == {0, 1, 2, 3} and len(queues) == 8
    calls = Calls(partitioned_broker)
    async with client_of(partitioned_broker, batch_linger=0.05) as c:
        # The client learns the partition count first, so the batches are by partition (two
        # queues each), not by queue.
        assert (await c.get_cluster()).partition_count == 4
        results = await asyncio.gather(
            *(c.enqueue(q, i) for i in range(25) for q in queues), return_exceptions=True)
        refused = [r for r in results if not isinstance(r, EnqueueResult)]
        assert not refused, refused[:3]
        assert len({r.job_id for r in results if isinstance(r, EnqueueResult)}) == 200
        for q in queues:
            assert await total_jobs(c, q) == 25
    # None refused whole (that would be split and so pass above): no batch spanned partitions.
    assert calls.of(ENQUEUE_BATCH, "INVALID_ARGUMENT") == 0
    assert calls.of(ENQUEUE_BATCH) >= 1
    assert calls.of(ENQUEUE) + calls.of(ENQUEUE_BATCH) < 200


# --- options ---------------------------------------------------------------------------------


def test_the_defaults() -> None:
    o = ClientOptions()
    assert (o.batching, o.batch_max_jobs, o.batch_max_bytes, o.batch_linger,
            o.batch_max_in_flight) == (True, 100, 1 << 20, 0.0, 4)


@pytest.mark.parametrize("field,value", [
    ("batch_max_jobs", 0), ("batch_max_jobs", 1001), ("batch_max_jobs", -5),
    ("batch_max_bytes", 0), ("batch_max_in_flight", 0), ("batch_linger", -0.1),
    ("batch_linger", float("nan")), ("batch_linger", float("inf")),
])
def test_bad_batching_options_are_refused_naming_the_option(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"ClientOptions\.{field}"):
        ClientOptions(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("field,value", [
    ("batch_max_jobs", 1.5), ("batch_max_jobs", True), ("batch_max_in_flight", "4"),
    ("batching", 1), ("batch_linger", "0"),
])
def test_batching_options_of_the_wrong_type_are_refused(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"ClientOptions\.{field}"):
        ClientOptions(**{field: value})  # type: ignore[arg-type]


def test_the_bounds_are_accepted() -> None:
    ClientOptions(batch_max_jobs=1, batch_max_bytes=1, batch_max_in_flight=1, batch_linger=0)
    ClientOptions(batch_max_jobs=1000, batch_linger=2)


# --- the flush rules, with a stubbed sender --------------------------------------------------


def req(n: int, *, queue: str = "q", dedup: str = "", payload: bytes | None = None,
        headers: dict[str, str] | None = None) -> broker_pb2.EnqueueRequest:
    return broker_pb2.EnqueueRequest(queue=queue, payload=str(n).encode() if payload is None
                                     else payload, dedup_key=dedup, headers=headers or {})


class StubSender:
    """Records each call's jobs (by payload) and timeout; answers each job with its payload
    as its id. `hold` makes every call wait for `release()`; `fail` decides an error."""

    def __init__(self, *, hold: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.timeouts: list[float | None] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.gate = asyncio.Event()
        if not hold:
            self.gate.set()
        self.fail: object = None

    async def __call__(self, requests: list[broker_pb2.EnqueueRequest],
                       timeout: float | None) -> list[str]:
        self.batches.append([r.payload.decode() for r in requests])
        self.timeouts.append(timeout)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            if callable(self.fail):
                err = self.fail(requests)
                if err is not None:
                    raise err
            return [r.payload.decode() for r in requests]
        finally:
            self.in_flight -= 1


async def turns(n: int = 5) -> None:
    """Lets the loop run the batches' tasks up to their first wait."""
    for _ in range(n):
        await asyncio.sleep(0)


def coalescer(send: StubSender, **kw: object) -> Coalescer[str]:
    args: dict[str, object] = dict(max_jobs=100, max_bytes=1 << 20, linger=0.0, max_in_flight=4)
    args.update(kw)
    return Coalescer(send, **args)  # type: ignore[arg-type]


async def test_full_batches_go_at_once_in_call_order() -> None:
    send = StubSender()
    # An hour's linger: whatever goes before close() went because it was full.
    co = coalescer(send, max_jobs=10, linger=3600)
    futures = [co.submit(req(i), None) for i in range(35)]
    await turns()
    assert send.batches == [[str(i) for i in range(k, k + 10)] for k in (0, 10, 20)]
    assert [f.done() for f in futures] == [True] * 30 + [False] * 5
    await co.close()
    assert await asyncio.gather(*futures) == [str(i) for i in range(35)]
    assert [len(b) for b in send.batches] == [10, 10, 10, 5]
    assert [j for b in send.batches for j in b] == [str(i) for i in range(35)]


async def test_with_linger_zero_a_partial_batch_goes_after_the_turn() -> None:
    send = StubSender()
    co = coalescer(send, max_jobs=10)
    futures = [co.submit(req(i), None) for i in range(35)]
    assert await asyncio.gather(*futures) == [str(i) for i in range(35)]
    assert [len(b) for b in send.batches] == [10, 10, 10, 5]
    assert [j for b in send.batches for j in b] == [str(i) for i in range(35)]
    await co.close()


async def test_a_batch_goes_when_its_bytes_reach_the_limit() -> None:
    assert request_bytes(req(0, payload=b"xyz", headers={"ab": "cdé"})) == 3 + 2 + 4
    send = StubSender()
    co = coalescer(send, max_bytes=100, linger=3600)
    futures = [co.submit(req(i, payload=b"p" * 20, headers={"h": f"{i:09d}"}), None)
               for i in range(9)]  # 30 bytes each: the 4th reaches 100
    await turns()
    assert [len(b) for b in send.batches] == [4, 4]
    await co.close()
    await asyncio.gather(*futures)
    assert [len(b) for b in send.batches] == [4, 4, 1]


async def test_a_lone_job_goes_at_the_end_of_the_turn() -> None:
    send = StubSender()
    co = coalescer(send)
    future = co.submit(req(1), None)
    assert send.batches == []  # not yet: more may come this turn
    assert await future == "1"
    assert send.batches == [["1"]]
    await co.close()


async def test_no_more_than_max_in_flight_batches_are_outstanding() -> None:
    send = StubSender(hold=True)
    co = coalescer(send, max_jobs=5, max_in_flight=2)
    futures = [co.submit(req(i), None) for i in range(30)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(send.batches) == 2 and send.in_flight == 2
    send.gate.set()
    assert await asyncio.gather(*futures) == [str(i) for i in range(30)]
    assert send.most_in_flight == 2
    assert [j for b in send.batches for j in b] == [str(i) for i in range(30)]
    assert all(len(b) <= 5 for b in send.batches)
    await co.close()


async def test_jobs_gather_while_every_slot_is_taken() -> None:
    send = StubSender(hold=True)
    co = coalescer(send, max_in_flight=1)
    first = co.submit(req(0), None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert send.batches == [["0"]]
    later = []
    for i in range(1, 6):  # one per turn: without the limit, each would go alone
        later.append(co.submit(req(i), None))
        await asyncio.sleep(0)
    assert send.batches == [["0"]]
    send.gate.set()
    assert await first == "0"
    assert await asyncio.gather(*later) == ["1", "2", "3", "4", "5"]
    assert send.batches == [["0"], ["1", "2", "3", "4", "5"]]
    await co.close()


async def test_keys_keep_partitions_and_dedup_keys_apart() -> None:
    send = StubSender()
    co = coalescer(send, partition_count=lambda: 4)
    by_partition: dict[int, list[str]] = collections.defaultdict(list)
    for i in range(200):
        by_partition[partition_of_queue(f"k{i}", 4)].append(f"k{i}")
    a, b = by_partition[0][:2]
    c = by_partition[1][0]
    futures = [co.submit(req(1, queue=a), None), co.submit(req(2, queue=b), None),
               co.submit(req(3, queue=c), None), co.submit(req(4, queue=a, dedup="d"), None),
               co.submit(req(5, queue=a), None)]
    await asyncio.gather(*futures)
    assert sorted(send.batches) == sorted([["1", "2", "5"], ["3"], ["4"]])
    await co.close()


async def test_without_a_partition_count_the_key_is_the_queue() -> None:
    send = StubSender()
    co = coalescer(send)
    await asyncio.gather(*(co.submit(req(i, queue=f"q{i % 2}"), None) for i in range(6)))
    assert sorted(send.batches) == [["0", "2", "4"], ["1", "3", "5"]]
    await co.close()


async def test_close_sends_open_batches_and_waits_for_those_in_flight() -> None:
    send = StubSender(hold=True)
    co = coalescer(send, linger=3600, max_in_flight=1, max_jobs=2)
    futures = [co.submit(req(i), None) for i in range(5)]  # [0,1] out, [2,3] waits, [4] open
    await turns()
    assert send.batches == [["0", "1"]]
    closing = asyncio.create_task(co.close())
    await turns()
    assert not closing.done() and send.batches == [["0", "1"]]
    send.gate.set()
    await asyncio.wait_for(closing, 60)
    assert all(f.done() for f in futures)
    assert send.batches == [["0", "1"], ["2", "3"], ["4"]]


async def test_a_refused_batch_is_sent_again_one_job_per_call() -> None:
    send = StubSender()

    def refuse(requests: list[broker_pb2.EnqueueRequest]) -> Exception | None:
        if any(r.payload == b"3" for r in requests):
            prefix = "jobs[3]." if len(requests) > 1 else ""
            return jobbroker.InvalidArgumentError(f"{prefix}headers: empty name")
        return None

    send.fail = refuse
    co = coalescer(send)
    outcomes = await asyncio.gather(*(co.submit(req(i), None) for i in range(6)),
                                    return_exceptions=True)
    assert isinstance(outcomes[3], jobbroker.InvalidArgumentError)
    assert outcomes[3].message == "headers: empty name"
    assert [o for i, o in enumerate(outcomes) if i != 3] == ["0", "1", "2", "4", "5"]
    assert send.batches[0] == [str(i) for i in range(6)]
    assert sorted(send.batches[1:]) == [[str(i)] for i in range(6)]
    await co.close()


async def test_other_errors_reach_every_caller_of_the_batch() -> None:
    send = StubSender()
    send.fail = lambda requests: jobbroker.UnavailableError("broker gone")
    co = coalescer(send)
    outcomes = await asyncio.gather(*(co.submit(req(i), None) for i in range(4)),
                                    return_exceptions=True)
    assert all(isinstance(o, jobbroker.UnavailableError) for o in outcomes)
    assert all(o.code == grpc.StatusCode.UNAVAILABLE for o in outcomes  # type: ignore[union-attr]
               )
    assert len({id(o) for o in outcomes}) == 4  # each caller its own exception
    assert send.batches == [["0", "1", "2", "3"]]  # not split
    await co.close()


async def test_the_deadline_is_the_earliest_of_the_callers() -> None:
    send = StubSender()
    co = coalescer(send)
    await asyncio.gather(co.submit(req(0), 50.0), co.submit(req(1), 2.0),
                         co.submit(req(2), None))
    [timeout] = send.timeouts
    assert timeout is not None and 0 < timeout <= 2.0
    await asyncio.gather(co.submit(req(3), None), co.submit(req(4), None))
    assert send.timeouts[1] is None
    await co.close()


async def test_a_caller_that_gives_up_leaves_its_job_in_the_batch() -> None:
    send = StubSender()
    co = coalescer(send)
    futures = [co.submit(req(i), None) for i in range(3)]
    futures[1].cancel()
    assert await futures[0] == "0" and await futures[2] == "2"
    assert send.batches == [["0", "1", "2"]]
    await co.close()
