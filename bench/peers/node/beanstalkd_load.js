'use strict';
// The workloads against beanstalkd, through the small pipelining client in beanstalk.js.
//
// Each run uses a fresh tube. A consumer is one connection looping reserve -> (no-op handler) ->
// delete; it writes the delete and its next reserve together, the way BullMQ's worker fetches
// its next job in the same call that completes the last one. beanstalkd has no batch put, so
// there is no `batch` workload here (load.js reports it as null).

const { Connection } = require('./beanstalk');
const { NewReport, NowMs, Payload, SendAtRate, SeqOf, Sleep } = require('./common');

const kMaxErrors = 100;
// Time for consumers' first reserve to reach the server before the producer starts, so the first
// jobs do not measure connection set-up.
const kSettleMs = 100;

function TubeName() {
  return `bench-${process.pid}-${Date.now()}`;
}

async function Producer(flags, tube) {
  const conn = await Connection.Connect(flags.host, flags.port);
  await conn.Use(tube);
  return conn;
}

async function Consumer(flags, tube) {
  const conn = await Connection.Connect(flags.host, flags.port);
  await conn.Watch(tube);
  await conn.Ignore('default');
  return conn;
}

// `inFlight` loops share `next` and put single jobs until `jobs` are claimed. `onSent(seq, t)`
// is called just before each put is written; `onPut(seq, ms)` after its reply.
async function PutAll(conn, flags, inFlight, r, onSent, onPut) {
  let next = 0;
  const loop = async () => {
    for (;;) {
      const seq = next++;
      if (seq >= flags.jobs || r.errors.count >= kMaxErrors || conn.error) return;
      const t0 = NowMs();
      if (onSent) onSent(seq, t0);
      try {
        await conn.Put(Payload(seq, flags.payloadBytes));
        if (onPut) onPut(seq, NowMs() - t0);
      } catch (err) {
        r.errors.Record('put', err);
      }
    }
  };
  await Promise.all(Array.from({ length: inFlight }, loop));
}

// Reserves and deletes jobs until `isDone()`; `onJob(body, t)` is the handler, called when the
// job arrives; `onDeleted()` after the server confirmed the delete.
async function ConsumeLoop(conn, r, isDone, onJob, onDeleted) {
  let job;
  try {
    job = await conn.Reserve();
  } catch (err) {
    if (!isDone()) r.errors.Record('reserve', err);
    return;
  }
  for (;;) {
    onJob(job.body, NowMs());
    const deleted = conn.Delete(job.id);
    // Pipelined with the delete: written in the same send, answered after it.
    const next = conn.Reserve();
    next.catch(() => {}); // a reserve still open when the run ends is rejected by Close()
    try {
      await deleted;
      onDeleted();
    } catch (err) {
      r.errors.Record('delete', err);
    }
    if (isDone() || r.errors.count >= kMaxErrors) return;
    try {
      job = await next;
    } catch (err) {
      if (!isDone()) r.errors.Record('reserve', err);
      return;
    }
  }
}

// `--concurrency` puts in flight on one connection; latency is each put's round trip.
async function enqueue(flags, run) {
  const r = NewReport(flags, 'enqueue');
  run.report = r;
  const conn = await Producer(flags, TubeName());
  r.startMs = NowMs();
  await PutAll(conn, flags, flags.concurrency, r, null, (seq, ms) => {
    r.done++;
    r.latencies.AddMs(ms);
  });
  r.seconds = (NowMs() - r.startMs) / 1000;
  conn.Close();
  return r;
}

// Producer and `--concurrency` consumer connections at once, in this process; jobs/s from the
// first put to the last confirmed delete. Latency: from just before a job's put is written to
// its delete being confirmed.
async function e2e(flags, run) {
  const r = NewReport(flags, 'send_to_complete');
  run.report = r;
  // Puts have no batch form: the producer keeps 64 single puts in flight unless told otherwise.
  const inFlight = flags.explicit.has('producerInFlight') ? flags.producerInFlight : 64;
  r.producerInFlight = inFlight;
  const tube = TubeName();
  const sentAt = new Float64Array(flags.jobs);
  const consumers = await Promise.all(
    Array.from({ length: flags.concurrency }, () => Consumer(flags, tube)),
  );
  const producer = await Producer(flags, tube);
  let finished = 0;
  const isDone = () => r.done >= flags.jobs;
  const loops = consumers.map((c) => {
    let seq = -1;
    return ConsumeLoop(
      c,
      r,
      isDone,
      (body) => {
        seq = SeqOf(body);
      },
      () => {
        r.latencies.AddMs(NowMs() - sentAt[seq]);
        if (++r.done === flags.jobs) finished = NowMs();
      },
    );
  });
  await Sleep(kSettleMs);
  r.startMs = NowMs();
  await PutAll(producer, flags, inFlight, r, (seq, t) => {
    sentAt[seq] = t;
  });
  // Consumers blocked in reserve once the last job is gone: wait for the last delete, then
  // closing the connections ends their loops.
  while (!isDone() && r.errors.count === 0) await Sleep(2);
  r.seconds = ((finished || NowMs()) - r.startMs) / 1000;
  for (const c of consumers) c.Close();
  producer.Close();
  await Promise.all(loops);
  return r;
}

// The tube filled first (64 puts in flight, or `--producer-in-flight`; not timed), then
// `--concurrency` consumer connections empty it: jobs/s from their connecting to the last
// confirmed delete.
async function drain(flags, run) {
  const r = NewReport(flags, 'none');
  run.report = r;
  const inFlight = flags.explicit.has('producerInFlight') ? flags.producerInFlight : 64;
  r.producerInFlight = inFlight;
  const tube = TubeName();
  const producer = await Producer(flags, tube);
  await PutAll(producer, flags, inFlight, r, null, null);
  producer.Close();
  let finished = 0;
  const isDone = () => r.done >= flags.jobs;
  r.startMs = NowMs();
  const consumers = await Promise.all(
    Array.from({ length: flags.concurrency }, () => Consumer(flags, tube)),
  );
  const loops = consumers.map((c) =>
    ConsumeLoop(
      c,
      r,
      isDone,
      () => {},
      () => {
        if (++r.done === flags.jobs) finished = NowMs();
      },
    ),
  );
  while (!isDone() && r.errors.count === 0) await Sleep(2);
  r.seconds = ((finished || NowMs()) - r.startMs) / 1000;
  for (const c of consumers) c.Close();
  await Promise.all(loops);
  return r;
}

// One idle consumer (`--concurrency` connections, default 16); one producer puts at `--rate`
// per second, one put at a time. Latency: from just before the put is written to the moment
// the consumer's handler starts (same process, same clock).
async function latency(flags, run) {
  const r = NewReport(flags, 'send_to_handler');
  run.report = r;
  const tube = TubeName();
  const sentAt = new Float64Array(flags.jobs);
  const consumers = await Promise.all(
    Array.from({ length: flags.concurrency }, () => Consumer(flags, tube)),
  );
  const producer = await Producer(flags, tube);
  let handled = 0;
  const isDone = () => handled >= flags.jobs;
  const loops = consumers.map((c) =>
    ConsumeLoop(
      c,
      r,
      isDone,
      (body, t) => {
        r.latencies.AddMs(t - sentAt[SeqOf(body)]);
        ++handled;
      },
      () => {
        ++r.done;
      },
    ),
  );
  await Sleep(kSettleMs);
  await SendAtRate(flags, r, sentAt, kMaxErrors, 'put', (seq) =>
    producer.Put(Payload(seq, flags.payloadBytes)),
  );
  while (r.done < flags.jobs && r.errors.count === 0) await Sleep(2);
  r.seconds = (NowMs() - r.startMs) / 1000;
  for (const c of consumers) c.Close();
  producer.Close();
  await Promise.all(loops);
  return r;
}

module.exports = { enqueue, e2e, drain, latency };
