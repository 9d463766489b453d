'use strict';
// The DAG workload (1 -> N -> 1 fan-out/fan-in, N = 1000) against jobbroker, with the repo's own
// TypeScript client (@jobbroker/client, loaded by path from client/typescript/dist: build it with
// `client/typescript/test.sh --build-only`; bench/peers/dag.sh does when dist is missing).
// dag_bullmq.js runs the same workload against BullMQ's FlowProducer; README.md ("DAG") defines it.
//
// One DAG: a root job; N children that may start only once the root completed; one join that may
// start only once all N children completed, and that reads their N results (each child returns
// its index as text) and checks it got exactly N, all different, all in 0..N-1. A join that gets
// fewer fails the job and the run.
//
// How jobbroker does it: the whole graph goes in up front, with dependencies, in EnqueueBatch
// calls of at most 1000 jobs (root and N-1 children with depends_on_index [0]; then the last
// child with depends_on [root id] and the join with depends_on the first N-1 children's ids and
// depends_on_index [that last child]): 2 calls for N = 1000. The broker holds the children
// WAITING until the root completes and the join until every child did, and hands the join the
// children's results. The join reads them with one GetJob (Job.dependency_results): the
// TypeScript Worker's JobContext does not expose LeasedJob.dependency_results (yet), and GetJob
// returns the same map, copied into the job when it was released.
//
// One Worker (one Work stream) with --concurrency jobs at once runs every job of the run's one
// queue, in this process, next to the producer; --parallel DAGs are in flight at a time, each
// submitted as soon as one before it ended. The queue keeps its default retention (the last 1000
// completed jobs): DAGs running at once push each other's children out before their join is
// released, and the broker must still hand the join every result (a join keeps each child's
// result as it completes; docs/workflows.md).
//
// Prints a human line on stderr and one JSON line on stdout (keys in README.md); exits 1 if any
// DAG failed, a join's check failed, or the run timed out.
//
//   node dag_jobbroker.js --address 127.0.0.1:7070 [--dags 5] [--parallel 1] [--concurrency 64]

const path = require('node:path');
const { parseArgs } = require('node:util');
const { Errors, Latencies, NowMs } = require('./common');

const pkgDir = process.env.JOBBROKER_TS_PACKAGE || path.join(__dirname, '../../../client/typescript');
const { Client, Worker, PermanentError, JobState } = require(path.join(pkgDir, 'dist/src/index.js'));

const kMaxBatch = 1000; // EnqueueBatch takes at most this many jobs

const { values: opts } = parseArgs({
  options: {
    address: { type: 'string', default: '127.0.0.1:7070' },
    config: { type: 'string', default: 'jobbroker' },
    dags: { type: 'string', default: '5' },
    parallel: { type: 'string', default: '1' },
    children: { type: 'string', default: '1000' },
    concurrency: { type: 'string', default: '64' },
    'payload-bytes': { type: 'string', default: '100' },
    timeout: { type: 'string', default: '120' },
    // "short": the join waits for one child less (that child still runs), so its check must fail.
    fault: { type: 'string', default: 'none' },
  },
});
const dags = Number(opts.dags);
const parallel = Math.min(Number(opts.parallel), dags);
const children = Number(opts.children);
const concurrency = Number(opts.concurrency);
const payloadBytes = Number(opts['payload-bytes']);
const timeoutMs = Number(opts.timeout) * 1000;
const fault = opts.fault;
if (![dags, parallel, children, concurrency, payloadBytes].every((n) => Number.isInteger(n) && n >= 1)) {
  throw new Error('--dags, --parallel, --children, --concurrency and --payload-bytes must be integers >= 1');
}
if (children > 9999) throw new Error('--children: at most 9999 (a job has at most 10,000 dependencies)');
if (!['none', 'short'].includes(fault)) throw new Error('--fault must be none or short');
const jobsPerDag = children + 2;
const queue = `dag-${process.pid}-${Date.now()}`;

// "<kind>:<dag>:<child>:" then x up to the payload size; kind r (root), c (child), j (join).
function Payload(kind, dag, child) {
  const head = `${kind}:${dag}:${child}:`;
  return Buffer.from(head.length >= payloadBytes ? head : head + 'x'.repeat(payloadBytes - head.length));
}
function ParsePayload(buf) {
  const [kind, dag, child] = buf.toString('latin1', 0, Math.min(buf.length, 40)).split(':');
  return { kind, dag: Number(dag), child: Number(child) };
}

// The join's check: exactly `children` results, the children's indexes, each once.
function CheckResults(values) {
  const seen = new Set();
  for (const v of values) {
    const i = Number(v);
    if (!Number.isInteger(i) || i < 0 || i >= children || seen.has(i)) throw new Error(`bad child result "${v}"`);
    seen.add(i);
  }
  if (seen.size !== children) throw new Error(`the join got ${seen.size} child results, expected ${children}`);
}

const errors = new Errors();
const state = Array.from({ length: dags }, () => ({ submitMs: 0, rootEndMs: 0, joinStartMs: 0, doneMs: 0 }));
let handled = 0; // handlers that returned without an error
let timedOut = false;
const cpuStart = process.cpuUsage();

// The graph of DAG `d`, enqueued in order in batches of kMaxBatch: a dependency in the same batch
// by depends_on_index, one in an earlier batch by the id it got. Resolves to the join's id.
async function SubmitDag(client, d) {
  const jobs = [{ payload: Payload('r', d, 0), deps: [] }];
  for (let i = 0; i < children; ++i) jobs.push({ payload: Payload('c', d, i), deps: [0] });
  const joinDeps = [];
  for (let i = 1; i <= children; ++i) joinDeps.push(i);
  if (fault === 'short') joinDeps.pop();
  jobs.push({ payload: Payload('j', d, 0), deps: joinDeps });
  const ids = [];
  for (let first = 0; first < jobs.length; first += kMaxBatch) {
    const batch = jobs.slice(first, first + kMaxBatch).map((j) => {
      const b = { queue, payload: j.payload, dependsOn: [], dependsOnIndex: [] };
      for (const k of j.deps) {
        if (k >= first) b.dependsOnIndex.push(k - first);
        else b.dependsOn.push(ids[k]);
      }
      return b;
    });
    const results = await client.enqueueBatch(batch);
    for (const r of results) ids.push(r.jobId);
  }
  return ids[ids.length - 1];
}

// Resolves with the job's terminal state, at the moment the broker reports it (Admin.WatchJob
// sends a state once it is durable).
function WatchUntilEnded(client, jobId) {
  const terminal = new Set([JobState.JOB_STATE_COMPLETED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED]);
  return new Promise((resolve, reject) => {
    let ended = false;
    const call = client.admin.watchJob({ jobId });
    call.on('data', (job) => {
      if (ended || !terminal.has(job.state)) return;
      ended = true;
      resolve({ state: job.state, atMs: NowMs(), error: job.lastError });
    });
    call.on('error', (err) => {
      if (!ended) reject(err);
    });
    call.on('end', () => {
      if (!ended) reject(new Error(`the watch of ${jobId} ended before the job did`));
    });
  });
}

async function RunDag(client, d) {
  const s = state[d];
  s.submitMs = NowMs();
  const joinId = await SubmitDag(client, d);
  const end = await WatchUntilEnded(client, joinId);
  s.doneMs = end.atMs;
  if (end.state !== JobState.JOB_STATE_COMPLETED) {
    errors.Record(`dag ${d}`, `the join ended ${JobState[end.state]}: ${end.error}`);
  }
}

function Report() {
  const firstSubmit = Math.min(...state.filter((s) => s.submitMs > 0).map((s) => s.submitMs));
  const lastDone = Math.max(0, ...state.map((s) => s.doneMs));
  const seconds = lastDone > firstSubmit ? (lastDone - firstSubmit) / 1000 : 0;
  const rootToJoin = new Latencies();
  const perDag = new Latencies();
  for (const s of state) {
    if (s.rootEndMs && s.joinStartMs) rootToJoin.AddMs(s.joinStartMs - s.rootEndMs);
    if (s.doneMs) perDag.AddMs(s.doneMs - s.submitMs);
  }
  const cpu = process.cpuUsage(cpuStart);
  const dagsDone = state.filter((s) => s.doneMs > 0).length;
  const line = {
    mode: 'dag',
    system: 'jobbroker',
    config: opts.config,
    address: opts.address,
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
    submit: `EnqueueBatch x${Math.ceil(jobsPerDag / kMaxBatch)} per DAG, depends_on`,
    fault,
    errors: errors.count,
    first_error: errors.first,
    timed_out: timedOut,
    client_cpu_s: round((cpu.user + cpu.system) / 1e6, 3),
    client: `node ${process.versions.node}`,
  };
  process.stderr.write(
    `${line.config} dag parallel=${parallel} dags=${dagsDone}/${dags} jobs=${handled}/${line.jobs} ` +
      `seconds=${line.seconds} jobs_per_sec=${line.jobs_per_sec} root_to_join_p50_ms=${line.root_to_join_p50_ms} ` +
      `errors=${errors.count}${errors.first ? ` (${errors.first})` : ''}${timedOut ? ' TIMED_OUT' : ''}\n`,
  );
  process.stdout.write(`${JSON.stringify(line)}\n`);
  return errors.count === 0 && !timedOut && dagsDone === dags && handled === line.jobs;
}

function round(x, digits) {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

async function main() {
  const client = new Client({ address: opts.address, timeoutMs: timeoutMs });
  const worker = new Worker({
    address: opts.address,
    concurrency,
    workerId: `dag-jobbroker-${process.pid}`,
    log: (m) => process.stderr.write(`worker: ${m}\n`),
  });
  worker.handle(queue, async (job) => {
    const p = ParsePayload(job.payload);
    if (p.kind === 'r') {
      state[p.dag].rootEndMs = NowMs(); // the root's work (none) is done
      ++handled;
      return undefined;
    }
    if (p.kind === 'c') {
      ++handled;
      return String(p.child);
    }
    state[p.dag].joinStartMs = NowMs();
    const j = await client.getJob(job.jobId);
    try {
      CheckResults(Object.values(j.dependencyResults).map((b) => Buffer.from(b).toString('utf8')));
    } catch (err) {
      errors.Record(`join of dag ${p.dag}`, err);
      throw new PermanentError(err.message);
    }
    ++handled;
    return undefined;
  });
  await worker.start();

  const timer = setTimeout(() => {
    timedOut = true;
    errors.Record('run', `timed out after ${timeoutMs / 1000} s`);
    Report();
    process.exit(1);
  }, timeoutMs);
  let next = 0;
  const loop = async () => {
    while (next < dags) {
      const d = next++;
      try {
        await RunDag(client, d);
      } catch (err) {
        errors.Record(`dag ${d}`, err);
      }
    }
  };
  await Promise.all(Array.from({ length: parallel }, loop));
  clearTimeout(timer);
  const ok = Report();
  await worker.stop(5000);
  client.close();
  process.exitCode = ok ? 0 : 1;
}

main().catch((err) => {
  process.stderr.write(`dag_jobbroker: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
