"""The Client against the real broker: every unary call, options, and error mapping."""

from __future__ import annotations

import datetime as dt

import grpc
import pytest
from conftest import wait_state

import jobbroker
from jobbroker import NewJob
from jobbroker.v1 import broker_pb2


def test_new_job_sets_the_fields_given_and_only_those() -> None:
    # to_proto sets a field only when it differs from its default (cheaper per job): a job of a
    # queue and a payload is exactly that, and every other field still reaches the request.
    assert NewJob(queue="q", payload=b"p").to_proto() == broker_pb2.EnqueueRequest(
        queue="q", payload=b"p")
    when = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    full = NewJob(
        queue="q", payload={"a": 1}, headers={"h": "v"}, priority=-3, delay=1.5,
        dedup_key="d", dedup_ttl=60, max_attempts=4, lease_duration=dt.timedelta(seconds=5),
        concurrency_key="c", timeout=30, expire_at=when, depends_on=iter(["j1", "j2"]),
        depends_on_index=(0,)).to_proto()
    expected = broker_pb2.EnqueueRequest(
        queue="q", payload=b'{"a":1}', headers={"h": "v"}, priority=-3, dedup_key="d",
        max_attempts=4, concurrency_key="c", depends_on=["j1", "j2"], depends_on_index=[0])
    expected.delay.FromMilliseconds(1500)
    expected.dedup_ttl.FromSeconds(60)
    expected.lease_duration.FromSeconds(5)
    expected.timeout.FromSeconds(30)
    expected.expire_at.FromDatetime(when)
    assert full == expected
    scheduled = NewJob(queue="q", run_at=when).to_proto()
    assert [f.name for f, _ in scheduled.ListFields()] == ["queue", "run_at"]
    assert scheduled.run_at.ToDatetime(tzinfo=dt.timezone.utc) == when


async def test_enqueue_with_options_is_visible_to_admin(client: jobbroker.Client) -> None:
    res = await client.enqueue(
        "emails", {"to": "ada@example.com"}, headers={"trace": "t1"}, priority=7,
        max_attempts=4, dedup_key="welcome:ada", dedup_ttl=60, lease_duration=dt.timedelta(seconds=5),
        concurrency_key="tenant-1")
    assert not res.deduplicated
    job = await client.get_job(res.job_id)
    assert job.state == jobbroker.JOB_STATE_READY
    assert job.payload == b'{"to":"ada@example.com"}'
    assert dict(job.headers) == {"trace": "t1"}
    assert job.priority == 7
    assert job.max_attempts == 4
    assert job.dedup_key == "welcome:ada"
    assert job.concurrency_key == "tenant-1"
    assert job.idempotency_key == "welcome:ada"


async def test_delay_and_run_at_schedule_the_job(client: jobbroker.Client) -> None:
    delayed = await client.enqueue("later", b"x", delay=3600)
    at = await client.enqueue("later", b"y", run_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
    for job_id in (delayed.job_id, at.job_id):
        assert (await client.get_job(job_id)).state == jobbroker.JOB_STATE_SCHEDULED
    assert await client.lease("later", wait=0.2) == []


async def test_enqueue_batch_keeps_order(client: jobbroker.Client) -> None:
    results = await client.enqueue_batch(
        [NewJob("batch", f"job-{i}", priority=i) for i in range(3)])
    assert len(results) == 3
    for i, r in enumerate(results):
        assert (await client.get_job(r.job_id)).payload == f"job-{i}".encode()


async def test_lease_heartbeat_ack(client: jobbroker.Client) -> None:
    res = await client.enqueue("work", "hello")
    [job] = await client.lease("work", worker_id="py-test", lease_duration=1, wait=5)
    assert job.job_id == res.job_id
    assert job.attempt == 1
    assert job.payload == b"hello"
    assert job.idempotency_key == res.job_id
    assert (await client.get_job(job.job_id)).state == jobbroker.JOB_STATE_ACTIVE
    hb = await client.heartbeat(job, extend_by=30, checkpoint=b"half")
    assert not hb.cancel_requested
    assert hb.lease_deadline.ToDatetime(tzinfo=dt.timezone.utc) > dt.datetime.now(dt.timezone.utc)
    await client.ack(job, result={"sent": True})
    done = await client.get_job(job.job_id)
    assert done.state == jobbroker.JOB_STATE_COMPLETED
    assert done.result == b'{"sent":true}'
    assert done.checkpoint == b"half"
    assert [a.outcome for a in done.attempts] == [jobbroker.ATTEMPT_OUTCOME_COMPLETED]
    assert done.attempts[0].worker_id == "py-test"


async def test_fail_is_retried_as_attempt_two(client: jobbroker.Client) -> None:
    res = await client.enqueue("retries", "flaky")
    [first] = await client.lease("retries", wait=5)
    answer = await client.fail(first, error="provider timed out")
    assert answer.state == jobbroker.JOB_STATE_SCHEDULED
    job = await client.get_job(res.job_id)
    assert job.state in (jobbroker.JOB_STATE_SCHEDULED, jobbroker.JOB_STATE_READY)
    assert job.last_error == "provider timed out"
    [second] = await client.lease("retries", wait=10)
    assert second.job_id == res.job_id
    assert second.attempt == 2
    await client.ack(second)
    done = await client.get_job(res.job_id)
    assert done.state == jobbroker.JOB_STATE_COMPLETED
    assert [a.outcome for a in done.attempts] == [
        jobbroker.ATTEMPT_OUTCOME_ERROR, jobbroker.ATTEMPT_OUTCOME_COMPLETED]


async def test_permanent_fail_kills_the_job(client: jobbroker.Client) -> None:
    res = await client.enqueue("perm", "bad address")
    [job] = await client.lease("perm", wait=5)
    answer = await client.fail(job.job_id, job.lease_id, error="no such mailbox", permanent=True)
    assert answer.state == jobbroker.JOB_STATE_FAILED
    dead = await client.get_job(res.job_id)
    assert dead.state == jobbroker.JOB_STATE_FAILED
    assert dead.fail_reason == jobbroker.FAIL_REASON_PERMANENT
    assert dead.attempt == 1
    assert dead.last_error == "no such mailbox"


async def test_release_gives_the_job_back_without_an_attempt(client: jobbroker.Client) -> None:
    res = await client.enqueue("rel", "x")
    [job] = await client.lease("rel", wait=5)
    await client.release(job)
    assert (await client.get_job(res.job_id)).state == jobbroker.JOB_STATE_READY
    [again] = await client.lease("rel", wait=5)
    assert again.attempt == 1


async def test_dedup_returns_the_same_job(client: jobbroker.Client) -> None:
    first = await client.enqueue("dedup", "same", dedup_key="k1")
    second = await client.enqueue("dedup", "same", dedup_key="k1")
    assert second.job_id == first.job_id
    assert second.deduplicated and not first.deduplicated
    with pytest.raises(jobbroker.AlreadyExistsError) as err:
        await client.enqueue("dedup", "different", dedup_key="k1")
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS


async def test_empty_queue_name_is_invalid_argument(client: jobbroker.Client) -> None:
    with pytest.raises(jobbroker.InvalidArgumentError) as err:
        await client.enqueue("", b"x")
    assert isinstance(err.value, jobbroker.JobBrokerError)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "queue" in err.value.message


async def test_unknown_job_is_not_found(client: jobbroker.Client) -> None:
    with pytest.raises(jobbroker.NotFoundError) as err:
        await client.get_job("01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


async def test_stale_lease_is_failed_precondition(client: jobbroker.Client) -> None:
    res = await client.enqueue("stale", "x")
    [first] = await client.lease("stale", wait=5)
    await client.fail(first, error="boom")
    [second] = await client.lease("stale", wait=10)
    with pytest.raises(jobbroker.FailedPreconditionError):
        await client.heartbeat(first)
    await client.ack(second)
    await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)


async def test_admin_queue_calls(client: jobbroker.Client) -> None:
    await client.enqueue("adm", "a")
    paused = await client.pause_queue("adm")
    assert paused.policy.paused
    assert await client.lease("adm", wait=0.2) == []
    await client.resume_queue("adm")
    info = await client.get_queue("adm")
    assert info.counts["JOB_STATE_READY"] == 1
    assert "adm" in [q.name for q in await client.list_queues()]
    page = await client.list_jobs("adm", jobbroker.JOB_STATE_READY)
    assert len(page.jobs) == 1
    cancelled = await client.cancel_job(page.jobs[0].id)
    assert cancelled.state == jobbroker.JOB_STATE_CANCELLED
    retried = await client.retry_job(cancelled.id)
    assert retried.state == jobbroker.JOB_STATE_READY
    with pytest.raises(jobbroker.NotFoundError):
        await client.get_queue("no-such-queue")
