// The producer workload through the TypeScript client helper, written as users write it: 64
// concurrent loops, each awaiting one `client.enqueue()` of one job at a time, on one Client.
// By default the client coalesces concurrent enqueues (docs/worker-contract.md §10);
// --no-batching turns that off, so every job is one unary Enqueue. Prints one JSON line on
// stdout (jobbroker-bench's keys, mode "producer-typescript") and a human line on stderr.
//
// It loads the package as built in client/typescript/dist (client/typescript/test.sh
// --build-only builds it):
//   node bench/peers/clients/producer.mjs --address 127.0.0.1:7070 --jobs 50000
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const pkgDir = process.env.JOBBROKER_TS_PACKAGE ?? path.join(here, "../../../client/typescript");
const { Client } = require(path.join(pkgDir, "dist/src/index.js"));
// The peers' load scripts' latency percentiles and error count, so that the figures compare.
const { Latencies, Errors } = require(path.join(here, "../node/common.js"));

const { values: opts } = parseArgs({
  options: {
    address: { type: "string", default: "127.0.0.1:7070" },
    jobs: { type: "string", default: "50000" },
    concurrency: { type: "string", default: "64" },
    "payload-bytes": { type: "string", default: "100" },
    "no-batching": { type: "boolean", default: false },
    "no-batch-stream": { type: "boolean", default: false },
    "batch-max-jobs": { type: "string", default: "" },
    timeout: { type: "string", default: "180" },
  },
});
const jobs = Number(opts.jobs);
const concurrency = Number(opts.concurrency);
const batching = !opts["no-batching"];
const batchStream = !opts["no-batch-stream"];
const queue = `bench-producer-typescript-${process.pid}-${Date.now()}`;
const maxErrors = 100;

async function main() {
  const client = new Client({
    address: opts.address,
    deadlineMs: 30_000,
    batching,
    batchStream,
    ...(opts["batch-max-jobs"] ? { batchMaxJobs: Number(opts["batch-max-jobs"]) } : {}),
  });
  // One job before the clock starts: the channel is connected and the routing table fetched.
  await client.enqueue(queue, Buffer.alloc(Number(opts["payload-bytes"]), 0x77));
  const payload = Buffer.alloc(Number(opts["payload-bytes"]), 0x70);
  const latencies = new Latencies();
  const errors = new Errors();
  let next = 0;
  let done = 0;
  const deadline = performance.now() + Number(opts.timeout) * 1000;
  const cpu0 = process.cpuUsage();
  const start = performance.now();
  const loop = async () => {
    while (next < jobs && errors.count < maxErrors && performance.now() < deadline) {
      next++;
      const t0 = performance.now();
      try {
        await client.enqueue(queue, payload);
        latencies.AddMs(performance.now() - t0);
        done++;
      } catch (err) {
        errors.Record("enqueue", err);
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, loop));
  const seconds = (performance.now() - start) / 1000;
  const cpu = process.cpuUsage(cpu0);
  await client.close();
  const line = {
    mode: "producer-typescript",
    batching,
    batch_stream: batchStream,
    concurrency,
    jobs,
    done,
    seconds: Math.round(seconds * 1e4) / 1e4,
    jobs_per_sec: Math.round((done / seconds) * 10) / 10,
    latency_of: "enqueue",
    p50_ms: latencies.PercentileMs(50),
    p90_ms: latencies.PercentileMs(90),
    p99_ms: latencies.PercentileMs(99),
    max_ms: latencies.MaxMs(),
    errors: errors.count,
    timed_out: done + errors.count < jobs,
    first_error: errors.first,
    client_cpu_s: (cpu.user + cpu.system) / 1e6,
    client: `node ${process.versions.node}`,
  };
  process.stderr.write(
    `producer-typescript batching=${batching} done=${done}/${jobs} seconds=${line.seconds} ` +
      `jobs_per_sec=${line.jobs_per_sec} p50_ms=${line.p50_ms} p99_ms=${line.p99_ms} errors=${errors.count}\n`,
  );
  process.stdout.write(`${JSON.stringify(line)}\n`);
  return done === jobs && errors.count === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`producer.mjs: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
