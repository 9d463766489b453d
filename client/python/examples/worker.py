"""A jobbroker worker: sends (prints) welcome emails from the "emails" queue.

    pip install jobbroker
    JOBBROKER_ADDRESS=127.0.0.1:7070 python worker.py

The connection comes from the environment: $JOBBROKER_ADDRESS (comma-separated for a cluster),
$JOBBROKER_TOKEN (a token with the worker role) and, for TLS, $JOBBROKER_CA (the CA's PEM file).
SIGTERM or Ctrl-C stops it gracefully: running jobs finish, unstarted ones go back, exit 0.
"""

import asyncio
import os

import jobbroker

options = jobbroker.ClientOptions(tls=os.environ.get("JOBBROKER_CA") or False)
worker = jobbroker.Worker(options=options, concurrency=4)


@worker.handler("emails")
async def send_welcome(job: jobbroker.JobContext) -> dict[str, str]:
    signup = job.json()  # {"email": ..., "name": ...}
    if "@" not in signup.get("email", ""):
        raise jobbroker.PermanentError(f"bad address {signup.get('email')!r}")  # no retry
    # A durable step runs once per job, even if this process dies and another worker resumes.
    greeting = await job.step("render", lambda: f"Welcome, {signup['name']}!")
    # Pass job.idempotency_key to the provider: a repeated attempt is then harmless.
    print(f"to={signup['email']} key={job.idempotency_key} attempt={job.attempt}: {greeting}",
          flush=True)
    return {"status": "sent"}  # kept as the job's result; raising fails the attempt (retried)


asyncio.run(worker.run())
