"""The asyncio producer and admin client."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import enum
import os
import random
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio

from ._coalescer import Coalescer
from ._convert import DurationLike, encode_payload, to_duration, to_timestamp
from ._metadata import Metadata
from ._router import Route, Router
from .errors import JobFailedError, UnavailableError, error_from_rpc
from .options import ClientOptions
from .v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, job_pb2, policy_pb2

__all__ = [
    "Client",
    "NewJob",
    "EnqueueResult",
    "EnqueueNext",
    "ProducerMiddleware",
    "default_address",
    "default_worker_id",
]


class _Unset(enum.Enum):
    UNSET = 0


# "Not given": a deadline of None means "no deadline", so it cannot also mean "the default".
_UNSET = _Unset.UNSET
DeadlineArg = float | None | _Unset

_TERMINAL = (job_pb2.JOB_STATE_COMPLETED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


def default_address() -> str:
    """The first address of $JOBBROKER_ADDRESS, else 127.0.0.1:7070."""
    return ClientOptions().targets()[0]


def default_worker_id() -> str:
    """<hostname>-<pid>."""
    return f"{socket.gethostname()}-{os.getpid()}"


def resolve_options(
    address: str | None,
    options: ClientOptions | None,
    *,
    token: str | None = None,
    deadline: DeadlineArg = _UNSET,
) -> ClientOptions:
    """`options` (or the defaults) with the shorthand arguments of Client() and Worker()
    applied on top: `address`, `token`, `deadline` when given."""
    opts = options or ClientOptions()
    changes: dict[str, Any] = {}
    if address:
        changes["address"] = address
        changes["addresses"] = ()
    if token is not None:
        changes["token"] = token
    if deadline is not _UNSET:
        changes["deadline"] = deadline
    return dataclasses.replace(opts, **changes) if changes else opts


@dataclasses.dataclass(frozen=True)
class EnqueueResult:
    """What Enqueue answered."""

    job_id: str
    # True when dedup_key matched an existing job: job_id is that job and nothing was created.
    deduplicated: bool


def _enqueue_request(
    queue: str,
    payload: Any,
    headers: Mapping[str, str] | None,
    priority: int,
    delay: DurationLike | None,
    run_at: _dt.datetime | None,
    dedup_key: str,
    dedup_ttl: DurationLike | None,
    max_attempts: int,
    lease_duration: DurationLike | None,
    concurrency_key: str,
    timeout: DurationLike | None,
    expire_at: _dt.datetime | None,
    depends_on: Iterable[str],
    depends_on_index: Iterable[int],
) -> broker_pb2.EnqueueRequest:
    """The EnqueueRequest of a job's fields, NewJob's in its order: NewJob.to_proto, and
    Client.enqueue when no middleware needs a NewJob."""
    # Only the fields that are set: each keyword of a message's constructor costs, also one
    # that only repeats a default (with upb, 5.2 us with every keyword against 1.0 us with
    # the queue and the payload alone), and a producer pays this once per job.
    req = broker_pb2.EnqueueRequest(queue=queue, payload=encode_payload(payload))
    if headers:
        req.headers.update(headers)
    if priority:
        req.priority = priority
    if dedup_key:
        req.dedup_key = dedup_key
    if max_attempts:
        req.max_attempts = max_attempts
    if concurrency_key:
        req.concurrency_key = concurrency_key
    if depends_on:
        req.depends_on.extend(depends_on)
    if depends_on_index:
        req.depends_on_index.extend(depends_on_index)
    if delay is not None:
        req.delay.CopyFrom(to_duration(delay))
    if run_at is not None:
        req.run_at.CopyFrom(to_timestamp(run_at))
    if dedup_ttl is not None:
        req.dedup_ttl.CopyFrom(to_duration(dedup_ttl))
    if lease_duration is not None:
        req.lease_duration.CopyFrom(to_duration(lease_duration))
    if timeout is not None:
        req.timeout.CopyFrom(to_duration(timeout))
    if expire_at is not None:
        req.expire_at.CopyFrom(to_timestamp(expire_at))
    return req


@dataclasses.dataclass
class NewJob:
    """One job to enqueue: every field of EnqueueRequest. Client.enqueue's keywords mean the
    same; Client.enqueue_batch takes a list of these, and producer middleware sees them."""

    queue: str
    # bytes as they are, str as UTF-8, anything else as JSON.
    payload: Any = b""
    headers: Mapping[str, str] | None = None
    priority: int = 0
    # Durations are seconds or timedeltas; times datetimes (naive = UTC). At most one of delay
    # and run_at.
    delay: DurationLike | None = None
    run_at: _dt.datetime | None = None
    dedup_key: str = ""
    dedup_ttl: DurationLike | None = None
    # 0 and the unset durations mean the queue's policy.
    max_attempts: int = 0
    lease_duration: DurationLike | None = None
    concurrency_key: str = ""
    # Each attempt's run-time limit.
    timeout: DurationLike | None = None
    # No attempt starts at or after it.
    expire_at: _dt.datetime | None = None
    # Ids of jobs that must complete first.
    depends_on: Iterable[str] = ()
    # Inside enqueue_batch only: indexes of earlier jobs of the same batch it waits for.
    depends_on_index: Iterable[int] = ()

    def to_proto(self) -> broker_pb2.EnqueueRequest:
        return _enqueue_request(
            self.queue, self.payload, self.headers, self.priority, self.delay, self.run_at,
            self.dedup_key, self.dedup_ttl, self.max_attempts, self.lease_duration,
            self.concurrency_key, self.timeout, self.expire_at, self.depends_on,
            self.depends_on_index,
        )


# Producer middleware (worker contract §9): `async def mw(jobs, next)` gets the jobs of one
# enqueue or enqueue_batch call (one NewJob for enqueue), may change them (add headers), and
# returns what `await next(jobs)` returns, or raises. The first registered is the outermost.
EnqueueNext = Callable[[list[NewJob]], Awaitable[list[EnqueueResult]]]
ProducerMiddleware = Callable[[list[NewJob], EnqueueNext], Awaitable[list[EnqueueResult]]]


def _lease_ref(job: broker_pb2.LeasedJob | str, lease_id: str | None) -> tuple[str, str]:
    if isinstance(job, broker_pb2.LeasedJob):
        return job.job_id, lease_id if lease_id is not None else job.lease_id
    if lease_id is None:
        raise TypeError("lease_id is required when a job id is given")
    return job, lease_id


class Client:
    """An asyncio client of the broker: producer calls, the unary worker calls, and Admin.

        async with Client("127.0.0.1:7070") as client:
            result = await client.enqueue("emails", {"to": "ada@example.com"})

    The connection (addresses, TLS, client certificate, token, deadline, retries, keepalive) is
    a ClientOptions, shared with the Worker: `Client(options=ClientOptions(...))`. `address`,
    `token` and `deadline` (or its older name `timeout`) are shorthands that override the
    options' fields. `channel` replaces dialing altogether (the options' TLS, addresses and
    keepalive are then not used).

    Every failed call raises a JobBrokerError subclass carrying the gRPC status code
    (InvalidArgumentError, NotFoundError, ...). Every call carries
    `jobbroker-client: jobbroker-python/<version>` and the bearer token, if any; each unary
    call has the options' deadline (10 s by default), which its `deadline=` keyword overrides
    (seconds; None: no deadline).

    In a cluster, each call goes straight to the leader of its partition: by its queue
    (enqueue, queue admin calls, a batch by its first job's queue), by its job id (get, watch,
    cancel, ack...), or to any node (list queues, workers, the cluster). Where the leaders are
    comes from Admin.GetCluster, asked of the given addresses before the first call and again
    after a call failed UNAVAILABLE or DEADLINE_EXCEEDED (a leader moved or died). A broker
    that is not a cluster, or that will not answer GetCluster (an older broker, a token without
    the admin role), takes every call, as does the next given address when it stops answering.

    Retries: a unary call that fails UNAVAILABLE is tried again (3 attempts in all, short
    backoff, after asking where the partition's leader is now) only when repeating it cannot do
    anything twice: reads, ack/fail/release/heartbeat (the broker answers a repeat of the same
    lease's ack OK), idempotent settings (pause, resume, policies, schedules), and enqueues whose
    jobs all carry a dedup key (a repeat of one that was applied answers deduplicated). Any other
    call, an enqueue without a dedup key above all, is tried once: the caller sees the error and
    decides. Use it from one event loop (SyncClient is the blocking facade).

    Coalescing (worker contract §10): concurrent enqueue() calls of one partition (and alike in
    having a dedup key or not) are merged into EnqueueBatch calls, and each caller gets its own
    answer. A batch goes at the end of the event loop's current turn (or `batch_linger` after
    it opened), at once when it holds `batch_max_jobs` jobs or `batch_max_bytes` bytes, and
    while `batch_max_in_flight` batches of its partition are in flight it waits, gathering
    more. A batch of one is a unary Enqueue. A batch the broker refuses whole (a bad job, a
    full queue) is sent again one job per call, so only the bad job's caller sees the error;
    other errors reach every caller of the batch. Middleware runs per enqueue() call, before
    the coalescer. close() sends the open batches and waits for those in flight. Turn it off
    with ClientOptions(batching=False), or for one call with enqueue(..., batch=False).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        options: ClientOptions | None = None,
        token: str | None = None,
        deadline: DeadlineArg = _UNSET,
        timeout: DeadlineArg = _UNSET,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        if deadline is _UNSET:
            deadline = timeout  # the older name of the same setting
        self.options = resolve_options(address, options, token=token, deadline=deadline)
        self.metadata: Metadata = self.options.metadata()
        self._router = Router(self.options, channel=channel)
        self.addresses = self._router.addresses
        self.address = self.addresses[0]
        self._middleware: list[ProducerMiddleware] = []
        opts = self.options
        self._coalescer: Coalescer[EnqueueResult] = Coalescer(
            self._send_requests,
            max_jobs=opts.batch_max_jobs,
            max_bytes=opts.batch_max_bytes,
            linger=opts.batch_linger,
            max_in_flight=opts.batch_max_in_flight,
            partition_count=self._router.held_partition_count,
        )

    @property
    def channel(self) -> grpc.aio.Channel:
        """The channel to the node calls that any node serves go to now."""
        return self._router.current().channel

    @property
    def broker(self) -> broker_pb2_grpc.BrokerStub:
        """The generated Broker stub of that node, for calls this class does not wrap (pass
        metadata=client.metadata). In a cluster, a node forwards what it does not lead."""
        return self._router.current().broker

    @property
    def admin(self) -> admin_pb2_grpc.AdminStub:
        """The generated Admin stub of that node (pass metadata=client.metadata)."""
        return self._router.current().admin

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Sends the enqueues still gathering into batches, waits for those in flight, then
        closes the channels (if this client dialed them)."""
        await self._coalescer.close()
        await self._router.close()

    # --- calls and retries -----------------------------------------------------------------

    def _timeout(self, deadline: DeadlineArg) -> float | None:
        return self.options.deadline if deadline is _UNSET else deadline

    async def _unary(
        self,
        service: str,
        method: str,
        request: Any,
        *,
        route: Route,
        retry: bool,
        deadline: DeadlineArg = _UNSET,
        extra_time: float = 0.0,
    ) -> Any:
        """One unary call to the node `route` names, tried up to retry_attempts times on
        UNAVAILABLE when `retry` (the caller knows a repeat cannot duplicate), else once. A
        failure that may mean the node no longer leads the partition (UNAVAILABLE,
        DEADLINE_EXCEEDED) makes the router ask for the cluster's layout again before the next
        call, this call's retry included."""
        attempts = self.options.retry_attempts if retry else 1
        timeout = self._timeout(deadline)
        if timeout is not None:
            timeout += extra_time
        backoff = self.options.retry_backoff
        for attempt in range(1, attempts + 1):
            stub = getattr(await self._router.node_for(route), service)
            try:
                return await getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
            except grpc.aio.AioRpcError as err:
                self._router.note_failure(err)
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise error_from_rpc(err) from err
                if attempt == attempts:
                    raise error_from_rpc(err) from err
            # Full jitter: clients that lost the same broker do not all come back at once.
            await asyncio.sleep(random.uniform(0, backoff))
            backoff *= 2
        raise AssertionError("unreachable")

    # --- producer -------------------------------------------------------------------------

    def use(self, middleware: ProducerMiddleware) -> ProducerMiddleware:
        """Adds producer middleware around enqueue, enqueue_batch and enqueue_and_wait: the
        first added is the outermost. Returns it, so it works as a decorator."""
        self._middleware.append(middleware)
        return middleware

    async def _send_requests(
        self, requests: list[broker_pb2.EnqueueRequest], timeout: float | None
    ) -> list[EnqueueResult]:
        """The coalescer's sender: one job as unary Enqueue, more as one EnqueueBatch."""
        # The coalescer keeps jobs with and without a dedup key in different batches, so this
        # retries a batch exactly when each of its jobs would have been retried alone.
        retry = all(r.dedup_key for r in requests)
        if len(requests) == 1:
            resp = await self._unary(
                "broker", "Enqueue", requests[0], route=Route.of_queue(requests[0].queue),
                retry=retry, deadline=timeout
            )
            return [EnqueueResult(resp.job_id, resp.deduplicated)]
        batch = broker_pb2.EnqueueBatchRequest(jobs=requests)
        resp = await self._unary(
            "broker", "EnqueueBatch", batch, route=_batch_route(batch), retry=retry,
            deadline=timeout
        )
        return [EnqueueResult(r.job_id, r.deduplicated) for r in resp.results]

    async def _send_jobs(
        self, jobs: list[NewJob], single: bool, deadline: DeadlineArg, coalesce: bool = False
    ) -> list[EnqueueResult]:
        if coalesce and single and len(jobs) == 1:
            # Where the one job of enqueue() was sent alone before coalescing: below the
            # middleware, so each call still has its own producer span and headers.
            future = self._coalescer.submit(jobs[0].to_proto(), self._timeout(deadline))
            return [await future]
        requests = [j.to_proto() for j in jobs]
        # A repeat of an applied enqueue is answered with the same job (deduplicated) only when
        # every job has a dedup key; without one it would create a second job.
        retry = all(r.dedup_key for r in requests)
        if single and len(requests) == 1:
            route = Route.of_queue(requests[0].queue)
            resp = await self._unary(
                "broker", "Enqueue", requests[0], route=route, retry=retry, deadline=deadline
            )
            return [EnqueueResult(resp.job_id, resp.deduplicated)]
        batch = broker_pb2.EnqueueBatchRequest(jobs=requests)
        resp = await self._unary(
            "broker", "EnqueueBatch", batch, route=_batch_route(batch),
            retry=retry, deadline=deadline
        )
        return [EnqueueResult(r.job_id, r.deduplicated) for r in resp.results]

    async def _enqueue_jobs(
        self, jobs: list[NewJob], single: bool, deadline: DeadlineArg, coalesce: bool = False
    ) -> list[EnqueueResult]:
        async def send(js: list[NewJob]) -> list[EnqueueResult]:
            return await self._send_jobs(js, single, deadline, coalesce)

        call: EnqueueNext = send
        for mw in reversed(self._middleware):
            call = _bind_producer(mw, call)
        return await call(jobs)

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
        deadline: DeadlineArg = _UNSET,
        batch: bool = True,
    ) -> EnqueueResult:
        """Adds one job; returns once it is durable on the broker.

        `payload`: bytes as they are, str as UTF-8, anything else as JSON. Durations are seconds
        or timedeltas; `run_at` a datetime (naive = UTC). At most one of `delay` and `run_at`.
        `max_attempts` 0 and the unset durations mean the queue's policy. `timeout`: each
        attempt's run-time limit; `expire_at`: no attempt starts after it; `depends_on`: ids of
        jobs that must complete first. `deadline`: this call's deadline (seconds).
        Retried on UNAVAILABLE only with a `dedup_key` (see the class comment).

        Concurrent calls are coalesced into EnqueueBatch calls (options.batching, see the
        class comment); each still gets its own answer. `batch=False` sends this one at once
        as a unary Enqueue.
        Raises InvalidArgumentError (a malformed field, named in the message),
        AlreadyExistsError (dedup_key held by a job with another payload),
        ResourceExhaustedError (a full queue, an oversized payload).
        """
        if batch and not self._middleware and self.options.batching:
            # The common case, a plain enqueue() with coalescing on and no middleware: straight
            # to the coalescer, without the NewJob that only middleware reads nor the call chain
            # built for it. That was about 30% of the helper's own CPU per job (10.9 -> 7.7 us,
            # docs/performance.md).
            request = _enqueue_request(
                queue, payload, headers, priority, delay, run_at, dedup_key, dedup_ttl,
                max_attempts, lease_duration, concurrency_key, timeout, expire_at, depends_on, ()
            )
            return await self._coalescer.submit(request, self._timeout(deadline))
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
        [result] = await self._enqueue_jobs(
            [job], True, deadline, batch and self.options.batching
        )
        return result

    async def enqueue_batch(
        self, jobs: Iterable[NewJob], *, deadline: DeadlineArg = _UNSET
    ) -> list[EnqueueResult]:
        """Adds 1 to 1000 jobs, all or nothing; results in the order of `jobs`. Retried on
        UNAVAILABLE only when every job has a dedup key. Sent as it is: never merged with
        other calls' jobs, never split."""
        return await self._enqueue_jobs(list(jobs), False, deadline)

    async def enqueue_and_wait(
        self,
        queue: str,
        payload: Any = b"",
        *,
        wait_timeout: float | None = None,
        **options: Any,
    ) -> job_pb2.Job:
        """Enqueues a job (`options` are enqueue's keywords) and waits until it ends: returns
        the COMPLETED job (its `result`); raises JobFailedError naming the state when it ends
        FAILED or CANCELLED, and TimeoutError when `wait_timeout` seconds pass first (the job
        goes on)."""
        result = await self.enqueue(queue, payload, **options)
        return await self.wait_job(result.job_id, timeout=wait_timeout)

    async def wait_job(self, job_id: str, *, timeout: float | None = None) -> job_pb2.Job:
        """Watches the job (WatchJob) until it ends: returns it COMPLETED, raises JobFailedError
        for FAILED or CANCELLED, TimeoutError after `timeout` seconds. A watch cut by a broker
        that goes away (UNAVAILABLE) is opened again: watching changes nothing."""
        async with asyncio.timeout(timeout):
            backoff = self.options.retry_backoff
            while True:
                try:
                    async for job in self.watch_job(job_id):
                        if job.state in _TERMINAL:
                            if job.state != job_pb2.JOB_STATE_COMPLETED:
                                raise JobFailedError(job)
                            return job
                except UnavailableError:
                    await asyncio.sleep(random.uniform(0, backoff))
                    backoff = min(backoff * 2, 5.0)

    # --- unary worker calls ----------------------------------------------------------------

    async def lease(
        self,
        queue: str,
        *,
        worker_id: str | None = None,
        max_jobs: int = 1,
        lease_duration: DurationLike | None = None,
        wait: DurationLike | None = None,
        deadline: DeadlineArg = _UNSET,
    ) -> list[broker_pb2.LeasedJob]:
        """Leases up to `max_jobs` ready jobs; waits up to `wait` for one. May return []. Not
        retried (a lost answer would leave jobs leased to nobody until their leases end)."""
        req = broker_pb2.LeaseRequest(
            queue=queue, worker_id=worker_id or default_worker_id(), max_jobs=max_jobs
        )
        if lease_duration is not None:
            req.lease_duration.CopyFrom(to_duration(lease_duration))
        extra = 0.0
        if wait is not None:
            req.wait.CopyFrom(to_duration(wait))
            extra = req.wait.ToTimedelta().total_seconds()  # the long poll is not a slow call
        resp = await self._unary(
            "broker", "Lease", req, route=Route.of_queue(queue),
            retry=False, deadline=deadline, extra_time=extra
        )
        return list(resp.jobs)

    async def heartbeat(
        self,
        job: broker_pb2.LeasedJob | str,
        lease_id: str | None = None,
        *,
        extend_by: DurationLike | None = None,
        checkpoint: bytes | None = None,
        progress: Any = None,
        deadline: DeadlineArg = _UNSET,
    ) -> broker_pb2.HeartbeatResponse:
        """Extends a lease (and saves `checkpoint`, reports `progress` when given: bytes, str
        or JSON). FailedPreconditionError if the lease is gone. `job` is a LeasedJob, or a job
        id with its `lease_id`."""
        job_id, lease = _lease_ref(job, lease_id)
        req = broker_pb2.HeartbeatRequest(job_id=job_id, lease_id=lease)
        if extend_by is not None:
            req.extend_by.CopyFrom(to_duration(extend_by))
        if checkpoint is not None:
            req.checkpoint = checkpoint
        if progress is not None:
            req.progress = encode_payload(progress)
        resp: broker_pb2.HeartbeatResponse = await self._unary(
            "broker", "Heartbeat", req, route=Route.of_job(job_id), retry=True, deadline=deadline
        )
        return resp

    async def ack(
        self,
        job: broker_pb2.LeasedJob | str,
        lease_id: str | None = None,
        *,
        result: Any = b"",
        deadline: DeadlineArg = _UNSET,
    ) -> None:
        """Completes the job; `result` is kept with it (bytes, str, or JSON)."""
        job_id, lease = _lease_ref(job, lease_id)
        req = broker_pb2.AckRequest(job_id=job_id, lease_id=lease, result=encode_payload(result))
        await self._unary(
            "broker", "Ack", req, route=Route.of_job(job_id), retry=True, deadline=deadline
        )

    async def fail(
        self,
        job: broker_pb2.LeasedJob | str,
        lease_id: str | None = None,
        *,
        error: str = "",
        permanent: bool = False,
        retry_after: DurationLike | None = None,
        deadline: DeadlineArg = _UNSET,
    ) -> broker_pb2.FailResponse:
        """Fails the attempt: retried after the backoff (or `retry_after`), or dead when
        `permanent` or out of attempts. The answer says which (`state`)."""
        job_id, lease = _lease_ref(job, lease_id)
        req = broker_pb2.FailRequest(job_id=job_id, lease_id=lease, error=error, permanent=permanent)
        if retry_after is not None:
            req.retry_after.CopyFrom(to_duration(retry_after))
        resp: broker_pb2.FailResponse = await self._unary(
            "broker", "Fail", req, route=Route.of_job(job_id), retry=True, deadline=deadline
        )
        return resp

    async def release(
        self,
        job: broker_pb2.LeasedJob | str,
        lease_id: str | None = None,
        *,
        delay: DurationLike | None = None,
        deadline: DeadlineArg = _UNSET,
    ) -> None:
        """Gives the job back unstarted: READY again, no attempt counted; with `delay`
        (snooze), SCHEDULED that much later and its `snoozes` count one more."""
        job_id, lease = _lease_ref(job, lease_id)
        req = broker_pb2.ReleaseRequest(job_id=job_id, lease_id=lease)
        if delay is not None:
            req.delay.CopyFrom(to_duration(delay))
        await self._unary(
            "broker", "Release", req, route=Route.of_job(job_id), retry=True, deadline=deadline
        )

    # --- admin: jobs -----------------------------------------------------------------------

    async def get_job(self, job_id: str, *, deadline: DeadlineArg = _UNSET) -> job_pb2.Job:
        """The job with its state, attempts and checkpoint. NotFoundError if unknown."""
        req = admin_pb2.GetJobRequest(job_id=job_id)
        job: job_pb2.Job = await self._unary(
            "admin", "GetJob", req, route=Route.of_job(job_id), retry=True, deadline=deadline
        )
        return job

    async def watch_job(self, job_id: str) -> AsyncGenerator[job_pb2.Job, None]:
        """The job as it is now, then once per change (state, attempt, progress, snoozes,
        cancel request); ends after the message showing a terminal state. NotFoundError if
        unknown; UnavailableError if the broker shuts down (watch again, or use wait_job).
        A stream: no deadline."""
        node = await self._router.node_for(Route.of_job(job_id))
        req = admin_pb2.WatchJobRequest(job_id=job_id)
        call = node.admin.WatchJob(req, metadata=self.metadata)
        try:
            async for job in call:
                yield job
        except grpc.aio.AioRpcError as err:
            self._router.note_failure(err)
            raise error_from_rpc(err) from err
        finally:
            call.cancel()

    async def list_jobs(
        self,
        queue: str,
        state: job_pb2.JobState = job_pb2.JOB_STATE_UNSPECIFIED,
        *,
        page_size: int = 0,
        page_token: str = "",
        newest_first: bool = False,
        dedup_key: str = "",
        deadline: DeadlineArg = _UNSET,
    ) -> admin_pb2.ListJobsResponse:
        """One page of the queue's jobs in `state` (every state when unspecified); with
        `dedup_key`, only the job holding it. Follow `next_page_token` for the next page."""
        req = admin_pb2.ListJobsRequest(
            queue=queue,
            state=state,
            page_size=page_size,
            page_token=page_token,
            newest_first=newest_first,
            dedup_key=dedup_key,
        )
        resp: admin_pb2.ListJobsResponse = await self._unary(
            "admin", "ListJobs", req, route=Route.of_queue(queue), retry=True, deadline=deadline
        )
        return resp

    async def cancel_job(self, job_id: str, *, deadline: DeadlineArg = _UNSET) -> job_pb2.Job:
        """READY or SCHEDULED: CANCELLED at once; ACTIVE: its worker is told (the job is
        CANCELLED when the attempt ends). FailedPreconditionError if it already ended."""
        req = admin_pb2.CancelJobRequest(job_id=job_id)
        job: job_pb2.Job = await self._unary(
            "admin", "CancelJob", req, route=Route.of_job(job_id), retry=False, deadline=deadline
        )
        return job

    async def retry_job(self, job_id: str, *, deadline: DeadlineArg = _UNSET) -> job_pb2.Job:
        """A FAILED or CANCELLED job back to READY, attempts reset, history kept."""
        req = admin_pb2.RetryJobRequest(job_id=job_id)
        resp = await self._unary(
            "admin", "RetryJob", req, route=Route.of_job(job_id), retry=False, deadline=deadline
        )
        job: job_pb2.Job = resp.job
        return job

    async def retry_jobs(
        self,
        queue: str,
        state: job_pb2.JobState = job_pb2.JOB_STATE_FAILED,
        *,
        dry_run: bool = False,
        limit: int = 0,
        deadline: DeadlineArg = _UNSET,
    ) -> admin_pb2.RetryJobResponse:
        """Bulk redrive: the queue's jobs in `state` (FAILED or CANCELLED) back to READY, oldest
        ended first, at most `limit` (0: 1000). `matched` and `retried` count them; `dry_run`
        only counts."""
        req = admin_pb2.RetryJobRequest(queue=queue, state=state, dry_run=dry_run, limit=limit)
        resp: admin_pb2.RetryJobResponse = await self._unary(
            "admin", "RetryJob", req, route=Route.of_queue(queue), retry=dry_run, deadline=deadline
        )
        return resp

    async def delete_job(self, job_id: str, *, deadline: DeadlineArg = _UNSET) -> None:
        """Removes a job that is not ACTIVE (FailedPreconditionError: cancel it first)."""
        req = admin_pb2.DeleteJobRequest(job_id=job_id)
        await self._unary(
            "admin", "DeleteJob", req, route=Route.of_job(job_id), retry=False, deadline=deadline
        )

    # --- admin: queues ---------------------------------------------------------------------

    async def list_queues(self, *, deadline: DeadlineArg = _UNSET) -> list[admin_pb2.QueueInfo]:
        req = admin_pb2.ListQueuesRequest()
        resp = await self._unary(
            "admin", "ListQueues", req, route=Route.any(), retry=True, deadline=deadline
        )
        return list(resp.queues)

    async def get_queue(
        self, queue: str, *, deadline: DeadlineArg = _UNSET
    ) -> admin_pb2.QueueInfo:
        """The queue's effective policy and job counts by state name."""
        req = admin_pb2.GetQueueRequest(queue=queue)
        info: admin_pb2.QueueInfo = await self._unary(
            "admin", "GetQueue", req, route=Route.of_queue(queue), retry=True, deadline=deadline
        )
        return info

    async def update_queue_policy(
        self,
        queue: str,
        policy: policy_pb2.QueuePolicy | None = None,
        *,
        reset: bool = False,
        deadline: DeadlineArg = _UNSET,
    ) -> admin_pb2.QueueInfo:
        """Sets the fields of `policy` that are set (the others keep their value); `reset`
        first drops every run-time override. Creates the queue if new."""
        req = admin_pb2.UpdateQueuePolicyRequest(queue=queue, reset=reset)
        if policy is not None:
            req.policy.CopyFrom(policy)
        # Setting the same fields (after the same reset) twice leaves the queue as once.
        info: admin_pb2.QueueInfo = await self._unary(
            "admin", "UpdateQueuePolicy", req, route=Route.of_queue(queue),
            retry=True, deadline=deadline
        )
        return info

    async def pause_queue(
        self, queue: str, *, deadline: DeadlineArg = _UNSET
    ) -> admin_pb2.QueueInfo:
        req = admin_pb2.PauseQueueRequest(queue=queue)
        info: admin_pb2.QueueInfo = await self._unary(
            "admin", "PauseQueue", req, route=Route.of_queue(queue), retry=True, deadline=deadline
        )
        return info

    async def resume_queue(
        self, queue: str, *, deadline: DeadlineArg = _UNSET
    ) -> admin_pb2.QueueInfo:
        req = admin_pb2.ResumeQueueRequest(queue=queue)
        info: admin_pb2.QueueInfo = await self._unary(
            "admin", "ResumeQueue", req, route=Route.of_queue(queue), retry=True, deadline=deadline
        )
        return info

    async def purge_queue(
        self,
        queue: str,
        states: Iterable[job_pb2.JobState] = (),
        *,
        deadline: DeadlineArg = _UNSET,
    ) -> int:
        """Removes the queue's jobs in `states` (every terminal state if none); the count."""
        req = admin_pb2.PurgeQueueRequest(queue=queue, states=list(states))
        resp = await self._unary(
            "admin", "PurgeQueue", req, route=Route.of_queue(queue), retry=False, deadline=deadline
        )
        return int(resp.purged)

    # --- admin: cluster and workers --------------------------------------------------------

    async def get_cluster(self, *, deadline: DeadlineArg = _UNSET) -> admin_pb2.ClusterInfo:
        """The nodes and each partition's leader (a single node: a cluster of one)."""
        req = admin_pb2.GetClusterRequest()
        info: admin_pb2.ClusterInfo = await self._unary(
            "admin", "GetCluster", req, route=Route.any(), retry=True, deadline=deadline
        )
        return info

    async def list_workers(
        self, queue: str = "", *, deadline: DeadlineArg = _UNSET
    ) -> list[admin_pb2.WorkerInfo]:
        """The connected workers (of `queue`, or all), with the library each one says it is."""
        req = admin_pb2.ListWorkersRequest(queue=queue)
        resp = await self._unary(
            "admin", "ListWorkers", req, route=Route.any(), retry=True, deadline=deadline
        )
        return list(resp.workers)

    # --- admin: schedules ------------------------------------------------------------------

    async def put_schedule(
        self,
        schedule_id: str,
        template: NewJob,
        *,
        cron: str = "",
        every: DurationLike | None = None,
        time_zone: str = "",
        paused: bool = False,
        start_at: _dt.datetime | None = None,
        end_at: _dt.datetime | None = None,
        catch_up: admin_pb2.ScheduleCatchUp = admin_pb2.SCHEDULE_CATCH_UP_UNSPECIFIED,
        deadline: DeadlineArg = _UNSET,
    ) -> admin_pb2.Schedule:
        """Creates or replaces a recurring schedule: exactly one of `cron` (5 or 6 fields, on
        `time_zone`'s wall clock, UTC if empty) and `every` (seconds or a timedelta). Each run
        enqueues `template` (not its dedup_key, delay, run_at nor expire_at: the schedule names
        and times its runs). Returns the stored schedule with next_run_at."""
        schedule = admin_pb2.Schedule(
            schedule_id=schedule_id,
            cron=cron,
            time_zone=time_zone,
            paused=paused,
            catch_up=catch_up,
        )
        schedule.template.CopyFrom(template.to_proto())
        if every is not None:
            schedule.every.CopyFrom(to_duration(every))
        if start_at is not None:
            schedule.start_at.CopyFrom(to_timestamp(start_at))
        if end_at is not None:
            schedule.end_at.CopyFrom(to_timestamp(end_at))
        return await self.put_schedule_proto(schedule, deadline=deadline)

    async def put_schedule_proto(
        self, schedule: admin_pb2.Schedule, *, deadline: DeadlineArg = _UNSET
    ) -> admin_pb2.Schedule:
        """put_schedule with a ready admin_pb2.Schedule."""
        req = admin_pb2.PutScheduleRequest(schedule=schedule)
        # Putting the same schedule twice leaves it as once: safe to repeat.
        stored: admin_pb2.Schedule = await self._unary(
            "admin", "PutSchedule", req, route=Route.of_queue(schedule.template.queue),
            retry=True, deadline=deadline
        )
        return stored

    async def get_schedule(
        self, schedule_id: str, *, deadline: DeadlineArg = _UNSET
    ) -> admin_pb2.Schedule:
        """NotFoundError if there is none."""
        req = admin_pb2.GetScheduleRequest(schedule_id=schedule_id)
        schedule: admin_pb2.Schedule = await self._unary(
            "admin", "GetSchedule", req, route=Route.any(), retry=True, deadline=deadline
        )
        return schedule

    async def list_schedules(
        self, queue: str = "", *, deadline: DeadlineArg = _UNSET
    ) -> list[admin_pb2.Schedule]:
        """Every schedule (whose template enqueues into `queue`, if named), by id."""
        req = admin_pb2.ListSchedulesRequest(queue=queue)
        resp = await self._unary(
            "admin", "ListSchedules", req, route=Route.of_queue(queue) if queue else Route.any(),
            retry=True, deadline=deadline
        )
        return list(resp.schedules)

    async def delete_schedule(self, schedule_id: str, *, deadline: DeadlineArg = _UNSET) -> None:
        """Removes the schedule; the jobs it enqueued stay."""
        req = admin_pb2.DeleteScheduleRequest(schedule_id=schedule_id)
        await self._unary(
            "admin", "DeleteSchedule", req, route=Route.any(), retry=False, deadline=deadline
        )

    async def trigger_schedule(
        self, schedule_id: str, *, deadline: DeadlineArg = _UNSET
    ) -> EnqueueResult:
        """Enqueues one run now, outside the timing (also while paused). Not retried: a repeat
        in another second would be another run."""
        req = admin_pb2.TriggerScheduleRequest(schedule_id=schedule_id)
        resp = await self._unary(
            "admin", "TriggerSchedule", req, route=Route.any(), retry=False, deadline=deadline
        )
        return EnqueueResult(resp.job_id, resp.deduplicated)


def _batch_route(batch: broker_pb2.EnqueueBatchRequest) -> Route:
    """A batch is all or nothing within one partition: it goes to the leader of its first job's
    queue. One whose jobs span partitions is refused there (INVALID_ARGUMENT naming them)."""
    return Route.of_queue(batch.jobs[0].queue) if batch.jobs else Route.any()


def _bind_producer(mw: ProducerMiddleware, nxt: EnqueueNext) -> EnqueueNext:
    async def call(jobs: list[NewJob]) -> list[EnqueueResult]:
        return await mw(jobs, nxt)

    return call

