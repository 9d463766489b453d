"""The producer workload through the Python client helper, written as users write it: 64
concurrent asyncio tasks, each awaiting one `client.enqueue()` of one job at a time, on one
Client. By default the client coalesces concurrent enqueues (docs/worker-contract.md §10);
--no-batching turns that off, so every job is one unary Enqueue. --loop uvloop runs it on uvloop's
event loop instead of asyncio's own, as an app served by uvicorn with its standard extras does.
Prints one JSON line on stdout
(jobbroker-bench's keys, mode "producer-python") and a human line on stderr.

Run it with the interpreter of client/python/.venv (client/python/test.sh --build-only makes it):
    .venv/bin/python bench/peers/clients/producer.py --address 127.0.0.1:7070 --jobs 50000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import jobbroker

MAX_ERRORS = 100


def percentile_ms(sorted_micros: list[float], p: float) -> float:
    if not sorted_micros:
        return 0.0
    i = min(len(sorted_micros) - 1, int(p / 100.0 * len(sorted_micros)))
    return sorted_micros[i] / 1000.0


async def run(args: argparse.Namespace) -> dict[str, object]:
    queue = f"bench-producer-python-{os.getpid()}-{int(time.time() * 1000)}"
    options = jobbroker.ClientOptions(
        address=args.address, deadline=30, batching=not args.no_batching
    )
    latencies: list[float] = []
    errors = 0
    first_error = ""
    next_job = 0
    async with jobbroker.Client(options=options) as client:
        # One job before the clock starts: the channel is connected and the routing table fetched.
        await client.enqueue(queue, b"w" * args.payload_bytes)
        payload = b"p" * args.payload_bytes
        deadline = time.monotonic() + args.timeout

        async def loop() -> None:
            nonlocal next_job, errors, first_error
            while next_job < args.jobs and errors < MAX_ERRORS and time.monotonic() < deadline:
                next_job += 1
                t0 = time.perf_counter()
                try:
                    await client.enqueue(queue, payload)
                except jobbroker.JobBrokerError as err:
                    errors += 1
                    if not first_error:
                        first_error = f"enqueue: {err}"
                    continue
                latencies.append((time.perf_counter() - t0) * 1e6)

        cpu0 = time.process_time()
        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(args.concurrency)))
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    done = len(latencies)
    latencies.sort()
    return {
        "mode": "producer-python",
        "batching": not args.no_batching,
        "concurrency": args.concurrency,
        "jobs": args.jobs,
        "done": done,
        "seconds": round(seconds, 4),
        "jobs_per_sec": round(done / seconds, 1) if seconds > 0 else 0.0,
        "latency_of": "enqueue",
        "p50_ms": percentile_ms(latencies, 50),
        "p90_ms": percentile_ms(latencies, 90),
        "p99_ms": percentile_ms(latencies, 99),
        "max_ms": percentile_ms(latencies, 100),
        "errors": errors,
        "timed_out": done + errors < args.jobs,
        "first_error": first_error,
        "client_cpu_s": round(cpu, 3),
        "client": f"python {sys.version.split()[0]}",
        "loop": args.loop,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1:7070")
    parser.add_argument("--jobs", type=int, default=50000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--no-batching", action="store_true")
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        line = uvloop.run(run(args))
    else:
        line = asyncio.run(run(args))
    print(
        f"producer-python loop={args.loop} batching={line['batching']} done={line['done']}/{line['jobs']} "
        f"seconds={line['seconds']} jobs_per_sec={line['jobs_per_sec']} "
        f"p50_ms={line['p50_ms']} p99_ms={line['p99_ms']} errors={line['errors']}",
        file=sys.stderr,
    )
    print(json.dumps(line))
    return 0 if line["done"] == args.jobs and line["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
