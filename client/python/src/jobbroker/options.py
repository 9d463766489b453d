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

__all__ = ["ClientOptions", "DEFAULT_ADDRESS", "DEFAULT_DEADLINE"]

DEFAULT_ADDRESS = "127.0.0.1:7070"
# Seconds. Long enough for a synced write-ahead-log append on a busy disk, short enough that a
# broker that stopped answering surfaces as an error rather than a hung request.
DEFAULT_DEADLINE = 10.0

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

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("ClientOptions: cert and key go together (mutual TLS needs both)")
        if self.retry_attempts < 1:
            raise ValueError("ClientOptions.retry_attempts: at least 1")
        if isinstance(self.addresses, str):
            raise TypeError("ClientOptions.addresses: a list of host:port, not one string")

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
