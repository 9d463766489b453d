"""Waits until every job named on the command line is ACTIVE in attempt >= N; exits 0, or 1
after 60 s. A separate process, so that a handler can block its worker's event loop until the
broker has moved on (a client in the test's own process would need that loop to run).

    python wait_attempt.py ADDRESS N JOB_ID...
"""

from __future__ import annotations

import asyncio
import sys
import time

import jobbroker


async def main(address: str, attempt: int, ids: list[str]) -> int:
    async with jobbroker.Client(address, timeout=10) as client:
        give_up = time.monotonic() + 60
        while True:
            jobs = [await client.get_job(i) for i in ids]
            if all(j.state == jobbroker.JOB_STATE_ACTIVE and j.attempt >= attempt for j in jobs):
                return 0
            if time.monotonic() > give_up:
                print(f"gave up waiting for attempt {attempt}: {jobs}", file=sys.stderr)
                return 1
            await asyncio.sleep(0.02)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])))
