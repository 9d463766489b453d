"""ClientOptions: how the Client, the SyncClient and the Worker reach the broker.

One object for all three, so a program that enqueues and works jobs configures the connection
once: the addresses, TLS, the client certificate, the bearer token, the unary calls' deadline and
their retries, the keepalive pings.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from ._metadata import Metadata, call_metadata

__all__ = [
    "ClientOptions",
    "DEFAULT_ADDRESS",
    "DEFAULT_DEADLINE",
    "DEFAULT_KEEPALIVE_TIME",
    "DEFAULT_KEEPALIVE_TIMEOUT",
    "MAX_BATCH_JOBS",
]

DEFAULT_ADDRESS = "127.0.0.1:7070"
# Seconds. Long enough for a synced write-ahead-log append on a busy disk, short enough that a
# broker that stopped answering surfaces as an error rather than a hung request.
DEFAULT_DEADLINE = 10.0
# The most jobs one EnqueueBatch may carry (the broker refuses more).
MAX_BATCH_JOBS = 1000
# Seconds. A connection that has carried nothing for this long is pinged, and given up (its
# calls, a worker's Work stream above all, end UNAVAILABLE and reconnect) when the ping has no
# answer within the timeout: TCP alone does not notice a broker that froze, lost power or sits
# behind a firewall that drops packets, and a stream on such a connection would wait forever.
DEFAULT_KEEPALIVE_TIME = 10.0
DEFAULT_KEEPALIVE_TIMEOUT = 5.0
# gRPC's channel arguments are C ints of milliseconds.
_MAX_MILLIS = 2**31 - 1

# PEM may be given inline (bytes, or text that starts like PEM) or as a file to read.
PemSource = str | bytes | os.PathLike[str]


def _read_pem(source: PemSource, what: str) -> bytes:
    if isinstance(source, bytes):
        return source
    text = os.fspath(source)
    if text.lstrip().startswith("-----BEGIN"):
        return text.encode("ascii")
    try:
        return pathlib.Path(text).read_bytes()
    except OSError as err:
        raise ValueError(f"ClientOptions.{what}: cannot read {text!r}: {err}") from err


def _millis(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _check_seconds(name: str, value: object) -> None:
    """More than 0 seconds, finite, and within a gRPC channel argument's milliseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"ClientOptions.{name}: seconds, not {value!r}")
    if not 0 < value <= _MAX_MILLIS / 1000:  # also refuses NaN and infinity
        raise ValueError(
            f"ClientOptions.{name}: more than 0 and at most {_MAX_MILLIS // 1000} seconds "
            f"(got {value!r})"
        )


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"ClientOptions.{name}: an integer, not {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"{low} to {high}" if high is not None else f"at least {low}"
        raise ValueError(f"ClientOptions.{name}: {bounds} (got {value})")


@dataclasses.dataclass(frozen=True)
class ClientOptions:
    """The connection settings shared by Client, SyncClient and Worker.

        options = jobbroker.ClientOptions(
            addresses=["broker-0:7070", "broker-1:7070"],
            tls="/etc/jobbroker/ca.pem", cert="client.pem", key="client.key",
            token=os.environ["BILLING_TOKEN"])
        client = jobbroker.Client(options=options)
        worker = jobbroker.Worker(options=options, concurrency=4)

    Every field has a default; see each field's comment. The options are immutable: derive a
    variant with dataclasses.replace(options, deadline=30).
    """

    # The broker, host:port. None: $JOBBROKER_ADDRESS, else 127.0.0.1:7070. Either may list
    # several, separated by commas (taken as `addresses`).
    address: str | None = None
    # Several brokers (a cluster's nodes), asked in order where each partition's leader is; a
    # call that fails UNAVAILABLE makes the client ask again, of the others when that one is
    # gone (a retried call goes to the answer at once; a call that is not retried fails, and the
    # next call does). Takes precedence over `address` when not empty.
    addresses: Sequence[str] = ()
    # TLS. False: plaintext. True: TLS trusting the system's roots. A CA certificate (a file's
    # path, or PEM as bytes or text): TLS trusting that CA only.
    tls: bool | PemSource = False
    # Mutual TLS: this client's certificate chain and private key (paths or PEM), both or
    # neither. Either one turns TLS on (with the system's roots when `tls` is False).
    cert: PemSource | None = None
    key: PemSource | None = None
    # The name the broker's certificate must carry when it differs from the address's host
    # (an address by IP behind a certificate for a DNS name). Empty: the address's host.
    server_name: str = ""
    # Bearer token: every call carries `authorization: Bearer <token>`. None: $JOBBROKER_TOKEN
    # (never a command-line flag: every user of a machine can read a program's arguments).
    # "": no token even when the variable is set.
    token: str | None = None
    # Seconds each unary call may take (each attempt of a retried one). None: no deadline.
    # Calls take a `deadline=` keyword to override it once.
    deadline: float | None = DEFAULT_DEADLINE
    # Attempts of a unary call that is safe to repeat (a read, an ack, an enqueue whose jobs all
    # have a dedup key) when it fails UNAVAILABLE; 1 turns retries off. Other calls are tried
    # once whatever this says: repeating them could do the work twice.
    retry_attempts: int = 3
    # Seconds before the first retry; doubled for each next one, with full jitter.
    retry_backoff: float = 0.05
    # Keepalive of every channel these options open: after this many seconds without a frame
    # from the broker, the channel pings it, with or without a call open, as often as that
    # (no cap on pings without data between). None: no pings (gRPC's default; a frozen or
    # cut-off broker then goes unnoticed until the operating system gives the connection up,
    # which for a connection that sends nothing is never). The broker answers pings as often
    # as once a second and closes a connection that pings more often.
    keepalive_time: float | None = DEFAULT_KEEPALIVE_TIME
    # Seconds a ping waits for its answer; then the connection is closed and its calls end
    # UNAVAILABLE: the Worker reconnects with its backoff, a Client's next call connects anew.
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
    # Extra gRPC channel arguments, e.g. [("grpc.max_receive_message_length", 64 << 20)]. They
    # win over the ones these options set (the keepalive's "grpc.keepalive_time_ms",
    # "grpc.keepalive_timeout_ms", "grpc.http2.ping_timeout_ms",
    # "grpc.keepalive_permit_without_calls", "grpc.http2.max_pings_without_data", and the
    # Worker's reconnect backoff).
    channel_options: Sequence[tuple[str, Any]] = ()
    # grpc.aio client interceptors, applied to every call of the channels these options open.
    interceptors: Sequence[Any] = ()
    # Enqueue coalescing (worker contract §10): concurrent enqueue() calls of one partition go
    # out together as one EnqueueBatch, each caller still answered on its own. False: every
    # enqueue() is one unary Enqueue, as `enqueue(..., batch=False)` is for one call.
    batching: bool = True
    # A batch is sent once it holds this many jobs (1 to 1000)...
    batch_max_jobs: int = 100
    # ... or once its jobs' payload and header (name and value) bytes reach this many.
    batch_max_bytes: int = 1 << 20
    # Seconds a batch that could be sent waits for more jobs. 0: until the end of the current
    # turn of the event loop, so the enqueue() calls of one turn go together.
    batch_linger: float = 0.0
    # Batches of one partition in flight at once; later jobs wait in the open batch, which is
    # sent when one of them ends (under load, that wait is what makes the batches).
    batch_max_in_flight: int = 4

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("ClientOptions: cert and key go together (mutual TLS needs both)")
        if self.retry_attempts < 1:
            raise ValueError("ClientOptions.retry_attempts: at least 1")
        if isinstance(self.addresses, str):
            raise TypeError("ClientOptions.addresses: a list of host:port, not one string")
        if self.keepalive_time is not None:
            _check_seconds("keepalive_time", self.keepalive_time)
        _check_seconds("keepalive_timeout", self.keepalive_timeout)
        self._check_batching()

    def _check_batching(self) -> None:
        # Refused here rather than at the first enqueue, where the error would surface far
        # from the configuration that caused it.
        if not isinstance(self.batching, bool):
            raise TypeError(f"ClientOptions.batching: True or False, not {self.batching!r}")
        _check_int("batch_max_jobs", self.batch_max_jobs, 1, MAX_BATCH_JOBS)
        _check_int("batch_max_bytes", self.batch_max_bytes, 1, None)
        _check_int("batch_max_in_flight", self.batch_max_in_flight, 1, None)
        linger = self.batch_linger
        if isinstance(linger, bool) or not isinstance(linger, (int, float)):
            raise TypeError(f"ClientOptions.batch_linger: seconds, not {linger!r}")
        if not 0 <= linger < float("inf"):  # also refuses NaN
            raise ValueError(f"ClientOptions.batch_linger: 0 or more seconds (got {linger!r})")

    def targets(self) -> list[str]:
        """The addresses to try, in order."""
        if self.addresses:
            return list(self.addresses)
        # A comma-separated list names several, as the variable, the other clients and the CLI do.
        given = self.address or os.environ.get("JOBBROKER_ADDRESS", "")
        listed = [a.strip() for a in given.split(",") if a.strip()]
        return listed or [self.address or DEFAULT_ADDRESS]

    def metadata(self) -> Metadata:
        """What every call carries: `jobbroker-client: jobbroker-python/<version>` and the
        bearer token, if any."""
        return call_metadata(self.token)

    @property
    def uses_tls(self) -> bool:
        return self.tls is not False or self.cert is not None

    def credentials(self) -> grpc.ChannelCredentials | None:
        """The channel credentials for TLS; None for plaintext."""
        if not self.uses_tls:
            return None
        roots = None if isinstance(self.tls, bool) else _read_pem(self.tls, "tls")
        cert = None if self.cert is None else _read_pem(self.cert, "cert")
        key = None if self.key is None else _read_pem(self.key, "key")
        return grpc.ssl_channel_credentials(
            root_certificates=roots, private_key=key, certificate_chain=cert
        )

    def keepalive_args(self) -> list[tuple[str, int]]:
        """The channel arguments of the keepalive; none when keepalive_time is None."""
        if self.keepalive_time is None:
            return []
        timeout = _millis(self.keepalive_timeout)
        return [
            ("grpc.keepalive_time_ms", _millis(self.keepalive_time)),
            ("grpc.keepalive_timeout_ms", timeout),
            # In the gRPC core of grpcio 1.85 every ping waits this long for its answer
            # (default 60 s), and a keepalive ping that falls due while another ping is out
            # (gRPC's own bandwidth probe, sent after reads) rides on that one, with its
            # timeout: without this a frozen broker was noticed after a minute, not after
            # keepalive_timeout.
            ("grpc.http2.ping_timeout_ms", timeout),
            # Pings on a channel without a call too (a producer between calls): a dead
            # connection is dropped before the next call would find it.
            ("grpc.keepalive_permit_without_calls", 1),
            # gRPC stops pinging after two pings with no data sent between (its default): an
            # idle Work stream would be checked twice, then never again.
            ("grpc.http2.max_pings_without_data", 0),
        ]

    def channel_args(self, extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
        """The arguments of every channel these options open: `channel_options`, then the
        keepalive and `extra` (the caller's, e.g. the worker's reconnect backoff) where
        `channel_options` does not set the same key. gRPC takes the first of a repeated key."""
        args = list(self.channel_options)
        given = {key for key, _ in args}
        args += [(k, v) for k, v in [*self.keepalive_args(), *extra] if k not in given]
        return args

    def open_channel(
        self, target: str, extra: Sequence[tuple[str, Any]] = ()
    ) -> grpc.aio.Channel:
        """A grpc.aio channel to `target` with these options (TLS, keepalive, interceptors);
        `extra` are channel arguments the caller adds (the worker's reconnect backoff), which
        `channel_options` override."""
        args = self.channel_args(extra)
        if self.server_name:
            args.append(("grpc.ssl_target_name_override", self.server_name))
        interceptors = list(self.interceptors) or None
        creds = self.credentials()
        if creds is None:
            return grpc.aio.insecure_channel(target, options=args, interceptors=interceptors)
        return grpc.aio.secure_channel(target, creds, options=args, interceptors=interceptors)
