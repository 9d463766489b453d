"""The sign-up kill test: a worker dies after sending an email and before acking it.

    python kill_test.py        (broker: $JOBBROKER_BIN, else <repo>/build/server/jobbroker)

For each of two runs (the provider without and with the idempotency key): start a broker with
1 s leases, enqueue 20 welcome emails, start worker 1, which SIGKILLs itself right after
user_6's email; start worker 2, which takes over (user_6's lease runs out and its job runs
again); wait until all 20 jobs are COMPLETED; count the emails. Prints a table and exits 1
unless: 20 users emailed, 0 never, 1 duplicate without the key, 0 with it.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from producer import QUEUE, enqueue_signups
from provider import emails_per_user

import jobbroker

HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
USERS = 20
CONFIG = {
    "queues": {
        QUEUE: {
            "leaseDuration": "1s",
            "retry": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s",
                      "jitter": "JITTER_NONE"},
        }
    }
}


class Broker:
    def __init__(self, workdir: str) -> None:
        binary = os.environ.get("JOBBROKER_BIN") or str(REPO_ROOT / "build/server/jobbroker")
        config = os.path.join(workdir, "config.json")
        with open(config, "w") as f:
            json.dump(CONFIG, f)
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--data-dir", os.path.join(workdir, "data"), "--config", config,
             "--log-level", "warn"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = threading.Event()
        self.address = ""

        def drain() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:  # keep reading so the pipe never fills
                m = re.search(r"jobbroker: serving grpc=(\S+)", line)
                if m and not ready.is_set():
                    self.address = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(30) or not self.address:
            self.proc.kill()
            raise RuntimeError("the broker did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn_worker(address: str, outbox: str, idempotent: bool,
                 die_after: str = "") -> subprocess.Popen[bytes]:
    args = [sys.executable, str(HERE / "worker.py"), "--address", address, "--outbox", outbox]
    if idempotent:
        args.append("--idempotent")
    if die_after:
        args += ["--die-after", die_after]
    return subprocess.Popen(args)


async def run_once(idempotent: bool) -> dict[str, int]:
    workdir = tempfile.mkdtemp(prefix="signup-kill-")
    broker = Broker(workdir)
    outbox = os.path.join(workdir, "outbox.txt")
    try:
        ids = await enqueue_signups(broker.address, USERS)
        first = spawn_worker(broker.address, outbox, idempotent, die_after="user_6")
        status = await asyncio.to_thread(first.wait, 120)
        if status != -signal.SIGKILL:
            raise RuntimeError(f"worker 1 should have killed itself after user_6 (exit {status})")
        async with jobbroker.Client(broker.address, timeout=30) as client:
            user6 = await client.get_job(ids[5])
            if user6.state != jobbroker.JOB_STATE_ACTIVE:
                raise RuntimeError("user_6's job should still be ACTIVE: sent but never acked")
            second = spawn_worker(broker.address, outbox, idempotent)
            try:
                deadline = time.monotonic() + 120
                while (await client.get_queue(QUEUE)).counts["JOB_STATE_COMPLETED"] < USERS:
                    if time.monotonic() > deadline:
                        raise RuntimeError("not every signup completed")
                    await asyncio.sleep(0.1)
            finally:
                second.send_signal(signal.SIGTERM)
                if await asyncio.to_thread(second.wait, 60) != 0:
                    raise RuntimeError("worker 2 did not exit 0 on SIGTERM")
            retried = await client.get_job(ids[5])
            if retried.attempts[0].outcome != jobbroker.ATTEMPT_OUTCOME_LEASE_EXPIRED:
                raise RuntimeError("user_6's first attempt should have expired")
        emails = emails_per_user(outbox)
        users = [f"user_{i}" for i in range(1, USERS + 1)]
        return {
            "emailed": sum(1 for u in users if emails.get(u, 0) >= 1),
            "never": sum(1 for u in users if emails.get(u, 0) == 0),
            "duplicates": sum(max(0, emails.get(u, 0) - 1) for u in users),
        }
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def main() -> int:
    without_key = await run_once(idempotent=False)
    with_key = await run_once(idempotent=True)
    print(f"{'':24}{'without key':>12}{'with key':>10}")
    for label, field in (("users emailed", "emailed"), ("never emailed", "never"),
                         ("duplicate emails", "duplicates")):
        print(f"{label:24}{without_key[field]:>12}{with_key[field]:>10}")
    expected = ({"emailed": USERS, "never": 0, "duplicates": 1},
                {"emailed": USERS, "never": 0, "duplicates": 0})
    if (without_key, with_key) != expected:
        print("FAIL: expected 20 emailed, 0 never, 1 duplicate without the key, 0 with it")
        return 1
    print("OK: nobody missed; the idempotency key removes the one duplicate")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
