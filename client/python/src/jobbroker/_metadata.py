"""The call metadata every call of the client and the worker carries (worker contract §2)."""

from __future__ import annotations

import os

from ._version import __version__

# The broker shows it in ListWorkers (WorkerInfo.client): which library a worker runs.
CLIENT_NAME = f"jobbroker-python/{__version__}"

Metadata = tuple[tuple[str, str], ...]


def default_token() -> str:
    """$JOBBROKER_TOKEN, else no token (like the address, never a command-line flag: every user
    of a machine can read a program's command line)."""
    return os.environ.get("JOBBROKER_TOKEN", "")


def call_metadata(token: str | None) -> Metadata:
    """`jobbroker-client: jobbroker-python/<version>`, and `authorization: Bearer <token>` when
    a token is given (None: $JOBBROKER_TOKEN)."""
    if token is None:
        token = default_token()
    metadata: list[tuple[str, str]] = [("jobbroker-client", CLIENT_NAME)]
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    return tuple(metadata)
