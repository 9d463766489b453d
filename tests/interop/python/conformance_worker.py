"""The Python conformance worker (tests/interop/CONFORMANCE.md): the shortest program on the
library's Worker that reaches every behaviour the harness checks. Run it through run.sh."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

import jobbroker


class Events:
    """The events file: one JSON object per line, each line one write(2) on an O_APPEND file
    descriptor, so the harness reads whole lines, also after this process was SIGKILLed."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, job: jobbroker.JobContext | None = None, **extra: Any) -> None:
        line: dict[str, Any] = {"event": event}
        if job is not None:
            line["job"] = job.job_id
            line["attempt"] = job.attempt
        line.update(extra)
        os.write(self._fd, (json.dumps(line) + "\n").encode("utf-8"))


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--address", required=True)
    p.add_argument("--queues", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--prefetch", type=int, default=0)
    p.add_argument("--lease-ms", type=int, default=0)
    p.add_argument("--grace-ms", type=int, default=10000)
    p.add_argument("--die-at-step")
    p.add_argument("--die-after-user")
    p.add_argument("--outbox")
    p.add_argument("--idempotent", action="store_true")
    p.add_argument("--lang-name", default="python")
    p.add_argument("--ca", help="connect with TLS, trusting this CA (PEM file)")
    p.add_argument("--cert", help="with --ca: this client certificate (mutual TLS)")
    p.add_argument("--key", help="with --ca: the client certificate's key")
    p.add_argument("--token", help="the bearer token of every call")
    return p.parse_args(argv)


async def ignoring_cancellation(seconds: float) -> None:
    """Sleeps `seconds` whatever the cancellation signal says, as a handler stuck in a blocking
    call would: a cancellation of this task is caught, and the sleep goes on until the time is
    up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(left)


class Actions:
    """What a job's payload asks its handler to do (CONFORMANCE.md, "Jobs")."""

    def __init__(self, args: argparse.Namespace, events: Events) -> None:
        self.args = args
        self.events = events
        self.snoozed: set[str] = set()  # job ids this process has snoozed once

    def handler_of(self, queue: str) -> jobbroker.Handler:
        async def handle(job: jobbroker.JobContext) -> Any:
            self.events.write("start", job, queue=job.queue, handler=queue)
            try:
                return await self.run(queue, job, job.json())
            except asyncio.CancelledError:
                self.events.write("cancelled", job)
                raise  # ends the attempt as cancelled: the library decides what that sends

        return handle

    def ok(self, queue: str, job: jobbroker.JobContext, payload: dict[str, Any]) -> Any:
        self.events.write("done", job)
        return {"queue": queue, "echo": payload.get("echo")}

    async def run(self, queue: str, job: jobbroker.JobContext, payload: dict[str, Any]) -> Any:
        action = payload["action"]
        not_yet = job.attempt < payload.get("ok_from_attempt", sys.maxsize)
        if action == "sleep":
            await asyncio.sleep(payload["ms"] / 1000)
        elif action == "wait_cancel" and not_yet:
            try:
                await asyncio.Event().wait()  # until the cancellation signal cancels this task
            except asyncio.CancelledError:
                if payload.get("after_cancel") != "return":
                    raise
                # The work was done after all: return normally (the library acks it).
                self.events.write("cancelled", job)
        elif action == "ignore_cancel" and not_yet:
            await ignoring_cancellation(payload["ms"] / 1000)
        elif action == "fail" and not_yet:
            raise RuntimeError(payload["message"])
        elif action == "permanent":
            raise jobbroker.PermanentError(payload["message"])
        elif action == "retry_after" and job.attempt == 1:
            raise jobbroker.RetryAfter(payload["ms"] / 1000, payload["message"])
        elif action == "snooze" and job.job_id not in self.snoozed:
            self.snoozed.add(job.job_id)
            raise jobbroker.Snooze(payload["ms"] / 1000)
        elif action == "progress":
            job.progress({"percent": payload["percent"]})
            while not os.path.exists(payload["gate"]):
                await asyncio.sleep(0.02)
        elif action == "steps":
            return await self.steps(job, payload["steps"])
        elif action == "signup":
            self.signup(job, payload["user"])
        return self.ok(queue, job, payload)

    async def steps(self, job: jobbroker.JobContext, names: list[str]) -> Any:
        results: dict[str, Any] = {}
        for name in names:

            async def body(name: str = name) -> dict[str, Any]:
                self.events.write("step", job, step=name)
                if name == self.args.die_at_step:
                    die()
                return {"by": self.args.lang_name, "step": name}

            results[name] = await job.step(name, body)
        self.events.write("done", job)
        return results

    def signup(self, job: jobbroker.JobContext, user: str) -> None:
        """The fake email provider: appends {"user", "key"} to the outbox; with --idempotent
        the key is the job's idempotency_key and a key already there is not sent again."""
        if self.args.idempotent:
            key = job.idempotency_key
            with open(self.args.outbox, "a+", encoding="utf-8") as f:
                f.seek(0)
                sent = any(json.loads(line).get("key") == key for line in f if line.strip())
        else:
            key, sent = f"{job.job_id}/{job.attempt}", False
        if not sent:
            line = json.dumps({"user": user, "key": key}) + "\n"
            fd = os.open(self.args.outbox, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        if user == self.args.die_after_user:
            die()  # after the email, before the ack: the broker will lease the job again


async def main(args: argparse.Namespace) -> int:
    events = Events(args.events)
    # The library's client options, as a user sets them: never a channel built here.
    options = jobbroker.ClientOptions(
        # Several: a cluster's nodes, the worker moves to the next when one dies.
        addresses=[a for a in args.address.split(",") if a],
        tls=args.ca or False,
        cert=args.cert,
        key=args.key,
        token=args.token,
    )
    worker = jobbroker.Worker(
        options=options,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        lease_duration=args.lease_ms / 1000 if args.lease_ms > 0 else None,
        grace=args.grace_ms / 1000,
    )
    actions = Actions(args, events)
    for queue in args.queues.split(","):
        worker.handle(queue, actions.handler_of(queue))
    # While run() runs, the library's handlers make SIGTERM and SIGINT start the graceful stop;
    # it puts back the ones it found when it returns. Ignoring them here absorbs a second signal
    # that arrives after the stop finished, before the process exited (as the Go worker does).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    events.write("ready")
    try:
        await worker.run()
    except Exception as err:  # noqa: BLE001 - any error of the run call ends the program
        # Among them the errors the contract does not retry: UNAUTHENTICATED for a refused token.
        print(f"conformance worker: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    events.write("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
