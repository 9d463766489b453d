"""A worker process for the tests that must SIGTERM or SIGKILL a worker.

    worker_child.py ADDRESS MODE LOGFILE [--slow]

MODE drain: queue "drain", concurrency 1, prefetch 2; each job logs "start"/"end" around a
2 s sleep. MODE steps: queue "steps", three durable steps that log each execution; with --slow
step 3 sleeps for a minute (the test kills the process during it).
"""

from __future__ import annotations

import asyncio
import sys

import jobbroker


def log(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()


async def main(address: str, mode: str, path: str, slow: bool) -> None:
    if mode == "drain":
        worker = jobbroker.Worker(address, concurrency=1, prefetch=2, lease_duration=1, grace=30)

        @worker.handler("drain")
        async def drain(job: jobbroker.JobContext) -> str:
            log(path, f"start {job.text}")
            await asyncio.sleep(2)
            log(path, f"end {job.text}")
            return "drained"

    else:
        worker = jobbroker.Worker(address, lease_duration=1)

        @worker.handler("steps")
        async def steps(job: jobbroker.JobContext) -> object:
            def one() -> int:
                log(path, "step1")
                return 1

            async def two() -> dict[str, int]:
                log(path, "step2")
                return {"a": 2}

            async def three() -> list[str]:
                log(path, f"step3 attempt={job.attempt}")
                if slow:
                    await asyncio.sleep(60)
                return ["three"]

            a = await job.step("one", one)
            b = await job.step("two", two)
            c = await job.step("three", three)
            return {"one": a, "two": b, "three": c}

    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], "--slow" in sys.argv[4:]))
