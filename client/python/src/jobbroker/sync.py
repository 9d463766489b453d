"""SyncClient: the Client's calls, blocking, for code without an event loop (Django, Flask,
scripts)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from .client import (
    Client,
    DeadlineArg,
    EnqueueResult,
    NewJob,
    ProducerMiddleware,
    _UNSET,
)
from .options import ClientOptions
from .v1 import admin_pb2, broker_pb2, job_pb2, policy_pb2

__all__ = ["SyncClient"]

_T = TypeVar("_T")


class SyncClient:
    """The Client's calls, each blocking until it is answered, safe from any thread.

        client = jobbroker.SyncClient(options=jobbroker.ClientOptions(token=...))
        result = client.enqueue("emails", {"to": "ada@example.com"}, dedup_key="welcome:ada")
        job = client.enqueue_and_wait("thumbnails", {"image": 7}, wait_timeout=30)
        client.close()  # or: with jobbroker.SyncClient() as client: ...

    It takes what Client takes (the same ClientOptions, the `address`, `token` and `deadline`
    shorthands) and raises the same errors. One SyncClient serves a whole program: it runs an
    asyncio Client on an event loop of its own, in a daemon thread, and every call of every
    thread is handed to that loop; make one at start-up (a module global, a Django AppConfig)
    rather than one per request. The methods are the Client's: see Client for each.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        options: ClientOptions | None = None,
        token: str | None = None,
        deadline: DeadlineArg = _UNSET,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="jobbroker-sync-client", daemon=True
        )
        self._thread.start()
        self._closed = False

        async def make() -> Client:
            # Made on the loop's thread: a grpc.aio channel belongs to the loop it was made on.
            return Client(address, options=options, token=token, deadline=deadline)

        self.client: Client = self._run(make())

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channels and stops the loop's thread. Calls after it raise RuntimeError."""
        if self._closed:
            return
        self._run(self.client.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._closed:
            coro.close()
            raise RuntimeError("this SyncClient is closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SyncClient called from its own loop (middleware): use the Client")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def options(self) -> ClientOptions:
        return self.client.options

    # --- producer -------------------------------------------------------------------------

    def use(self, middleware: ProducerMiddleware) -> ProducerMiddleware:
        """Producer middleware, as Client.use (async functions: they run on the client's loop)."""
        return self.client.use(middleware)

    def enqueue(self, queue: str, payload: Any = b"", **options: Any) -> EnqueueResult:
        """Client.enqueue: `options` are its keywords (priority, delay, dedup_key, ...)."""
        return self._run(self.client.enqueue(queue, payload, **options))

    def enqueue_batch(
        self, jobs: Iterable[NewJob], *, deadline: DeadlineArg = _UNSET
    ) -> list[EnqueueResult]:
        return self._run(self.client.enqueue_batch(list(jobs), deadline=deadline))

    def enqueue_and_wait(
        self, queue: str, payload: Any = b"", *, wait_timeout: float | None = None, **options: Any
    ) -> job_pb2.Job:
        return self._run(
            self.client.enqueue_and_wait(queue, payload, wait_timeout=wait_timeout, **options)
        )

    def wait_job(self, job_id: str, *, timeout: float | None = None) -> job_pb2.Job:
        return self._run(self.client.wait_job(job_id, timeout=timeout))

    # --- unary worker calls ----------------------------------------------------------------

    def lease(self, queue: str, **options: Any) -> list[broker_pb2.LeasedJob]:
        return self._run(self.client.lease(queue, **options))

    def heartbeat(
        self, job: broker_pb2.LeasedJob | str, lease_id: str | None = None, **options: Any
    ) -> broker_pb2.HeartbeatResponse:
        return self._run(self.client.heartbeat(job, lease_id, **options))

    def ack(
        self, job: broker_pb2.LeasedJob | str, lease_id: str | None = None, **options: Any
    ) -> None:
        self._run(self.client.ack(job, lease_id, **options))

    def fail(
        self, job: broker_pb2.LeasedJob | str, lease_id: str | None = None, **options: Any
    ) -> broker_pb2.FailResponse:
        return self._run(self.client.fail(job, lease_id, **options))

    def release(
        self, job: broker_pb2.LeasedJob | str, lease_id: str | None = None, **options: Any
    ) -> None:
        self._run(self.client.release(job, lease_id, **options))

    # --- admin -----------------------------------------------------------------------------

    def get_job(self, job_id: str, *, deadline: DeadlineArg = _UNSET) -> job_pb2.Job:
        return self._run(self.client.get_job(job_id, deadline=deadline))

    def watch_job(self, job_id: str) -> Iterator[job_pb2.Job]:
        """The job now, then once per change; ends after a terminal state. Each message is
        fetched from the client's loop as the iteration asks for it."""
        stream = self.client.watch_job(job_id)

        async def next_job() -> job_pb2.Job:
            return await stream.__anext__()

        async def close() -> None:
            await stream.aclose()

        try:
            while True:
                try:
                    yield self._run(next_job())
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._run(close())

    def list_jobs(
        self, queue: str, state: job_pb2.JobState = job_pb2.JOB_STATE_UNSPECIFIED, **options: Any
    ) -> admin_pb2.ListJobsResponse:
        return self._run(self.client.list_jobs(queue, state, **options))

    def cancel_job(self, job_id: str, *, deadline: DeadlineArg = _UNSET) -> job_pb2.Job:
        return self._run(self.client.cancel_job(job_id, deadline=deadline))

    def retry_job(self, job_id: str, *, deadline: DeadlineArg = _UNSET) -> job_pb2.Job:
        return self._run(self.client.retry_job(job_id, deadline=deadline))

    def retry_jobs(
        self, queue: str, state: job_pb2.JobState = job_pb2.JOB_STATE_FAILED, **options: Any
    ) -> admin_pb2.RetryJobResponse:
        return self._run(self.client.retry_jobs(queue, state, **options))

    def delete_job(self, job_id: str, *, deadline: DeadlineArg = _UNSET) -> None:
        self._run(self.client.delete_job(job_id, deadline=deadline))

    def list_queues(self, *, deadline: DeadlineArg = _UNSET) -> list[admin_pb2.QueueInfo]:
        return self._run(self.client.list_queues(deadline=deadline))

    def get_queue(self, queue: str, *, deadline: DeadlineArg = _UNSET) -> admin_pb2.QueueInfo:
        return self._run(self.client.get_queue(queue, deadline=deadline))

    def update_queue_policy(
        self,
        queue: str,
        policy: policy_pb2.QueuePolicy | None = None,
        *,
        reset: bool = False,
        deadline: DeadlineArg = _UNSET,
    ) -> admin_pb2.QueueInfo:
        return self._run(
            self.client.update_queue_policy(queue, policy, reset=reset, deadline=deadline)
        )

    def pause_queue(self, queue: str, *, deadline: DeadlineArg = _UNSET) -> admin_pb2.QueueInfo:
        return self._run(self.client.pause_queue(queue, deadline=deadline))

    def resume_queue(self, queue: str, *, deadline: DeadlineArg = _UNSET) -> admin_pb2.QueueInfo:
        return self._run(self.client.resume_queue(queue, deadline=deadline))

    def purge_queue(
        self,
        queue: str,
        states: Iterable[job_pb2.JobState] = (),
        *,
        deadline: DeadlineArg = _UNSET,
    ) -> int:
        return self._run(self.client.purge_queue(queue, list(states), deadline=deadline))

    def get_cluster(self, *, deadline: DeadlineArg = _UNSET) -> admin_pb2.ClusterInfo:
        return self._run(self.client.get_cluster(deadline=deadline))

    def list_workers(
        self, queue: str = "", *, deadline: DeadlineArg = _UNSET
    ) -> list[admin_pb2.WorkerInfo]:
        return self._run(self.client.list_workers(queue, deadline=deadline))

    def put_schedule(self, schedule_id: str, template: NewJob, **options: Any) -> admin_pb2.Schedule:
        """Client.put_schedule: `options` are cron or every, time_zone, paused, ..."""
        return self._run(self.client.put_schedule(schedule_id, template, **options))

    def put_schedule_proto(
        self, schedule: admin_pb2.Schedule, *, deadline: DeadlineArg = _UNSET
    ) -> admin_pb2.Schedule:
        return self._run(self.client.put_schedule_proto(schedule, deadline=deadline))

    def get_schedule(
        self, schedule_id: str, *, deadline: DeadlineArg = _UNSET
    ) -> admin_pb2.Schedule:
        return self._run(self.client.get_schedule(schedule_id, deadline=deadline))

    def list_schedules(
        self, queue: str = "", *, deadline: DeadlineArg = _UNSET
    ) -> list[admin_pb2.Schedule]:
        return self._run(self.client.list_schedules(queue, deadline=deadline))

    def delete_schedule(self, schedule_id: str, *, deadline: DeadlineArg = _UNSET) -> None:
        self._run(self.client.delete_schedule(schedule_id, deadline=deadline))

    def trigger_schedule(
        self, schedule_id: str, *, deadline: DeadlineArg = _UNSET
    ) -> EnqueueResult:
        return self._run(self.client.trigger_schedule(schedule_id, deadline=deadline))

