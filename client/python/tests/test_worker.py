"""The Worker helper against the real broker (child processes where a worker must be killed)."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import grpc
import pytest
from brokerproc import BrokerProcess
from conftest import CONFIG, eventually, running_worker, wait_state

import jobbroker

CHILD = pathlib.Path(__file__).with_name("worker_child.py")
WAIT_ATTEMPT = pathlib.Path(__file__).with_name("wait_attempt.py")


def spawn(address: str, mode: str, log: pathlib.Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(CHILD), address, mode, str(log), *extra])


def lines(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_handlers_ack_with_their_results(broker: BrokerProcess,
                                               client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, concurrency=3, handle_signals=False)

    @worker.handler("acks")
    async def double(job: jobbroker.JobContext) -> dict[str, int]:
        assert job.queue == "acks" and job.attempt == 1 and job.headers == {"h": "v"}
        return {"double": job.json()["n"] * 2}

    ids = [(await client.enqueue("acks", {"n": n}, headers={"h": "v"})).job_id for n in range(6)]
    async with running_worker(worker):
        for n, job_id in enumerate(ids):
            done = await wait_state(client, job_id, jobbroker.JOB_STATE_COMPLETED)
            assert done.result == f'{{"double":{n * 2}}}'.encode()
    assert worker.stats.acked == 6


async def test_plain_function_handler_runs_in_a_thread(broker: BrokerProcess,
                                                       client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    def shout(job: jobbroker.JobContext) -> str:
        first = job.step_sync("upper", lambda: job.text.upper())
        return first + "!"

    worker.handle("sync", shout)
    res = await client.enqueue("sync", "hi")
    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert done.result == b"HI!"


async def test_heartbeats_keep_a_short_lease_over_a_long_job(broker: BrokerProcess,
                                                             client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, lease_duration=1, handle_signals=False)

    @worker.handler("long")
    async def slow(job: jobbroker.JobContext) -> None:
        await asyncio.sleep(3)  # three leases long
        assert not job.cancelled

    res = await client.enqueue("long", "x")
    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert done.attempt == 1
    assert [a.outcome for a in done.attempts] == [jobbroker.ATTEMPT_OUTCOME_COMPLETED]


async def test_an_exception_fails_the_attempt_and_it_is_retried(broker: BrokerProcess,
                                                                client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    @worker.handler("flaky")
    async def flaky(job: jobbroker.JobContext) -> str:
        if job.attempt == 1:
            raise RuntimeError("provider timed out")
        return "ok"

    res = await client.enqueue("flaky", "x")
    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert [a.outcome for a in done.attempts] == [
        jobbroker.ATTEMPT_OUTCOME_ERROR, jobbroker.ATTEMPT_OUTCOME_COMPLETED]
    assert done.attempts[0].error == "RuntimeError: provider timed out"


async def test_permanent_error_fails_the_job_after_one_attempt(broker: BrokerProcess,
                                                              client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    @worker.handler("perm-w")
    async def bad(job: jobbroker.JobContext) -> None:
        raise jobbroker.PermanentError("no such mailbox")

    res = await client.enqueue("perm-w", "x")
    async with running_worker(worker):
        dead = await wait_state(client, res.job_id, jobbroker.JOB_STATE_FAILED)
    assert dead.fail_reason == jobbroker.FAIL_REASON_PERMANENT
    assert dead.attempt == 1
    assert dead.last_error == "no such mailbox"
    assert [a.outcome for a in dead.attempts] == [jobbroker.ATTEMPT_OUTCOME_PERMANENT_ERROR]


async def test_retry_after_sets_the_next_attempt(broker: BrokerProcess,
                                                 client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    @worker.handler("429")
    async def limited(job: jobbroker.JobContext) -> None:
        raise jobbroker.RetryAfter(3600, "rate limited")

    res = await client.enqueue("429", "x")
    async with running_worker(worker):
        job = await wait_state(client, res.job_id, jobbroker.JOB_STATE_SCHEDULED)
    assert job.last_error == "rate limited"
    wait = job.run_at.ToDatetime() - job.attempts[0].ended_at.ToDatetime()
    assert wait.total_seconds() >= 3599  # the broker's own timestamps: no wall clock here


async def test_an_operator_cancel_cancels_the_handlers_task(broker: BrokerProcess,
                                                            client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    started = asyncio.Event()
    saw_cancel: list[bool] = []

    @worker.handler("cancel")
    async def long(job: jobbroker.JobContext) -> str:
        if job.text == "next":
            return "next done"
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            saw_cancel.append(job.cancelled)
            raise
        return "not cancelled"

    res = await client.enqueue("cancel", "x")
    async with running_worker(worker):
        await asyncio.wait_for(started.wait(), 60)
        await client.cancel_job(res.job_id)
        job = await wait_state(client, res.job_id, jobbroker.JOB_STATE_CANCELLED)
        # The slot is free again: the next job runs (concurrency 1).
        after = await client.enqueue("cancel", "next")
        await wait_state(client, after.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert saw_cancel == [True]
    assert [a.error for a in job.attempts] == ["cancelled"]


def wait_for_attempt(address: str, ids: list[str], attempt: int) -> None:
    """Blocks the calling thread until every job in `ids` is ACTIVE in `attempt` or later."""
    subprocess.run([sys.executable, str(WAIT_ATTEMPT), address, str(attempt), *ids],
                   check=True, timeout=120)


async def test_a_backlog_is_handled_once_each_with_fewer_ack_messages_than_jobs(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    n = 300
    ids = [r.job_id for r in await client.enqueue_batch(
        [jobbroker.NewJob("backlog", f"job{i}") for i in range(n)])]
    handled: collections.Counter[str] = collections.Counter()
    worker = jobbroker.Worker(broker.address, concurrency=16, handle_signals=False)

    @worker.handler("backlog")
    async def record(job: jobbroker.JobContext) -> None:
        handled[job.job_id] += 1

    async with running_worker(worker):
        async def all_completed() -> bool:
            info = await client.get_queue("backlog")
            return info.counts["JOB_STATE_COMPLETED"] == n

        await eventually(all_completed, what=f"{n} jobs to complete")
    assert handled == collections.Counter({job_id: 1 for job_id in ids})
    for job_id in ids:
        job = await client.get_job(job_id)
        assert job.state == jobbroker.JOB_STATE_COMPLETED and job.attempt == 1
    assert worker.stats.acked == n
    # Acks that completed while one was unanswered went out together (AckBatch).
    assert 0 < worker.stats.ack_messages < n, worker.stats


async def test_a_stale_ack_in_a_batch_is_logged_and_the_worker_carries_on(
        broker: BrokerProcess, client: jobbroker.Client,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="jobbroker.worker")
    n = 4
    ids = [r.job_id for r in await client.enqueue_batch(
        [jobbroker.NewJob("stale-acks", f"job{i}") for i in range(n)])]
    worker = jobbroker.Worker(broker.address, concurrency=n, lease_duration=1,
                              handle_signals=False)
    started: set[str] = set()
    all_started = asyncio.Event()

    @worker.handler("stale-acks")
    async def work(job: jobbroker.JobContext) -> str:
        if job.attempt > 1 or job.job_id not in ids:
            return "second"
        started.add(job.job_id)
        if len(started) < n:
            await all_started.wait()
            return "first"
        all_started.set()
        # Blocks the event loop (the bug of CPU work in an async handler): no heartbeats go out,
        # the four 1 s leases run out, and the broker leases the jobs again (attempt 2, pushed to
        # this very stream) before these acks of attempt 1 reach it. The first of them goes out
        # alone; the other three complete while it is unanswered and follow as one AckBatch,
        # whose items are stale. The block lasts until the broker shows attempt 2 active.
        wait_for_attempt(broker.address, ids, 2)
        return "first"

    async with running_worker(worker):
        for job_id in ids:
            job = await wait_state(client, job_id, jobbroker.JOB_STATE_COMPLETED)
            assert job.result == b"second"
            assert [a.outcome for a in job.attempts] == [
                jobbroker.ATTEMPT_OUTCOME_LEASE_EXPIRED, jobbroker.ATTEMPT_OUTCOME_COMPLETED]
        # The worker still works after the refused items.
        after = await client.enqueue("stale-acks", "after")
        await wait_state(client, after.job_id, jobbroker.JOB_STATE_COMPLETED)
    # Item errors of an AckBatch name their item ("acks[i]: lease ... is stale").
    stale = [r.getMessage() for r in caplog.records if "ack not applied: acks[" in r.getMessage()]
    assert stale and all("is stale" in m for m in stale), [r.getMessage() for r in caplog.records]
    assert worker.stats.acked == 2 * n + 1
    assert worker.stats.acks_refused == n


async def test_stop_sends_the_acks_buffered_behind_an_unanswered_one(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    n = 40
    ids = [r.job_id for r in await client.enqueue_batch(
        [jobbroker.NewJob("stop-acks", f"job{i}") for i in range(n)])]
    worker = jobbroker.Worker(broker.address, concurrency=n, handle_signals=False)
    started: set[str] = set()
    all_started = asyncio.Event()
    gate = asyncio.Event()

    @worker.handler("stop-acks")
    async def held(job: jobbroker.JobContext) -> None:
        started.add(job.job_id)
        if len(started) == n:
            all_started.set()
        await gate.wait()

    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(all_started.wait(), 60)
    # All n finish at once as the stop begins: one ack goes out, the rest wait behind it.
    worker.stop()
    gate.set()
    await asyncio.wait_for(task, 60)
    # run() has returned: every ack, buffered ones included, was sent and answered.
    for job_id in ids:
        assert (await client.get_job(job_id)).state == jobbroker.JOB_STATE_COMPLETED
    assert worker.stats.acked == n
    assert worker.stats.ack_messages < n, worker.stats


async def test_a_refused_subscription_is_raised(broker: BrokerProcess) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    worker.handle("not a queue!", lambda job: None)
    with pytest.raises(jobbroker.InvalidArgumentError) as err:
        await asyncio.wait_for(worker.run(), 60)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_worker_reconnects_after_a_broker_restart(tmp_path: pathlib.Path) -> None:
    first = BrokerProcess(CONFIG, data_dir=str(tmp_path)).start()
    address = first.address
    worker = jobbroker.Worker(address, reconnect_initial=0.05, reconnect_max=0.5,
                              handle_signals=False)
    seen: list[str] = []

    @worker.handler("restart")
    async def record(job: jobbroker.JobContext) -> None:
        seen.append(job.text)

    second = None
    try:
        async with running_worker(worker):
            async with jobbroker.Client(address, timeout=30) as c:
                one = await c.enqueue("restart", "before")
                await wait_state(c, one.job_id, jobbroker.JOB_STATE_COMPLETED)
            assert first.stop() == 0
            # Same data and the same (OS-chosen) port: the worker finds it again.
            second = BrokerProcess(CONFIG, data_dir=str(tmp_path), listen=address).start()
            async with jobbroker.Client(address, timeout=30) as c:
                two = await c.enqueue("restart", "after")
                await wait_state(c, two.job_id, jobbroker.JOB_STATE_COMPLETED)
        assert seen == ["before", "after"]
        assert worker.stats.reconnects >= 1
    finally:
        first.kill()
        if second is not None:
            second.stop()


async def test_sigterm_drains_and_loses_nothing(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "log.txt"
    with BrokerProcess(CONFIG) as broker:
        async with jobbroker.Client(broker.address, timeout=30) as client:
            ids = [(await client.enqueue("drain", f"job{i}")).job_id for i in range(3)]
            child = spawn(broker.address, "drain", log)
            try:
                async def started() -> bool:
                    return any(line.startswith("start") for line in lines(log))

                await eventually(started, what="the first job to start")
                # All three are held (concurrency 1 + prefetch 2): one runs, two wait.
                async def all_held() -> bool:
                    info = await client.get_queue("drain")
                    return info.counts["JOB_STATE_ACTIVE"] == 3

                await eventually(all_held, what="the worker to hold three jobs")
                child.send_signal(signal.SIGTERM)
                assert child.wait(60) == 0
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            assert lines(log) == [lines(log)[0], "end " + lines(log)[0].split()[1]]
            ran = lines(log)[0].split()[1]
            states = {}
            for i, job_id in enumerate(ids):
                job = await client.get_job(job_id)
                states[f"job{i}"] = job.state
                if f"job{i}" != ran:
                    assert job.attempts == [] or all(
                        a.outcome == jobbroker.ATTEMPT_OUTCOME_UNSPECIFIED for a in job.attempts)
            assert states.pop(ran) == jobbroker.JOB_STATE_COMPLETED
            assert set(states.values()) == {jobbroker.JOB_STATE_READY}
