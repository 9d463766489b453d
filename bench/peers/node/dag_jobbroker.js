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
// released unless the broker holds them back for it, and the join must still get every result
// (docs/workflows.md).
//
// Prints a human line on stderr and one JSON line on stdout (keys in README.md); exits 1 if any
// DAG failed, a join's check failed, or the run timed out.
//
//   node dag_jobbroker.js --address 127.0.0.1:7070 [--dags 5] [--parallel 1] [--concurrency 64]

const path = require('node:path');
const { CheckResults, DagRun, NowMs, ParseDagFlags, ParsePayload, Payload } = require('./dag_common');

const pkgDir = process.env.JOBBROKER_TS_PACKAGE || path.join(__dirname, '../../../client/typescript');
const { Client, Worker, PermanentError, JobState } = require(path.join(pkgDir, 'dist/src/index.js'));

const kMaxBatch = 1000; // EnqueueBatch takes at most this many jobs

const flags = ParseDagFlags({ address: { type: 'string', default: '127.0.0.1:7070' } });
const { opts, children, concurrency, payloadBytes, timeoutMs, fault, jobsPerDag } = flags;
if (children > 9999) throw new Error('--children: at most 9999 (a job has at most 10,000 dependencies)');
const queue = `dag-${process.pid}-${Date.now()}`;
const run = new DagRun(flags, {
  system: 'jobbroker',
  address: opts.address,
  submit: `EnqueueBatch x${Math.ceil(jobsPerDag / kMaxBatch)} per DAG, depends_on`,
});
const payload = (kind, d, child) => Buffer.from(Payload(kind, d, child, payloadBytes));

// The graph of DAG `d`, enqueued in order in batches of kMaxBatch: a dependency in the same batch
// by depends_on_index, one in an earlier batch by the id it got. Resolves to the join's id.
async function SubmitDag(client, d) {
  const jobs = [{ payload: payload('r', d, 0), deps: [] }];
  for (let i = 0; i < children; ++i) jobs.push({ payload: payload('c', d, i), deps: [0] });
  const joinDeps = [];
  for (let i = 1; i <= children; ++i) joinDeps.push(i);
  if (fault === 'short') joinDeps.pop();
  jobs.push({ payload: payload('j', d, 0), deps: joinDeps });
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
  const s = run.state[d];
  s.submitMs = NowMs();
  const joinId = await SubmitDag(client, d);
  const end = await WatchUntilEnded(client, joinId);
  s.doneMs = end.atMs;
  if (end.state !== JobState.JOB_STATE_COMPLETED) {
    run.errors.Record(`dag ${d}`, `the join ended ${JobState[end.state]}: ${end.error}`);
  }
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
    const p = ParsePayload(Buffer.from(job.payload).toString('latin1', 0, Math.min(job.payload.length, 40)));
    if (p.kind === 'r') {
      run.state[p.dag].rootEndMs = NowMs(); // the root's work (none) is done
      ++run.handled;
      return undefined;
    }
    if (p.kind === 'c') {
      ++run.handled;
      return String(p.child);
    }
    run.state[p.dag].joinStartMs = NowMs();
    const j = await client.getJob(job.jobId);
    try {
      CheckResults(
        Object.values(j.dependencyResults).map((b) => Buffer.from(b).toString('utf8')),
        children,
      );
    } catch (err) {
      run.errors.Record(`join of dag ${p.dag}`, err);
      throw new PermanentError(err.message);
    }
    ++run.handled;
    return undefined;
  });
  await worker.start();

  const ok = await run.RunAll((d) => RunDag(client, d));
  await worker.stop(5000);
  client.close();
  process.exitCode = ok ? 0 : 1;
}

main().catch((err) => {
  process.stderr.write(`dag_jobbroker: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
