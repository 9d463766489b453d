"""Enqueues a welcome email for user_1..user_20 on queue "signups".

    python producer.py [--address HOST:PORT] [--users N]

Each job carries dedup_key "welcome:<user>": enqueueing twice creates nothing new, and the key is
also the idempotency_key every attempt of the job sees.
"""

from __future__ import annotations

import argparse
import asyncio

import jobbroker

QUEUE = "signups"


async def enqueue_signups(address: str, users: int = 20) -> list[str]:
    async with jobbroker.Client(address, timeout=30) as client:
        ids = []
        for i in range(1, users + 1):
            user = f"user_{i}"
            res = await client.enqueue(QUEUE, user, dedup_key=f"welcome:{user}")
            ids.append(res.job_id)
        return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=jobbroker.default_address())
    parser.add_argument("--users", type=int, default=20)
    args = parser.parse_args()
    ids = asyncio.run(enqueue_signups(args.address, args.users))
    print(f"enqueued {len(ids)} welcome emails")


if __name__ == "__main__":
    main()
