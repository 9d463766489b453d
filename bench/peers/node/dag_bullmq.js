'use strict';
// The DAG workload (1 -> N -> 1 fan-out/fan-in, N = 1000) against BullMQ 6.7.0 on Redis, the
// way a BullMQ user would build it; dag_jobbroker.js runs the same workload against jobbroker
// and README.md ("DAG") defines it.
//
// One DAG: a root job; N children that may start only once the root completed; one join that may
// start only once all N children completed, and that reads their N results (each child returns
// its index as text) and checks it got exactly N, all different, all in 0..N-1. A join that gets
// fewer fails the job and the run.
//
// How BullMQ does it: a flow (FlowProducer) is a tree whose children run before their parent, and
// a job has one parent, so "root before N children" cannot be one flow. The root is a plain job
// (Queue.add); once it is done, FlowProducer.add puts the join (the parent) and its N children in
// one atomic call, and the join reads the children's results with job.getChildrenValues(). Who
// adds the flow, --fanout:
//   processor  (default) the root's processor, as its last step; the root completes after that.
//              The faster of the two here (no event round trip); the children are then in Redis
//              a moment before the root is marked completed.
//   events     the producer: it waits for the root with job.waitUntilFinished(QueueEvents), then
//              adds the flow; the children exist only once the root completed.
//
// One queue for every job of the run; one Worker with --concurrency runs them all, in this
// process next to the producer; --parallel DAGs are in flight at a time, each started as soon as
// one before it ended. Jobs are added with removeOnComplete: true, as in bullmq_load.js (a child's
// result stays in its parent's "processed" hash, which getChildrenValues reads), except the root
// with --fanout events (see rootOpts).
//
// Prints a human line on stderr and one JSON line on stdout (keys in README.md); exits 1 if any
// DAG failed, a join's check failed, or the run timed out.
//
//   node dag_bullmq.js --port 6379 [--dags 5] [--parallel 1] [--concurrency 64] [--fanout events]

const { parseArgs } = require('node:util');
const { FlowProducer, Queue, QueueEvents, UnrecoverableError, Worker } = require('bullmq');
const { Errors, Latencies, NowMs } = require('./common');

const { values: opts } = parseArgs({
  options: {
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string', default: '6379' },
    config: { type: 'string', default: 'bullmq' },
    dags: { type: 'string', default: '5' },
    parallel: { type: 'string', default: '1' },
    children: { type: 'string', default: '1000' },
    concurrency: { type: 'string', default: '64' },
    'payload-bytes': { type: 'string', default: '100' },
    timeout: { type: 'string', default: '120' },
    fanout: { type: 'string', default: 'processor' },
    // "short": the join waits for one child less (that child still runs, as a plain job), so its
    // check must fail.
    fault: { type: 'string', default: 'none' },
  },
});
const dags = Number(opts.dags);
const parallel = Math.min(Number(opts.parallel), dags);
const children = Number(opts.children);
const concurrency = Number(opts.concurrency);
const payloadBytes = Number(opts['payload-bytes']);
const timeoutMs = Number(opts.timeout) * 1000;
const { fanout, fault } = opts;
if (![dags, parallel, children, concurrency, payloadBytes].every((n) => Number.isInteger(n) && n >= 1)) {
  throw new Error('--dags, --parallel, --children, --concurrency and --payload-bytes must be integers >= 1');
}
if (!['processor', 'events'].includes(fanout)) throw new Error('--fanout must be processor or events');
if (!['none', 'short'].includes(fault)) throw new Error('--fault must be none or short');
const jobsPerDag = children + 2;
const queueName = `dag-${process.pid}-${Date.now()}`;
const connection = { host: opts.host, port: Number(opts.port) };
const jobOpts = { removeOnComplete: true };
// --fanout events: job.waitUntilFinished throws "Missing key" when the root was already removed
// by the time it looks, so there the root stays a while (among the queue's last 100 completed).
const rootOpts = fanout === 'events' ? { removeOnComplete: { count: 100 } } : jobOpts;

// "<kind>:<dag>:<child>:" then x up to the payload size; kind r (root), c (child), j (join). The
// job name says the kind too (root, child, join), as a BullMQ user would dispatch on it.
function Payload(kind, dag, child) {
  const head = `${kind}:${dag}:${child}:`;
  return head.length >= payloadBytes ? head : head + 'x'.repeat(payloadBytes - head.length);
}
function ParsePayload(s) {
  const [, dag, child] = s.split(':', 3);
  return { dag: Number(dag), child: Number(child) };
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
const joinEnded = new Map(); // dag -> resolve({ok, error}) of the join's completed/failed event
let handled = 0; // processors that returned without an error
let timedOut = false;
const cpuStart = process.cpuUsage();

// The join and its children, in one atomic FlowProducer.add; with --fault short the last child
// is a plain job instead.
async function AddFlow(flows, queue, d) {
  const kids = [];
  for (let i = 0; i < children; ++i) kids.push({ name: 'child', queueName, data: Payload('c', d, i), opts: jobOpts });
  const extra = fault === 'short' ? kids.pop() : null;
  await flows.add({ name: 'join', queueName, data: Payload('j', d, 0), opts: jobOpts, children: kids });
  if (extra) await queue.add(extra.name, extra.data, jobOpts);
}

async function RunDag(queue, flows, queueEvents, d) {
  const s = state[d];
  const ended = new Promise((resolve) => joinEnded.set(d, resolve));
  s.submitMs = NowMs();
  const root = await queue.add('root', Payload('r', d, 0), rootOpts);
  if (fanout === 'events') {
    await root.waitUntilFinished(queueEvents, timeoutMs);
    await AddFlow(flows, queue, d);
  }
  const end = await ended;
  s.doneMs = end.atMs;
  if (!end.ok) errors.Record(`dag ${d}`, `the join failed: ${end.error}`);
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
    system: 'bullmq',
    config: opts.config,
    address: `${opts.host}:${opts.port}`,
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
    submit: `Queue.add(root), FlowProducer.add(join + ${children}) by the ${fanout === 'events' ? 'producer on QueueEvents' : "root's processor"}`,
    fanout,
    fault,
    errors: errors.count,
    first_error: errors.first,
    timed_out: timedOut,
    client_cpu_s: round((cpu.user + cpu.system) / 1e6, 3),
    client: `node ${process.versions.node}`,
  };
  process.stderr.write(
    `${line.config} dag parallel=${parallel} fanout=${fanout} dags=${dagsDone}/${dags} jobs=${handled}/${line.jobs} ` +
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
  const queue = new Queue(queueName, { connection });
  const flows = new FlowProducer({ connection });
  const queueEvents = fanout === 'events' ? new QueueEvents(queueName, { connection }) : null;
  for (const c of [queue, flows, queueEvents]) {
    if (!c) continue;
    c.on('error', () => {}); // connection errors also reject the calls, which count them
    await c.waitUntilReady();
  }
  const worker = new Worker(
    queueName,
    async (job) => {
      const p = ParsePayload(job.data);
      if (job.name === 'root') {
        state[p.dag].rootEndMs = NowMs(); // the root's work (none) is done
        if (fanout === 'processor') await AddFlow(flows, queue, p.dag);
        ++handled;
        return undefined;
      }
      if (job.name === 'child') {
        ++handled;
        return String(p.child);
      }
      state[p.dag].joinStartMs = NowMs();
      const values = await job.getChildrenValues();
      try {
        CheckResults(Object.values(values));
      } catch (err) {
        errors.Record(`join of dag ${p.dag}`, err);
        throw new UnrecoverableError(err.message);
      }
      ++handled;
      return undefined;
    },
    { connection, concurrency },
  );
  worker.on('error', (err) => errors.Record('worker', err));
  // Emitted once Redis has the job completed (or failed): the join's end is the DAG's.
  worker.on('completed', (job) => {
    if (job.name === 'join') joinEnded.get(ParsePayload(job.data).dag)?.({ ok: true, atMs: NowMs() });
  });
  worker.on('failed', (job, err) => {
    // A failed root (or its flow add) ends its DAG too, so that nothing waits for its join.
    if (job && (job.name === 'join' || job.name === 'root')) {
      joinEnded.get(ParsePayload(job.data).dag)?.({ ok: false, atMs: NowMs(), error: `${job.name}: ${err.message}` });
    } else {
      errors.Record(`${job ? job.name : 'a job'} failed`, err);
    }
  });
  await worker.waitUntilReady();

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
        await RunDag(queue, flows, queueEvents, d);
      } catch (err) {
        errors.Record(`dag ${d}`, err);
      }
    }
  };
  await Promise.all(Array.from({ length: parallel }, loop));
  clearTimeout(timer);
  const ok = Report();
  await Promise.race([
    Promise.all([worker.close(), queue.close(), flows.close(), queueEvents?.close()]),
    new Promise((resolve) => setTimeout(resolve, 5000).unref()),
  ]);
  process.exit(ok ? 0 : 1);
}

main().catch((err) => {
  process.stderr.write(`dag_bullmq: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
