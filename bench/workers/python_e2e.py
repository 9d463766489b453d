"""End-to-end bench of the Python worker helper: the workload of
`jobbroker-bench stream --workers 1 --in-flight K --concurrency C --producer-batch B --jobs N`.

Producers (C asyncio tasks) enqueue N jobs of --payload-bytes bytes in EnqueueBatch calls of B,
C calls in flight, while one jobbroker.Worker handles them with a no-op async handler at
concurrency K. The run is timed from the first enqueue to the answer to the last ack (the
worker's graceful stop waits for it), as jobbroker-bench's stream mode is. Prints one text line
on stderr and one JSON line on stdout, with jobbroker-bench's fields (mode "stream-python").

Run it with the interpreter of client/python/.venv (client/python/test.sh --build-only makes it):
    .venv/bin/python bench/workers/python_e2e.py --address 127.0.0.1:7070 --jobs 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import grpc

import jobbroker
from jobbroker.v1 import broker_pb2

# Stop producing after this many failed calls instead of spinning on errors (as jobbroker-bench).
MAX_ERRORS = 100


def percentile_ms(sorted_micros: list[int], p: float) -> float:
    """jobbroker-bench's percentile: the sample at index min(n-1, p/100*n), in ms."""
    if not sorted_micros:
        return 0.0
    i = min(len(sorted_micros) - 1, int(p / 100.0 * len(sorted_micros)))
    return sorted_micros[i] / 1000.0


async def run(args: argparse.Namespace) -> dict[str, object]:
    queue = args.queue or f"bench-stream-python-{os.getpid()}-{int(time.time() * 1000)}"
    handled = 0
    all_handled = asyncio.Event()
    warmed = asyncio.Event()

    worker = jobbroker.Worker(
        args.address,
        concurrency=args.in_flight,
        worker_id=f"bench-stream-python-{os.getpid()}",
        handle_signals=False,
    )

    @worker.handler(queue)
    async def on_job(job: jobbroker.JobContext) -> None:
        nonlocal handled
        handled += 1
        if not warmed.is_set():
            warmed.set()
        elif handled == args.jobs:
            all_handled.set()

    deadline = time.monotonic() + args.timeout
    errors = 0
    first_error = ""
    latencies: list[int] = []
    async with jobbroker.Client(args.address, timeout=30) as client:
        running = asyncio.create_task(worker.run())
        # One job before the clock starts: the worker has subscribed once it is handled (Worker
        # has no "subscribed" signal; jobbroker-bench's Worker::Start waits for the same thing).
        await client.enqueue(queue, b"w" * args.payload_bytes)
        await asyncio.wait_for(warmed.wait(), 60)
        handled = 0
        warm_acks = worker.stats.acked
        warm_messages = getattr(worker.stats, "ack_messages", 0)

        # The same request every call (the jobs are identical): the producers' own Python cost
        # stays out of the measurement as far as it can, as jobbroker-bench's C++ producers do.
        payload = b"p" * args.payload_bytes
        full = broker_pb2.EnqueueBatchRequest(
            jobs=[broker_pb2.EnqueueRequest(queue=queue, payload=payload)] * args.producer_batch
        )
        next_job = 0
        enqueued = 0
        aborted = False

        async def producer() -> None:
            nonlocal next_job, enqueued, errors, first_error, aborted
            while not aborted and time.monotonic() < deadline:
                first = next_job
                if first >= args.jobs:
                    return
                n = min(args.producer_batch, args.jobs - first)
                next_job += n
                req = full
                if n < args.producer_batch:
                    req = broker_pb2.EnqueueBatchRequest(
                        jobs=[broker_pb2.EnqueueRequest(queue=queue, payload=payload)] * n
                    )
                start = time.perf_counter_ns()
                try:
                    await client.broker.EnqueueBatch(req, timeout=30)
                except grpc.aio.AioRpcError as err:
                    errors += 1
                    if not first_error:
                        first_error = f"EnqueueBatch: {err.code().name}: {err.details()}"
                    if errors >= MAX_ERRORS:
                        aborted = True
                    continue
                latencies.append((time.perf_counter_ns() - start) // 1000)
                enqueued += n

        start = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(args.concurrency)))
        timed_out = False
        if not aborted:
            try:
                await asyncio.wait_for(all_handled.wait(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                timed_out = True
        # The graceful stop returns once the broker has answered the last ack.
        worker.stop()
        await running
        seconds = time.perf_counter() - start

    acked = worker.stats.acked - warm_acks
    latencies.sort()
    return {
        "mode": "stream-python",
        "address": args.address,
        "concurrency": args.concurrency,
        "workers": 1,
        "jobs": args.jobs,
        "done": acked,
        "payload_bytes": args.payload_bytes,
        "seconds": round(seconds, 4),
        "jobs_per_sec": round(acked / seconds, 1) if seconds > 0 else 0.0,
        "in_flight": args.in_flight,
        "producer_batch": args.producer_batch,
        "latency_of": "enqueue",
        "p50_ms": percentile_ms(latencies, 50),
        "p90_ms": percentile_ms(latencies, 90),
        "p99_ms": percentile_ms(latencies, 99),
        "max_ms": percentile_ms(latencies, 100),
        "errors": errors,
        "timed_out": timed_out and acked < args.jobs,
        "first_error": first_error,
        "ack_messages": getattr(worker.stats, "ack_messages", 0) - warm_messages,
        "acks_refused": getattr(worker.stats, "acks_refused", 0),
        "runtime": f"python {sys.version.split()[0]}, grpcio {grpc.__version__}",
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default="127.0.0.1:7070")
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--in-flight", type=int, default=64, help="the worker's concurrency")
    p.add_argument("--concurrency", type=int, default=4, help="EnqueueBatch calls in flight")
    p.add_argument("--producer-batch", type=int, default=100, help="jobs per EnqueueBatch")
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--queue", default="", help="default: a fresh name per run")
    p.add_argument("--timeout", type=float, default=300, help="give up after this many seconds")
    args = p.parse_args()
    r = asyncio.run(run(args))
    print(
        f"{r['mode']} in_flight={r['in_flight']} jobs={r['jobs']} done={r['done']} "
        f"seconds={r['seconds']:.3f} jobs_per_sec={r['jobs_per_sec']:.1f} "
        f"ack_messages={r['ack_messages']} errors={r['errors']}"
        + (" TIMED_OUT" if r["timed_out"] else ""),
        file=sys.stderr,
    )
    print(json.dumps(r, separators=(",", ":")), flush=True)
    return 0 if r["done"] >= r["jobs"] and r["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
