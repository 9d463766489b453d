"""The worker helper: runs handlers for jobs pushed over Broker.Work streams, one per leading
node of a cluster."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import datetime as _dt
import inspect
import json
import logging
import random
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
import grpc.aio

from ._convert import (
    DurationLike,
    encode_payload,
    from_timestamp,
    timestamp_seconds,
    to_duration,
)
from ._metadata import Metadata
from ._router import GIVEN_CHANNEL, Node, Route, Router, StreamGroup, stream_groups
from ._typed import decode_payload, payload_type
from .client import default_worker_id, resolve_options
from .errors import JobBrokerError, error_from_code, error_from_rpc
from .options import ClientOptions
from .v1 import broker_pb2, job_pb2, steps_pb2

__all__ = [
    "Worker",
    "WorkerStats",
    "JobContext",
    "Handler",
    "TypedHandler",
    "HandlerNext",
    "WorkerMiddleware",
    "PermanentError",
    "RetryAfter",
    "Snooze",
    "StepCheckpointError",
]

_log = logging.getLogger("jobbroker.worker")

_OK = 0
_NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
_FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]

# The broker takes at most 1000 acks in one AckBatchRequest.
_MAX_ACKS_PER_MESSAGE = 1000

# How long an ack, fail, release or checkpoint the broker answered UNAVAILABLE ("retry": the
# partition is between leaders) waits before it is sent again on the same stream (worker
# contract §4); a stream that ends first sends it on the next one.
_ANSWER_RETRY_DELAY = 0.25

# Stream ends after which the worker reconnects; any other code is the caller's mistake
# (e.g. INVALID_ARGUMENT for a bad queue name) and ends Worker.run with that error.
_RETRYABLE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

# Why a handler's cancellation signal fired; it decides what the attempt's end sends.
_OPERATOR_CANCEL = "cancelled by an operator"  # the end sends fail "cancelled" (or its ack)
_LEASE_LOST = "lease lost"  # the broker ended the attempt: the end sends nothing
_TIMED_OUT = "timed out"  # timeout_at passed: the broker ends the attempt, the end sends nothing
_STOPPING = "the worker is stopping"  # past a graceful stop's grace: the end sends a release

# The gRPC channel's own reconnect backoff, kept as short as the stream's (worker contract §5):
# its default grows to 120 s, and a restarted broker would then wait that long for its workers.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5000),
]

T = TypeVar("T")
# A handler gets the JobContext. An `async def` runs on the worker's event loop; a plain
# function runs in a thread of the worker's own pool (use JobContext.step_sync there).
Handler = Callable[["JobContext"], Any]
# A handler that declares its payload's type as a second parameter (a pydantic model, a
# dataclass, a TypedDict...): the worker decodes the JSON payload into it (jobbroker._typed).
TypedHandler = Callable[["JobContext", Any], Any]
AnyHandler = TypeVar("AnyHandler", bound=Callable[..., Any])
# Worker middleware (worker contract §9): `async def mw(job, next)` wraps each handler call; it
# returns `await next(job)` (the handler's result, or its exception propagates) or a result of
# its own without calling it. The first registered (Worker.use) is the outermost.
HandlerNext = Callable[["JobContext"], Awaitable[Any]]
WorkerMiddleware = Callable[["JobContext", HandlerNext], Awaitable[Any]]


def _with_payload(fn: TypedHandler, tp: Any) -> Handler:
    """`fn(job, payload as tp)` as a one-argument handler, async if `fn` is."""

    def decode(job: JobContext) -> Any:
        try:
            return decode_payload(job.payload, tp)
        except (TypeError, ValueError) as err:
            raise PermanentError(f"invalid payload: {err}") from err

    if inspect.iscoroutinefunction(fn):
        async def typed_async(job: JobContext) -> Any:
            return await fn(job, decode(job))

        return typed_async

    def typed(job: JobContext) -> Any:
        return fn(job, decode(job))

    return typed


class PermanentError(Exception):
    """Raise it from a handler to fail the job with no retry: it dies FAILED with
    FAIL_REASON_PERMANENT (a bad address, invalid input: nothing another attempt can fix)."""


class RetryAfter(Exception):
    """Raise it from a handler to fail the attempt and have the next one start after `delay`
    (seconds or a timedelta) instead of the queue's computed backoff (a provider's 429)."""

    def __init__(self, delay: DurationLike, message: str = "") -> None:
        self.delay = delay
        super().__init__(message or f"retry after {delay}")


class Snooze(Exception):
    """Raise it from a handler to put the job back for `delay` (seconds or a timedelta) without
    spending an attempt: it is SCHEDULED that much later and its `snoozes` count one more (the
    queue's max_snoozes bounds them). For "not now" rather than "failed": a resource is busy."""

    def __init__(self, delay: DurationLike) -> None:
        self.delay = delay
        super().__init__(f"snoozed for {delay}")


class StepCheckpointError(Exception):
    """The job's checkpoint is not a jobbroker.v1.StepCheckpoint (something other than the
    durable steps saved it), so steps cannot be resumed from it. The attempt fails."""


@dataclasses.dataclass
class WorkerStats:
    """Attempts this worker finished, by outcome; and the ack messages it sent for them."""

    acked: int = 0
    failed: int = 0
    released: int = 0
    reconnects: int = 0
    # Ack and AckBatch messages sent (resends after a reconnect not counted): fewer than `acked`
    # when acks that completed while one was unanswered went out together.
    ack_messages: int = 0
    # Acks the broker answered as not applied: a single ack refused, or an AckBatch's item errors
    # (usually a stale lease: the job's lease ran out and another attempt owns it now).
    acks_refused: int = 0


class _Held:
    """A job this worker holds: waiting for a handler slot, or running."""

    def __init__(self, job: broker_pb2.LeasedJob, lease: float, stream: _Stream) -> None:
        self.job = job
        self.lease = lease  # seconds, as granted: deadline - arrival
        # The stream that pushed it: its answers go there while it is open (else on another).
        self.stream = stream
        # The broker ended the attempt (lease lost, timed out): heartbeats stop and nothing more
        # is sent for it, but a handler still running keeps its slot until it returns
        # (concurrency is a hard bound, worker contract §3).
        self.lost = False
        self.no_ack = False  # a durable step's checkpoint was refused: never ack this attempt
        self.ended = False  # the handler returned (or the job was released unstarted)
        # Its answer went out without waiting for the handler (a stop past the grace whose
        # handler ignored its cancellation): the handler's end sends nothing.
        self.answered = False
        self.cancel_reason: str | None = None  # why the cancellation signal fired; None: it did not
        self.ctx: JobContext | None = None
        # A timer, not a task: arming and cancelling one is a fraction of a task's cost per job.
        self.heartbeat_timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None  # _run_job, which awaits the handler
        # An async handler is being awaited by `task`: the signal cancels `task` then (and
        # _run_job tells that cancellation from the worker's own close by signal_cancelled).
        # No task of its own per handler: one task less per job is a sixth of the worker's
        # CPU at high rates.
        self.in_handler = False
        self.signal_cancelled = False
        self.timeout_timer: asyncio.TimerHandle | None = None
        # Progress (contract §8): one heartbeat with progress in flight; the newest value waits.
        self.progress_in_flight = False
        self.progress_next: bytes | None = None


class _Pending:
    """A request waiting for its WorkResult."""

    def __init__(
        self,
        req: broker_pb2.WorkRequest,
        fut: asyncio.Future[Any],
        resend: bool,
        stream: _Stream | None,
    ):
        self.req = req
        self.future: asyncio.Future[broker_pb2.WorkResult] = fut
        # Acks, fails, releases and checkpoints go out again on another stream if this one
        # ends unanswered: they are idempotent per lease, and any node routes them by job id.
        self.resend = resend
        # The stream it went out on; None: it waits for the next stream opened.
        self.stream = stream
        # Answered UNAVAILABLE ("retry"): sent again after _ANSWER_RETRY_DELAY, or on the next
        # stream if it comes first.
        self.refused = False


class _Stream:
    """One Work stream of the worker: its group (node, queues, share of max_in_flight), and
    the acks it coalesces."""

    def __init__(self, group: StreamGroup, node: Node) -> None:
        self.group = group
        self.node = node
        # What the request iterator sends; None puts an end to it. Set to None when the stream
        # ended or is being ended: nothing more goes out on it then.
        self.out: asyncio.Queue[broker_pb2.WorkRequest | None] | None = asyncio.Queue()
        self.call: Any = None
        self.task: asyncio.Task[None] | None = None
        # Acks not yet sent: they wait while an ack message of this stream is unanswered
        # (ack_request), then go out together. One ack message in flight per stream is the
        # worker's group commit: a busy worker sends one per broker round trip instead of one
        # per job.
        self.acks: list[broker_pb2.AckRequest] = []
        self.ack_request = 0  # request id of the unanswered ack message; 0 = none
        # Acks an AckBatch's item errors answered UNAVAILABLE: they go back in front of `acks`
        # after _ANSWER_RETRY_DELAY (or to another stream when this one ends).
        self.ack_retry: list[broker_pb2.AckRequest] = []
        self.subscribed = False
        self.retired = False  # ended by a regrouping, not by the broker
        self.end_code = grpc.StatusCode.OK
        self.end_message = "the broker ended the stream"


class JobContext:
    """What a handler sees of the job it runs: one attempt.

    The cancellation signal fires when an operator cancelled the job, its lease was lost, its
    time-out (`timeout_at`) came, or the worker is stopping past its grace period: `cancelled`
    turns true, `cancel_event` is set, and an async handler's task is cancelled (the
    asyncio.CancelledError arrives at its next await; let it propagate). A plain handler running
    in a thread cannot be interrupted: it should look at `cancelled`. The helper cannot stop code
    that ignores the signal; such a handler holds its slot until it returns.
    """

    def __init__(self, worker: Worker, held: _Held) -> None:
        self._worker = worker
        self._held = held
        self._job = held.job
        self.cancel_event = asyncio.Event()
        self._steps: dict[str, bytes] | None = None
        self._checkpoint = steps_pb2.StepCheckpoint()
        self._step_names: set[str] = set()

    @property
    def job_id(self) -> str:
        return self._job.job_id

    @property
    def lease_id(self) -> str:
        return self._job.lease_id

    @property
    def queue(self) -> str:
        return self._job.queue

    @property
    def payload(self) -> bytes:
        return self._job.payload

    @property
    def text(self) -> str:
        """The payload as UTF-8 text."""
        return self._job.payload.decode("utf-8")

    def json(self) -> Any:
        """The payload decoded as JSON."""
        return json.loads(self._job.payload)

    def data_as(self, tp: type[T]) -> T:
        """The JSON payload as a `tp`: a pydantic model, a dataclass, a TypedDict or another
        JSON type (what a handler's typed second parameter gets). ValueError or TypeError when
        it does not fit."""
        return decode_payload(self._job.payload, tp)

    @property
    def headers(self) -> dict[str, str]:
        return dict(self._job.headers)

    @property
    def attempt(self) -> int:
        """1 for the first attempt; attempt == max_attempts is the last chance."""
        return self._job.attempt

    @property
    def max_attempts(self) -> int:
        return self._job.max_attempts

    @property
    def idempotency_key(self) -> str:
        """The same for every attempt: pass it to side effects' providers so a repeat (after a
        crash between the side effect and the ack) is harmless."""
        return self._job.idempotency_key

    @property
    def checkpoint(self) -> bytes:
        """The checkpoint the job arrived with (a serialized StepCheckpoint, or empty)."""
        return self._job.checkpoint

    @property
    def enqueued_at(self) -> _dt.datetime:
        return from_timestamp(self._job.enqueued_at)

    @property
    def lease_deadline(self) -> _dt.datetime:
        """The deadline the lease arrived with (heartbeats extend it)."""
        return from_timestamp(self._job.lease_deadline)

    @property
    def timeout_at(self) -> _dt.datetime | None:
        """When this attempt's run-time limit ends (the signal fires then); None without one."""
        if not self._job.HasField("timeout_at"):
            return None
        return from_timestamp(self._job.timeout_at)

    @property
    def dependency_results(self) -> dict[str, bytes]:
        """The results of the jobs it depended on (enqueue's depends_on), by job id."""
        return dict(self._job.dependency_results)

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def progress(self, value: Any) -> None:
        """Reports progress (bytes as they are, str as UTF-8, anything else as JSON, by
        convention {"percent": 40}): a heartbeat carrying it goes out at once, and WatchJob and
        the dashboard show it. While one is unanswered, the newest value waits and goes out when
        the answer comes (values in between are dropped). Returns at once; safe from a plain
        handler's thread too. Ignored once the attempt ended or its lease was lost."""
        data = encode_payload(value)
        loop = self._worker._loop
        if loop is None:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._worker._report_progress(self._held, data)
        else:
            with contextlib.suppress(RuntimeError):  # a closed loop: the worker is gone
                loop.call_soon_threadsafe(self._worker._report_progress, self._held, data)

    # --- durable steps ---------------------------------------------------------------------

    async def step(self, name: str, fn: Callable[[], T | Awaitable[T]]) -> Any:
        """Runs `fn` once per job, across attempts and worker processes.

        If an earlier attempt finished a step named `name`, returns its saved result without
        calling `fn`. Otherwise calls `fn` (an async function is awaited; a plain one runs in a
        worker thread), saves its JSON-encoded value in the job's checkpoint, waits until the
        broker has stored it, and returns the value as JSON decodes it (so a first run and a
        replay return the same thing). An exception from `fn` propagates (the attempt fails;
        finished steps stay saved). Raises ValueError for a name used twice in one attempt,
        TypeError for a value JSON cannot encode, StepCheckpointError for a checkpoint that is
        not a StepCheckpoint, and a JobBrokerError (FailedPreconditionError) if the lease is gone
        so the step could not be saved: the attempt is then not acked.
        """
        found, value = self._replay(name)
        if found:
            return value
        if inspect.iscoroutinefunction(fn):
            value = await fn()
        else:
            loop = asyncio.get_running_loop()
            context = contextvars.copy_context()  # the handler's (its tracing span)
            value = await loop.run_in_executor(self._worker._executor(), context.run, fn)
            if inspect.isawaitable(value):
                value = await value
        return await self._record(name, value)

    def step_sync(self, name: str, fn: Callable[[], T]) -> Any:
        """step() for a plain (non-async) handler, which runs in a worker thread: `fn` runs
        in the calling thread. Do not call it from the event loop's thread."""
        found, value = self._replay(name)
        if found:
            return value
        value = fn()
        loop = self._worker._loop
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(self._record(name, value), loop).result()

    def _load_steps(self) -> dict[str, bytes]:
        if self._steps is not None:
            return self._steps
        data = self._job.checkpoint
        steps: dict[str, bytes] = {}
        why = _load_step_checkpoint(data, self._checkpoint, steps)
        if why:
            raise StepCheckpointError(
                f"job {self.job_id}: its checkpoint ({len(data)} bytes) is not a "
                f"jobbroker.v1.StepCheckpoint ({why}), so durable steps cannot resume from it"
            )
        self._steps = steps
        return steps

    def _replay(self, name: str) -> tuple[bool, Any]:
        if not name:
            raise ValueError("a durable step needs a non-empty name")
        if name in self._step_names:
            raise ValueError(
                f"durable step {name!r} was used twice in one attempt: step names must be unique "
                "within a job"
            )
        self._step_names.add(name)
        steps = self._load_steps()
        if name in steps:
            return True, json.loads(steps[name].decode("utf-8"))
        return False, None

    async def _record(self, name: str, value: Any) -> Any:
        encoded = json.dumps(value, allow_nan=False, separators=(",", ":")).encode("utf-8")
        steps = self._load_steps()
        self._checkpoint.steps.add(name=name, result=encoded)
        steps[name] = encoded
        await self._worker._save_checkpoint(
            self._held, self._checkpoint.SerializeToString(), name
        )
        return json.loads(encoded)


def _load_step_checkpoint(
    data: bytes, checkpoint: steps_pb2.StepCheckpoint, results: dict[str, bytes]
) -> str:
    """Decodes `data` into `checkpoint` and `results`, or says why it is not a checkpoint of
    durable steps. Every language's helper applies these rules (steps.proto): fields this version
    does not know are ignored, so the message can grow; bytes that hold no step, a step without a
    name or named twice, or a result that is not JSON were written by something else."""
    if not data:
        return ""
    try:
        checkpoint.ParseFromString(data)
    except Exception as err:  # DecodeError and friends
        return str(err) or type(err).__name__
    if not checkpoint.steps:
        return "it holds no step"
    for step in checkpoint.steps:
        if not step.name or step.name in results:
            return f"bad or repeated step name {step.name!r}"
        try:
            json.loads(step.result.decode("utf-8"))
        except ValueError:
            return f"step {step.name!r} has a result that is not JSON"
        results[step.name] = step.result
    return ""


class Worker:
    """Runs handlers for jobs pushed over Broker.Work streams: one, or one per leading node.

        worker = Worker("127.0.0.1:7070", concurrency=4)

        @worker.handler("emails")
        async def send(job: JobContext) -> None:
            await send_email(job.json(), idempotency_key=job.idempotency_key)

        await worker.run()  # until SIGTERM/SIGINT or worker.stop()

    A handler that returns acks the job (its return value, if not None, is kept as the job's
    result: bytes, str, or JSON). One that raises fails the attempt with the exception's text
    (retried after the queue's backoff), except PermanentError (no retry), RetryAfter (retry
    after the given delay) and Snooze (back later, no attempt spent). Heartbeats go out every
    third of the lease while a job is held. The cancellation signal (JobContext) fires on an
    operator's cancel (a handler that then lets the CancelledError propagate ends the attempt
    as a fail "cancelled", one that raises as a fail with its text, and the job stays CANCELLED;
    one that returns normally did the work, and its ack completes the job), a lost lease or the job's time-out (nothing is sent: the broker already ended the
    attempt), and at the end of a graceful stop's grace (the job is released: no attempt spent).
    `concurrency` is a hard bound: a handler that keeps running after its signal (one stuck in a
    blocking call) holds its slot until it returns, even when the broker already ended its
    attempt; no other handler starts in its place meanwhile.

    `concurrency`: handlers at once. `prefetch`: jobs held ready beyond that (they hold leases
    while they wait; a graceful stop gives them back). `lease_duration`: asked for each job
    (None = the job's, else the queue's). `grace`: seconds running handlers get to finish after
    a stop. `reconnect_initial`/`reconnect_max`: reconnect backoff in seconds, doubling, with
    full jitter. `handle_signals`: run() stops gracefully on SIGTERM/SIGINT (main thread only;
    the handlers in place before run() are put back when it returns).
    The connection is a ClientOptions (`options=`), the one the Client takes: addresses, TLS,
    client certificate, token, keepalive (a stream whose broker stopped answering the pings
    ends UNAVAILABLE, and the worker reconnects as after any other end). In a cluster
    (Admin.GetCluster tells where each partition's leader is) the worker holds one stream per
    leader of its queues' partitions, each subscribed to that leader's queues with the same
    worker id and a share of `concurrency + prefetch` (at least 1 each), so no node relays
    them; queues whose partition
    has no leader share one more stream, to any node. `concurrency` stays one pool across the
    streams, and a job's answers go on the stream that pushed it while it is open, else on
    another. When a stream ends, the worker waits the backoff, asks for the layout again (of
    the other addresses when that node is gone) and regroups: streams still wanted keep
    running, the others end, the missing ones open. While it has a stream to any node, it also
    asks again after each backoff delay (growing to `reconnect_max`) and regroups, so queues a
    node relays move to their leader's own stream once the layout names it. Without an answer
    to GetCluster it holds one stream, on the first address that answers.
    `address` and `token` are shorthands that override its fields; `channel` replaces dialing.
    The stream carries `jobbroker-client: jobbroker-python/<version>` (ListWorkers shows it) and
    `authorization: Bearer <token>` when a token is set (default $JOBBROKER_TOKEN). A token the
    broker refuses (UNAUTHENTICATED, PERMISSION_DENIED) ends run() with that error.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        options: ClientOptions | None = None,
        concurrency: int = 1,
        prefetch: int = 0,
        lease_duration: DurationLike | None = None,
        worker_id: str | None = None,
        grace: float = 30.0,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        handle_signals: bool = True,
        channel: grpc.aio.Channel | None = None,
        token: str | None = None,
    ) -> None:
        self.options = resolve_options(address, options, token=token)
        self.addresses = self.options.targets() if channel is None else [GIVEN_CHANNEL]
        self.address = self.addresses[0]
        self.concurrency = max(1, concurrency)
        self.prefetch = max(0, prefetch)
        self.lease_duration = lease_duration
        self.worker_id = worker_id or default_worker_id()
        self.grace = grace
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.handle_signals = handle_signals
        self.stats = WorkerStats()
        self._metadata: Metadata = self.options.metadata()
        self._given_channel = channel
        self._router: Router | None = None  # while run() runs
        self._handlers: dict[str, Handler] = {}
        self._middleware: list[WorkerMiddleware] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._reset()

    def _reset(self) -> None:
        # The newest attempt held of each job, by job id (pushes name jobs by id).
        self._held: dict[str, _Held] = {}
        self._queued: deque[_Held] = deque()  # leased, waiting for a slot, in arrival order
        # Handlers not yet returned, lost ones included: each holds a slot until it returns.
        self._active: set[_Held] = set()
        # Requests waiting for their answer, of every stream (request ids are the worker's).
        self._pending: dict[int, _Pending] = {}
        # The open streams (one per group, worker contract §5), in the order they opened;
        # the first takes what another stream's end leaves.
        self._streams: list[_Stream] = []
        self._retiring: set[_Stream] = set()  # ended by a regrouping, not closed yet
        self._ended: list[_Stream] = []  # ended by the broker, not yet seen by _connection_loop
        self._streams_changed: asyncio.Event | None = None
        # Acks left by a stream that ended while no other was open: the next stream sends them.
        self._acks_waiting: list[broker_pb2.AckRequest] = []
        self._backoff = self.reconnect_initial  # one backoff for the worker, not per stream
        self._retry_timer: asyncio.TimerHandle | None = None
        self._next_request_id = 1
        self._stopping = False
        self._closing = False
        self._stop_event: asyncio.Event | None = None
        self._close_event: asyncio.Event | None = None

    # --- registration ----------------------------------------------------------------------

    def handle(self, queue: str, fn: Handler | TypedHandler) -> None:
        """Registers the handler of `queue`. Call before run().

        A handler with a second parameter gets the payload decoded into that parameter's type
        (`async def send(job, signup: Signup)`): a pydantic model, a dataclass, a TypedDict or
        another JSON type. A payload that does not fit fails the job with no retry
        (PermanentError), before the handler is called."""
        tp = payload_type(fn)
        if tp is None:
            self._handlers[queue] = cast(Handler, fn)
        else:
            self._handlers[queue] = _with_payload(cast(TypedHandler, fn), tp)

    def use(self, middleware: WorkerMiddleware) -> WorkerMiddleware:
        """Adds worker middleware around every handler call: the first added is the outermost.
        Call before run(). Returns it, so it works as a decorator."""
        self._middleware.append(middleware)
        return middleware

    def handler(self, queue: str) -> Callable[[AnyHandler], AnyHandler]:
        """Decorator form of handle()."""

        def register(fn: AnyHandler) -> AnyHandler:
            self.handle(queue, fn)
            return fn

        return register

    # --- running ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks run() to stop gracefully. Safe from any thread and from signal handlers."""
        loop, event = self._loop, self._stop_event
        if loop is None or event is None:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            with contextlib.suppress(RuntimeError):  # a closed loop: nothing runs any more
                loop.call_soon_threadsafe(event.set)

    async def run(self) -> None:
        """Connects, takes jobs, and returns after a graceful stop (stop(), SIGTERM, SIGINT):
        no new jobs, unstarted ones released, running handlers get `grace` seconds, then their
        signal fires and their jobs are released; the answers are awaited, the stream closes.

        A broker that cannot be reached is not an error: the worker reconnects with backoff.
        Raises the broker's refusal of the subscription (InvalidArgumentError for a bad queue
        name) and RuntimeError when no handler is registered.
        """
        if not self._handlers:
            raise RuntimeError("register a handler with handle() or @handler() before run()")
        if self._loop is not None:
            raise RuntimeError("this worker is already running")
        self._reset()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop_event = asyncio.Event()
        self._close_event = asyncio.Event()
        self._streams_changed = asyncio.Event()
        router = Router(self.options, channel=self._given_channel, channel_args=_CHANNEL_OPTIONS)
        self._router = router
        signals = self._install_signals(loop)
        conn = asyncio.create_task(self._connection_loop(), name="jobbroker-worker-stream")
        stop = asyncio.create_task(self._stop_event.wait())
        try:
            await asyncio.wait({conn, stop}, return_when=asyncio.FIRST_COMPLETED)
            if conn.done():
                conn.result()  # the broker refused the subscription: raise it
            else:
                await self._drain()
        finally:
            stop.cancel()
            await self._close(conn)
            await router.close()
            self._router = None
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
            # Last, so that a signal arriving while the worker closes is still absorbed; the
            # handlers in place before run() come back (not the default action, which would let
            # a late second SIGTERM kill a program that ignores or handles it).
            for sig, previous in signals:
                loop.remove_signal_handler(sig)
                if previous is not None:
                    with contextlib.suppress(TypeError, ValueError, OSError):
                        signal.signal(sig, previous)
            self._loop = None

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[tuple[int, Any]]:
        """SIGTERM and SIGINT stop the worker gracefully while run() runs; returns each signal
        installed with the handler it replaced (restored when run() returns)."""
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed: list[tuple[int, Any]] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                previous = signal.getsignal(sig)
                loop.add_signal_handler(sig, self.stop)
                installed.append((sig, previous))
        return installed

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.concurrency, thread_name_prefix="jobbroker-handler"
            )
        return self._pool

    # --- the stream ------------------------------------------------------------------------

    async def _requests(
        self, out: asyncio.Queue[broker_pb2.WorkRequest | None]
    ) -> AsyncIterator[broker_pb2.WorkRequest]:
        while True:
            req = await out.get()
            if req is None:
                return
            yield req

    async def _connection_loop(self) -> None:
        """Opens the worker's streams, and groups them anew each time one ends (worker contract
        §5): after the backoff, the table is fetched again; streams whose group is still wanted
        keep running, the others are ended, the missing ones opened. Raises the end of a stream
        that is the caller's mistake (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED).

        This goes on during a graceful stop (worker contract §6): a stream that ends before the
        close (step 6) is reopened the same way, so that the answers still to come (acks, fails
        and releases of handlers finishing in the grace) reach the broker; a stream opened while
        stopping does not subscribe, so nothing is pushed on it (_open). The close ends this
        loop: nothing is reopened after it.

        While the plan has a group for any node (a partition without a leader in the table),
        the table is also fetched again after each backoff delay, without a stream's end; this
        stops when no such group is left, and at the close."""
        assert self._close_event is not None and self._streams_changed is not None
        assert self._router is not None
        self._backoff = self.reconnect_initial
        while not self._closing:
            plan = await self._plan()
            if self._closing:
                return
            self._regroup(plan)
            if any(not group.address for group, _ in plan):
                # A group for any node (worker contract §5): a node that already knows its
                # partition's new leader relays that stream, and no leader change will end the
                # relay. So ask again after each backoff delay (the same backoff, growing to
                # reconnect_max) and regroup; streams whose group stays keep running, and the
                # queues move to their leader's own stream once the table names it.
                wait = random.uniform(0, self._backoff)
                try:
                    await asyncio.wait_for(self._streams_changed.wait(), wait)
                except asyncio.TimeoutError:
                    self._backoff = min(self._backoff * 2, self.reconnect_max)
                    self._router.mark_stale()
                    continue
            else:
                await self._streams_changed.wait()
            self._streams_changed.clear()
            ended, self._ended = self._ended, []
            if self._closing:
                return
            for stream in ended:
                if stream.end_code not in _RETRYABLE:
                    raise error_from_code(stream.end_code, stream.end_message)
            self.stats.reconnects += len(ended)
            # Full jitter: workers that lost the same broker do not all come back at once.
            wait = random.uniform(0, self._backoff)
            for stream in ended:
                _log.warning(
                    "jobbroker worker: stream to %s ended (%s: %s); regrouping in %.2fs",
                    stream.node.address,
                    stream.end_code.name,
                    stream.end_message,
                    wait,
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._close_event.wait(), wait)
            self._backoff = min(self._backoff * 2, self.reconnect_max)

    async def _plan(self) -> list[tuple[StreamGroup, Node]]:
        """The streams the worker should hold now, each with the node to open it on. With a
        cluster's table: one per leader of the handled queues' partitions (stream_groups), so no
        node relays them. Without one (a single broker, or no answer to GetCluster): one stream
        for every queue, on the node calls for any node go to."""
        assert self._router is not None
        table = await self._router.table()
        queues = sorted(self._handlers)
        max_in_flight = self.concurrency + self.prefetch
        if not table.is_cluster:
            node = await self._router.node_for(Route.any())
            return [(StreamGroup(node.address, tuple(queues), max_in_flight), node)]
        any_address = table.any_address()
        return [
            (group, self._router.node_at(group.address or any_address))
            for group in stream_groups(table, queues, max_in_flight)
        ]

    def _regroup(self, plan: list[tuple[StreamGroup, Node]]) -> None:
        wanted = {group for group, _ in plan}
        for stream in list(self._streams):
            if stream.group not in wanted:
                self._retire(stream)
        have = {stream.group for stream in self._streams}
        for group, node in plan:
            if group not in have:
                self._open(group, node)

    def _open(self, group: StreamGroup, node: Node) -> None:
        """Opens a stream for `group` on `node` and subscribes it; what waits for a stream (the
        answers of jobs whose stream ended while no other was open) goes out on it. While the
        worker stops, the stream is not subscribed: it only carries the answers still to come
        (the broker takes them without a subscription and routes them by job id), and the
        broker pushes nothing on it (what a stream is pushed while stopping is released at
        once anyway, _on_job)."""
        assert self._loop is not None
        stream = _Stream(group, node)
        assert stream.out is not None
        stream.call = node.broker.Work(self._requests(stream.out), metadata=self._metadata)
        self._streams.append(stream)
        subscribe: asyncio.Future[broker_pb2.WorkResult] | None = None
        if not self._stopping:
            sub = broker_pb2.SubscribeRequest(
                queues=list(group.queues),
                worker_id=self.worker_id,
                max_in_flight=group.share,
                batch_pushes=True,
            )
            if self.lease_duration is not None:
                sub.lease_duration.CopyFrom(to_duration(self.lease_duration))
            subscribe = self._send(broker_pb2.WorkRequest(subscribe=sub), stream=stream)
        # The acks, fails, releases and checkpoints left unanswered by a stream that ended, with
        # their lease ids: the broker answers a repeat of an applied one OK, and any node routes
        # an answer to its job's leader.
        for p in self._pending.values():
            if p.resend and p.stream is None:
                p.refused = False
                p.stream = stream
                stream.out.put_nowait(p.req)
        if self._acks_waiting:
            stream.acks, self._acks_waiting = self._acks_waiting, []
            self._flush_acks(stream)
        stream.task = self._loop.create_task(
            self._read(stream, subscribe), name=f"jobbroker-worker-stream {node.address}"
        )

    async def _read(
        self, stream: _Stream, subscribe: asyncio.Future[broker_pb2.WorkResult] | None
    ) -> None:
        call = stream.call
        try:
            async for resp in call:
                self._on_message(resp, stream)
                if not stream.subscribed and subscribe is not None and subscribe.done():
                    result = subscribe.result()
                    if result.code != _OK:
                        stream.end_code = error_from_code(result.code, "").code
                        stream.end_message = f"subscribe refused: {result.message}"
                        call.cancel()
                        break
                    stream.subscribed = True
                    self._backoff = self.reconnect_initial
        except grpc.aio.AioRpcError as err:
            mapped = error_from_rpc(err)
            stream.end_code, stream.end_message = mapped.code, mapped.message
        finally:
            self._stream_ended(stream)

    def _retire(self, stream: _Stream) -> None:
        """Ends a stream whose group is no longer wanted: half-closed now (nothing more goes out
        on it; the broker still answers what it carried), cancelled after 2 s. Its jobs keep
        running and answer on the other streams: their leases stay valid."""
        assert self._loop is not None and stream.out is not None
        stream.retired = True
        self._streams.remove(stream)
        self._retiring.add(stream)
        stream.out.put_nowait(None)
        stream.out = None
        self._loop.call_later(2.0, stream.call.cancel)

    def _stream_ended(self, stream: _Stream) -> None:
        """What a stream carried moves to another open stream, or waits for the next one; a
        request that is not resent is answered UNAVAILABLE."""
        if stream.out is not None:
            stream.out.put_nowait(None)
            stream.out = None
        with contextlib.suppress(ValueError):
            self._streams.remove(stream)
        self._retiring.discard(stream)
        target = self._streams[0] if self._streams else None
        for rid, p in list(self._pending.items()):
            if p.stream is not stream:
                continue
            if not p.resend:
                del self._pending[rid]
                if not p.future.done():
                    p.future.set_result(
                        broker_pb2.WorkResult(
                            request_id=rid, code=_UNAVAILABLE, message="the stream ended"
                        )
                    )
                continue
            p.refused = False
            p.stream = target
            if target is not None:
                assert target.out is not None
                target.out.put_nowait(p.req)
        stream.acks = stream.ack_retry + stream.acks
        stream.ack_retry = []
        stream.ack_request = 0
        self._flush_acks(stream)
        # The node may have died or stopped leading the queues: ask where they are now.
        if self._router is not None:
            self._router.mark_stale()
        if not stream.retired and self._streams_changed is not None:
            self._ended.append(stream)
            self._streams_changed.set()

    def _send(
        self,
        req: broker_pb2.WorkRequest,
        *,
        resend: bool = False,
        stream: _Stream | None = None,
    ) -> asyncio.Future[broker_pb2.WorkResult]:
        """Sends `req` with a fresh request id on `stream` while it is open, else on any open
        stream; the future gets its WorkResult. Without an open stream, a resendable request
        waits for the next one; any other is answered UNAVAILABLE."""
        assert self._loop is not None
        req.request_id = self._next_request_id
        self._next_request_id += 1
        fut: asyncio.Future[broker_pb2.WorkResult] = self._loop.create_future()
        out = None if stream is None else stream.out
        if out is None:
            stream = self._streams[0] if self._streams else None
            out = None if stream is None else stream.out
            if out is None and not resend:
                fut.set_result(broker_pb2.WorkResult(code=_UNAVAILABLE, message="not connected"))
                return fut
        self._pending[req.request_id] = _Pending(req, fut, resend, stream)
        if out is not None:
            out.put_nowait(req)
        return fut

    def _on_message(self, resp: broker_pb2.WorkResponse, stream: _Stream) -> None:
        kind = resp.WhichOneof("response")
        if kind == "job":
            self._on_job(resp.job, stream)
        elif kind == "job_batch":
            for job in resp.job_batch.jobs:  # each exactly as if pushed alone
                self._on_job(job, stream)
        elif kind == "result":
            self._on_result(resp.result, stream)
        elif kind == "lease_lost":
            held = self._held.get(resp.lease_lost.job_id)
            if held is not None:
                timed_out = resp.lease_lost.outcome == job_pb2.ATTEMPT_OUTCOME_TIMED_OUT
                self._lose(held, _TIMED_OUT if timed_out else _LEASE_LOST)
        elif kind == "cancel_requested":
            held = self._held.get(resp.cancel_requested.job_id)
            if held is not None:
                self._signal_cancel(held, _OPERATOR_CANCEL)

    def _on_result(self, result: broker_pb2.WorkResult, stream: _Stream) -> None:
        p = self._pending.pop(result.request_id, None)
        if p is None:
            return
        if p.resend and result.code == _UNAVAILABLE:
            # Not final (worker contract §4): the broker is shutting down, or (cluster) the
            # partition is between leaders and says "retry". The request goes out again after
            # _ANSWER_RETRY_DELAY, or on another stream if this one ends first; dropping it
            # would have the job run again when its lease runs out. An unanswered ack message
            # stays the one in flight: acks completing meanwhile wait for its answer.
            self._pending[result.request_id] = p
            p.refused = True
            _log.info(
                "jobbroker worker: %s refused for now (%s); sending it again",
                p.req.WhichOneof("request"),
                result.message,
            )
            self._schedule_resend()
            return
        kind = p.req.WhichOneof("request")
        if kind == "heartbeat":
            held = self._held.get(p.req.heartbeat.job_id)
            if held is not None and held.job.lease_id == p.req.heartbeat.lease_id:
                if result.code in (_FAILED_PRECONDITION, _NOT_FOUND):
                    self._lose(held, _LEASE_LOST)
                elif result.cancel_requested:
                    self._signal_cancel(held, _OPERATOR_CANCEL)
        elif kind in ("ack", "ack_batch", "fail", "release") and result.code not in (
            _OK,
            _FAILED_PRECONDITION,
            _NOT_FOUND,
        ):
            _log.warning("jobbroker worker: %s refused: %s", kind, result.message)
        if kind == "ack" and result.code != _OK:
            self.stats.acks_refused += 1
        elif kind == "ack_batch":
            if result.code != _OK:
                self.stats.acks_refused += len(p.req.ack_batch.acks)
            else:
                self.stats.acks_refused += sum(
                    1 for item in result.item_errors if item.code != _UNAVAILABLE
                )
        for item in result.item_errors:
            # An ack the broker did not apply; the others in the batch were. A stale or unknown
            # lease means another attempt owns the job now: nothing to do, as for a single ack.
            # UNAVAILABLE is not final: that ack goes out again after _ANSWER_RETRY_DELAY.
            if (
                item.code == _UNAVAILABLE
                and kind == "ack_batch"
                and 0 <= item.index < len(p.req.ack_batch.acks)
            ):
                ack = p.req.ack_batch.acks[item.index]
                _log.info(
                    "jobbroker worker: ack of job %s refused for now (%s); sending it again",
                    ack.job_id,
                    item.message,
                )
                retry = broker_pb2.AckRequest()
                retry.CopyFrom(ack)
                stream.ack_retry.append(retry)
                self._schedule_resend()
            elif item.code in (_FAILED_PRECONDITION, _NOT_FOUND):
                _log.debug("jobbroker worker: ack not applied: %s", item.message)
            else:
                _log.warning("jobbroker worker: ack not applied: %s", item.message)
        if result.request_id == stream.ack_request:
            stream.ack_request = 0
            self._flush_acks(stream)  # what completed while this one was unanswered
        if not p.future.done():
            p.future.set_result(result)

    def _schedule_resend(self) -> None:
        """Arranges for _resend_refused to run after _ANSWER_RETRY_DELAY (once for all)."""
        if self._retry_timer is None and self._loop is not None and not self._closing:
            self._retry_timer = self._loop.call_later(_ANSWER_RETRY_DELAY, self._resend_refused)

    def _resend_refused(self) -> None:
        """Sends again what the broker answered UNAVAILABLE, on the stream it went out on while
        that is open, else on another; without any, what a stream that ends leaves waits for the
        next stream (_stream_ended, _open)."""
        self._retry_timer = None
        if self._closing:
            return
        other = self._streams[0] if self._streams else None
        for rid in sorted(self._pending):
            p = self._pending[rid]
            if not p.refused:
                continue
            stream = p.stream if p.stream is not None and p.stream.out is not None else other
            if stream is None or stream.out is None:
                continue
            p.refused = False
            p.stream = stream
            stream.out.put_nowait(p.req)
        for stream in list(self._streams):
            self._requeue_refused_acks(stream)

    def _requeue_refused_acks(self, stream: _Stream) -> None:
        """Puts the stream's acks refused for now back in front of its line, and sends them
        unless an ack message is unanswered (they then go out with its answer)."""
        if stream.ack_retry:
            stream.acks = stream.ack_retry + stream.acks
            stream.ack_retry = []
            self._flush_acks(stream)

    def _on_job(self, job: broker_pb2.LeasedJob, stream: _Stream) -> None:
        if self._stopping:  # pushed before our drain arrived: give it straight back
            self._release(job, stream)
            return
        assert self._loop is not None
        # Seconds since the epoch, without datetimes: this runs once per job.
        now = time.time()
        lease = max(timestamp_seconds(job.lease_deadline) - now, 0.3)
        old = self._held.get(job.job_id)
        if old is not None:  # a newer attempt: the one we held is gone
            self._lose(old, _LEASE_LOST)
        held = _Held(job, lease, stream)
        self._held[job.job_id] = held
        self._arm_heartbeat(held)
        if job.HasField("timeout_at"):
            # The helper fires the signal itself at the time-out; the broker's lease_lost for
            # it is sent at the same moment, and the handler need not wait for it.
            left = timestamp_seconds(job.timeout_at) - now
            held.timeout_timer = self._loop.call_later(
                max(left, 0.0), self._lose, held, _TIMED_OUT
            )
        self._queued.append(held)  # jobs start in arrival order
        self._fill_slots()

    def _release(
        self,
        job: broker_pb2.LeasedJob,
        stream: _Stream | None,
        delay: DurationLike | None = None,
    ) -> None:
        req = broker_pb2.WorkRequest(
            release=broker_pb2.ReleaseRequest(job_id=job.job_id, lease_id=job.lease_id)
        )
        if delay is not None:
            req.release.delay.CopyFrom(to_duration(delay))
        self._send(req, resend=True, stream=stream)
        self.stats.released += 1

    def _arm_heartbeat(self, held: _Held) -> None:
        assert self._loop is not None
        held.heartbeat_timer = self._loop.call_later(held.lease / 3, self._heartbeat, held)

    def _heartbeat(self, held: _Held) -> None:
        """Every third of the lease while the attempt is ours (worker contract §2)."""
        held.heartbeat_timer = None
        if held.lost or held.ended:
            return
        req = broker_pb2.WorkRequest(
            heartbeat=broker_pb2.HeartbeatRequest(
                job_id=held.job.job_id, lease_id=held.job.lease_id
            )
        )
        self._send(req, stream=held.stream)
        self._arm_heartbeat(held)

    async def _save_checkpoint(self, held: _Held, data: bytes, step: str) -> None:
        req = broker_pb2.WorkRequest(
            heartbeat=broker_pb2.HeartbeatRequest(
                job_id=held.job.job_id, lease_id=held.job.lease_id, checkpoint=data
            )
        )
        result = await self._send(req, resend=True, stream=held.stream)
        if result.code != _OK:
            held.no_ack = True
            raise error_from_code(
                result.code,
                f"durable step {step!r} finished but its result was not saved "
                f"({result.message}): the lease is gone, this attempt will not be acked",
            )

    def _report_progress(self, held: _Held, data: bytes) -> None:
        if held.lost or held.ended:
            return
        held.progress_next = data  # replaces a value not yet sent: the newest wins
        if not held.progress_in_flight:
            self._send_progress(held)

    def _send_progress(self, held: _Held) -> None:
        data, held.progress_next = held.progress_next, None
        if data is None or held.lost or held.ended:
            return
        req = broker_pb2.WorkRequest(
            heartbeat=broker_pb2.HeartbeatRequest(
                job_id=held.job.job_id, lease_id=held.job.lease_id, progress=data
            )
        )
        held.progress_in_flight = True
        # Resent after a reconnect like a checkpoint, so the newest value always arrives.
        answer = self._send(req, resend=True, stream=held.stream)
        answer.add_done_callback(lambda _: self._progress_answered(held))

    def _progress_answered(self, held: _Held) -> None:
        held.progress_in_flight = False
        self._send_progress(held)

    # --- cancellation ----------------------------------------------------------------------

    def _signal_cancel(self, held: _Held, reason: str) -> None:
        """Fires the handler's cancellation signal (once; the first reason is kept)."""
        if held.ended:
            return
        if held.ctx is None:  # waiting for a slot: it never starts, the attempt ends now
            self._drop_unstarted(held)
            held.cancel_reason = reason
            fail = broker_pb2.FailRequest(
                job_id=held.job.job_id, lease_id=held.job.lease_id, error="cancelled"
            )
            self._send(broker_pb2.WorkRequest(fail=fail), resend=True, stream=held.stream)
            self.stats.failed += 1
            return
        first = held.cancel_reason is None
        if first:
            held.cancel_reason = reason
        held.ctx.cancel_event.set()
        task = held.task
        if first and held.in_handler and task is not None and not task.done():
            held.signal_cancelled = True
            task.cancel()

    def _lose(self, held: _Held, reason: str) -> None:
        """The broker ended the attempt (lease lost, time-out): stop heartbeating and fire the
        signal; the handler's end will send nothing. A handler that keeps running keeps its slot
        until it returns: concurrency is a hard bound (worker contract §3), so a handler stuck in
        a blocking call cannot pile up new ones beside it."""
        if held.lost or held.ended:
            return
        held.lost = True
        self._stop_timers(held)
        if held.ctx is None:  # still waiting for a slot: it never starts
            self._drop_unstarted(held)
            return
        _log.info("jobbroker worker: job %s: %s", held.job.job_id, reason)
        self._signal_cancel(held, reason)

    def _drop_unstarted(self, held: _Held) -> None:
        """Forgets a job that waited for a slot and will not start."""
        held.ended = True
        self._stop_timers(held)
        with contextlib.suppress(ValueError):
            self._queued.remove(held)
        if self._held.get(held.job.job_id) is held:
            del self._held[held.job.job_id]

    def _stop_timers(self, held: _Held) -> None:
        if held.heartbeat_timer is not None:
            held.heartbeat_timer.cancel()
            held.heartbeat_timer = None
        if held.timeout_timer is not None:
            held.timeout_timer.cancel()

    # --- running handlers ------------------------------------------------------------------

    def _start(self, held: _Held) -> None:
        held.ctx = JobContext(self, held)
        self._active.add(held)
        held.task = asyncio.create_task(self._run_job(held))

    def _fill_slots(self) -> None:
        while self._queued and not self._stopping and len(self._active) < self.concurrency:
            self._start(self._queued.popleft())

    async def _cancellable(self, held: _Held, work: Awaitable[Any]) -> Any:
        """Awaits an async handler in _run_job's task; the cancellation signal cancels that
        task while the handler runs (_signal_cancel)."""
        if held.cancel_reason is not None:  # the signal fired before the handler began
            if inspect.iscoroutine(work):
                work.close()
            raise asyncio.CancelledError
        held.in_handler = True
        try:
            return await work
        finally:
            held.in_handler = False

    async def _invoke(self, held: _Held, fn: Handler, ctx: JobContext) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await self._cancellable(held, fn(ctx))
        loop = asyncio.get_running_loop()
        # In the caller's context (contextvars): what middleware set, such as the current
        # tracing span, is seen by a plain handler's thread too.
        context = contextvars.copy_context()
        value = await loop.run_in_executor(self._executor(), context.run, fn, ctx)
        if inspect.isawaitable(value):
            value = await self._cancellable(held, value)
        return value

    async def _call_chain(self, held: _Held, fn: Handler, ctx: JobContext) -> Any:
        """The handler inside the middleware, the first registered outermost."""

        async def handler(job: JobContext) -> Any:
            return await self._invoke(held, fn, job)

        call: HandlerNext = handler
        for mw in reversed(self._middleware):
            call = _bind_worker(mw, call)
        return await call(ctx)

    async def _run_job(self, held: _Held) -> None:
        job = held.job
        assert held.ctx is not None
        fail: broker_pb2.FailRequest | None = None
        snooze: DurationLike | None = None
        result = b""
        try:
            fn = self._handlers[job.queue]
            if self._middleware:
                value = await self._call_chain(held, fn, held.ctx)
            else:  # one coroutine frame less per job
                value = await self._invoke(held, fn, held.ctx)
            result = b"" if value is None else encode_payload(value)
        except PermanentError as err:
            fail = broker_pb2.FailRequest(error=str(err) or "permanent error", permanent=True)
        except RetryAfter as err:
            fail = broker_pb2.FailRequest(error=str(err))
            fail.retry_after.CopyFrom(to_duration(err.delay))
        except Snooze as err:
            snooze = err.delay
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if held.signal_cancelled and task is not None:
                held.signal_cancelled = False
                if task.uncancel() > 0:
                    raise  # the worker is closing as well: nothing to send
            elif task is not None and task.cancelling():
                raise  # this task itself is cancelled: the worker is closing, nothing to send
            # The handler ended on its cancellation signal (or cancelled itself).
            fail = broker_pb2.FailRequest(error="cancelled")
        except Exception as err:  # noqa: BLE001 - any handler error fails the attempt
            text = str(err)
            fail = broker_pb2.FailRequest(
                error=f"{type(err).__name__}: {text}" if text else type(err).__name__
            )
        self._complete(held, fail, result, snooze)

    def _complete(
        self,
        held: _Held,
        fail: broker_pb2.FailRequest | None,
        result: bytes,
        snooze: DurationLike | None,
    ) -> None:
        job = held.job
        held.ended = True
        self._stop_timers(held)
        if self._held.get(job.job_id) is held:
            del self._held[job.job_id]
        self._active.discard(held)
        if held.answered:
            pass  # released at the end of a stop's grace already
        elif held.lost:
            # The broker ended the attempt (and refuses a stale answer): send nothing.
            _log.debug("jobbroker worker: job %s ended after %s", job.job_id, held.cancel_reason)
        elif held.cancel_reason == _STOPPING:
            self._release(job, held.stream)  # the stop was not the job's fault: no attempt spent
        elif snooze is not None:
            self._release(job, held.stream, snooze)
        elif fail is None and held.no_ack:
            _log.warning("jobbroker worker: job %s not acked: its lease is gone", job.job_id)
        elif fail is None:
            # Coalesced on the stream that pushed the job (_flush_acks moves them to another
            # when that one ended).
            stream = held.stream
            stream.acks.append(
                broker_pb2.AckRequest(job_id=job.job_id, lease_id=job.lease_id, result=result)
            )
            self.stats.acked += 1
            self._flush_acks(stream)
        else:
            fail.job_id, fail.lease_id = job.job_id, job.lease_id
            self._send(broker_pb2.WorkRequest(fail=fail), resend=True, stream=held.stream)
            self.stats.failed += 1
        self._fill_slots()

    def _flush_acks(self, stream: _Stream) -> None:
        """Sends the stream's buffered acks, unless an ack message of it is unanswered: they
        then wait for its answer and go out together (one AckBatch, or a plain ack when there is
        one). An idle worker's ack thus leaves at once. A stream that ended hands its acks to
        another open stream, or, without one, to the next stream opened (_open)."""
        if stream.ack_request or not stream.acks:
            return
        if stream.out is None:
            acks, stream.acks = stream.acks, []
            other = self._streams[0] if self._streams else None
            if other is None:
                self._acks_waiting.extend(acks)
                return
            other.acks.extend(acks)
            stream = other
            if stream.ack_request:
                return
        n = min(len(stream.acks), _MAX_ACKS_PER_MESSAGE)
        batch, stream.acks = stream.acks[:n], stream.acks[n:]
        if n == 1:
            req = broker_pb2.WorkRequest(ack=batch[0])
        else:
            req = broker_pb2.WorkRequest(ack_batch=broker_pb2.AckBatchRequest(acks=batch))
        self._send(req, resend=True, stream=stream)
        stream.ack_request = req.request_id
        self.stats.ack_messages += 1

    # --- stopping --------------------------------------------------------------------------

    async def _drain(self) -> None:
        """The graceful stop (worker contract §6): stop taking, release what has not started,
        give running handlers the grace, then fire their signal and release their jobs, and
        wait for the answers. Steps 1 and 2 go to every open stream; a stream that ends
        meanwhile is reopened, not subscribed (_connection_loop, _open), and what it left (and
        what waits for a stream) goes out on the next one. The wait is bounded even when no
        stream comes back: _close then drops what is still unanswered."""
        assert self._loop is not None
        self._stopping = True
        deadline = self._loop.time() + max(self.grace, 0.0)
        for stream in list(self._streams):
            flow = broker_pb2.FlowRequest(max_in_flight=0)
            self._send(broker_pb2.WorkRequest(flow=flow), stream=stream)
        while self._queued:
            held = self._queued[0]
            self._drop_unstarted(held)
            self._release(held.job, held.stream)
        tasks = {h.task for h in self._active if h.task is not None}
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=max(self.grace, 0.0))
            if late:
                await self._cancel_after_grace()
        # The answers to the last acks, fails and releases, bounded by the grace period (and a
        # moment past it). Acks buffered behind the unanswered ack message go out when its answer
        # arrives, adding a pending request: so look again after each answer.
        end = max(deadline, self._loop.time()) + 1.0
        while True:
            answers = [p.future for p in self._pending.values() if p.resend]
            left = end - self._loop.time()
            unsent = self._acks_waiting or any(
                s.acks or s.ack_retry for s in self._streams + list(self._retiring)
            )
            if (not answers and not unsent) or left <= 0:
                break
            if not answers:  # acks refused for now wait for their resend (_resend_refused)
                await asyncio.sleep(min(0.05, left))
                continue
            await asyncio.wait(answers, timeout=left, return_when=asyncio.FIRST_COMPLETED)

    async def _cancel_after_grace(self) -> None:
        """Handlers still running at the end of the grace: their signal fires, and whatever they
        end with, their job is released (no attempt spent). One that has not returned a second
        later (it ignores the signal, or is a thread that cannot be interrupted) has its job
        released at once; its end then sends nothing."""
        late = list(self._active)
        for held in late:
            self._signal_cancel(held, _STOPPING)
        tasks = {h.task for h in late if h.task is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for held in late:
            if not held.ended and not held.lost and not held.answered:
                _log.warning(
                    "jobbroker worker: job %s: its handler ignores its cancellation; released",
                    held.job.job_id,
                )
                held.answered = True
                self._stop_timers(held)
                self._release(held.job, held.stream)

    async def _close(self, conn: asyncio.Task[None]) -> None:
        self._stopping = True
        self._closing = True
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self._close_event is not None:
            self._close_event.set()
        if self._streams_changed is not None:
            self._streams_changed.set()  # _connection_loop may be waiting for a stream's end
        for held in list(self._held.values()) + list(self._active):
            self._stop_timers(held)
            if held.task is not None:
                held.task.cancel()
        streams = self._streams + list(self._retiring)
        for stream in self._streams:
            if stream.out is not None:
                stream.out.put_nowait(None)  # half-close: the broker ends the stream
                stream.out = None
        self._streams = []
        tasks = {conn} | {s.task for s in streams if s.task is not None}
        _, late = await asyncio.wait(tasks, timeout=2.0)
        for stream in streams:
            if stream.task in late:
                stream.call.cancel()
        for task in late:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, JobBrokerError):
                await task


def _bind_worker(mw: WorkerMiddleware, nxt: HandlerNext) -> HandlerNext:
    async def call(job: JobContext) -> Any:
        return await mw(job, nxt)

    return call
