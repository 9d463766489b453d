'use strict';
// The workloads against BullMQ on Redis, used the way its documentation shows: one Queue (one
// ioredis connection) to add, one Worker with `concurrency` to process, default settings
// otherwise. Every job is added with removeOnComplete: true, so completed jobs are deleted at
// once and Redis memory stays flat however many jobs a run pushes through.

const { Queue, Worker } = require('bullmq');
const { NewReport, NowMs, Payload, SendAtRate, SeqOf, Sleep } = require('./common');

const kMaxErrors = 100;
// Time for the worker's first blocking fetch to reach Redis before the producer starts.
const kSettleMs = 200;
const kJobName = 'bench';

function Connection(flags) {
  return { host: flags.host, port: flags.port };
}

async function NewQueue(flags) {
  const queue = new Queue(`bench-${process.pid}-${Date.now()}`, {
    connection: Connection(flags),
    defaultJobOptions: { removeOnComplete: true },
  });
  queue.on('error', () => {}); // connection errors also reject the calls, which count them
  await queue.waitUntilReady();
  return queue;
}

async function NewWorker(flags, queue, handler) {
  const worker = new Worker(queue.name, handler, {
    connection: Connection(flags),
    concurrency: flags.concurrency,
  });
  worker.on('error', () => {});
  await worker.waitUntilReady();
  return worker;
}

// `inFlight` loops share `next` and add jobs until `jobs` are claimed, `size` at a time (1:
// Queue.add, more: Queue.addBulk). `onSent(first, n, t)` runs just before each request is
// sent; `onAdded(n, ms)` after its reply.
async function AddAll(queue, flags, inFlight, size, r, onSent, onAdded) {
  let next = 0;
  const loop = async () => {
    for (;;) {
      const first = next;
      if (first >= flags.jobs || r.errors.count >= kMaxErrors) return;
      const n = Math.min(size, flags.jobs - first);
      next += n;
      const t0 = NowMs();
      if (onSent) onSent(first, n, t0);
      try {
        if (size === 1) {
          await queue.add(kJobName, Payload(first, flags.payloadBytes));
        } else {
          const jobs = [];
          for (let i = 0; i < n; ++i) {
            jobs.push({ name: kJobName, data: Payload(first + i, flags.payloadBytes) });
          }
          await queue.addBulk(jobs);
        }
        if (onAdded) onAdded(n, NowMs() - t0);
      } catch (err) {
        r.errors.Record(size === 1 ? 'add' : 'addBulk', err);
      }
    }
  };
  await Promise.all(Array.from({ length: inFlight }, loop));
}

// `--concurrency` single adds in flight; latency is each add's round trip.
async function enqueue(flags, run) {
  const r = NewReport(flags, 'enqueue');
  run.report = r;
  const queue = await NewQueue(flags);
  r.startMs = NowMs();
  await AddAll(queue, flags, flags.concurrency, 1, r, null, (n, ms) => {
    r.done += n;
    r.latencies.AddMs(ms);
  });
  r.seconds = (NowMs() - r.startMs) / 1000;
  await queue.close();
  return r;
}

// addBulk of `--batch` jobs, `--concurrency` batches in flight; latency is each batch's.
async function batch(flags, run) {
  const r = NewReport(flags, 'batch');
  run.report = r;
  r.batch = flags.batch;
  const queue = await NewQueue(flags);
  r.startMs = NowMs();
  await AddAll(queue, flags, flags.concurrency, flags.batch, r, null, (n, ms) => {
    r.done += n;
    r.latencies.AddMs(ms);
  });
  r.seconds = (NowMs() - r.startMs) / 1000;
  await queue.close();
  return r;
}

// A producer (addBulk of `--batch`, `--producer-in-flight` batches in flight) and a Worker with
// `--concurrency` at once, in this process; jobs/s from the first add to the last completion
// (the worker's `completed` event, after Redis has the job finished). Latency: from just before
// a job's batch is sent to its completion.
async function e2e(flags, run) {
  const r = NewReport(flags, 'send_to_complete');
  run.report = r;
  r.batch = flags.batch;
  r.producerInFlight = flags.producerInFlight;
  const queue = await NewQueue(flags);
  const sentAt = new Float64Array(flags.jobs);
  let finished = 0;
  const worker = await NewWorker(flags, queue, async () => {});
  worker.on('completed', (job) => {
    r.latencies.AddMs(NowMs() - sentAt[SeqOf(job.data)]);
    if (++r.done === flags.jobs) finished = NowMs();
  });
  worker.on('failed', (job, err) => r.errors.Record('job failed', err));
  await Sleep(kSettleMs);
  r.startMs = NowMs();
  await AddAll(queue, flags, flags.producerInFlight, flags.batch, r, (first, n, t) => {
    sentAt.fill(t, first, first + n);
  });
  while (r.done < flags.jobs && r.errors.count === 0) await Sleep(2);
  r.seconds = ((finished || NowMs()) - r.startMs) / 1000;
  await worker.close();
  await queue.close();
  return r;
}

// The queue filled first (addBulk of `--batch`, `--producer-in-flight` in flight; not timed),
// then one Worker with `--concurrency` empties it: jobs/s from the Worker's creation to the last
// completion, which is what the fetch-and-complete path alone sustains.
async function drain(flags, run) {
  const r = NewReport(flags, 'none');
  run.report = r;
  r.batch = flags.batch;
  r.producerInFlight = flags.producerInFlight;
  const queue = await NewQueue(flags);
  await AddAll(queue, flags, flags.producerInFlight, flags.batch, r, null, null);
  const enqueued = (await queue.getJobCounts('wait')).wait;
  if (enqueued !== flags.jobs) r.errors.Record('fill', `${enqueued} of ${flags.jobs} jobs waiting`);
  let finished = 0;
  r.startMs = NowMs();
  const worker = await NewWorker(flags, queue, async () => {});
  worker.on('completed', () => {
    if (++r.done === flags.jobs) finished = NowMs();
  });
  worker.on('failed', (job, err) => r.errors.Record('job failed', err));
  while (r.done < flags.jobs && r.errors.count === 0) await Sleep(2);
  r.seconds = ((finished || NowMs()) - r.startMs) / 1000;
  await worker.close();
  await queue.close();
  return r;
}

// One idle Worker (`--concurrency`, default 16); one producer adds at `--rate` per second, one
// add at a time. Latency: from just before the add is sent to the moment the handler starts
// (same process, same clock).
async function latency(flags, run) {
  const r = NewReport(flags, 'send_to_handler');
  run.report = r;
  const queue = await NewQueue(flags);
  const sentAt = new Float64Array(flags.jobs);
  const worker = await NewWorker(flags, queue, async (job) => {
    r.latencies.AddMs(NowMs() - sentAt[SeqOf(job.data)]);
  });
  worker.on('completed', () => {
    ++r.done;
  });
  worker.on('failed', (job, err) => r.errors.Record('job failed', err));
  await Sleep(kSettleMs);
  await SendAtRate(flags, r, sentAt, kMaxErrors, 'add', (seq) =>
    queue.add(kJobName, Payload(seq, flags.payloadBytes)),
  );
  while (r.done < flags.jobs && r.errors.count === 0) await Sleep(2);
  r.seconds = (NowMs() - r.startMs) / 1000;
  await worker.close();
  await queue.close();
  return r;
}

module.exports = { enqueue, batch, e2e, drain, latency };
