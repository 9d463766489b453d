"""The Client's calls beyond enqueue and lease, against the real broker: enqueue_and_wait, every
Admin rpc (schedules, cluster, bulk retry, purge, policies), the batch's dependencies, and the
blocking SyncClient."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import threading
from collections.abc import Iterator

import pytest
from brokerproc import BrokerProcess
from conftest import eventually, running_worker, wait_state

import jobbroker
from jobbroker import NewJob


def worker_for(broker: BrokerProcess, queue: str) -> jobbroker.Worker:
    """A worker whose handler does what the payload's "do" says: "ok" returns {"echo": ...},
    "fail" fails permanently, "hold" waits for its cancellation."""
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    @worker.handler(queue)
    async def handle(job: jobbroker.JobContext) -> object:
        payload = job.json()
        if payload["do"] == "fail":
            raise jobbroker.PermanentError("refused by the handler")
        if payload["do"] == "hold":
            await asyncio.Event().wait()
        return {"echo": payload.get("echo")}

    return worker


# --- enqueue_and_wait ------------------------------------------------------------------------


async def test_enqueue_and_wait_returns_the_completed_job_with_its_result(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    async with running_worker(worker_for(broker, "wait.ok")):
        job = await client.enqueue_and_wait("wait.ok", {"do": "ok", "echo": 7}, priority=3)
    assert job.state == jobbroker.JOB_STATE_COMPLETED
    assert json.loads(job.result) == {"echo": 7}
    assert job.priority == 3


async def test_enqueue_and_wait_raises_naming_failed(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    async with running_worker(worker_for(broker, "wait.fail")):
        with pytest.raises(jobbroker.JobFailedError, match="JOB_STATE_FAILED") as err:
            await client.enqueue_and_wait("wait.fail", {"do": "fail"})
    assert err.value.state == "JOB_STATE_FAILED"
    assert err.value.job.fail_reason == jobbroker.FAIL_REASON_PERMANENT
    assert "refused by the handler" in str(err.value)


async def test_enqueue_and_wait_raises_naming_cancelled(client: jobbroker.Client) -> None:
    waiting = asyncio.create_task(
        client.enqueue_and_wait("wait.cancel", {"do": "ok"}, delay=3600))

    async def enqueued() -> bool:
        with contextlib.suppress(jobbroker.NotFoundError):  # the queue is made by the enqueue
            return bool((await client.list_jobs("wait.cancel")).jobs)
        return False

    await eventually(enqueued, what="the job to be enqueued")
    [job] = (await client.list_jobs("wait.cancel")).jobs
    await client.cancel_job(job.id)
    with pytest.raises(jobbroker.JobFailedError, match="JOB_STATE_CANCELLED"):
        await waiting


async def test_enqueue_and_wait_gives_up_after_its_timeout(client: jobbroker.Client) -> None:
    with pytest.raises(TimeoutError):
        await client.enqueue_and_wait("wait.nobody", {"do": "ok"}, wait_timeout=0.3)
    [job] = (await client.list_jobs("wait.nobody")).jobs
    assert job.state == jobbroker.JOB_STATE_READY  # the job goes on without the waiter


# --- schedules -------------------------------------------------------------------------------


async def test_a_schedule_round_trip(client: jobbroker.Client) -> None:
    template = NewJob("sched.reports", {"report": "daily"}, headers={"origin": "schedule"},
                      priority=2)
    stored = await client.put_schedule("daily-report", template, every=dt.timedelta(hours=1))
    assert stored.schedule_id == "daily-report"
    assert stored.every.ToTimedelta() == dt.timedelta(hours=1)
    assert stored.HasField("next_run_at")
    assert (await client.get_schedule("daily-report")).template.queue == "sched.reports"
    assert [s.schedule_id for s in await client.list_schedules("sched.reports")] == [
        "daily-report"]

    run = await client.trigger_schedule("daily-report")
    job = await client.get_job(run.job_id)
    assert job.queue == "sched.reports"
    assert json.loads(job.payload) == {"report": "daily"}
    assert dict(job.headers) == {"origin": "schedule"}
    assert job.dedup_key.startswith("daily-report@")

    await client.put_schedule("daily-report", template, cron="0 6 * * *",
                              time_zone="Europe/Berlin", paused=True)
    replaced = await client.get_schedule("daily-report")
    assert (replaced.cron, replaced.time_zone, replaced.paused) == (
        "0 6 * * *", "Europe/Berlin", True)
    assert replaced.last_job_id == run.job_id  # replacing keeps the run history

    await client.delete_schedule("daily-report")
    with pytest.raises(jobbroker.NotFoundError):
        await client.get_schedule("daily-report")
    await client.get_job(run.job_id)  # its jobs stay


# --- the other Admin calls -------------------------------------------------------------------


async def test_get_cluster_on_a_single_node(client: jobbroker.Client) -> None:
    cluster = await client.get_cluster()
    assert cluster.partition_count >= 1
    assert all(p.leader_node_id == cluster.node_id for p in cluster.partitions)


async def test_bulk_retry_redrives_the_dead_jobs_of_a_queue(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    async with running_worker(worker_for(broker, "redrive")):
        ids = [(await client.enqueue("redrive", {"do": "fail"})).job_id for _ in range(3)]
        for job_id in ids:
            await wait_state(client, job_id, jobbroker.JOB_STATE_FAILED)
    counted = await client.retry_jobs("redrive", dry_run=True)
    assert (counted.matched, counted.retried) == (3, 0)
    done = await client.retry_jobs("redrive", jobbroker.JOB_STATE_FAILED)
    assert (done.matched, done.retried) == (3, 3)
    for job_id in ids:
        assert (await client.get_job(job_id)).state == jobbroker.JOB_STATE_READY


async def test_delete_purge_and_policy(client: jobbroker.Client) -> None:
    keep = await client.enqueue("tidy", "keep", dedup_key="tidy:keep")
    gone = await client.enqueue("tidy", "gone")
    await client.cancel_job(gone.job_id)
    await client.delete_job(gone.job_id)
    with pytest.raises(jobbroker.NotFoundError):
        await client.get_job(gone.job_id)
    page = await client.list_jobs("tidy", dedup_key="tidy:keep")
    assert [j.id for j in page.jobs] == [keep.job_id]
    assert await client.purge_queue("tidy", [jobbroker.JOB_STATE_READY]) == 1

    policy = jobbroker.policy_pb2.QueuePolicy(max_length=5)
    info = await client.update_queue_policy("tidy", policy)
    assert info.policy.max_length == 5
    reset = await client.update_queue_policy("tidy", reset=True)
    assert reset.policy.max_length != 5


async def test_a_batch_can_wait_on_its_own_earlier_jobs(client: jobbroker.Client) -> None:
    first, second = await client.enqueue_batch([
        NewJob("graph", "first", expire_at=dt.datetime.now(dt.timezone.utc)
               + dt.timedelta(hours=1), timeout=30),
        NewJob("graph", "second", depends_on_index=[0]),
    ])
    assert (await client.get_job(second.job_id)).state == jobbroker.JOB_STATE_WAITING
    job = await client.get_job(first.job_id)
    assert job.timeout.ToTimedelta() == dt.timedelta(seconds=30)
    assert job.HasField("expire_at")


async def test_release_with_a_delay_snoozes_and_heartbeat_reports_progress(
        client: jobbroker.Client) -> None:
    res = await client.enqueue("unary.snooze", "x")
    [leased] = await client.lease("unary.snooze", wait=5)
    await client.heartbeat(leased, progress={"percent": 30})
    assert json.loads((await client.get_job(res.job_id)).progress) == {"percent": 30}
    await client.release(leased, delay=3600)
    job = await client.get_job(res.job_id)
    assert (job.state, job.snoozes) == (jobbroker.JOB_STATE_SCHEDULED, 1)


# --- SyncClient ------------------------------------------------------------------------------


@pytest.fixture
def sync_client(broker: BrokerProcess) -> Iterator[jobbroker.SyncClient]:
    with jobbroker.SyncClient(broker.address) as c:
        yield c


def test_the_sync_client_blocks_on_each_call(sync_client: jobbroker.SyncClient) -> None:
    res = sync_client.enqueue("sync.plain", {"n": 1}, dedup_key="sync:1")
    job = sync_client.get_job(res.job_id)
    assert json.loads(job.payload) == {"n": 1}
    assert sync_client.enqueue("sync.plain", {"n": 1}, dedup_key="sync:1").deduplicated
    assert "sync.plain" in [q.name for q in sync_client.list_queues()]
    with pytest.raises(jobbroker.InvalidArgumentError):
        sync_client.enqueue("", b"x")


def test_the_sync_client_serves_many_threads(sync_client: jobbroker.SyncClient) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        res = sync_client.enqueue("sync.threads", {"n": n})
        with lock:
            ids.append(res.job_id)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 8
    assert len(sync_client.list_jobs("sync.threads", page_size=100).jobs) == 8


def test_the_sync_client_waits_for_a_job_worked_elsewhere(
        broker: BrokerProcess, sync_client: jobbroker.SyncClient) -> None:
    worker = worker_for(broker, "sync.wait")
    runner = threading.Thread(target=asyncio.run, args=(worker.run(),))
    runner.start()
    try:
        job = sync_client.enqueue_and_wait("sync.wait", {"do": "ok", "echo": "hi"},
                                           wait_timeout=60)
        states = [j.state for j in sync_client.watch_job(job.id)]
    finally:
        worker.stop()
        runner.join(60)
    assert json.loads(job.result) == {"echo": "hi"}
    assert states == [jobbroker.JOB_STATE_COMPLETED]


def test_a_closed_sync_client_refuses_calls(broker: BrokerProcess) -> None:
    c = jobbroker.SyncClient(broker.address)
    c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.list_queues()
