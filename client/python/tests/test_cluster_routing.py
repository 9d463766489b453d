"""Routing against a real 3-node cluster of 4 partitions: each call goes to the address of its
partition's leader, and after a kill -9 of a leader the client and the worker follow the new one.
One cluster for the file; the leader-kill test runs last, as it leaves a node dead."""

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
