"""The client and the worker on uvloop's event loop, which an app served by uvicorn with its
standard extras runs on (and which makes the producer faster: docs/performance.md). Each test
runs its own loop with uvloop.run, outside pytest-asyncio's loop."""

from __future__ import annotations

import asyncio

import uvloop
from brokerproc import BrokerProcess
from conftest import running_worker, wait_state

import jobbroker


def test_coalesced_enqueues_and_a_worker_run_on_uvloop(broker: BrokerProcess) -> None:
    async def main() -> list[str]:
        # Proof that the test is where it means to be: a uvloop loop, not asyncio's.
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        ran: list[str] = []
        worker = jobbroker.Worker(broker.address, worker_id="uvloop-worker",
                                  concurrency=8, handle_signals=False)

        @worker.handler("uvloop")
        async def record(job: jobbroker.JobContext) -> None:
            ran.append(job.text)

        async with jobbroker.Client(broker.address, timeout=30) as client:
            # 64 at once: the coalescer merges them into batches, each caller gets its own id.
            enqueued = await asyncio.gather(
                *(client.enqueue("uvloop", f"job {i}") for i in range(64)))
            assert len({e.job_id for e in enqueued}) == 64
            async with running_worker(worker):
                for e in enqueued:
                    done = await wait_state(client, e.job_id, jobbroker.JOB_STATE_COMPLETED)
                    assert done.attempts[-1].worker_id == "uvloop-worker"
        return ran

    ran = uvloop.run(main())
    assert sorted(ran) == sorted(f"job {i}" for i in range(64))
