"""The Worker against the contract (docs/worker-contract.md), real broker: Snooze, progress,
the cancellation signal (time-out, lost lease holding its slot, operator cancel, end of a
stop's grace), answers resent after a reconnect, a stream reopened during a stop for the
answers still to come (and the stop's bounds when none can be), and the call metadata (library
name, token)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import pathlib
import subprocess
import sys
import time

import pytest
from brokerproc import BrokerProcess
from conftest import CONFIG, eventually, running_worker, wait_state

import jobbroker

WAIT_ATTEMPT = pathlib.Path(__file__).with_name("wait_attempt.py")


async def test_snooze_puts_the_job_back_without_spending_an_attempt(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    seen: list[int] = []

    @worker.handler("snooze")
    async def busy_once(job: jobbroker.JobContext) -> str:
        seen.append(job.attempt)
        if len(seen) == 1:
            raise jobbroker.Snooze(0.5)
        return "done"

    res = await client.enqueue("snooze", "x")
    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert seen == [1, 1]  # the snooze spent no attempt
    assert done.snoozes == 1 and done.attempt == 1
    assert worker.stats.released == 1


async def test_progress_reaches_watchers_and_the_newest_value_wins(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    finish = asyncio.Event()

    @worker.handler("progress")
    async def report(job: jobbroker.JobContext) -> None:
        # A burst: one heartbeat is in flight at a time, the values in between are dropped,
        # and the last one always arrives.
        for percent in range(1, 51):
            job.progress({"percent": percent})
        await finish.wait()

    res = await client.enqueue("progress", "x")
    shown: list[object] = []
    async with running_worker(worker):
        async for job in client.watch_job(res.job_id):
            if job.progress:
                shown.append(json.loads(job.progress))
            if shown and shown[-1] == {"percent": 50} and not finish.is_set():
                assert job.state == jobbroker.JOB_STATE_ACTIVE  # seen before the job ended
                finish.set()
            if job.state == jobbroker.JOB_STATE_COMPLETED:
                break
    assert shown[-1] == {"percent": 50}
    percents = [value["percent"] for value in shown]  # type: ignore[index]
    assert percents == sorted(percents)  # an older value never overtakes a newer one


async def test_a_plain_handler_reports_progress_from_its_thread_and_sees_a_cancel(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    def poll(job: jobbroker.JobContext) -> str:
        job.progress("started")
        while not job.cancelled:  # a thread cannot be interrupted: it looks at the flag
            time.sleep(0.02)
        raise RuntimeError("stopped on cancel")

    worker.handle("thread-cancel", poll)
    res = await client.enqueue("thread-cancel", "x")
    async with running_worker(worker):
        async def reported() -> bool:
            return (await client.get_job(res.job_id)).progress == b"started"

        await eventually(reported, what="the progress of a plain handler")
        await client.cancel_job(res.job_id)
        job = await wait_state(client, res.job_id, jobbroker.JOB_STATE_CANCELLED)
    assert [a.error for a in job.attempts] == ["RuntimeError: stopped on cancel"]


async def test_a_time_out_fires_the_signal_and_the_attempt_sends_nothing(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, lease_duration=60, handle_signals=False)
    cancelled: list[tuple[int, bool]] = []

    @worker.handler("timeout")
    async def slow(job: jobbroker.JobContext) -> str:
        assert job.timeout_at is not None
        if job.attempt == 1:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append((job.attempt, job.cancelled))
                raise
        return "in time"

    res = await client.enqueue("timeout", "x", timeout=1)
    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert cancelled == [(1, True)]
    assert [a.outcome for a in done.attempts] == [
        jobbroker.ATTEMPT_OUTCOME_TIMED_OUT, jobbroker.ATTEMPT_OUTCOME_COMPLETED]
    assert worker.stats.failed == 0  # nothing was sent for the timed-out attempt


async def test_a_lost_lease_keeps_the_slot_while_its_handler_ignores_the_signal(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    # concurrency is a hard bound (worker contract §3): the broker pushes attempt 2 to this
    # worker while attempt 1's handler still runs, and attempt 2 waits (leased, heartbeated)
    # until that handler returned.
    worker = jobbroker.Worker(broker.address, concurrency=1, lease_duration=1,
                              handle_signals=False)
    order: list[str] = []
    first_saw: list[bool] = []

    @worker.handler("lost")
    async def work(job: jobbroker.JobContext) -> str:
        order.append(f"start {job.attempt}")
        if job.attempt > 1:
            return "second"
        # Blocks the event loop until the broker re-leased the job: no heartbeat went out, the
        # lease ran out (the broker pushes lease_lost and attempt 2 to this stream).
        subprocess.run([sys.executable, str(WAIT_ATTEMPT), broker.address, "2", job.job_id],
                       check=True, timeout=120)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            first_saw.append(job.cancelled)
        # Ignores the signal for a while (longer than attempt 2's lease: its heartbeats must
        # keep it while it waits): attempt 2 must not start beside it.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(deadline - time.monotonic())
        order.append("end 1")
        return "first"

    res = await client.enqueue("lost", "x", max_attempts=5)
    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert first_saw == [True]
    assert order == ["start 1", "end 1", "start 2"]
    assert done.result == b"second"
    assert [a.outcome for a in done.attempts] == [
        jobbroker.ATTEMPT_OUTCOME_LEASE_EXPIRED, jobbroker.ATTEMPT_OUTCOME_COMPLETED]
    assert worker.stats.acked == 1  # the lost attempt's end sent nothing


async def test_an_operator_cancelled_handler_that_returns_is_acked(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    started = asyncio.Event()

    @worker.handler("cancel-return")
    async def work(job: jobbroker.JobContext) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass  # the work was done after all: return normally
        return "done anyway"

    res = await client.enqueue("cancel-return", "x")
    async with running_worker(worker):
        await asyncio.wait_for(started.wait(), 60)
        await client.cancel_job(res.job_id)
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert done.result == b"done anyway"
    assert worker.stats.acked == 1 and worker.stats.failed == 0


async def test_the_end_of_the_grace_cancels_handlers_and_releases_their_jobs(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, concurrency=2, grace=0.3, handle_signals=False)
    started: set[str] = set()
    both_started = asyncio.Event()
    ends: dict[str, str] = {}

    @worker.handler("grace")
    async def long(job: jobbroker.JobContext) -> None:
        started.add(job.text)
        if len(started) == 2:
            both_started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            ends[job.text] = "cancelled"
            if job.text == "stubborn":
                # Ignores its cancellation: the job is released anyway, a moment later.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(60)
            raise

    ids = [(await client.enqueue("grace", text)).job_id for text in ("polite", "stubborn")]
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(both_started.wait(), 60)
    worker.stop()
    await asyncio.wait_for(task, 60)
    assert ends == {"polite": "cancelled", "stubborn": "cancelled"}
    for job_id in ids:
        job = await client.get_job(job_id)
        assert job.state == jobbroker.JOB_STATE_READY  # released: no attempt spent
        assert not job.last_error
    assert worker.stats.released == 2 and worker.stats.failed == 0


def hold_the_handler(worker: jobbroker.Worker, queue: str,
                     result: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Registers on `worker` a handler of `queue` that sets the first event once it runs, waits
    for the second, then returns `result`."""
    started = asyncio.Event()
    gate = asyncio.Event()

    @worker.handler(queue)
    async def held(job: jobbroker.JobContext) -> str:
        started.set()
        await gate.wait()
        return result

    return started, gate


async def test_an_answer_left_by_a_dead_broker_goes_out_on_the_next_stream(
        tmp_path: pathlib.Path) -> None:
    first = BrokerProcess(CONFIG, data_dir=str(tmp_path)).start()
    address = first.address
    worker = jobbroker.Worker(address, lease_duration=30, handle_signals=False)
    started, gate = hold_the_handler(worker, "resend", "done while the broker was down")

    second = None
    try:
        async with jobbroker.Client(address, timeout=30) as c:
            res = await c.enqueue("resend", "x")
        async with running_worker(worker):
            await asyncio.wait_for(started.wait(), 60)
            first.kill()  # kill -9: the stream ends, the lease stays in the broker's log
            gate.set()

            async def acked() -> bool:
                return worker.stats.acked == 1

            await eventually(acked, what="the handler to end while the broker is down")
            second = BrokerProcess(CONFIG, data_dir=str(tmp_path), listen=address).start()
            async with jobbroker.Client(address, timeout=30) as c:
                done = await wait_state(c, res.job_id, jobbroker.JOB_STATE_COMPLETED)
        assert done.result == b"done while the broker was down"
        assert [a.outcome for a in done.attempts] == [jobbroker.ATTEMPT_OUTCOME_COMPLETED]
        assert worker.stats.reconnects >= 1
    finally:
        first.kill()
        if second is not None:
            second.stop()
        first.cleanup()


async def test_a_stream_that_ends_during_a_stop_is_reopened_for_the_answers(
        tmp_path: pathlib.Path) -> None:
    """Worker contract §6: the broker dies (kill -9) during a stop's grace, while a handler
    still runs, and comes back on the same data and port; the handler then returns. Its ack can
    only reach the broker on a stream reopened during the stop: the job ends COMPLETED, and the
    stop returns without waiting out the grace."""
    first = BrokerProcess(CONFIG, data_dir=str(tmp_path)).start()
    address = first.address
    worker = jobbroker.Worker(address, lease_duration=60, grace=30, reconnect_initial=0.05,
                              reconnect_max=0.5, handle_signals=False)
    started, gate = hold_the_handler(worker, "stop-reopen", "done after the broker came back")

    second = None
    try:
        async with jobbroker.Client(address, timeout=30) as c:
            res = await c.enqueue("stop-reopen", "x")
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(started.wait(), 60)
            worker.stop()
            await asyncio.sleep(0.2)  # the stop has begun: Flow{0} sent, the grace runs
            assert not task.done()
            first.kill()  # kill -9: the stream ends during the grace
            await asyncio.sleep(1.0)  # the worker sees it end, and fails to reopen it for now
            assert not task.done()
            second = BrokerProcess(CONFIG, data_dir=str(tmp_path), listen=address).start()
            gate.set()
            # The ack comes back on the reopened stream: no need to wait out the grace.
            await asyncio.wait({task}, timeout=15)
            assert task.done(), "the stop did not return: the ack found no stream"
            task.result()
        finally:
            gate.set()
            if not task.done():
                await asyncio.wait_for(task, 60)
        async with jobbroker.Client(address, timeout=30) as c:
            done = await c.get_job(res.job_id)
        assert done.state == jobbroker.JOB_STATE_COMPLETED, done
        assert done.result == b"done after the broker came back"
        assert [a.outcome for a in done.attempts] == [jobbroker.ATTEMPT_OUTCOME_COMPLETED]
        assert worker.stats.acked == 1 and worker.stats.released == 0
        assert worker.stats.reconnects >= 1
    finally:
        first.kill()
        if second is not None:
            second.stop()
        first.cleanup()


async def test_a_stop_ends_within_its_bounds_when_no_stream_comes_back(
        tmp_path: pathlib.Path) -> None:
    """The broker dies during a stop's grace and stays dead: the worker keeps trying to reopen
    its stream for the handler's ack, but the stop still returns within the grace and the waits
    after it (1 s for the answers, 2 s to close), dropping the ack."""
    broker = BrokerProcess(CONFIG, data_dir=str(tmp_path)).start()
    grace = 1.0
    worker = jobbroker.Worker(broker.address, lease_duration=60, grace=grace,
                              reconnect_initial=0.05, reconnect_max=0.2, handle_signals=False)
    started, gate = hold_the_handler(worker, "stop-dead", "never acked")

    try:
        async with jobbroker.Client(broker.address, timeout=30) as c:
            await c.enqueue("stop-dead", "x")
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 60)
        began = time.monotonic()
        worker.stop()
        await asyncio.sleep(0.1)
        broker.kill()
        gate.set()  # returns within the grace; its ack has no stream to go on
        await asyncio.wait_for(task, 30)
        took = time.monotonic() - began
        assert took < grace + 1.0 + 2.0 + 1.0, f"the stop took {took:.2f}s"
        assert worker.stats.acked == 1 and worker.stats.reconnects >= 1
    finally:
        broker.kill()
        broker.cleanup()


async def test_every_call_names_the_library(broker: BrokerProcess,
                                            client: jobbroker.Client) -> None:
    want = f"jobbroker-python/{jobbroker.__version__}"
    worker = jobbroker.Worker(broker.address, worker_id="names-itself", handle_signals=False)
    worker.handle("names", lambda job: None)
    # A unary Lease of the Client: ListWorkers shows its caller for minutes afterwards.
    await client.lease("names-unary", worker_id="unary-caller", wait=0.1)
    async with running_worker(worker):
        async def listed() -> bool:
            ids = {w.worker_id for w in await client.list_workers()}
            return {"names-itself", "unary-caller"} <= ids

        await eventually(listed, what="both workers in ListWorkers")
        clients = {w.worker_id: w.client for w in await client.list_workers()}
    assert clients["names-itself"] == want
    assert clients["unary-caller"] == want


async def test_a_token_goes_with_every_call(tmp_path: pathlib.Path) -> None:
    token = "py-secret-token"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{
        "name": "everything", "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "roles": ["producer", "worker", "admin"], "queues": ["*"]}]}))
    with BrokerProcess(CONFIG, extra_args=["--auth-tokens", str(tokens)]) as secured:
        async with jobbroker.Client(secured.address, timeout=30, token=token) as c:
            res = await c.enqueue("tokens", "x")
            worker = jobbroker.Worker(secured.address, token=token, handle_signals=False)
            worker.handle("tokens", lambda job: "ok")
            async with running_worker(worker):
                await wait_state(c, res.job_id, jobbroker.JOB_STATE_COMPLETED)
        without = jobbroker.Worker(secured.address, token="", handle_signals=False)
        without.handle("tokens", lambda job: None)
        with pytest.raises(jobbroker.UnauthenticatedError):
            await asyncio.wait_for(without.run(), 60)


async def test_a_cancelled_job_waiting_for_a_slot_never_starts(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, concurrency=1, prefetch=1, handle_signals=False)
    started: list[str] = []
    gate = asyncio.Event()

    @worker.handler("prefetched")
    async def work(job: jobbroker.JobContext) -> None:
        started.append(job.text)
        await gate.wait()

    first = await client.enqueue("prefetched", "first")
    async with running_worker(worker):
        async def first_started() -> bool:
            return started == ["first"]

        await eventually(first_started, what="the first job to start")
        waiting = await client.enqueue("prefetched", "waiting")
        await wait_state(client, waiting.job_id, jobbroker.JOB_STATE_ACTIVE)  # held, unstarted
        await client.cancel_job(waiting.job_id)
        job = await wait_state(client, waiting.job_id, jobbroker.JOB_STATE_CANCELLED)
        gate.set()
        await wait_state(client, first.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert started == ["first"]
    assert [a.error for a in job.attempts] == ["cancelled"]
