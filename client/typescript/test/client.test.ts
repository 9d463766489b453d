// Integration tests of Client against the real broker binary.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AttemptOutcome, Client, FailReason, JobBrokerError, JobState, Status } from "../src";
import { Broker, eventually } from "./broker";

const config = {
  queues: {
    retries: { retry: { maxAttempts: 3, initialBackoff: "0.05s", jitter: "JITTER_NONE" }, leaseDuration: "1s" },
  },
};

describe("Client", () => {
  let broker: Broker;
  let client: Client;

  before(async () => {
    broker = await Broker.start({ config });
    client = new Client({ address: broker.address, deadlineMs: 30_000 });
  });
  after(async () => {
    client?.close();
    assert.equal(await broker?.stop(), 0);
    await broker?.dispose();
  });

  test("enqueue, lease, heartbeat and ack complete a job", async () => {
    const { jobId, deduplicated } = await client.enqueue("basic", { hello: "world" }, { headers: { trace: "t-1" } });
    assert.equal(deduplicated, false);
    assert.equal((await client.getJob(jobId)).state, JobState.JOB_STATE_READY);

    const [job] = await client.lease("basic", { workerId: "ts-test", waitMs: 5000, leaseDurationMs: 10_000 });
    assert.equal(job.jobId, jobId);
    assert.equal(job.attempt, 1);
    assert.equal(job.idempotencyKey, jobId);
    assert.deepEqual(JSON.parse(job.payload.toString()), { hello: "world" });
    assert.deepEqual(job.headers, { trace: "t-1" });
    assert.equal((await client.getJob(jobId)).state, JobState.JOB_STATE_ACTIVE);

    const hb = await client.heartbeat(job, { extendByMs: 20_000, checkpoint: Buffer.from("half") });
    assert.ok(hb.leaseDeadline instanceof Date);
    assert.ok(hb.leaseDeadline.getTime() > job.leaseDeadline!.getTime(), "the heartbeat extended the lease");
    assert.equal(hb.cancelRequested, false);

    await client.ack(job, "done");
    const done = await client.getJob(jobId);
    assert.equal(done.state, JobState.JOB_STATE_COMPLETED);
    assert.equal(done.result.toString(), "done");
    assert.equal(done.checkpoint.toString(), "half");
    assert.equal(done.attempts.length, 1);
    assert.equal(done.attempts[0].outcome, AttemptOutcome.ATTEMPT_OUTCOME_COMPLETED);
    assert.equal(done.attempts[0].workerId, "ts-test");

    // Ack is idempotent per attempt.
    await client.ack(job, "done");
  });

  test("a failed attempt is SCHEDULED and then leased again as attempt 2", async () => {
    const { jobId } = await client.enqueue("retries", "flaky");
    const [first] = await client.lease("retries", { waitMs: 5000 });
    assert.equal(first.attempt, 1);
    assert.equal(first.maxAttempts, 3);
    const failed = await client.fail(first, "provider timed out", { retryAfterMs: 300 });
    assert.equal(failed.state, JobState.JOB_STATE_SCHEDULED);
    const scheduled = await client.getJob(jobId);
    assert.equal(scheduled.state, JobState.JOB_STATE_SCHEDULED);
    assert.equal(scheduled.lastError, "provider timed out");
    assert.equal(scheduled.attempts[0].outcome, AttemptOutcome.ATTEMPT_OUTCOME_ERROR);

    const second = await eventually(async () => (await client.lease("retries", { waitMs: 2000 }))[0], "attempt 2");
    assert.equal(second.jobId, jobId);
    assert.equal(second.attempt, 2);
    assert.notEqual(second.leaseId, first.leaseId);

    // The first attempt's lease is fenced off now.
    await assert.rejects(client.ack(first), (e: unknown) => e instanceof JobBrokerError && e.code === Status.FAILED_PRECONDITION);
    await client.ack(second);
    assert.equal((await client.getJob(jobId)).state, JobState.JOB_STATE_COMPLETED);
  });

  test("a permanent fail kills the job after one attempt", async () => {
    const { jobId } = await client.enqueue("retries", "poison");
    const [job] = await client.lease("retries", { waitMs: 5000 });
    const r = await client.fail(job, "bad address", { permanent: true });
    assert.equal(r.state, JobState.JOB_STATE_FAILED);
    const dead = await client.getJob(jobId);
    assert.equal(dead.state, JobState.JOB_STATE_FAILED);
    assert.equal(dead.failReason, FailReason.FAIL_REASON_PERMANENT);
    assert.equal(dead.attempts.length, 1);
    assert.equal(dead.attempts[0].outcome, AttemptOutcome.ATTEMPT_OUTCOME_PERMANENT_ERROR);
    assert.equal(dead.lastError, "bad address");

    // An operator can bring it back.
    const revived = await client.retryJob(jobId);
    assert.equal(revived.state, JobState.JOB_STATE_READY);
  });

  test("a second enqueue with the same dedup key returns the same job", async () => {
    const a = await client.enqueue("dedup", "welcome user_1", { dedupKey: "welcome:user_1" });
    const b = await client.enqueue("dedup", "welcome user_1", { dedupKey: "welcome:user_1" });
    assert.equal(a.deduplicated, false);
    assert.equal(b.deduplicated, true);
    assert.equal(b.jobId, a.jobId);
    assert.equal((await client.getJob(a.jobId)).idempotencyKey, "welcome:user_1");

    // The same key with another payload is a caller bug.
    await assert.rejects(
      client.enqueue("dedup", "something else", { dedupKey: "welcome:user_1" }),
      (e: unknown) => e instanceof JobBrokerError && e.code === Status.ALREADY_EXISTS,
    );
  });

  test("an empty queue name is INVALID_ARGUMENT naming the field", async () => {
    const err = await client.enqueue("", "x").then(
      () => assert.fail("enqueue should have been refused"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof JobBrokerError);
    assert.ok(err instanceof Error);
    assert.equal(err.code, Status.INVALID_ARGUMENT);
    assert.equal(err.codeName, "INVALID_ARGUMENT");
    assert.match(err.details, /queue/);
    assert.match(err.message, /^INVALID_ARGUMENT: /);
  });

  test("an unknown job is NOT_FOUND", async () => {
    await assert.rejects(client.getJob("01J00000000000000000000000"), (e: unknown) => e instanceof JobBrokerError && e.code === Status.NOT_FOUND);
  });

  test("a job waits for its dependencies, by id or by index in a batch", async () => {
    const { jobId: first } = await client.enqueue("deps", "a");
    const { jobId: after } = await client.enqueue("deps", "b", { dependsOn: [first] });
    assert.equal((await client.getJob(after)).state, JobState.JOB_STATE_WAITING);
    const [root, part, join] = await client.enqueueBatch([
      { queue: "deps-batch", payload: "root" },
      { queue: "deps-batch", payload: "part", dependsOnIndex: [0] },
      { queue: "deps-batch", payload: "join", dependsOnIndex: [1] },
    ]);
    assert.deepEqual((await client.getJob(join.jobId)).dependsOn, [part.jobId]);
    assert.equal((await client.getJob(join.jobId)).state, JobState.JOB_STATE_WAITING);
    assert.equal((await client.getJob(root.jobId)).state, JobState.JOB_STATE_READY);
  });

  test("every enqueue option reaches the job", async () => {
    const runAt = new Date(Date.now() + 3_600_000);
    const { jobId } = await client.enqueue("options", Buffer.from([0, 1, 2]), {
      headers: { a: "1" },
      priority: 7,
      runAt,
      dedupKey: "opt-1",
      dedupTtlMs: 60_000,
      maxAttempts: 9,
      leaseDurationMs: 2000,
      concurrencyKey: "tenant-a",
      timeoutMs: 90_000,
      expireAt: new Date(runAt.getTime() + 60_000),
    });
    const job = await client.getJob(jobId);
    assert.equal(job.state, JobState.JOB_STATE_SCHEDULED);
    assert.deepEqual([...job.payload], [0, 1, 2]);
    assert.deepEqual(job.headers, { a: "1" });
    assert.equal(job.priority, 7);
    assert.equal(job.maxAttempts, 9);
    assert.equal(job.dedupKey, "opt-1");
    assert.equal(job.concurrencyKey, "tenant-a");
    assert.equal(Math.round(job.runAt!.getTime() / 1000), Math.round(runAt.getTime() / 1000));
    assert.equal(Number(job.timeout!.seconds), 90);
    assert.equal(Math.round(job.expireAt!.getTime() / 1000), Math.round(runAt.getTime() / 1000) + 60);

    const delayed = await client.enqueue("options", "later", { delayMs: 3_600_000 });
    assert.equal((await client.getJob(delayed.jobId)).state, JobState.JOB_STATE_SCHEDULED);
    await assert.rejects(
      client.enqueue("options", "both", { delayMs: 1000, runAt }),
      (e: unknown) => e instanceof JobBrokerError && e.code === Status.INVALID_ARGUMENT,
    );
  });

  test("enqueueBatch is all or nothing and keeps order", async () => {
    const results = await client.enqueueBatch([
      { queue: "batch", payload: "one" },
      { queue: "batch", payload: "two", priority: 1 },
      { queue: "batch", payload: "three", dedupKey: "b3" },
    ]);
    assert.equal(results.length, 3);
    assert.equal(new Set(results.map((r) => r.jobId)).size, 3);
    assert.equal((await client.getJob(results[1].jobId)).payload.toString(), "two");
    await assert.rejects(
      client.enqueueBatch([{ queue: "batch", payload: "ok" }, { queue: "", payload: "bad" }]),
      (e: unknown) => e instanceof JobBrokerError && e.code === Status.INVALID_ARGUMENT,
    );
    assert.equal((await client.getQueue("batch")).counts["JOB_STATE_READY"], 3);
  });

  test("release gives a job back without counting an attempt", async () => {
    const { jobId } = await client.enqueue("release", "x");
    const [job] = await client.lease("release", { waitMs: 5000 });
    await client.release(job);
    const back = await client.getJob(jobId);
    assert.equal(back.state, JobState.JOB_STATE_READY);
    const [again] = await client.lease("release", { waitMs: 5000 });
    assert.equal(again.jobId, jobId);
    assert.equal(again.attempt, 1);
    await client.ack(again);
  });

  test("admin: queues, pause and resume, policy, cancel, purge", async () => {
    await client.enqueue("admin", "a");
    const paused = await client.pauseQueue("admin");
    assert.equal(paused.policy!.paused, true);
    assert.deepEqual(await client.lease("admin", { waitMs: 200 }), []);
    await client.resumeQueue("admin");
    const updated = await client.updateQueuePolicy("admin", { maxConcurrency: 2, retry: { maxAttempts: 4 } });
    assert.equal(updated.policy!.maxConcurrency, 2);
    assert.equal(updated.policy!.retry!.maxAttempts, 4);
    assert.ok((await client.listQueues()).some((q) => q.name === "admin"));

    const { jobId } = await client.enqueue("admin", "to cancel");
    assert.equal((await client.cancelJob(jobId)).state, JobState.JOB_STATE_CANCELLED);
    const page = await client.listJobs("admin", { state: JobState.JOB_STATE_CANCELLED });
    assert.deepEqual(page.jobs.map((j) => j.id), [jobId]);
    assert.equal(await client.purgeQueue("admin"), 1);
  });
});
