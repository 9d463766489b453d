"""Enqueues a welcome email for examples/worker.py and waits for the worker's result.

    pip install jobbroker
    JOBBROKER_ADDRESS=127.0.0.1:7070 python producer.py ada@example.com Ada

The connection comes from the environment, as for the worker; the token needs the producer role
(enqueue) and the admin role (enqueue_and_wait watches the job).
"""

import asyncio
import json
import os
import sys

import jobbroker


async def main(email: str = "ada@example.com", name: str = "Ada") -> None:
    options = jobbroker.ClientOptions(tls=os.environ.get("JOBBROKER_CA") or False)
    async with jobbroker.Client(options=options) as client:
        # The dedup key makes a repeated enqueue (a retry, a double click) the same job.
        job = await client.enqueue_and_wait("emails", {"email": email, "name": name},
                                            dedup_key=f"welcome:{email}", max_attempts=5,
                                            wait_timeout=60)
        print(job.id, jobbroker.job_pb2.JobState.Name(job.state), json.loads(job.result))


asyncio.run(main(*sys.argv[1:3]))
