'use strict';
// What the two DAG load scripts (dag_jobbroker.js, dag_bullmq.js) share: their flags, the jobs'
// payloads, the join's check of its results, running the DAGs --parallel at a time under
// --timeout, and the report (one human line on stderr, one JSON line on stdout; keys in
// README.md). Each script adds only how its system submits and runs a DAG.

const { parseArgs } = require('node:util');
const { Errors, Latencies, NowMs } = require('./common');

// Parses the shared flags and the script's own (`own`, parseArgs options); throws on a bad value.
function ParseDagFlags(own) {
  const { values: opts } = parseArgs({
    options: {
      config: { type: 'string' },
      dags: { type: 'string', default: '5' },
      parallel: { type: 'string', default: '1' },
      children: { type: 'string', default: '1000' },
      concurrency: { type: 'string', default: '64' },
      'payload-bytes': { type: 'string', default: '100' },
      timeout: { type: 'string', default: '120' },
      // "short": the join waits for one child less (that child still runs), so its check must
      // fail.
      fault: { type: 'string', default: 'none' },
      ...own,
    },
  });
  const flags = {
    opts,
    dags: Number(opts.dags),
    children: Number(opts.children),
    concurrency: Number(opts.concurrency),
    payloadBytes: Number(opts['payload-bytes']),
    timeoutMs: Number(opts.timeout) * 1000,
    fault: opts.fault,
  };
  flags.parallel = Math.min(Number(opts.parallel), flags.dags);
  flags.jobsPerDag = flags.children + 2;
  const counts = [flags.dags, flags.parallel, flags.children, flags.concurrency, flags.payloadBytes];
  if (!counts.every((n) => Number.isInteger(n) && n >= 1)) {
    throw new Error('--dags, --parallel, --children, --concurrency and --payload-bytes must be integers >= 1');
  }
  if (!['none', 'short'].includes(flags.fault)) throw new Error('--fault must be none or short');
  return flags;
}

// "<kind>:<dag>:<child>:" then x up to the payload size; kind r (root), c (child), j (join).
function Payload(kind, dag, child, payloadBytes) {
  const head = `${kind}:${dag}:${child}:`;
  return head.length >= payloadBytes ? head : head + 'x'.repeat(payloadBytes - head.length);
}
function ParsePayload(text) {
  const [kind, dag, child] = text.split(':', 3);
  return { kind, dag: Number(dag), child: Number(child) };
}

// The join's check: exactly `children` results, the children's indexes, each once.
function CheckResults(values, children) {
  const seen = new Set();
  for (const v of values) {
    const i = Number(v);
    if (!Number.isInteger(i) || i < 0 || i >= children || seen.has(i)) throw new Error(`bad child result "${v}"`);
    seen.add(i);
  }
  if (seen.size !== children) throw new Error(`the join got ${seen.size} child results, expected ${children}`);
}

function round(x, digits) {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

// One run's bookkeeping: per DAG when it was submitted, when its root's work ended, when its join
// started and when the DAG was done; the handlers that returned; errors.
class DagRun {
  constructor(flags, describe) {
    this.flags = flags;
    // { system, address, submit, extra (more JSON keys), note (more of the human line) }
    this.describe = describe;
    this.errors = new Errors();
    this.state = Array.from({ length: flags.dags }, () => ({ submitMs: 0, rootEndMs: 0, joinStartMs: 0, doneMs: 0 }));
    this.handled = 0;
    this.timedOut = false;
    this.cpuStart = process.cpuUsage();
  }

  // Runs `runDag(d)` for every DAG, --parallel at a time; after --timeout reports and exits 1.
  // Resolves to whether every DAG completed with its check passed.
  async RunAll(runDag) {
    const { dags, parallel, timeoutMs } = this.flags;
    const timer = setTimeout(() => {
      this.timedOut = true;
      this.errors.Record('run', `timed out after ${timeoutMs / 1000} s`);
      this.Report();
      process.exit(1);
    }, timeoutMs);
    let next = 0;
    const loop = async () => {
      while (next < dags) {
        const d = next++;
        try {
          await runDag(d);
        } catch (err) {
          this.errors.Record(`dag ${d}`, err);
        }
      }
    };
    await Promise.all(Array.from({ length: parallel }, loop));
    clearTimeout(timer);
    return this.Report();
  }

  Report() {
    const { opts, dags, parallel, children, concurrency, payloadBytes, jobsPerDag, fault } = this.flags;
    const { state, errors, handled, timedOut } = this;
    const firstSubmit = Math.min(...state.filter((s) => s.submitMs > 0).map((s) => s.submitMs));
    const lastDone = Math.max(0, ...state.map((s) => s.doneMs));
    const seconds = lastDone > firstSubmit ? (lastDone - firstSubmit) / 1000 : 0;
    const rootToJoin = new Latencies();
    const perDag = new Latencies();
    for (const s of state) {
      if (s.rootEndMs && s.joinStartMs) rootToJoin.AddMs(s.joinStartMs - s.rootEndMs);
      if (s.doneMs) perDag.AddMs(s.doneMs - s.submitMs);
    }
    const cpu = process.cpuUsage(this.cpuStart);
    const dagsDone = state.filter((s) => s.doneMs > 0).length;
    const line = {
      mode: 'dag',
      system: this.describe.system,
      config: opts.config ?? this.describe.system,
      address: this.describe.address,
      dags,
      dags_done: dagsDone,
      parallel,
      children,
      concurrency,
      payload_bytes: payloadBytes,
      jobs: dags * jobsPerDag,
      done: handled,
      seconds: round(seconds, 4),
      jobs_per_sec: seconds > 0 ? round(handled / seconds, 1) : 0,
      dags_per_sec: seconds > 0 ? round(dagsDone / seconds, 3) : 0,
      root_to_join_p50_ms: round(rootToJoin.PercentileMs(50), 3),
      root_to_join_max_ms: round(rootToJoin.MaxMs(), 3),
      dag_p50_ms: round(perDag.PercentileMs(50), 3),
      dag_max_ms: round(perDag.MaxMs(), 3),
      submit: this.describe.submit,
      ...this.describe.extra,
      fault,
      errors: errors.count,
      first_error: errors.first,
      timed_out: timedOut,
      client_cpu_s: round((cpu.user + cpu.system) / 1e6, 3),
      client: `node ${process.versions.node}`,
    };
    process.stderr.write(
      `${line.config} dag parallel=${parallel}${this.describe.note ?? ''} dags=${dagsDone}/${dags} jobs=${handled}/${line.jobs} ` +
        `seconds=${line.seconds} jobs_per_sec=${line.jobs_per_sec} root_to_join_p50_ms=${line.root_to_join_p50_ms} ` +
        `errors=${errors.count}${errors.first ? ` (${errors.first})` : ''}${timedOut ? ' TIMED_OUT' : ''}\n`,
    );
    process.stdout.write(`${JSON.stringify(line)}\n`);
    return errors.count === 0 && !timedOut && dagsDone === dags && handled === line.jobs;
  }
}

module.exports = { CheckResults, DagRun, NowMs, ParseDagFlags, ParsePayload, Payload };
