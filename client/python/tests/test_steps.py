"""Durable steps: JobContext.step runs each named step once per job, across attempts and
worker processes; the checkpoint is a jobbroker.v1.StepCheckpoint of JSON results."""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal

from brokerproc import BrokerProcess
from conftest import eventually, running_worker, wait_state
from test_worker import lines, spawn

import jobbroker


def saved_steps(job: jobbroker.job_pb2.Job) -> dict[str, object]:
    cp = jobbroker.steps_pb2.StepCheckpoint.FromString(job.checkpoint)
    return {s.name: json.loads(s.result) for s in cp.steps}


async def test_a_failed_attempt_resumes_after_its_finished_steps(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    runs: list[str] = []
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    @worker.handler("resume")
    async def three_steps(job: jobbroker.JobContext) -> object:
        def charge() -> dict[str, str]:
            runs.append("charge")
            return {"charge_id": "ch_1"}

        async def ship() -> str:
            runs.append("ship")
            return "parcel-7"

        async def notify() -> None:
            runs.append(f"notify@{job.attempt}")
            if job.attempt == 1:
                raise ConnectionError("mail server down")

        charge_result = await job.step("charge", charge)
        parcel = await job.step("ship", ship)
        await job.step("notify", notify)
        return {"charge": charge_result, "parcel": parcel}

    res = await client.enqueue("resume", "order-1")
    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert runs == ["charge", "ship", "notify@1", "notify@2"]
    assert json.loads(done.result) == {"charge": {"charge_id": "ch_1"}, "parcel": "parcel-7"}
    assert done.attempts[0].error == "ConnectionError: mail server down"
    assert saved_steps(done) == {"charge": {"charge_id": "ch_1"}, "ship": "parcel-7",
                                 "notify": None}


async def test_a_killed_worker_process_resumes_at_the_step_it_died_in(
        tmp_path: pathlib.Path, broker: BrokerProcess, client: jobbroker.Client) -> None:
    log = tmp_path / "steps.txt"
    res = await client.enqueue("steps", "x")
    first = spawn(broker.address, "steps", log, "--slow")
    try:
        async def in_step_three() -> bool:
            return any(line.startswith("step3") for line in lines(log))

        await eventually(in_step_three, what="the first worker to reach step 3")
    finally:
        first.send_signal(signal.SIGKILL)
        assert first.wait(60) == -signal.SIGKILL
    job = await client.get_job(res.job_id)
    assert job.state == jobbroker.JOB_STATE_ACTIVE  # killed: the lease runs out
    assert list(saved_steps(job)) == ["one", "two"]

    second = spawn(broker.address, "steps", log)
    try:
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
    assert lines(log) == ["step1", "step2", "step3 attempt=1", "step3 attempt=2"]
    assert json.loads(done.result) == {"one": 1, "two": {"a": 2}, "three": ["three"]}
    assert [a.outcome for a in done.attempts] == [
        jobbroker.ATTEMPT_OUTCOME_LEASE_EXPIRED, jobbroker.ATTEMPT_OUTCOME_COMPLETED]


async def test_a_step_name_used_twice_fails_the_attempt(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    @worker.handler("twice")
    async def twice(job: jobbroker.JobContext) -> None:
        await job.step("same", lambda: 1)
        await job.step("same", lambda: 2)

    res = await client.enqueue("twice", "x", max_attempts=1)
    async with running_worker(worker):
        dead = await wait_state(client, res.job_id, jobbroker.JOB_STATE_FAILED)
    assert "used twice" in dead.last_error
    assert saved_steps(dead) == {"same": 1}


async def test_a_value_json_cannot_encode_fails_the_attempt(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    @worker.handler("notjson")
    async def bad(job: jobbroker.JobContext) -> None:
        await job.step("set", lambda: {1, 2})

    res = await client.enqueue("notjson", "x", max_attempts=1)
    async with running_worker(worker):
        dead = await wait_state(client, res.job_id, jobbroker.JOB_STATE_FAILED)
    assert dead.last_error.startswith("TypeError")
    assert dead.checkpoint == b""


async def test_a_foreign_checkpoint_fails_with_a_clear_message(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    res = await client.enqueue("foreign", "x", max_attempts=2)
    [leased] = await client.lease("foreign", wait=5)
    await client.heartbeat(leased, checkpoint=b"\xff\x01not a step checkpoint")
    await client.fail(leased, error="first attempt by hand")
    worker = jobbroker.Worker(broker.address, handle_signals=False)
    calls: list[str] = []

    @worker.handler("foreign")
    async def steps(job: jobbroker.JobContext) -> None:
        await job.step("one", lambda: calls.append("one"))

    async with running_worker(worker):
        dead = await wait_state(client, res.job_id, jobbroker.JOB_STATE_FAILED)
    assert dead.fail_reason == jobbroker.FAIL_REASON_ATTEMPTS_EXHAUSTED
    assert "StepCheckpointError" in dead.last_error
    assert "not a jobbroker.v1.StepCheckpoint" in dead.last_error
    assert calls == []


async def test_a_checkpoint_from_another_language_is_replayed(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    """A StepCheckpoint written by hand (as any language's helper writes it) is honoured."""
    cp = jobbroker.steps_pb2.StepCheckpoint()
    cp.steps.add(name="fetch", result=b'{"rows": 3}')
    res = await client.enqueue("xlang", "x")
    [leased] = await client.lease("xlang", wait=5)
    await client.heartbeat(leased, checkpoint=cp.SerializeToString())
    await client.fail(leased, error="crashed")
    worker = jobbroker.Worker(broker.address, handle_signals=False)

    @worker.handler("xlang")
    async def handler(job: jobbroker.JobContext) -> object:
        rows = await job.step("fetch", lambda: {"rows": -1})
        total = await job.step("sum", lambda: rows["rows"] * 2)
        return total

    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert done.result == b"6"
    assert saved_steps(done) == {"fetch": {"rows": 3}, "sum": 6}


async def test_a_step_whose_lease_is_gone_is_not_acked(
        broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(broker.address, lease_duration=1, handle_signals=False)
    outcomes: list[str] = []

    @worker.handler("gone")
    async def handler(job: jobbroker.JobContext) -> str:
        if job.attempt == 1:
            # Stall the event loop past the lease: no heartbeat goes out, the lease runs out.
            async def stall() -> int:
                import time
                time.sleep(3.5)
                return 1
            try:
                await job.step("slow", stall)
            except (jobbroker.FailedPreconditionError, asyncio.CancelledError):
                # The save is refused, or (when the broker's lease_lost is read first) the
                # cancellation signal of the lost lease ends the wait for its answer.
                outcomes.append("refused")
                return "should not be acked"
        outcomes.append(f"attempt {job.attempt}")
        return "ok"

    # The stall outlasts several 1 s leases: the attempts pushed meanwhile lose theirs too (and,
    # lost, send nothing), so the job gets attempts to spare for one that runs after the stall.
    res = await client.enqueue("gone", "x", max_attempts=10)
    async with running_worker(worker):
        done = await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert outcomes[0] == "refused"
    assert done.result == b"ok"
    assert done.attempts[0].outcome == jobbroker.ATTEMPT_OUTCOME_LEASE_EXPIRED
