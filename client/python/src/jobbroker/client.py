"""The asyncio producer and admin client."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from typing import Any, TypeVar

import grpc
import grpc.aio

from ._convert import DurationLike, encode_payload, to_duration, to_timestamp
from ._metadata import Metadata, call_metadata
from .errors import error_from_rpc
from .v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, job_pb2, policy_pb2

__all__ = ["Client", "NewJob", "EnqueueResult", "default_address", "default_worker_id"]

_T = TypeVar("_T")


def default_address() -> str:
    """$JOBBROKER_ADDRESS, else 127.0.0.1:7070."""
    return os.environ.get("JOBBROKER_ADDRESS") or "127.0.0.1:7070"


def default_worker_id() -> str:
    """<hostname>-<pid>."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclasses.dataclass(frozen=True)
class EnqueueResult:
    """What Enqueue answered."""

    job_id: str
    # True when dedup_key matched an existing job: job_id is that job and nothing was created.
    deduplicated: bool


@dataclasses.dataclass
class NewJob:
    """One job for Client.enqueue_batch; the fields mean what Client.enqueue's arguments mean."""

    queue: str
    payload: Any = b""
    headers: Mapping[str, str] | None = None
    priority: int = 0
    delay: DurationLike | None = None
    run_at: _dt.datetime | None = None
    dedup_key: str = ""
    dedup_ttl: DurationLike | None = None
    max_attempts: int = 0
    lease_duration: DurationLike | None = None
    concurrency_key: str = ""
    timeout: DurationLike | None = None
    expire_at: _dt.datetime | None = None
    depends_on: Iterable[str] = ()

    def to_proto(self) -> broker_pb2.EnqueueRequest:
        req = broker_pb2.EnqueueRequest(
            queue=self.queue,
            payload=encode_payload(self.payload),
            headers=dict(self.headers or {}),
            priority=self.priority,
            dedup_key=self.dedup_key,
            max_attempts=self.max_attempts,
            concurrency_key=self.concurrency_key,
            depends_on=list(self.depends_on),
        )
        if self.delay is not None:
            req.delay.CopyFrom(to_duration(self.delay))
        if self.run_at is not None:
            req.run_at.CopyFrom(to_timestamp(self.run_at))
        if self.dedup_ttl is not None:
            req.dedup_ttl.CopyFrom(to_duration(self.dedup_ttl))
        if self.lease_duration is not None:
            req.lease_duration.CopyFrom(to_duration(self.lease_duration))
        if self.timeout is not None:
            req.timeout.CopyFrom(to_duration(self.timeout))
        if self.expire_at is not None:
            req.expire_at.CopyFrom(to_timestamp(self.expire_at))
        return req


def _lease_ref(job: broker_pb2.LeasedJob | str, lease_id: str | None) -> tuple[str, str]:
    if isinstance(job, broker_pb2.LeasedJob):
        return job.job_id, lease_id if lease_id is not None else job.lease_id
    if lease_id is None:
        raise TypeError("lease_id is required when a job id is given")
    return job, lease_id


class Client:
    """An asyncio client of one broker: producer calls, the unary worker calls, and Admin.

        async with Client("127.0.0.1:7070") as client:
            result = await client.enqueue("emails", {"to": "ada@example.com"})

    Every failed call raises a JobBrokerError subclass carrying the gRPC status code
    (InvalidArgumentError, NotFoundError, ...). Use it from one event loop.

    `address` defaults to $JOBBROKER_ADDRESS, else 127.0.0.1:7070. `timeout` (seconds) is the
    deadline of each unary call; None waits as long as it takes. `channel` replaces dialing.
    `token`: sent as `authorization: Bearer <token>` (None: $JOBBROKER_TOKEN; "": none). Every
    call also carries `jobbroker-client: jobbroker-python/<version>`; pass `metadata=` to calls
    of the raw stubs `broker` and `admin` to do the same.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        timeout: float | None = None,
        channel: grpc.aio.Channel | None = None,
        token: str | None = None,
    ) -> None:
        self.address = address or default_address()
        self.timeout = timeout
        self.metadata: Metadata = call_metadata(token)
        self._owns_channel = channel is None
        self.channel: grpc.aio.Channel = channel or grpc.aio.insecure_channel(self.address)
        # The generated stubs, for calls this class does not wrap.
        self.broker = broker_pb2_grpc.BrokerStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel (if this client dialed it)."""
        if self._owns_channel:
            await self.channel.close(None)

    def _options(self) -> dict[str, Any]:
        """The keyword arguments of every unary call: its deadline and the metadata."""
        return {"timeout": self.timeout, "metadata": self.metadata}

    async def _call(self, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except grpc.aio.AioRpcError as err:
            raise error_from_rpc(err) from err

    # --- producer -------------------------------------------------------------------------

    async def enqueue(
        self,
        queue: str,
        payload: Any = b"",
        *,
        headers: Mapping[str, str] | None = None,
        priority: int = 0,
        delay: DurationLike | None = None,
        run_at: _dt.datetime | None = None,
        dedup_key: str = "",
        dedup_ttl: DurationLike | None = None,
        max_attempts: int = 0,
        lease_duration: DurationLike | None = None,
        concurrency_key: str = "",
        timeout: DurationLike | None = None,
        expire_at: _dt.datetime | None = None,
        depends_on: Iterable[str] = (),
    ) -> EnqueueResult:
        """Adds one job; returns once it is durable on the broker.

        `payload`: bytes as they are, str as UTF-8, anything else as JSON. Durations are seconds
        or timedeltas; `run_at` a datetime (naive = UTC). At most one of `delay` and `run_at`.
        `max_attempts` 0 and the unset durations mean the queue's policy. `timeout`: each
        attempt's run-time limit; `expire_at`: no attempt starts after it; `depends_on`: ids of
        jobs that must complete first.
        Raises InvalidArgumentError (a malformed field, named in the message),
        AlreadyExistsError (dedup_key held by a job with another payload),
        ResourceExhaustedError (a full queue, an oversized payload).
        """
        job = NewJob(
            queue=queue,
            payload=payload,
            headers=headers,
            priority=priority,
            delay=delay,
            run_at=run_at,
            dedup_key=dedup_key,
            dedup_ttl=dedup_ttl,
            max_attempts=max_attempts,
            lease_duration=lease_duration,
            concurrency_key=concurrency_key,
            timeout=timeout,
            expire_at=expire_at,
            depends_on=depends_on,
        )
        resp = await self._call(self.broker.Enqueue(job.to_proto(), **self._options()))
        return EnqueueResult(resp.job_id, resp.deduplicated)

    async def enqueue_batch(self, jobs: Iterable[NewJob]) -> list[EnqueueResult]:
        """Adds 1 to 1000 jobs, all or nothing; results in the order of `jobs`."""
        req = broker_pb2.EnqueueBatchRequest(jobs=[j.to_proto() for j in jobs])
        resp = await self._call(self.broker.EnqueueBatch(req, **self._options()))
        return [EnqueueResult(r.job_id, r.deduplicated) for r in resp.results]

    # --- unary worker calls ----------------------------------------------------------------

    async def lease(
        self,
        queue: str,
        *,
        worker_id: str | None = None,
        max_jobs: int = 1,
        lease_duration: DurationLike | None = None,
        wait: DurationLike | None = None,
    ) -> list[broker_pb2.LeasedJob]:
        """Leases up to `max_jobs` ready jobs; waits up to `wait` for one. May return []."""
        req = broker_pb2.LeaseRequest(
            queue=queue, worker_id=worker_id or default_worker_id(), max_jobs=max_jobs
        )
        if lease_duration is not None:
            req.lease_duration.CopyFrom(to_duration(lease_duration))
        timeout = self.timeout
        if wait is not None:
            req.wait.CopyFrom(to_duration(wait))
            if timeout is not None:
                timeout += req.wait.ToTimedelta().total_seconds()
        resp = await self._call(self.broker.Lease(req, timeout=timeout, metadata=self.metadata))
        return list(resp.jobs)

    async def heartbeat(
        self,
        job: broker_pb2.LeasedJob | str,
        lease_id: str | None = None,
        *,
        extend_by: DurationLike | None = None,
        checkpoint: bytes | None = None,
    ) -> broker_pb2.HeartbeatResponse:
        """Extends a lease (and saves `checkpoint` when given). FailedPreconditionError if the
        lease is gone. `job` is a LeasedJob, or a job id with its `lease_id`."""
        job_id, lease = _lease_ref(job, lease_id)
        req = broker_pb2.HeartbeatRequest(job_id=job_id, lease_id=lease)
        if extend_by is not None:
            req.extend_by.CopyFrom(to_duration(extend_by))
        if checkpoint is not None:
            req.checkpoint = checkpoint
        return await self._call(self.broker.Heartbeat(req, **self._options()))

    async def ack(
        self, job: broker_pb2.LeasedJob | str, lease_id: str | None = None, *, result: Any = b""
    ) -> None:
        """Completes the job; `result` is kept with it (bytes, str, or JSON)."""
        job_id, lease = _lease_ref(job, lease_id)
        req = broker_pb2.AckRequest(job_id=job_id, lease_id=lease, result=encode_payload(result))
        await self._call(self.broker.Ack(req, **self._options()))

    async def fail(
        self,
        job: broker_pb2.LeasedJob | str,
        lease_id: str | None = None,
        *,
        error: str = "",
        permanent: bool = False,
        retry_after: DurationLike | None = None,
    ) -> broker_pb2.FailResponse:
        """Fails the attempt: retried after the backoff (or `retry_after`), or dead when
        `permanent` or out of attempts. The answer says which (`state`)."""
        job_id, lease = _lease_ref(job, lease_id)
        req = broker_pb2.FailRequest(job_id=job_id, lease_id=lease, error=error, permanent=permanent)
        if retry_after is not None:
            req.retry_after.CopyFrom(to_duration(retry_after))
        return await self._call(self.broker.Fail(req, **self._options()))

    async def release(self, job: broker_pb2.LeasedJob | str, lease_id: str | None = None) -> None:
        """Gives the job back unstarted: READY again, no attempt counted."""
        job_id, lease = _lease_ref(job, lease_id)
        req = broker_pb2.ReleaseRequest(job_id=job_id, lease_id=lease)
        await self._call(self.broker.Release(req, **self._options()))

    # --- admin -----------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> job_pb2.Job:
        """The job with its state, attempts and checkpoint. NotFoundError if unknown."""
        req = admin_pb2.GetJobRequest(job_id=job_id)
        return await self._call(self.admin.GetJob(req, **self._options()))

    async def watch_job(self, job_id: str) -> AsyncIterator[job_pb2.Job]:
        """The job as it is now, then once per change (state, attempt, progress, snoozes,
        cancel request); ends after the message showing a terminal state. NotFoundError if
        unknown; UnavailableError if the broker shuts down (watch again)."""
        call = self.admin.WatchJob(admin_pb2.WatchJobRequest(job_id=job_id), metadata=self.metadata)
        try:
            async for job in call:
                yield job
        except grpc.aio.AioRpcError as err:
            raise error_from_rpc(err) from err
        finally:
            call.cancel()

    async def list_workers(self, queue: str = "") -> list[admin_pb2.WorkerInfo]:
        """The connected workers (of `queue`, or all), with the library each one says it is."""
        req = admin_pb2.ListWorkersRequest(queue=queue)
        resp = await self._call(self.admin.ListWorkers(req, **self._options()))
        return list(resp.workers)

    async def list_jobs(
        self,
        queue: str,
        state: job_pb2.JobState = job_pb2.JOB_STATE_UNSPECIFIED,
        *,
        page_size: int = 0,
        page_token: str = "",
        newest_first: bool = False,
    ) -> admin_pb2.ListJobsResponse:
        """One page of the queue's jobs in `state` (every state when unspecified)."""
        req = admin_pb2.ListJobsRequest(
            queue=queue,
            state=state,
            page_size=page_size,
            page_token=page_token,
            newest_first=newest_first,
        )
        return await self._call(self.admin.ListJobs(req, **self._options()))

    async def cancel_job(self, job_id: str) -> job_pb2.Job:
        req = admin_pb2.CancelJobRequest(job_id=job_id)
        return await self._call(self.admin.CancelJob(req, **self._options()))

    async def retry_job(self, job_id: str) -> job_pb2.Job:
        """A FAILED or CANCELLED job back to READY, attempts reset."""
        req = admin_pb2.RetryJobRequest(job_id=job_id)
        resp = await self._call(self.admin.RetryJob(req, **self._options()))
        job: job_pb2.Job = resp.job
        return job

    async def delete_job(self, job_id: str) -> None:
        req = admin_pb2.DeleteJobRequest(job_id=job_id)
        await self._call(self.admin.DeleteJob(req, **self._options()))

    async def list_queues(self) -> list[admin_pb2.QueueInfo]:
        resp = await self._call(
            self.admin.ListQueues(
                admin_pb2.ListQueuesRequest(), **self._options()
            )
        )
        return list(resp.queues)

    async def get_queue(self, queue: str) -> admin_pb2.QueueInfo:
        """The queue's effective policy and job counts by state name."""
        req = admin_pb2.GetQueueRequest(queue=queue)
        return await self._call(self.admin.GetQueue(req, **self._options()))

    async def update_queue_policy(
        self, queue: str, policy: policy_pb2.QueuePolicy, *, reset: bool = False
    ) -> admin_pb2.QueueInfo:
        req = admin_pb2.UpdateQueuePolicyRequest(queue=queue, policy=policy, reset=reset)
        return await self._call(self.admin.UpdateQueuePolicy(req, **self._options()))

    async def pause_queue(self, queue: str) -> admin_pb2.QueueInfo:
        req = admin_pb2.PauseQueueRequest(queue=queue)
        return await self._call(self.admin.PauseQueue(req, **self._options()))

    async def resume_queue(self, queue: str) -> admin_pb2.QueueInfo:
        req = admin_pb2.ResumeQueueRequest(queue=queue)
        return await self._call(self.admin.ResumeQueue(req, **self._options()))

    async def purge_queue(
        self, queue: str, states: Iterable[job_pb2.JobState] = ()
    ) -> int:
        """Removes the queue's jobs in `states` (every terminal state if none); the count."""
        req = admin_pb2.PurgeQueueRequest(queue=queue, states=list(states))
        resp = await self._call(self.admin.PurgeQueue(req, **self._options()))
        return int(resp.purged)
