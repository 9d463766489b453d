'use strict';
// Pieces every peer load script shares: flags, the 100-byte payload, latency percentiles and the
// one JSON line per run, with the keys jobbroker-bench prints so one report reads all systems.

const { performance } = require('node:perf_hooks');

const kDefaults = {
  system: '',
  mode: '',
  host: '127.0.0.1',
  port: 0,
  config: '', // label of the server configuration, e.g. redis-aof-always; copied to the report
  jobs: 50000,
  payloadBytes: 100,
  concurrency: 64, // enqueue: adds in flight; batch: batches in flight; e2e/latency: consumer C
  batch: 100,
  producerInFlight: 4, // e2e: the producer's requests in flight (beanstalkd's default is 64)
  rate: 1000, // latency: enqueues per second
  timeout: 120, // seconds; the run gives up after this long and reports what it did
};

const kUsage = `usage: node load.js --system bullmq|beanstalkd --mode enqueue|batch|e2e|drain|latency --port P
  --host H               server address (default 127.0.0.1)
  --config LABEL         server configuration, copied to the report
  --jobs N               jobs per run (default 50000)
  --payload-bytes N      payload size (default 100)
  --concurrency N        enqueue: adds in flight (64); batch: batches in flight;
                         e2e, drain: consumer concurrency; latency: consumer concurrency (16)
  --batch N              jobs per batch (default 100)
  --producer-in-flight N e2e, drain: producer requests in flight (default 4 batches for
                         bullmq, 64 single puts for beanstalkd)
  --rate N               latency: enqueues per second (default 1000)
  --timeout SECONDS      give up after this long (default 120)`;

function ParseFlags(argv) {
  const flags = { ...kDefaults };
  const explicit = new Set();
  for (let i = 0; i < argv.length; ++i) {
    let arg = argv[i];
    if (arg === '-h' || arg === '--help') {
      process.stdout.write(`${kUsage}\n`);
      process.exit(0);
    }
    if (!arg.startsWith('--')) throw new Error(`unexpected argument: ${arg}`);
    let value;
    const eq = arg.indexOf('=');
    if (eq >= 0) {
      value = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    } else if (i + 1 < argv.length) {
      value = argv[++i];
    } else {
      throw new Error(`${arg} needs a value`);
    }
    // --payload-bytes -> payloadBytes
    const key = arg.slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(key in kDefaults)) throw new Error(`unknown flag: ${arg}`);
    if (typeof kDefaults[key] === 'number') {
      const n = Number(value);
      if (!Number.isFinite(n) || n < 0) throw new Error(`${arg}: not a number >= 0: ${value}`);
      flags[key] = n;
    } else {
      flags[key] = value;
    }
    explicit.add(key);
  }
  flags.explicit = explicit;
  if (!['bullmq', 'beanstalkd'].includes(flags.system)) throw new Error('--system must be bullmq or beanstalkd');
  if (!['enqueue', 'batch', 'e2e', 'drain', 'latency'].includes(flags.mode)) {
    throw new Error('--mode must be enqueue, batch, e2e, drain or latency');
  }
  if (!flags.port) throw new Error('--port is required');
  // Latency: one idle consumer that may hold 16 jobs, as jobbroker-bench's latency worker does
  // (--in-flight 16), so no job waits behind another's completion at 1,000 jobs/s.
  if (flags.mode === 'latency' && !explicit.has('concurrency')) flags.concurrency = 16;
  return flags;
}

// A payload of exactly `bytes` bytes that starts with the job's sequence number, so a consumer
// can find when the job was sent (latency mode) without a side table keyed by server ids.
function Payload(seq, bytes) {
  const head = `${seq}:`;
  return head.length >= bytes ? head : head + 'x'.repeat(bytes - head.length);
}

function SeqOf(payload) {
  const s = typeof payload === 'string' ? payload : payload.toString('latin1', 0, 24);
  return Number.parseInt(s, 10);
}

// Latency samples in microseconds; percentiles picked the way jobbroker-bench picks them (the
// sample at index floor(p/100 * n) of the sorted list), so the systems' figures compare.
class Latencies {
  constructor() {
    this.us = [];
    this.sorted = true;
  }
  AddMs(ms) {
    this.us.push(Math.round(ms * 1000));
    this.sorted = false;
  }
  PercentileMs(p) {
    if (this.us.length === 0) return 0;
    if (!this.sorted) {
      this.us.sort((a, b) => a - b);
      this.sorted = true;
    }
    const i = Math.min(this.us.length - 1, Math.floor((p / 100) * this.us.length));
    return this.us[i] / 1000;
  }
  MaxMs() {
    return this.PercentileMs(100);
  }
}

// Counts failures and keeps the first one's text for the report.
class Errors {
  constructor() {
    this.count = 0;
    this.first = '';
  }
  Record(what, err) {
    if (this.count++ === 0) this.first = `${what}: ${err && err.message ? err.message : err}`;
  }
}

function NowMs() {
  return performance.now();
}

function Sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// The latency workload's producer: job `seq` is sent at r.startMs + seq / flags.rate seconds,
// each awaited before the next (closed loop, as jobbroker-bench's). sentAt[seq] is set just
// before the send; a failed send is recorded as `what` and counts towards `maxErrors`.
async function SendAtRate(flags, r, sentAt, maxErrors, what, send) {
  r.startMs = NowMs();
  const intervalMs = 1000 / flags.rate;
  for (let seq = 0; seq < flags.jobs && r.errors.count < maxErrors; ++seq) {
    const due = r.startMs + seq * intervalMs;
    const now = NowMs();
    if (now < due) await Sleep(due - now);
    sentAt[seq] = NowMs();
    try {
      await send(seq);
    } catch (err) {
      r.errors.Record(what, err);
    }
  }
}

// The state of one run, kept up to date as it goes so that a run cut short by its timeout can
// still report what it did.
function NewReport(flags, latencyOf) {
  return {
    mode: flags.mode,
    concurrency: flags.concurrency,
    latencyOf,
    done: 0,
    startMs: NowMs(),
    seconds: 0,
    latencies: new Latencies(),
    errors: new Errors(),
    timedOut: false,
    cpuStart: process.cpuUsage(),
  };
}

// Prints the run's JSON line on stdout and a human line on stderr.
function PrintReport(flags, r) {
  const rate = r.seconds > 0 ? r.done / r.seconds : 0;
  const cpu = process.cpuUsage(r.cpuStart);
  const line = {
    mode: r.mode,
    workload: r.mode,
    system: flags.system,
    config: flags.config || flags.system,
    address: `${flags.host}:${flags.port}`,
    concurrency: r.concurrency,
    workers: r.workers ?? 1,
    batch: r.batch ?? null,
    producer_in_flight: r.producerInFlight ?? null,
    jobs: flags.jobs,
    done: r.done,
    payload_bytes: flags.payloadBytes,
    seconds: round(r.seconds, 4),
    jobs_per_sec: round(rate, 1),
    latency_of: r.latencyOf,
    p50_ms: round(r.latencies.PercentileMs(50), 3),
    p90_ms: round(r.latencies.PercentileMs(90), 3),
    p99_ms: round(r.latencies.PercentileMs(99), 3),
    max_ms: round(r.latencies.MaxMs(), 3),
    errors: r.errors.count,
    timed_out: r.timedOut,
    first_error: r.errors.first,
    // The load process's own CPU: a figure near `seconds` means the client, not the server,
    // may have set the pace (one Node thread).
    client_cpu_s: round((cpu.user + cpu.system) / 1e6, 3),
    client: `node ${process.versions.node}`,
  };
  process.stderr.write(
    `${flags.config || flags.system} ${r.mode} concurrency=${r.concurrency} done=${r.done}/${flags.jobs} ` +
      `seconds=${line.seconds} jobs_per_sec=${line.jobs_per_sec} ${r.latencyOf}_p50_ms=${line.p50_ms} ` +
      `p99_ms=${line.p99_ms} errors=${line.errors}${r.timedOut ? ' TIMED_OUT' : ''}\n`,
  );
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

function round(x, digits) {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

module.exports = {
  ParseFlags,
  NewReport,
  Payload,
  SeqOf,
  Latencies,
  Errors,
  NowMs,
  Sleep,
  SendAtRate,
  PrintReport,
  kUsage,
};
