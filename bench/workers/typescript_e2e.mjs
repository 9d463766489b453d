// End-to-end bench of the TypeScript worker helper: the workload of
// `jobbroker-bench stream --workers 1 --in-flight K --concurrency C --producer-batch B --jobs N`.
//
// Producers (C async loops) enqueue N jobs of --payload-bytes bytes in EnqueueBatch calls of B,
// C calls in flight, while one Worker of @jobbroker/client handles them with a no-op handler at
// concurrency K. The run is timed from the first enqueue to the answer to the last ack (the
// worker's graceful stop waits for it), as jobbroker-bench's stream mode is. Prints one text line
// on stderr and one JSON line on stdout, with jobbroker-bench's fields (mode
// "stream-typescript").
//
// It loads the package as built in client/typescript/dist (client/typescript/test.sh
// --build-only builds it):
//   node bench/workers/typescript_e2e.mjs --address 127.0.0.1:7070 --jobs 20000
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const pkgDir = process.env.JOBBROKER_TS_PACKAGE ?? path.join(here, "../../client/typescript");
const { Client, JobBrokerError, Worker } = require(path.join(pkgDir, "dist/src/index.js"));
const grpcVersion = require(path.join(pkgDir, "node_modules/@grpc/grpc-js/package.json")).version;

// Stop producing after this many failed calls instead of spinning on errors (as jobbroker-bench).
const maxErrors = 100;

const { values: opts } = parseArgs({
  options: {
    address: { type: "string", default: "127.0.0.1:7070" },
    jobs: { type: "string", default: "20000" },
    "in-flight": { type: "string", default: "64" },
    concurrency: { type: "string", default: "4" },
    "producer-batch": { type: "string", default: "100" },
    "payload-bytes": { type: "string", default: "100" },
    queue: { type: "string", default: "" },
    timeout: { type: "string", default: "300" },
  },
});
const address = opts.address;
const jobs = Number(opts.jobs);
const inFlight = Number(opts["in-flight"]);
const concurrency = Number(opts.concurrency);
const producerBatch = Number(opts["producer-batch"]);
const payloadBytes = Number(opts["payload-bytes"]);
const timeoutMs = Number(opts.timeout) * 1000;
const queue = opts.queue || `bench-stream-typescript-${process.pid}-${Date.now()}`;

/** jobbroker-bench's percentile: the sample at index min(n-1, p/100*n), in ms. */
function percentileMs(sortedMicros, p) {
  if (sortedMicros.length === 0) return 0;
  const i = Math.min(sortedMicros.length - 1, Math.floor((p / 100) * sortedMicros.length));
  return sortedMicros[i] / 1000;
}

const nowMs = () => performance.now();

async function main() {
  let handled = 0;
  let allHandled;
  const allHandledP = new Promise((resolve) => (allHandled = resolve));
  const worker = new Worker({
    address,
    concurrency: inFlight,
    workerId: `bench-stream-typescript-${process.pid}`,
    log: (m) => process.stderr.write(`worker: ${m}\n`),
  });
  worker.handle(queue, () => {
    if (++handled === jobs) allHandled();
  });
  const client = new Client(address);
  // start() resolves once the broker accepted the subscription, like jobbroker-bench's
  // Worker::Start: the clock starts after it.
  await worker.start();

  const payload = Buffer.alloc(payloadBytes, "p");
  const batchOf = (n) => Array.from({ length: n }, () => ({ queue, payload }));
  const full = batchOf(producerBatch);
  const deadline = nowMs() + timeoutMs;
  const latencies = [];
  let next = 0;
  let errors = 0;
  let firstError = "";
  let aborted = false;

  async function producer() {
    while (!aborted && nowMs() < deadline) {
      const first = next;
      if (first >= jobs) return;
      const n = Math.min(producerBatch, jobs - first);
      next += n;
      const batch = n === producerBatch ? full : batchOf(n);
      const start = nowMs();
      try {
        await client.enqueueBatch(batch);
      } catch (e) {
        errors++;
        if (!firstError) firstError = `EnqueueBatch: ${e instanceof JobBrokerError ? `${e.codeName}: ${e.details}` : String(e)}`;
        if (errors >= maxErrors) aborted = true;
        continue;
      }
      latencies.push(Math.round((nowMs() - start) * 1000));
    }
  }

  const start = nowMs();
  await Promise.all(Array.from({ length: concurrency }, producer));
  let timedOut = false;
  if (!aborted) {
    let timer;
    const gaveUp = new Promise((resolve) => (timer = setTimeout(() => resolve(true), Math.max(deadline - nowMs(), 1))));
    timedOut = (await Promise.race([allHandledP.then(() => false), gaveUp])) === true;
    clearTimeout(timer);
  }
  // The graceful stop resolves once the broker has answered the last ack.
  await worker.stop();
  const seconds = (nowMs() - start) / 1000;
  client.close();

  const stats = worker.stats;
  latencies.sort((a, b) => a - b);
  const r = {
    mode: "stream-typescript",
    address,
    concurrency,
    workers: 1,
    jobs,
    done: stats.acked,
    payload_bytes: payloadBytes,
    seconds: Number(seconds.toFixed(4)),
    jobs_per_sec: seconds > 0 ? Number((stats.acked / seconds).toFixed(1)) : 0,
    in_flight: inFlight,
    producer_batch: producerBatch,
    latency_of: "enqueue",
    p50_ms: percentileMs(latencies, 50),
    p90_ms: percentileMs(latencies, 90),
    p99_ms: percentileMs(latencies, 99),
    max_ms: percentileMs(latencies, 100),
    errors,
    timed_out: timedOut && stats.acked < jobs,
    first_error: firstError,
    ack_messages: stats.ackMessages ?? 0,
    acks_refused: stats.acksRefused ?? 0,
    runtime: `node ${process.versions.node}, @grpc/grpc-js ${grpcVersion}`,
  };
  process.stderr.write(
    `${r.mode} in_flight=${inFlight} jobs=${jobs} done=${r.done} seconds=${seconds.toFixed(3)} ` +
      `jobs_per_sec=${r.jobs_per_sec.toFixed(1)} ack_messages=${r.ack_messages} errors=${errors}` +
      `${r.timed_out ? " TIMED_OUT" : ""}\n`,
  );
  process.stdout.write(`${JSON.stringify(r)}\n`);
  return r.done >= jobs && errors === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
