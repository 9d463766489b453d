// The worker contract (docs/worker-contract.md) as the TypeScript Worker keeps it, against the
// real broker binary: snooze, progress, time-outs, the end of a graceful stop's grace, prefetch,
// answers resent after a reconnect, and the "jobbroker-client" metadata.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import {
  AttemptOutcome,
  Client,
  JobCancelledError,
  JobState,
  SnoozeError,
  Worker,
  clientName,
  snooze,
} from "../src";
import type { ListWorkersResponse } from "../src/gen/jobbroker/v1/admin";
import { Broker, eventually, repoRoot } from "./broker";

const config = {
  queues: {
    // One attempt: a timed-out job ends FAILED instead of coming back to the test's worker.
    "timeout-once": { retry: { maxAttempts: 1 } },
    "lost-lease": { retry: { maxAttempts: 3, initialBackoff: "0.05s", jitter: "JITTER_NONE" } },
  },
};
const quiet = () => {};

/** A promise and the function that resolves it: a gate a handler waits at. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

describe("the worker contract", () => {
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

  async function waitState(c: Client, jobId: string, state: JobState) {
    return eventually(async () => {
      const j = await c.getJob(jobId);
      return j.state === state ? j : undefined;
    }, `job ${jobId} in ${JobState[state]}`);
  }

  test("a SnoozeError puts the job back without spending an attempt", async () => {
    const attempts: number[] = [];
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("snooze", (job) => {
      attempts.push(job.attempt);
      if (attempts.length === 1) throw snooze(200);
      return "later";
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("snooze", "x");
      const job = await waitState(client, jobId, JobState.JOB_STATE_COMPLETED);
      assert.equal(job.snoozes, 1);
      assert.equal(job.attempt, 1);
      assert.deepEqual(attempts, [1, 1]);
      assert.equal(job.result.toString(), "later");
    } finally {
      await worker.stop();
    }
    assert.equal(worker.stats.snoozed, 1);
    assert.ok(new SnoozeError(5) instanceof Error);
  });

  test("progress reaches the broker while the handler runs, the newest value last", async () => {
    const { opened, open } = gate();
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("progress", async (job) => {
      // A burst: the values between the first and the last may be dropped, the last may not.
      for (let percent = 1; percent <= 100; percent++) job.progress({ percent });
      await opened;
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("progress", "x");
      const running = await eventually(async () => {
        const j = await client.getJob(jobId);
        return j.progress.length > 0 && JSON.parse(j.progress.toString()).percent === 100 ? j : undefined;
      }, "progress 100 to be shown");
      assert.equal(running.state, JobState.JOB_STATE_ACTIVE);
      open();
      await waitState(client, jobId, JobState.JOB_STATE_COMPLETED);
    } finally {
      open();
      await worker.stop();
    }
  });

  test("a time-out aborts the signal at timeout_at; the handler keeps its slot until it returns", async () => {
    const { opened, open } = gate();
    let reason: unknown;
    const order: string[] = [];
    const worker = new Worker({ address: broker.address, concurrency: 1, log: quiet });
    worker.handle("timeout-once", async (job) => {
      order.push(`start ${job.text()}`);
      if (job.text() !== "slow") return "quick";
      assert.ok(job.timeoutAt instanceof Date);
      await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
      reason = job.signal.reason;
      // Ignores the signal until the test lets go, as a handler stuck in a blocking call would.
      await opened;
      order.push("end slow");
      return "too late";
    });
    await worker.start();
    try {
      const slow = await client.enqueue("timeout-once", "slow", { timeoutMs: 300 });
      const failed = await waitState(client, slow.jobId, JobState.JOB_STATE_FAILED);
      assert.equal(failed.attempts[0].outcome, AttemptOutcome.ATTEMPT_OUTCOME_TIMED_OUT);
      assert.ok(reason instanceof JobCancelledError);
      assert.equal(reason.reason, "timeout");
      // Concurrency 1 is a hard bound: the broker pushes the next job (its in-flight slot is
      // free), but it waits, leased, while the timed-out handler still runs.
      const quick = await client.enqueue("timeout-once", "quick");
      await waitState(client, quick.jobId, JobState.JOB_STATE_ACTIVE);
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert.deepEqual(order, ["start slow"]);
      open();
      await waitState(client, quick.jobId, JobState.JOB_STATE_COMPLETED);
      assert.deepEqual(order, ["start slow", "end slow", "start quick"]);
    } finally {
      open();
      await worker.stop();
    }
    // The late return of the timed-out handler was not answered: only the quick job was acked.
    const stats = worker.stats;
    assert.equal(stats.acked, 1, JSON.stringify(stats));
    assert.equal(stats.attemptsLost, 1, JSON.stringify(stats));
  });

  test("a lost lease aborts the signal; the next attempt waits until the old handler returned", async () => {
    let reason: unknown;
    const order: string[] = [];
    const worker = new Worker({ address: broker.address, concurrency: 1, leaseDurationMs: 1000, log: quiet });
    worker.handle("lost-lease", async (job) => {
      order.push(`start ${job.attempt}`);
      if (job.attempt > 1) return "second";
      // Blocks the event loop (no heartbeat goes out) until the broker has ended this attempt
      // and leased the job again, to this very stream.
      execFileSync(process.execPath, [path.join(__dirname, "fixtures/wait_attempt.js"), broker.address, "2", job.jobId], { stdio: "inherit", timeout: 120_000 });
      if (!job.signal.aborted) {
        await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
      }
      reason = job.signal.reason;
      // Ignores the signal for longer than a lease: attempt 2 waits, its heartbeats keep it.
      await new Promise((resolve) => setTimeout(resolve, 1500));
      order.push("end 1");
      return "first";
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("lost-lease", "x");
      const job = await waitState(client, jobId, JobState.JOB_STATE_COMPLETED);
      assert.equal(job.result.toString(), "second");
      assert.deepEqual(job.attempts.map((a) => a.outcome), [AttemptOutcome.ATTEMPT_OUTCOME_LEASE_EXPIRED, AttemptOutcome.ATTEMPT_OUTCOME_COMPLETED]);
      assert.deepEqual(order, ["start 1", "end 1", "start 2"]);
      assert.ok(reason instanceof JobCancelledError);
      assert.equal(reason.reason, "lease-lost");
    } finally {
      await worker.stop();
    }
    // The first attempt's late return was not answered.
    const stats = worker.stats;
    assert.equal(stats.acked, 1, JSON.stringify(stats));
    assert.equal(stats.attemptsLost, 1, JSON.stringify(stats));
  });

  test("a handler still running at the end of the grace is aborted and its job released", async () => {
    let reason: unknown;
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("grace", async (job) => {
      await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
      reason = job.signal.reason;
      // Even a normal return after the abort releases: the stop was not the job's fault.
      return "finished after all";
    });
    await worker.start();
    const { jobId } = await client.enqueue("grace", "x");
    await waitState(client, jobId, JobState.JOB_STATE_ACTIVE);
    await worker.stop(200);
    const job = await client.getJob(jobId);
    assert.equal(job.state, JobState.JOB_STATE_READY);
    assert.equal(job.attempts.length, 0, "a released job has no attempt counted");
    assert.ok(reason instanceof JobCancelledError);
    assert.equal(reason.reason, "shutdown");
    assert.equal(worker.stats.released, 1);
    assert.equal(worker.stats.acked, 0);
  });

  test("an operator-cancelled handler that throws is sent as the fail 'cancelled'", async () => {
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("cancel-fail", async (job) => {
      await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
      throw job.signal.reason;
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("cancel-fail", "x");
      await waitState(client, jobId, JobState.JOB_STATE_ACTIVE);
      await client.cancelJob(jobId);
      const job = await waitState(client, jobId, JobState.JOB_STATE_CANCELLED);
      assert.deepEqual(job.attempts.map((a) => a.error), ["cancelled"]);
    } finally {
      await worker.stop();
    }
    assert.equal(worker.stats.failed, 1);
    assert.equal(worker.stats.acked, 0);
  });

  test("an operator-cancelled handler that returns normally is acked: the job completes", async () => {
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("cancel-return", async (job) => {
      await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
      return "done anyway"; // the work was done after all
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("cancel-return", "x");
      await waitState(client, jobId, JobState.JOB_STATE_ACTIVE);
      await client.cancelJob(jobId);
      const job = await waitState(client, jobId, JobState.JOB_STATE_COMPLETED);
      assert.equal(job.result.toString(), "done anyway");
    } finally {
      await worker.stop();
    }
    assert.equal(worker.stats.acked, 1);
    assert.equal(worker.stats.failed, 0);
  });

  test("prefetched jobs wait leased, then go back unstarted at a stop", async () => {
    const { opened, open } = gate();
    const started: string[] = [];
    const worker = new Worker({ address: broker.address, concurrency: 1, prefetch: 1, log: quiet });
    worker.handle("prefetch", async (job) => {
      started.push(job.text());
      await opened;
    });
    await worker.start();
    const first = await client.enqueue("prefetch", "first");
    await eventually(() => started.includes("first"), "the first job to start");
    const second = await client.enqueue("prefetch", "second");
    await waitState(client, second.jobId, JobState.JOB_STATE_ACTIVE); // leased, held, not started
    const stopped = worker.stop(30_000);
    // Released at once, while the first job still runs.
    await waitState(client, second.jobId, JobState.JOB_STATE_READY);
    assert.equal((await client.getJob(first.jobId)).state, JobState.JOB_STATE_ACTIVE);
    open();
    await stopped;
    assert.equal((await client.getJob(first.jobId)).state, JobState.JOB_STATE_COMPLETED);
    assert.deepEqual(started, ["first"]);
    assert.equal((await client.getJob(second.jobId)).attempts.length, 0);
  });

  test("an ack that ended while the broker was down is sent again on the new stream", async () => {
    const b = await Broker.start({ config });
    const c = new Client(b.address);
    const { opened, open } = gate();
    let returned = false;
    const worker = new Worker({ address: b.address, leaseDurationMs: 30_000, reconnectMaxMs: 500, log: quiet });
    worker.handle("resend", async () => {
      await opened;
      returned = true;
      return "acked across a restart";
    });
    await worker.start();
    let restarted: Broker | undefined;
    try {
      const { jobId } = await c.enqueue("resend", "x");
      await waitState(c, jobId, JobState.JOB_STATE_ACTIVE);
      await b.kill();
      open();
      await eventually(() => returned, "the handler to return");
      restarted = await Broker.start({ dataDir: b.dataDir, listen: b.address, config }, b.tempDir);
      const job = await waitState(c, jobId, JobState.JOB_STATE_COMPLETED);
      assert.equal(job.attempts.length, 1, "completed by the first attempt's resent ack");
      assert.equal(job.result.toString(), "acked across a restart");
    } finally {
      open();
      await worker.stop();
      c.close();
      await restarted?.stop();
      await b.dispose();
    }
    assert.equal(worker.stats.ackMessages, 1, "a resend is not a new ack message");
  });

  test("a stream that ends during a graceful stop is reopened: the ack of a handler ending in the grace reaches the broker", async () => {
    // docs/worker-contract.md §6: a stream that ends before step 6 is reopened as usual, so that
    // the answers still to come reach the broker.
    const b = await Broker.start({ config });
    const c = new Client(b.address);
    const { opened, open } = gate();
    let started = false;
    const worker = new Worker({ address: b.address, leaseDurationMs: 30_000, reconnectMaxMs: 500, log: quiet });
    worker.handle("stop-reopen", async () => {
      started = true;
      await opened; // ignores its signal: the grace below is long enough anyway
      return "acked after a restart in the grace";
    });
    await worker.start();
    let restarted: Broker | undefined;
    let stopping: Promise<void> | undefined;
    try {
      const { jobId } = await c.enqueue("stop-reopen", "x");
      await waitState(c, jobId, JobState.JOB_STATE_ACTIVE);
      await eventually(() => started, "the handler to start");
      stopping = worker.stop(60_000);
      await b.kill(); // kill -9 during the grace: the worker's stream ends
      restarted = await Broker.start({ dataDir: b.dataDir, listen: b.address, config }, b.tempDir);
      open(); // the handler returns in the grace; its ack goes out on the reopened stream
      let bound: NodeJS.Timeout | undefined;
      await Promise.race([
        stopping,
        new Promise((_, reject) => {
          bound = setTimeout(() => reject(new Error("stop() did not return within 30 s of the handler's return")), 30_000);
        }),
      ]).finally(() => clearTimeout(bound));
      const job = await c.getJob(jobId);
      assert.equal(job.state, JobState.JOB_STATE_COMPLETED, "the ack reached the restarted broker before the stop returned");
      assert.equal(job.attempts.length, 1);
      assert.equal(job.result.toString(), "acked after a restart in the grace");
      assert.equal(worker.stats.acked, 1);
      assert.ok(worker.stats.reconnects >= 1, "the stream was reopened");
    } finally {
      open();
      await (stopping ?? worker.stop(0));
      c.close();
      await restarted?.stop();
      await b.dispose();
    }
  });

  test("a graceful stop ends within its bounds when no stream can be reopened", async () => {
    const b = await Broker.start({ config });
    const { opened, open } = gate();
    let started = false;
    const worker = new Worker({ address: b.address, leaseDurationMs: 30_000, reconnectMaxMs: 200, log: quiet });
    worker.handle("stop-no-broker", async () => {
      started = true;
      await opened;
      return "dropped";
    });
    await worker.start();
    try {
      const c = new Client(b.address);
      await c.enqueue("stop-no-broker", "x");
      c.close();
      await eventually(() => started, "the handler to start");
      const stopping = worker.stop(60_000);
      await b.kill(); // and never restarted
      open(); // its ack has no stream to go on
      let bound: NodeJS.Timeout | undefined;
      // Step 5 waits up to 1 s for the answers, step 6 up to 2.5 s for the streams to close:
      // 15 s is a bound for "it never returns" on a shared machine, not a timing check.
      await Promise.race([
        stopping,
        new Promise((_, reject) => {
          bound = setTimeout(() => reject(new Error("stop() did not return without a broker")), 15_000);
        }),
      ]).finally(() => clearTimeout(bound));
      assert.equal(worker.stats.acked, 1);
    } finally {
      open();
      await worker.stop(0);
      await b.dispose();
    }
  });

  test("every call names the library: ListWorkers shows jobbroker-typescript/<version>", async () => {
    const version = JSON.parse(readFileSync(path.join(repoRoot(), "client/typescript/package.json"), "utf8")).version;
    assert.equal(clientName, `jobbroker-typescript/${version}`);
    const worker = new Worker({ address: broker.address, workerId: "named-worker", log: quiet });
    worker.handle("named", () => {});
    await worker.start();
    try {
      const listed = await eventually(async () => {
        const r = await new Promise<ListWorkersResponse>((resolve, reject) =>
          client.admin.listWorkers({ queue: "named" }, (err, res) => (err ? reject(err) : resolve(res))),
        );
        return r.workers.find((w) => w.workerId === "named-worker" && w.streams > 0);
      }, "the worker to be listed");
      assert.equal(listed.client, clientName);
    } finally {
      await worker.stop();
    }
  });
});
