"""Sends each new user a welcome email through the fake provider (provider.py).

    python worker.py --outbox FILE [--address HOST:PORT] [--idempotent] [--die-after USER]

With --idempotent the job's idempotency_key goes to the provider, which skips keys it has seen,
so a retried job does not email the user twice. --die-after USER makes the process SIGKILL
itself right after that user's email was sent and before the ack: the crash a durable broker
exists for. Stops gracefully on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from provider import send_welcome_email

import jobbroker


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default=jobbroker.default_address())
    parser.add_argument("--outbox", required=True)
    parser.add_argument("--idempotent", action="store_true")
    parser.add_argument("--die-after", default="")
    args = parser.parse_args()

    worker = jobbroker.Worker(args.address, concurrency=1, lease_duration=1, grace=5)

    @worker.handler("signups")
    def welcome(job: jobbroker.JobContext) -> None:
        # Without --idempotent the provider gets no usable key: every call sends.
        key = job.idempotency_key if args.idempotent else f"{job.job_id}/{job.attempt}"
        send_welcome_email(args.outbox, job.text, key, honour_key=args.idempotent)
        if job.text == args.die_after:
            os.kill(os.getpid(), signal.SIGKILL)  # after the email, before the ack

    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
