"""Cross-language durable steps: a job whose worker died in one language resumes in another.

For each ordered pair (first, second) of the chain python -> go -> typescript -> python, against
the real broker: enqueue one job; run `first`'s worker with --die-at c (it records a, b, c, saving
a and b as durable steps, and SIGKILLs itself inside c); then run `second`'s worker until the job
is COMPLETED. Asserts that steps a and b ran once (in `first`), c ran again in `second`, the job's
result holds a and b as `first` saved them and c from `second` (JSON round-tripped intact),
the job took 2 attempts; its checkpoint is one StepCheckpoint holding a, b, c in that order.

Run with client/python/.venv/bin/python (the Python client enqueues and reads the job). The Go
worker binary comes from --go-worker (tests/interop/test.sh builds it); without it, it is built
into a temporary folder. Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import jobbroker
from jobbroker import job_pb2
from jobbroker.v1 import steps_pb2

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STEPS = ("a", "b", "c")
CHAIN = [("python", "go"), ("go", "typescript"), ("typescript", "python")]
ALL_PAIRS = [(a, b) for a in ("python", "go", "typescript") for b in ("python", "go", "typescript") if a != b]
GIVE_UP = 60.0  # seconds: a bound for "this is not going to happen", never an assertion


def expected_step(lang: str, step: str) -> dict[str, Any]:
    # What every worker's step returns (python/worker.py, go/main.go, typescript/worker.mjs).
    n = STEPS.index(step) + 1
    return {
        "by": lang,
        "step": step,
        "n": n,
        "nested": {"half": n + 0.5, "list": [n, "x", True, None], "text": "h\u00e9llo \u2713"},
    }


def canonical(value: Any) -> str:
    # Sorted keys; 1 and 1.0 stay different, so an int that came back as a float is caught.
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


class Broker:
    """The real broker on 127.0.0.1:0 with a fresh data dir."""

    def __init__(self, binary: str, workdir: Path, queues: list[str]) -> None:
        policy = {
            "retry": {"maxAttempts": 5, "initialBackoff": "0.05s", "jitter": "JITTER_NONE"},
            "leaseDuration": "1s",
        }
        config = workdir / "config.json"
        config.write_text(json.dumps({"queues": {q: policy for q in queues}}))
        (workdir / "data").mkdir()
        self.log = open(workdir / "broker.log", "wb")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--data-dir", str(workdir / "data"), "--config", str(config), "--log-level", "warn"],
            stdout=subprocess.PIPE, stderr=self.log,
        )
        assert self.proc.stdout is not None
        self.address = ""
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith("jobbroker: serving grpc="):
                self.address = line.split("grpc=")[1].split()[0]
                break
        if not self.address:
            self.proc.wait()
            raise RuntimeError(f"broker exited ({self.proc.returncode}) before serving; see {self.log.name}")
        # Keep draining stdout so the pipe never fills.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return proc.poll()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(none)"


async def run_pair(first: str, second: str, commands: dict[str, list[str]], broker: Broker,
                   client: jobbroker.Client, workdir: Path) -> dict[str, Any]:
    pair = f"{first}->{second}"
    queue = f"interop.{first}-{second}"
    record = workdir / f"{first}-{second}.record"
    record.touch()
    problems: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []

    def start(lang: str, die_at: str | None) -> tuple[subprocess.Popen[bytes], Path]:
        log = workdir / f"{first}-{second}.{lang}{'.dying' if die_at else ''}.log"
        args = commands[lang] + ["--address", broker.address, "--queue", queue,
                                 "--record", str(record), "--lang-name", lang]
        if die_at:
            args += ["--die-at", die_at]
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc, log

    job_id = (await client.enqueue(queue, {"pair": pair})).job_id
    job = None
    try:
        # 1. `first` runs a, b and dies inside c.
        proc, log1 = start(first, "c")
        rc = await wait_exit(proc, GIVE_UP)
        if rc != -signal.SIGKILL:
            problems.append(f"{first} worker: expected death by SIGKILL, got exit {rc}\n{tail(log1)}")
        else:
            # 2. `second` takes over once the dead worker's lease expires.
            proc, log2 = start(second, None)
            deadline = time.monotonic() + GIVE_UP
            while time.monotonic() < deadline:
                job = await client.get_job(job_id)
                if job.state in (job_pb2.JOB_STATE_COMPLETED, job_pb2.JOB_STATE_FAILED,
                                 job_pb2.JOB_STATE_CANCELLED) or proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            rc = await wait_exit(proc, GIVE_UP)
            if rc != 0:
                problems.append(f"{second} worker: SIGTERM should exit 0, got {rc}\n{tail(log2)}")
            job = await client.get_job(job_id)
            if job.state != job_pb2.JOB_STATE_COMPLETED:
                problems.append(f"job {job_id} is {job_pb2.JobState.Name(job.state)}, not COMPLETED "
                                f"(last error: {job.last_error!r})\n{tail(log2)}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    lines = record.read_text(encoding="utf-8").splitlines()
    want_lines = [f"{first} a", f"{first} b", f"{first} c", f"{second} c"]
    if lines != want_lines:
        problems.append(f"record is {lines}, want {want_lines}")

    attempts = job.attempt if job is not None else 0
    if job is not None and job.state == job_pb2.JOB_STATE_COMPLETED and attempts != 2:
        problems.append(f"attempts = {attempts}, want 2")

    result_ok = False
    if job is not None and job.state == job_pb2.JOB_STATE_COMPLETED:
        want = {"a": expected_step(first, "a"), "b": expected_step(first, "b"),
                "c": expected_step(second, "c")}
        try:
            got = json.loads(job.result.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            problems.append(f"result is not UTF-8 JSON ({err}): {job.result!r}")
        else:
            result_ok = canonical(got) == canonical(want)
            if not result_ok:
                problems.append(f"result is\n  {canonical(got)}\nwant\n  {canonical(want)}")
        # The checkpoint both languages wrote: one StepCheckpoint holding a, b, c in order.
        try:
            checkpoint = steps_pb2.StepCheckpoint.FromString(job.checkpoint)
            saved = [(s.name, json.loads(s.result.decode("utf-8"))) for s in checkpoint.steps]
        except Exception as err:  # DecodeError, bad UTF-8 or JSON
            problems.append(f"checkpoint is not a StepCheckpoint of JSON results: {err}")
        else:
            if canonical(saved) != canonical(list(want.items())):
                problems.append(f"checkpoint holds {saved}, want a, b, c as in the result")

    ran = {lang: ",".join(l.split()[1] for l in lines if l.split()[0] == lang) or "-"
           for lang in (first, second)}
    return {"pair": pair, "first": f"{first}: {ran[first]}", "second": f"{second}: {ran[second]}",
            "attempts": attempts, "result_ok": result_ok, "problems": problems}


def build_go_worker(out_dir: Path) -> str:
    binary = out_dir / "interop-go-worker"
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=HERE / "go", check=True)
    return str(binary)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--go-worker", help="built Go interop worker (default: go build it)")
    ap.add_argument("--all-pairs", action="store_true", help="all six ordered pairs, not the chain")
    opts = ap.parse_args()

    binary = os.environ.get("JOBBROKER_BIN", str(REPO / "build/server/jobbroker"))
    pairs = ALL_PAIRS if opts.all_pairs else CHAIN
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="jobbroker-interop-") as tmp:
        workdir = Path(tmp)
        commands = {
            "python": [sys.executable, str(HERE / "python/worker.py")],
            "go": [opts.go_worker or build_go_worker(workdir)],
            "typescript": ["node", str(HERE / "typescript/worker.mjs")],
        }
        broker = Broker(binary, workdir, [f"interop.{a}-{b}" for a, b in pairs])
        try:
            async with jobbroker.Client(broker.address, timeout=30) as client:
                for first, second in pairs:
                    rows.append(await run_pair(first, second, commands, broker, client, workdir))
        finally:
            broker.stop()
            if broker.proc.returncode not in (0, None):
                print(f"broker exited {broker.proc.returncode}:\n{tail(workdir / 'broker.log')}")

    header = ("pair", "steps run by first", "steps run by second", "attempts", "result ok", "")
    table = [header] + [
        (r["pair"], r["first"], r["second"], str(r["attempts"]), "yes" if r["result_ok"] else "no",
         "PASS" if not r["problems"] else "FAIL")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    failed = [r for r in rows if r["problems"]]
    for r in failed:
        print(f"\n{r['pair']} FAILED:")
        for p in r["problems"]:
            print("  " + p.replace("\n", "\n    "))
    print(f"interop: {len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
