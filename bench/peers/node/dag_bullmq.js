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

const { FlowProducer, Queue, QueueEvents, UnrecoverableError, Worker } = require('bullmq');
const { CheckResults, DagRun, NowMs, ParseDagFlags, ParsePayload, Payload } = require('./dag_common');

const flags = ParseDagFlags({
  host: { type: 'string', default: '127.0.0.1' },
  port: { type: 'string', default: '6379' },
  fanout: { type: 'string', default: 'processor' },
});
const { opts, children, concurrency, payloadBytes, timeoutMs, fault } = flags;
const { fanout } = opts;
if (!['processor', 'events'].includes(fanout)) throw new Error('--fanout must be processor or events');
const queueName = `dag-${process.pid}-${Date.now()}`;
const connection = { host: opts.host, port: Number(opts.port) };
const run = new DagRun(flags, {
  system: 'bullmq',
  address: `${opts.host}:${opts.port}`,
  submit: `Queue.add(root), FlowProducer.add(join + ${children}) by the ${fanout === 'events' ? 'producer on QueueEvents' : "root's processor"}`,
  extra: { fanout },
  note: ` fanout=${fanout}`,
});
// The job name says the kind too (root, child, join), as a BullMQ user would dispatch on it.
const payload = (kind, d, child) => Payload(kind, d, child, payloadBytes);
const joinEnded = new Map(); // dag -> resolve({ok, error}) of the join's completed/failed event
const jobOpts = { removeOnComplete: true };
// --fanout events: job.waitUntilFinished throws "Missing key" when the root was already removed
// by the time it looks, so there the root stays a while (among the queue's last 100 completed).
const rootOpts = fanout === 'events' ? { removeOnComplete: { count: 100 } } : jobOpts;

// The join and its children, in one atomic FlowProducer.add; with --fault short the last child
// is a plain job instead.
async function AddFlow(flows, queue, d) {
  const kids = [];
  for (let i = 0; i < children; ++i) kids.push({ name: 'child', queueName, data: payload('c', d, i), opts: jobOpts });
  const extra = fault === 'short' ? kids.pop() : null;
  await flows.add({ name: 'join', queueName, data: payload('j', d, 0), opts: jobOpts, children: kids });
  if (extra) await queue.add(extra.name, extra.data, jobOpts);
}

async function RunDag(queue, flows, queueEvents, d) {
  const s = run.state[d];
  const ended = new Promise((resolve) => joinEnded.set(d, resolve));
  s.submitMs = NowMs();
  const root = await queue.add('root', payload('r', d, 0), rootOpts);
  if (fanout === 'events') {
    await root.waitUntilFinished(queueEvents, timeoutMs);
    await AddFlow(flows, queue, d);
  }
  const end = await ended;
  s.doneMs = end.atMs;
  if (!end.ok) run.errors.Record(`dag ${d}`, `the join failed: ${end.error}`);
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
        run.state[p.dag].rootEndMs = NowMs(); // the root's work (none) is done
        if (fanout === 'processor') await AddFlow(flows, queue, p.dag);
        ++run.handled;
        return undefined;
      }
      if (job.name === 'child') {
        ++run.handled;
        return String(p.child);
      }
      run.state[p.dag].joinStartMs = NowMs();
      const values = await job.getChildrenValues();
      try {
        CheckResults(Object.values(values), children);
      } catch (err) {
        run.errors.Record(`join of dag ${p.dag}`, err);
        throw new UnrecoverableError(err.message);
      }
      ++run.handled;
      return undefined;
    },
    { connection, concurrency },
  );
  worker.on('error', (err) => run.errors.Record('worker', err));
  // Emitted once Redis has the job completed (or failed): the join's end is the DAG's.
  worker.on('completed', (job) => {
    if (job.name === 'join') joinEnded.get(ParsePayload(job.data).dag)?.({ ok: true, atMs: NowMs() });
  });
  worker.on('failed', (job, err) => {
    // A failed root (or its flow add) ends its DAG too, so that nothing waits for its join.
    if (job && (job.name === 'join' || job.name === 'root')) {
      joinEnded.get(ParsePayload(job.data).dag)?.({ ok: false, atMs: NowMs(), error: `${job.name}: ${err.message}` });
    } else {
      run.errors.Record(`${job ? job.name : 'a job'} failed`, err);
    }
  });
  await worker.waitUntilReady();

  const ok = await run.RunAll((d) => RunDag(queue, flows, queueEvents, d));
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
