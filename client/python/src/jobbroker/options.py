"""ClientOptions: how the Client, the SyncClient and the Worker reach the broker.

One object for all three, so a program that enqueues and works jobs configures the connection
once: the addresses, TLS, the client certificate, the bearer token, the unary calls' deadline and
their retries.
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

__all__ = ["ClientOptions", "DEFAULT_ADDRESS", "DEFAULT_DEADLINE", "MAX_BATCH_JOBS"]

DEFAULT_ADDRESS = "127.0.0.1:7070"
# Seconds. Long enough for a synced write-ahead-log append on a busy disk, short enough that a
# broker that stopped answering surfaces as an error rather than a hung request.
DEFAULT_DEADLINE = 10.0
# The most jobs one EnqueueBatch may carry (the broker refuses more).
MAX_BATCH_JOBS = 1000

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
    # Extra gRPC channel arguments, e.g. [("grpc.max_receive_message_length", 64 << 20)].
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

    def open_channel(
        self, target: str, extra: Sequence[tuple[str, Any]] = ()
    ) -> grpc.aio.Channel:
        """A grpc.aio channel to `target` with these options (TLS, interceptors); `extra` are
        channel arguments the caller adds (the worker's reconnect backoff)."""
        args = list(extra) + list(self.channel_options)
        if self.server_name:
            args.append(("grpc.ssl_target_name_override", self.server_name))
        interceptors = list(self.interceptors) or None
        creds = self.credentials()
        if creds is None:
            return grpc.aio.insecure_channel(target, options=args, interceptors=interceptors)
        return grpc.aio.secure_channel(target, creds, options=args, interceptors=interceptors)
