from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

sys.path.insert(0, __import__("os").path.dirname(__file__))

from brokerproc import BrokerProcess  # noqa: E402

import jobbroker  # noqa: E402

# Fast retries and short leases for the test queues.
FAST = {"retry": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.05s",
                  "jitter": "JITTER_NONE"}, "leaseDuration": "1s"}
CONFIG = {"defaultPolicy": FAST}


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    """One broker per test module (it takes a while to stop): tests use their own queues."""
    with BrokerProcess(CONFIG) as b:
        yield b


@pytest.fixture
async def client(broker: BrokerProcess) -> AsyncIterator[jobbroker.Client]:
    async with jobbroker.Client(broker.address, timeout=30) as c:
        yield c


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 60.0,
                     what: str = "condition") -> None:
    """Polls `check` until it is true; `timeout` is only a give-up bound."""
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_state(client: jobbroker.Client, job_id: str, state: int,
                     timeout: float = 60.0) -> Any:
    job = None

    async def check() -> bool:
        nonlocal job
        job = await client.get_job(job_id)
        return job.state == state

    await eventually(check, timeout, f"job {job_id} to reach {jobbroker.job_pb2.JobState.Name(state)}")
    return job


@contextlib.asynccontextmanager
async def running_worker(worker: jobbroker.Worker) -> AsyncIterator[asyncio.Task[None]]:
    """Runs `worker` in a task of the test's loop; stops it gracefully on the way out."""
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)
