// Durable steps (JobContext.step) against the real broker binary.
import assert from "node:assert/strict";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { AttemptOutcome, Client, JobState, StepCheckpoint, Worker } from "../src";
import { Broker, eventually } from "./broker";
import { lines, spawnWorker } from "./processes";

const config = {
  queues: {
    steps: { retry: { maxAttempts: 5, initialBackoff: "0.05s", jitter: "JITTER_NONE" }, leaseDuration: "1s" },
    resume: { retry: { maxAttempts: 5, initialBackoff: "0.05s", jitter: "JITTER_NONE" } },
  },
};
const quiet = () => {};

describe("durable steps", () => {
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

  async function waitEnded(jobId: string) {
    return eventually(async () => {
      const j = await client.getJob(jobId);
      return j.state === JobState.JOB_STATE_COMPLETED || j.state === JobState.JOB_STATE_FAILED ? j : undefined;
    }, `job ${jobId} to end`);
  }

  test("a worker SIGKILLed in step 3 is resumed at step 3 by another process", async () => {
    const log = path.join(broker.tempDir, "steps.log");
    const { jobId } = await client.enqueue("steps", "three steps");
    const first = spawnWorker("steps", broker.address, log, { STEP3_HANG: "1" });
    await first.ready;
    await eventually(() => lines(log).includes(`step3-begin ${jobId}`), "step 3 to begin");
    first.proc.kill("SIGKILL");
    assert.equal((await first.exited).signal, "SIGKILL");

    const second = spawnWorker("steps", broker.address, log);
    await second.ready;
    const job = await waitEnded(jobId);
    second.proc.kill("SIGTERM");
    assert.equal((await second.exited).code, 0, second.stderr());

    assert.equal(job.state, JobState.JOB_STATE_COMPLETED);
    assert.deepEqual(JSON.parse(job.result.toString()), { a: 1, b: { sum: 2 }, c: 3 });
    assert.deepEqual(lines(log), [
      `one ${jobId}`,
      `two ${jobId}`,
      `step3-begin ${jobId}`, // the first process, killed here
      `step3-begin ${jobId}`, // the second process: steps one and two are not run again
      `three ${jobId}`,
    ]);
    assert.equal(job.attempts.length, 2);
    assert.equal(job.attempts[0].outcome, AttemptOutcome.ATTEMPT_OUTCOME_LEASE_EXPIRED);
    // The checkpoint is the cross-language StepCheckpoint with JSON results.
    const saved = StepCheckpoint.decode(job.checkpoint);
    assert.deepEqual(
      saved.steps.map((s) => [s.name, Buffer.from(s.result).toString()]),
      [["one", "1"], ["two", '{"sum":2}'], ["three", "3"]],
    );
  });

  test("finished steps survive a thrown error; values round-trip through JSON", async () => {
    const runs: string[] = [];
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("resume", async (job) => {
      const when = await job.step("created", () => {
        runs.push(`created#${job.attempt}`);
        return new Date(0); // saved as JSON: the ISO string
      });
      assert.equal(typeof when, "string");
      const nothing = await job.step("void", () => {
        runs.push(`void#${job.attempt}`);
      });
      assert.equal(nothing, null);
      await job.step("flaky", () => {
        runs.push(`flaky#${job.attempt}`);
        if (job.attempt < 3) throw new Error(`flaky step failed on attempt ${job.attempt}`);
        return "ok";
      });
      return when;
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("resume", "x");
      const job = await waitEnded(jobId);
      assert.equal(job.state, JobState.JOB_STATE_COMPLETED);
      assert.equal(job.attempt, 3);
      assert.equal(job.attempts[0].error, "flaky step failed on attempt 1");
      assert.deepEqual(runs, ["created#1", "void#1", "flaky#1", "flaky#2", "flaky#3"]);
      assert.equal(job.result.toString(), "1970-01-01T00:00:00.000Z"); // a string result is kept as text
    } finally {
      await worker.stop();
    }
  });

  test("using a step name twice in one attempt fails the attempt", async () => {
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("twice", async (job) => {
      await job.step("same", () => 1);
      await job.step("same", () => 2);
    });
    await worker.start();
    try {
      const { jobId } = await client.enqueue("twice", "x", { maxAttempts: 1 });
      const job = await waitEnded(jobId);
      assert.equal(job.state, JobState.JOB_STATE_FAILED);
      assert.match(job.lastError, /step "same" was used twice/);
    } finally {
      await worker.stop();
    }
  });

  test("a checkpoint that is not a StepCheckpoint fails the attempt with a clear message", async () => {
    const { jobId } = await client.enqueue("foreign", "x", { maxAttempts: 2 });
    const [leased] = await client.lease("foreign", { waitMs: 5000 });
    await client.heartbeat(leased, { checkpoint: Buffer.from("page=7 of 12, not a proto") });
    await client.fail(leased, "crashed", { retryAfterMs: 0 });

    let called = false;
    const worker = new Worker({ address: broker.address, log: quiet });
    worker.handle("foreign", async (job) => {
      await job.step("first", () => {
        called = true;
      });
    });
    await worker.start();
    try {
      const job = await waitEnded(jobId);
      assert.equal(job.state, JobState.JOB_STATE_FAILED);
      assert.match(job.lastError, /not a jobbroker\.v1\.StepCheckpoint/);
      assert.equal(called, false);
    } finally {
      await worker.stop();
    }
  });
});
