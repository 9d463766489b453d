"""Routing against a real 3-node cluster of 4 partitions: each call goes to the address of its
partition's leader, and after a kill -9 of a leader the client and the worker follow the new one.
One cluster for these; the leader-kill test runs last, as it leaves a node dead. Then a cluster of
2 partitions led by different nodes: a worker over a queue of each holds one stream per leader
(no node relays one, by the nodes' /metrics), and regroups after a kill -9 of one of them, also
while it stops (the answers of handlers finishing in the grace reach the new leader)."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import grpc
import grpc.aio
import pytest
from clusterproc import ClusterProcess
from conftest import running_worker, wait_state

import jobbroker
from jobbroker import ClientOptions
from jobbroker._partition import partition_of_queue
from jobbroker.v1 import admin_pb2

PARTITIONS = 4

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None, reason="needs etcd on PATH")


def method_name(details: Any) -> str:
    method = details.method.decode() if isinstance(details.method, bytes) else details.method
    return str(method.rsplit("/", 1)[-1])


class UnaryRecorder(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Records (method, target address, answered OK) of each unary call on the channel to one
    address."""

    def __init__(self, target: str, calls: list[tuple[str, str, bool]]) -> None:
        self.target = target
        self.calls = calls

    async def intercept_unary_unary(self, continuation: Callable[..., Awaitable[Any]],
                                    details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        try:
            await call
            ok = True
        except grpc.aio.AioRpcError:
            ok = False
        self.calls.append((method_name(details), self.target, ok))
        return call


class StreamRecorder(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Records (method, target address, True) of each stream opened on the channel to one
    address. (A grpc.aio channel files an interceptor under one kind only.)"""

    def __init__(self, target: str, calls: list[tuple[str, str, bool]]) -> None:
        self.target = target
        self.calls = calls

    async def intercept_stream_stream(self, continuation: Callable[..., Awaitable[Any]],
                                      details: Any, request_iterator: Any) -> Any:
        self.calls.append((method_name(details), self.target, True))
        return await continuation(details, request_iterator)


@dataclasses.dataclass(frozen=True)
class RecordingOptions(ClientOptions):
    """ClientOptions whose every channel records its calls with the address it was opened to."""

    calls: list[tuple[str, str, bool]] = dataclasses.field(default_factory=list, compare=False)

    def open_channel(self, target: str,
                     extra: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        recorders = [UnaryRecorder(target, self.calls), StreamRecorder(target, self.calls)]
        plain = ClientOptions(**{
            f.name: getattr(self, f.name) for f in dataclasses.fields(ClientOptions)})
        with_recorders = dataclasses.replace(plain, interceptors=[*self.interceptors, *recorders])
        return with_recorders.open_channel(target, extra)

    def targets_of(self, method: str) -> list[str]:
        """The addresses `method` answered OK at, in order."""
        return [target for name, target, ok in self.calls if name == method and ok]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcess]:
    config = ('{"defaultPolicy": {"retry": {"maxAttempts": 5, "initialBackoff": "0.1s",'
              ' "maxBackoff": "0.1s"}}}')
    with ClusterProcess(PARTITIONS, config) as c:
        yield c


@pytest.fixture
async def recording_client(cluster: ClusterProcess
                           ) -> AsyncIterator[tuple[jobbroker.Client, RecordingOptions]]:
    options = RecordingOptions(addresses=cluster.addresses, token="", deadline=30)
    async with jobbroker.Client(options=options) as c:
        yield c, options


def queue_in(partition: int) -> str:
    """A queue name that lives in `partition`."""
    return next(q for q in (f"routed.{i}" for i in range(1000))
                if partition_of_queue(q, PARTITIONS) == partition)


def leader_of(cluster: ClusterProcess, queue: str) -> str:
    info = cluster.cluster_info()
    assert info is not None
    [partition] = [p for p in info.partitions
                   if p.partition == partition_of_queue(queue, PARTITIONS)]
    return str(partition.leader_address)


async def test_each_call_goes_to_the_leader_of_its_partition(
        cluster: ClusterProcess,
        recording_client: tuple[jobbroker.Client, RecordingOptions]) -> None:
    client, options = recording_client
    queues = [queue_in(p) for p in range(PARTITIONS)]
    leaders = [leader_of(cluster, q) for q in queues]
    for queue in queues:
        res = await client.enqueue(queue, "routed")
        assert (await client.get_job(res.job_id)).queue == queue
        await client.get_queue(queue)
    assert leaders == [leader_of(cluster, q) for q in queues], "leadership moved meanwhile"
    assert options.targets_of("Enqueue") == leaders
    assert options.targets_of("GetJob") == leaders
    assert options.targets_of("GetQueue") == leaders


async def test_a_worker_of_one_partitions_queues_streams_to_its_leader(
        cluster: ClusterProcess, recording_client: tuple[jobbroker.Client, RecordingOptions]
) -> None:
    client, _ = recording_client
    queue = queue_in(1)
    options = RecordingOptions(addresses=cluster.addresses, token="")
    worker = jobbroker.Worker(options=options, handle_signals=False)
    worker.handle(queue, lambda job: "done")
    res = await client.enqueue(queue, "work")
    async with running_worker(worker):
        await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert options.targets_of("Work")[0] == leader_of(cluster, queue)


async def test_after_a_kill_of_its_leader_the_client_and_the_worker_follow_the_new_one(
        cluster: ClusterProcess,
        recording_client: tuple[jobbroker.Client, RecordingOptions]) -> None:
    client, options = recording_client
    queue = queue_in(2)
    worker = jobbroker.Worker(options=RecordingOptions(addresses=cluster.addresses, token=""),
                              handle_signals=False)
    worker.handle(queue, lambda job: {"done": job.text})
    async with running_worker(worker):
        before = [(await client.enqueue(queue, f"before {n}", dedup_key=f"before-{n}")).job_id
                  for n in range(3)]
        for job_id in before:
            await wait_state(client, job_id, jobbroker.JOB_STATE_COMPLETED)

        old_leader = leader_of(cluster, queue)
        cluster.kill9(old_leader)

        # The same dedup key each time: an attempt whose answer was lost is not a second job.
        give_up = time.monotonic() + 60
        while True:
            try:
                after = await client.enqueue(queue, "after", dedup_key="after-the-kill",
                                             deadline=5)
                break
            except (jobbroker.UnavailableError, jobbroker.DeadlineExceededError):
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(0.2)
        new_leader = leader_of(cluster, queue)
        assert new_leader != old_leader
        assert options.targets_of("Enqueue")[-1] == new_leader

        for job_id in before:
            assert (await client.get_job(job_id)).state == jobbroker.JOB_STATE_COMPLETED
        done = await wait_state(client, after.job_id, jobbroker.JOB_STATE_COMPLETED)
        assert done.result == b'{"done":"after"}'


async def poll(check: Callable[[], Awaitable[bool]], what: str, give_up_after: float = 60.0
               ) -> None:
    """Until check() is true; a call failing UNAVAILABLE or DEADLINE_EXCEEDED (a leader died,
    its successor is not serving yet) counts as not yet."""
    give_up = time.monotonic() + give_up_after
    while True:
        try:
            if await check():
                return
        except (jobbroker.UnavailableError, jobbroker.DeadlineExceededError):
            pass
        assert time.monotonic() < give_up, f"gave up waiting for {what}"
        await asyncio.sleep(0.2)


async def enqueue_each(client: jobbroker.Client, queues: Sequence[str], n: int, tag: str
                       ) -> list[str]:
    """`n` jobs on each queue, each retried with its dedup key until a leader takes it."""
    ids: list[str] = []
    for queue in queues:
        for i in range(n):
            job: list[str] = []

            async def enqueue(queue: str = queue, i: int = i, job: list[str] = job) -> bool:
                res = await client.enqueue(queue, f"{tag} {i}", dedup_key=f"{tag}-{queue}-{i}",
                                           deadline=5)
                job.append(res.job_id)
                return True

            await poll(enqueue, f"an enqueue on {queue}")
            ids.append(job[0])
    return ids


async def all_completed(client: jobbroker.Client, ids: Sequence[str]) -> None:
    async def done() -> bool:
        for job_id in ids:
            if (await client.get_job(job_id, deadline=5)).state != jobbroker.JOB_STATE_COMPLETED:
                return False
        return True

    await poll(done, f"{len(ids)} jobs to complete")


class LeaderHeldBack(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """A stand-in for the answers of Admin.GetCluster: the real answer with the leader of
    `partition` taken out, until `shown` is set, as a node answers that has not yet learnt a
    new leader. Counts the answers."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.shown = False
        self.answers = 0

    async def intercept_unary_unary(self, continuation: Callable[..., Awaitable[Any]],
                                    details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        if method_name(details) != "GetCluster":
            return call
        try:
            info = await call
        except grpc.aio.AioRpcError:
            return call
        self.answers += 1
        if self.shown:
            return info
        held_back = admin_pb2.ClusterInfo()
        held_back.CopyFrom(info)
        for p in held_back.partitions:
            if p.partition == self.partition:
                p.leader_node_id = ""
                p.leader_address = ""
        return held_back


@pytest.fixture
def two_leaders() -> Iterator[tuple[ClusterProcess, dict[int, int]]]:
    """A cluster of 2 partitions, once they are led by different nodes (the controller moves
    leaders to their preferred nodes after a start), with partition -> leading node's index."""
    with ClusterProcess(2) as cluster:
        give_up = time.monotonic() + 60
        while True:
            info = cluster.cluster_info()
            led = {} if info is None else {
                p.partition: cluster.addresses.index(p.leader_address)
                for p in info.partitions if p.leader_address in cluster.addresses}
            if len(led) == 2 and led[0] != led[1]:
                break
            assert time.monotonic() < give_up, f"the 2 partitions never had 2 leaders: {info}"
            time.sleep(0.2)
        yield cluster, led


async def test_a_worker_streams_to_each_leader_of_its_queues_and_regroups_after_a_kill(
        two_leaders: tuple[ClusterProcess, dict[int, int]]) -> None:
    cluster, led = two_leaders
    queues = [next(q for q in (f"per-leader.{i}" for i in range(1000))
                   if partition_of_queue(q, 2) == p) for p in (0, 1)]
    leaders = [led[0], led[1]]
    [neither] = [n for n in range(3) if n not in leaders]
    # The node that leads neither queue first: a worker that streamed to "the first address
    # that answers" would have it relay both.
    order = [cluster.addresses[n] for n in (neither, *leaders)]
    options = ClientOptions(addresses=order, token="", deadline=30)
    worker = jobbroker.Worker(options=options, concurrency=4, handle_signals=False)
    for queue in queues:
        worker.handle(queue, lambda job: {"done": job.text})

    def gauges(name: str, nodes: Sequence[int]) -> list[float]:
        return [cluster.metric(n, name) for n in nodes]

    async with jobbroker.Client(options=options) as client, running_worker(worker):
        await all_completed(client, await enqueue_each(client, queues, 10, "first"))
        assert gauges("jobbroker_work_streams_relaying", range(3)) == [0, 0, 0]
        opened = gauges("jobbroker_work_streams_open", range(3))
        assert opened[leaders[0]] >= 1 and opened[leaders[1]] >= 1 and opened[neither] == 0, \
            f"open streams per node {opened}: want them on node-{leaders} only"

        cluster.kill9(cluster.addresses[leaders[0]])
        await all_completed(client, await enqueue_each(client, queues, 10, "after-the-kill"))
        alive = [n for n in range(3) if n != leaders[0]]

        async def not_relayed() -> bool:
            return gauges("jobbroker_work_streams_relaying", alive) == [0, 0]

        await poll(not_relayed, "no live node to relay the worker's streams", 30)


async def test_a_stopping_worker_reopens_the_stream_of_a_killed_leader_for_its_answers(
        two_leaders: tuple[ClusterProcess, dict[int, int]]) -> None:
    """Worker contract §6 with one stream per leader: a stop begins while a handler of each
    queue runs; one leader is killed (kill -9) during the grace. The worker regroups while it
    stops (streams opened then do not subscribe); the handlers then return, and both acks reach
    the partitions' leaders, the new one included: both jobs end COMPLETED, and the stop
    returns without waiting out the grace."""
    cluster, led = two_leaders
    queues = [next(q for q in (f"stop-per-leader.{i}" for i in range(1000))
                   if partition_of_queue(q, 2) == p) for p in (0, 1)]
    options = ClientOptions(addresses=cluster.addresses, token="", deadline=30)
    worker = jobbroker.Worker(options=options, concurrency=2, lease_duration=60, grace=45,
                              reconnect_initial=0.05, reconnect_max=0.5, handle_signals=False)
    started: set[str] = set()
    both_started = asyncio.Event()
    gate = asyncio.Event()

    async def held(job: jobbroker.JobContext) -> dict[str, str]:
        started.add(job.queue)
        if len(started) == 2:
            both_started.set()
        await gate.wait()
        return {"done": job.text}

    for queue in queues:
        worker.handle(queue, held)

    async with jobbroker.Client(options=options) as client:
        ids = await enqueue_each(client, queues, 1, "stopping")
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(both_started.wait(), 60)
            worker.stop()
            await asyncio.sleep(0.2)  # the stop has begun: Flow{0} on both streams
            cluster.kill9(cluster.addresses[led[0]])

            async def new_leader() -> bool:
                info = await asyncio.to_thread(cluster.cluster_info)
                if info is None:
                    return False
                leader = {p.partition: p.leader_address for p in info.partitions}.get(0, "")
                return leader in cluster.addresses and leader != cluster.addresses[led[0]]

            await poll(new_leader, "partition 0 to get a new leader")
            info = await asyncio.to_thread(cluster.cluster_info)
            assert info is not None
            moved = {p.partition: p.leader_address for p in info.partitions}[0]

            async def regrouped() -> bool:
                # The worker regrouped while stopping: a stream for partition 0's queue is
                # open on its new leader.
                return any(s.node.address == moved and queues[0] in s.group.queues
                           for s in worker._streams)

            await poll(regrouped, f"a stream to {moved}, partition 0's new leader", 30)
            assert not task.done()
            gate.set()
            await asyncio.wait({task}, timeout=30)
            assert task.done(), "the stop did not return: an ack found no stream"
            task.result()
        finally:
            gate.set()
            if not task.done():
                await asyncio.wait_for(task, 60)
        await all_completed(client, ids)
    assert worker.stats.acked == 2 and worker.stats.released == 0
    assert worker.stats.reconnects >= 1


async def test_a_relayed_stream_to_any_node_moves_to_the_leader_once_the_table_names_it(
        two_leaders: tuple[ClusterProcess, dict[int, int]]) -> None:
    """Worker contract §5: the worker's table shows partition 0 without a leader (a stand-in
    GetCluster answer), so its queue goes to the group for any node; the node that answered
    leads neither partition but knows the leader, and relays that stream. No stream ends, yet
    the worker asks again after each backoff delay; once the answer names the leader, the
    queue moves to the leader's own stream, and no node relays any more."""
    cluster, led = two_leaders
    queue = next(q for q in (f"any-node.{i}" for i in range(1000))
                 if partition_of_queue(q, 2) == 0)
    leader = cluster.addresses[led[0]]
    [neither] = [n for n in range(3) if n not in led.values()]
    stand_in = LeaderHeldBack(partition=0)
    options = ClientOptions(addresses=[cluster.addresses[n] for n in (neither, led[1], led[0])],
                            token="", deadline=30, interceptors=[stand_in])
    worker = jobbroker.Worker(options=options, reconnect_initial=0.05, reconnect_max=0.5,
                              handle_signals=False)
    worker.handle(queue, lambda job: {"done": job.text})

    def relaying() -> list[float]:
        return [cluster.metric(n, "jobbroker_work_streams_relaying") for n in range(3)]

    client_options = ClientOptions(addresses=cluster.addresses, token="", deadline=30)
    async with jobbroker.Client(options=client_options) as client, running_worker(worker):
        await all_completed(client, await enqueue_each(client, [queue], 3, "relayed"))
        assert [(s.group.address, s.node.address) for s in worker._streams] == [
            ("", cluster.addresses[neither])]

        async def relayed() -> bool:
            return relaying()[neither] == 1

        await poll(relayed, f"node-{neither} to relay the worker's stream", 30)
        asked = stand_in.answers

        async def asked_again() -> bool:
            return stand_in.answers >= asked + 2

        await poll(asked_again, "the worker to ask for the table again", 30)
        assert worker.stats.reconnects == 0, "a stream ended: the refresh is not what moved it"

        stand_in.shown = True

        async def moved() -> bool:
            return ([(s.group.address, s.node.address) for s in worker._streams]
                    == [(leader, leader)] and relaying() == [0, 0, 0])

        await poll(moved, f"the worker's stream to move to the leader {leader}", 30)
        await all_completed(client, await enqueue_each(client, [queue], 3, "led"))
        assert worker.stats.reconnects == 0
