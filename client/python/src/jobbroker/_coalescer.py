"""Coalescer: the producer's enqueue coalescing (worker contract §10).

Concurrent single enqueue() calls are merged into EnqueueBatch calls, and each caller is still
answered on its own. Jobs are grouped by key: (partition, has a dedup key). Per key there is at
most one open batch (still taking jobs), a queue of closed batches waiting for an in-flight
slot, and a count of batches in flight. The rules, as the contract numbers them:

1. A job joins its key's open batch, or opens one.
2. A batch that reaches max_jobs or max_bytes is closed and sent at once (once a slot is free
   when max_in_flight batches are already out: the limit holds for full batches too).
3. A batch opened while a slot is free is sent `linger` seconds after it opened; with a linger
   of 0, at the end of the current turn of the event loop (loop.call_soon), so the calls of one
   turn go together. One timer or callback per batch, never one per job.
4. A batch that could not go when due (every slot taken) stays open and takes more jobs; it is
   sent as soon as an in-flight batch of its key ends.
5. One job goes as unary Enqueue, two or more as EnqueueBatch, in the order of their calls
   (the sender decides by the count).
6. The batch's deadline is the earliest of its callers' deadlines.

A batch refused whole (a status that applies nothing) is split: each job is sent again alone,
all at once, so one bad job fails only its own call. Any other error goes to every caller.
Retries are the sender's (the client's unary retries), decided per batch: the key keeps jobs
with and without a dedup key apart, so a batch is retried exactly when each of its jobs would be.

Used from one event loop, the client's.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import grpc

from ._partition import partition_of_queue
from .errors import JobBrokerError, error_from_code
from .v1 import broker_pb2

__all__ = ["Coalescer", "REFUSALS", "request_bytes"]

_R = TypeVar("_R")

# Sends the requests as one call (unary Enqueue for one, EnqueueBatch for more) with this
# timeout in seconds (None: no deadline); the results in the requests' order. Raises a
# JobBrokerError when the call fails.
Sender = Callable[[list[broker_pb2.EnqueueRequest], float | None], Awaitable[list[_R]]]

# Statuses with which the broker refuses a batch whole and applies none of it: sending each
# job again alone is safe, and gives each caller the answer a unary call would.
REFUSALS = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.PERMISSION_DENIED,
})

# The key of a batch: the partition (or the queue name while the partition count is unknown)
# and whether its jobs have a dedup key.
_Key = tuple[int | str, bool]


def request_bytes(request: broker_pb2.EnqueueRequest) -> int:
    """What a job counts toward batch_max_bytes: its payload and its headers' names and
    values, in bytes (the bulk of a request; the fixed fields are small)."""
    size = len(request.payload)
    headers = request.headers
    if headers:  # most jobs have none, and walking an empty map still costs
        for name, value in headers.items():
            size += len(name.encode()) + len(value.encode())
    return size


class _Batch(Generic[_R]):
    __slots__ = ("requests", "futures", "deadlines", "size", "timer")

    def __init__(self) -> None:
        self.requests: list[broker_pb2.EnqueueRequest] = []
        self.futures: list[asyncio.Future[_R]] = []
        # Each caller's deadline on the loop's clock; None: no deadline.
        self.deadlines: list[float | None] = []
        self.size = 0
        # The pending send (rule 3); None once it fired, or when the batch opened while every
        # slot was taken (rule 4: it goes when a slot frees).
        self.timer: asyncio.Handle | None = None


class _KeyState(Generic[_R]):
    __slots__ = ("open", "waiting", "in_flight")

    def __init__(self) -> None:
        self.open: _Batch[_R] | None = None
        # Closed batches (full, or flushed by close()) waiting for a slot, oldest first.
        self.waiting: collections.deque[_Batch[_R]] = collections.deque()
        self.in_flight = 0


class Coalescer(Generic[_R]):
    """Merges submitted jobs into batches and sends them with `send`.

    `partition_count` answers the partition count of the cluster table the client holds now,
    or None (no table, or a broker that would not say): then the key is the queue name, so a
    batch never spans partitions whatever their count.
    """

    def __init__(
        self,
        send: Sender[_R],
        *,
        max_jobs: int,
        max_bytes: int,
        linger: float,
        max_in_flight: int,
        partition_count: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._send = send
        self._max_jobs = max_jobs
        self._max_bytes = max_bytes
        self._linger = linger
        self._max_in_flight = max_in_flight
        self._partition_count = partition_count
        self._keys: dict[_Key, _KeyState[_R]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # partition_of_queue hashes the name byte by byte in Python: remember it per queue for
        # the count it was computed with.
        self._partitions: dict[str, int] = {}
        self._partitions_of = 0

    def submit(
        self, request: broker_pb2.EnqueueRequest, timeout: float | None
    ) -> asyncio.Future[_R]:
        """Adds the job to its key's open batch; the future answers it. `timeout`: seconds
        this caller allows from now (None: no deadline)."""
        loop = asyncio.get_running_loop()
        key = self._key_of(request)
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _KeyState()
        batch = state.open
        opened = batch is None
        if batch is None:
            batch = state.open = _Batch()
        future: asyncio.Future[_R] = loop.create_future()
        batch.requests.append(request)
        batch.futures.append(future)
        batch.deadlines.append(None if timeout is None else loop.time() + timeout)
        batch.size += request_bytes(request)
        if len(batch.requests) >= self._max_jobs or batch.size >= self._max_bytes:
            self._close_open(state)
            self._pump(key, state)
        elif opened and state.in_flight < self._max_in_flight:
            if self._linger > 0:
                batch.timer = loop.call_later(self._linger, self._due, key, state, batch)
            else:
                batch.timer = loop.call_soon(self._due, key, state, batch)
        return future

    async def close(self) -> None:
        """Sends every open batch and waits until no batch is waiting or in flight."""
        while True:
            for key, state in list(self._keys.items()):
                if state.open is not None:
                    self._close_open(state)
                    self._pump(key, state)
            if not self._tasks:
                return
            await asyncio.wait(set(self._tasks))

    # --- internals -------------------------------------------------------------------------

    def _key_of(self, request: broker_pb2.EnqueueRequest) -> _Key:
        keyed = bool(request.dedup_key)
        count = self._partition_count()
        if count is None:
            return (request.queue, keyed)
        if count <= 1:
            return (0, keyed)
        if count != self._partitions_of:
            self._partitions.clear()
            self._partitions_of = count
        partition = self._partitions.get(request.queue)
        if partition is None:
            partition = partition_of_queue(request.queue, count)
            self._partitions[request.queue] = partition
        return (partition, keyed)

    def _close_open(self, state: _KeyState[_R]) -> None:
        batch = state.open
        assert batch is not None
        state.open = None
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        state.waiting.append(batch)

    def _due(self, key: _Key, state: _KeyState[_R], batch: _Batch[_R]) -> None:
        """Rule 3: the batch's linger (or the loop's turn) is over."""
        batch.timer = None
        if state.open is batch and state.in_flight < self._max_in_flight:
            self._close_open(state)
            self._pump(key, state)
        # Otherwise every slot is taken: it stays open, taking jobs, until one frees (rule 4).

    def _pump(self, key: _Key, state: _KeyState[_R]) -> None:
        """Sends the waiting batches while a slot is free, oldest first."""
        while state.waiting and state.in_flight < self._max_in_flight:
            batch = state.waiting.popleft()
            state.in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run(key, state, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, key: _Key, state: _KeyState[_R], batch: _Batch[_R]) -> None:
        try:
            await self._deliver(batch)
        except BaseException:
            # Cancelled: the loop is shutting down, and nothing more can be sent on it.
            state.in_flight -= 1
            raise
        state.in_flight -= 1
        self._pump(key, state)
        # Rule 4: a batch that was due while every slot was taken goes now.
        if (state.open is not None and state.open.timer is None
                and state.in_flight < self._max_in_flight):
            self._close_open(state)
            self._pump(key, state)
        if state.open is None and not state.waiting and state.in_flight == 0:
            # Keys by queue name come and go: forget an idle one.
            if self._keys.get(key) is state:
                del self._keys[key]

    async def _deliver(self, batch: _Batch[_R]) -> None:
        try:
            results = await self._send(batch.requests, self._timeout(batch.deadlines))
        except JobBrokerError as err:
            if err.code in REFUSALS and len(batch.requests) > 1:
                await self._split(batch)
            else:
                _fail_all(batch.futures, err)
            return
        except asyncio.CancelledError:
            # The loop is going away: the callers must not wait forever.
            for future in batch.futures:
                future.cancel()
            raise
        except Exception as err:  # whatever broke, every caller hears it
            _fail_all(batch.futures, err)
            return
        if len(results) != len(batch.futures):
            _fail_all(batch.futures, error_from_code(
                grpc.StatusCode.INTERNAL,
                f"the broker answered {len(results)} results for {len(batch.futures)} jobs"))
            return
        for future, result in zip(batch.futures, results):
            if not future.done():  # its caller gave up (the job may still be created)
                future.set_result(result)

    async def _split(self, batch: _Batch[_R]) -> None:
        """The batch was refused whole: each job alone, all at once, each with its own
        deadline, so each caller gets the answer its unary call gives."""

        async def alone(i: int) -> None:
            future = batch.futures[i]
            try:
                [result] = await self._send(
                    [batch.requests[i]], self._timeout([batch.deadlines[i]])
                )
            except asyncio.CancelledError:
                future.cancel()
                raise
            except Exception as err:  # delivered to its caller
                if not future.done():
                    future.set_exception(err)
                return
            if not future.done():
                future.set_result(result)

        await asyncio.gather(*(alone(i) for i in range(len(batch.requests))))

    @staticmethod
    def _timeout(deadlines: list[float | None]) -> float | None:
        """Rule 6: seconds left until the earliest deadline; None when no caller has one."""
        given = [d for d in deadlines if d is not None]
        if not given:
            return None
        return max(0.0, min(given) - asyncio.get_running_loop().time())


def _fail_all(futures: list[asyncio.Future[_R]], err: Exception) -> None:
    first = True
    for future in futures:
        if future.done():
            continue
        # Each caller its own exception object: one raised in many tasks would collect their
        # tracebacks into one.
        future.set_exception(err if first else _copy_error(err))
        first = False


def _copy_error(err: Exception) -> Exception:
    if not isinstance(err, JobBrokerError):
        return err
    copy = error_from_code(err.code, err.message)
    copy.__cause__ = err.__cause__
    return copy
