"""Interop worker (Python): runs durable steps "a", "b", "c" for every job of --queue.

Each step appends "<lang-name> <step>" to --record (flushed and fsynced) and returns a JSON
value; with --die-at STEP the process SIGKILLs itself right after recording that step.
The job's result is {"a": ..., "b": ..., "c": ...} as step() returned them.
Run with client/python/.venv/bin/python.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from typing import Any

import jobbroker

STEPS = ("a", "b", "c")


def step_value(lang: str, step: str) -> dict[str, Any]:
    # Must match expected_step() in ../steps_interop.py and the Go and TypeScript workers.
    n = STEPS.index(step) + 1
    return {
        "by": lang,
        "step": step,
        "n": n,
        "nested": {"half": n + 0.5, "list": [n, "x", True, None], "text": "h\u00e9llo \u2713"},
    }


def record(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--lang-name", required=True)
    p.add_argument("--die-at", choices=STEPS)
    args = p.parse_args()

    worker = jobbroker.Worker(args.address, concurrency=1)

    @worker.handler(args.queue)
    async def handle(job: jobbroker.JobContext) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for step in STEPS:

            def run(step: str = step) -> dict[str, Any]:
                record(args.record, f"{args.lang_name} {step}")
                if step == args.die_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                return step_value(args.lang_name, step)

            results[step] = await job.step(step, run)
        return results

    asyncio.run(worker.run())


if __name__ == "__main__":
    main()
