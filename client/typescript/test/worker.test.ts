// Integration tests of Worker against the real broker binary.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import net from "node:net";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  AttemptOutcome,
  Client,
  FailReason,
  JobBrokerError,
  JobCancelledError,
  JobState,
  PermanentError,
  Status,
  Worker,
  retryAfter,
} from "../src";
import { Broker, eventually } from "./broker";
import { lines, spawnWorker } from "./processes";

const config = {
  queues: {
    flaky: { retry: { maxAttempts: 3, initialBackoff: "0.05s", jitter: "JITTER_NONE" } },
    short: { leaseDuration: "1s" },
    "stale-acks": { retry: { maxAttempts: 3, initialBackoff: "0.05s", jitter: "JITTER_NONE" } },
  },
};
const quiet = () => {};

describe("Worker", () => {
  let broker: Broker;
  let client: Client;

  before(async () => {
    broker = await Broker.start({ config });
    client = new Client(broker.address);
  });
  after(async () => {
    client?.close();
    await broker?.dispose();
  });

  async function waitState(jobId: string, state: JobState) {
    return eventually(async () => {
      const j = await client.getJob(jobId);
      return j.state === state ? j : undefined;
    }, `job ${jobId} in ${JobState[state]}`);
  }

  test("heartbeats keep a 1 s lease alive over a 3 s job", async () => {
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("short", async (job) => {
      await sleep(3000);
      return { done: job.text() };
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("short", "long job");
      const job = await waitState(jobId, JobState.JOB_STATE_COMPLETED);
      assert.equal(job.attempt, 1);
      assert.equal(job.attempts.length, 1);
      assert.equal(job.attempts[0].outcome, AttemptOutcome.ATTEMPT_OUTCOME_COMPLETED);
      assert.deepEqual(JSON.parse(job.result.toString()), { done: "long job" });
    } finally {
      await worker.stop();
    }
  });

  test("a thrown error is retried; PermanentError kills the job after one attempt", async () => {
    const seen: string[] = [];
    const worker = new Worker({ address: broker.address, concurrency: 2, log: quiet });
    worker.handle("flaky", async (job) => {
      seen.push(`${job.text()}#${job.attempt}`);
      if (job.text() === "poison") throw new PermanentError("malformed address");
      if (job.attempt === 1) throw new Error("provider timed out");
      return "sent";
    });
    await worker.start();
    try {
      const flaky = await client.enqueue("flaky", "flaky");
      const poison = await client.enqueue("flaky", "poison");
      const ok = await waitState(flaky.jobId, JobState.JOB_STATE_COMPLETED);
      assert.equal(ok.attempt, 2);
      assert.equal(ok.attempts[0].outcome, AttemptOutcome.ATTEMPT_OUTCOME_ERROR);
      assert.equal(ok.attempts[0].error, "provider timed out");

      const dead = await waitState(poison.jobId, JobState.JOB_STATE_FAILED);
      assert.equal(dead.failReason, FailReason.FAIL_REASON_PERMANENT);
      assert.equal(dead.attempts.length, 1);
      assert.equal(dead.attempts[0].outcome, AttemptOutcome.ATTEMPT_OUTCOME_PERMANENT_ERROR);
      assert.equal(dead.lastError, "malformed address");
      assert.deepEqual(seen.filter((s) => s.startsWith("poison")), ["poison#1"]);
    } finally {
      await worker.stop();
    }
    assert.equal(worker.stats.failed, 2);
    assert.equal(worker.stats.acked, 1);
  });

  test("retryAfter replaces the backoff of the next attempt", async () => {
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("flaky", () => {
      throw retryAfter(600_000, "rate limited");
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("flaky", "rate limited");
      const job = await waitState(jobId, JobState.JOB_STATE_SCHEDULED);
      assert.equal(job.lastError, "rate limited");
      // The queue's backoff is 50 ms; the job waits the ten minutes it was asked for.
      const waitMs = job.runAt!.getTime() - job.attempts[0].endedAt!.getTime();
      assert.ok(waitMs > 300_000, `next attempt ${waitMs} ms after the failure`);
    } finally {
      await worker.stop();
    }
  });

  test("an operator's cancel aborts the job's signal", async () => {
    const worker = new Worker({ address: broker.address, log: quiet });
    let reason: unknown;
    worker.handle("cancellable", async (job) => {
      await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
      reason = job.signal.reason;
      throw job.signal.reason;
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("cancellable", "x");
      await waitState(jobId, JobState.JOB_STATE_ACTIVE);
      await client.cancelJob(jobId);
      await waitState(jobId, JobState.JOB_STATE_CANCELLED);
      assert.ok(reason instanceof JobCancelledError);
      assert.equal(reason.reason, "cancel-requested");
    } finally {
      await worker.stop();
    }
  });

  test("a backlog is handled once each, with fewer ack messages than jobs", async () => {
    const n = 300;
    const ids = (await client.enqueueBatch(Array.from({ length: n }, (_, i) => ({ queue: "backlog", payload: `job${i}` })))).map((r) => r.jobId);
    const handled = new Map<string, number>();
    const worker = new Worker({ address: broker.address, concurrency: 16, log: quiet });
    worker.handle("backlog", (job) => {
      handled.set(job.jobId, (handled.get(job.jobId) ?? 0) + 1);
    });
    await worker.start();
    try {
      await eventually(async () => (await client.getQueue("backlog")).counts["JOB_STATE_COMPLETED"] === n, `${n} jobs to complete`);
    } finally {
      await worker.stop();
    }
    assert.deepEqual([...handled.keys()].sort(), [...ids].sort());
    assert.ok([...handled.values()].every((c) => c === 1), "each job handled once");
    for (const id of ids) {
      const j = await client.getJob(id);
      assert.equal(j.state, JobState.JOB_STATE_COMPLETED);
      assert.equal(j.attempt, 1);
    }
    const stats = worker.stats;
    assert.equal(stats.acked, n);
    // Acks that completed while one was unanswered went out together (AckBatch).
    assert.ok(stats.ackMessages > 0 && stats.ackMessages < n, JSON.stringify(stats));
  });

  test("stale acks in a batch are logged and the worker carries on", async () => {
    const n = 4;
    const ids = (await client.enqueueBatch(Array.from({ length: n }, (_, i) => ({ queue: "stale-acks", payload: `job${i}` })))).map((r) => r.jobId);
    const logged: string[] = [];
    const worker = new Worker({ address: broker.address, concurrency: n, leaseDurationMs: 1000, log: (m) => logged.push(m) });
    const started = new Set<string>();
    let releaseOthers!: () => void;
    const allStarted = new Promise<void>((resolve) => (releaseOthers = resolve));
    worker.handle("stale-acks", async (job) => {
      if (job.attempt > 1 || !ids.includes(job.jobId)) return "second";
      started.add(job.jobId);
      if (started.size < n) {
        await allStarted;
        return "first";
      }
      releaseOthers();
      // Blocks the event loop (the bug of CPU work in a handler): no heartbeats go out, the four
      // 1 s leases run out, and the broker leases the jobs again (attempt 2, pushed to this very
      // stream) before these acks of attempt 1 reach it. The first of them goes out alone; the
      // other three complete while it is unanswered and follow as one AckBatch, whose items are
      // stale. The block lasts until the broker shows attempt 2 active.
      execFileSync(process.execPath, [path.join(__dirname, "fixtures/wait_attempt.js"), broker.address, "2", ...ids], { stdio: "inherit", timeout: 120_000 });
      return "first";
    });
    await worker.start();
    try {
      for (const id of ids) {
        const j = await waitState(id, JobState.JOB_STATE_COMPLETED);
        assert.equal(j.result.toString(), "second");
        assert.deepEqual(j.attempts.map((a) => a.outcome), [AttemptOutcome.ATTEMPT_OUTCOME_LEASE_EXPIRED, AttemptOutcome.ATTEMPT_OUTCOME_COMPLETED]);
      }
      // The worker still works after the refused items.
      const after = await client.enqueue("stale-acks", "after");
      await waitState(after.jobId, JobState.JOB_STATE_COMPLETED);
    } finally {
      await worker.stop();
    }
    const stats = worker.stats;
    assert.equal(stats.acked, 2 * n + 1);
    // The lone first ack and the three in the batch: all refused as stale, nothing else logged.
    assert.equal(stats.acksRefused, n, JSON.stringify(stats));
    assert.ok(stats.ackMessages < stats.acked, JSON.stringify(stats));
    assert.deepEqual(logged, []);
  });

  test("stop sends the acks buffered behind an unanswered one", async () => {
    const n = 40;
    const ids = (await client.enqueueBatch(Array.from({ length: n }, (_, i) => ({ queue: "stop-acks", payload: `job${i}` })))).map((r) => r.jobId);
    const worker = new Worker({ address: broker.address, concurrency: n, log: quiet });
    const started = new Set<string>();
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    worker.handle("stop-acks", async (job) => {
      started.add(job.jobId);
      await gate;
    });
    await worker.start();
    await eventually(() => started.size === n, `all ${n} jobs to start`);
    // All n finish at once as the stop begins: one ack goes out, the rest wait behind it.
    const stopped = worker.stop();
    open();
    await stopped;
    // stop() has resolved: every ack, buffered ones included, was sent and answered.
    for (const id of ids) assert.equal((await client.getJob(id)).state, JobState.JOB_STATE_COMPLETED);
    const stats = worker.stats;
    assert.equal(stats.acked, n);
    assert.ok(stats.ackMessages < n, JSON.stringify(stats));
  });

  test("a refused subscription rejects start() with the broker's code", async () => {
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("not a valid queue name!", () => {});
    await assert.rejects(worker.start(), (e: unknown) => e instanceof JobBrokerError && e.code === Status.INVALID_ARGUMENT);
  });

  test("SIGTERM drains: the running job is acked, the rest released, exit 0", async () => {
    const log = path.join(broker.tempDir, "drain.log");
    const ids = (await client.enqueueBatch(["j1", "j2", "j3", "j4", "j5"].map((p) => ({ queue: "drain", payload: p })))).map((r) => r.jobId);
    const w = spawnWorker("slow", broker.address, log, { SLOW_MS: "2000" });
    await w.ready;
    await eventually(() => lines(log).includes("start j1"), "j1 to start");
    w.proc.kill("SIGTERM");
    const exit = await w.exited;
    assert.deepEqual(exit, { code: 0, signal: null }, w.stderr());
    assert.deepEqual(lines(log), ["start j1", "end j1"]);
    assert.equal((await client.getJob(ids[0])).state, JobState.JOB_STATE_COMPLETED);
    for (const id of ids.slice(1)) {
      const j = await client.getJob(id);
      assert.equal(j.state, JobState.JOB_STATE_READY, `${id} should be READY`);
      assert.equal(j.attempts.length, 0, "a released job has no attempt counted");
    }
    // Nothing is lost: another worker finishes the rest.
    const worker = new Worker({ address: broker.address, concurrency: 4, log: quiet });
    worker.handle("drain", () => {});
    await worker.start();
    try {
      for (const id of ids) await waitState(id, JobState.JOB_STATE_COMPLETED);
    } finally {
      await worker.stop();
    }
  });

  test("SIGTERM while run() still connects stops the worker gracefully, exit 0", async () => {
    // Nothing listens there: run()'s start() is still waiting for its first subscription.
    const port = await new Promise<number>((resolve) => {
      const server = net.createServer();
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as net.AddressInfo;
        server.close(() => resolve(port));
      });
    });
    const log = path.join(broker.tempDir, "connecting.log");
    const w = spawnWorker("slow", `127.0.0.1:${port}`, log, { RUN_ONLY: "1" });
    await w.ready;
    w.proc.kill("SIGTERM");
    assert.deepEqual(await w.exited, { code: 0, signal: null }, w.stderr());
  });

  test("the worker reconnects after the broker restarts", async () => {
    const b = await Broker.start({ config });
    const c = new Client(b.address);
    const done: string[] = [];
    const worker = new Worker({ address: b.address, log: quiet, reconnectMaxMs: 500 });
    worker.handle("restart", (job) => {
      done.push(job.text());
    });
    await worker.start();
    let restarted: Broker | undefined;
    try {
      await c.enqueue("restart", "before");
      await eventually(() => done.includes("before"), "the job before the restart");
      await b.kill();
      restarted = await Broker.start({ dataDir: b.dataDir, listen: b.address, config }, b.tempDir);
      const { jobId } = await c.enqueue("restart", "after").catch(async () =>
        eventually(() => c.enqueue("restart", "after"), "enqueue after the restart"),
      );
      await eventually(async () => (await c.getJob(jobId)).state === JobState.JOB_STATE_COMPLETED, "the job after the restart");
      assert.deepEqual(done, ["before", "after"]);
      assert.ok(worker.stats.reconnects >= 1);
    } finally {
      await worker.stop();
      c.close();
      await restarted?.stop();
      await b.dispose();
    }
  });
});
