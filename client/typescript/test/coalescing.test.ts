// Enqueue coalescing (docs/worker-contract.md §10): the flush rules against a stubbed sender, the
// options' validation, and the real broker's call counts (its /metrics) for merged, split,
// opted-out, deduplicated and multi-partition enqueues.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { Client, JobBrokerError, Status, type EnqueueResult } from "../src";
import { Coalescer, jobBytes, type CoalescerOptions } from "../src/coalescer";
import { toEnqueueRequest } from "../src/client";
import type { EnqueueRequest } from "../src/gen/jobbroker/v1/broker";
import { partitionOfQueue } from "../src/partition";
import { Broker, eventually } from "./broker";

// ---- The flush rules, against a stubbed sender ----------------------------------------------

interface Sent {
  /** The payloads of the batch, as text, in the order sent. */
  jobs: string[];
  deadlineMs: number;
  /** Answers the call (results are "id-<payload>"), or fails it with `error`. */
  answer(error?: unknown): void;
}

/**
 * A Coalescer whose sends are recorded and answered by the test (or at once with `autoAnswer`),
 * so that what is in flight at each moment is the test's to decide.
 */
function stubbed(options: Partial<CoalescerOptions>, autoAnswer = false, place = (r: EnqueueRequest) => r.queue) {
  const sent: Sent[] = [];
  let outstanding = 0;
  let maxOutstanding = 0;
  const record = <T>(requests: EnqueueRequest[], deadlineMs: number, result: () => T): Promise<T> => {
    outstanding++;
    maxOutstanding = Math.max(maxOutstanding, outstanding);
    return new Promise<T>((resolve, reject) => {
      const s: Sent = {
        jobs: requests.map((r) => r.payload.toString()),
        deadlineMs,
        answer: (error) => {
          outstanding--;
          if (error) reject(error);
          else resolve(result());
        },
      };
      sent.push(s);
      if (autoAnswer) setImmediate(() => s.answer());
    });
  };
  const idOf = (r: EnqueueRequest): EnqueueResult => ({ jobId: `id-${r.payload.toString()}`, deduplicated: false });
  const coalescer = new Coalescer(
    { maxJobs: 100, maxBytes: 1 << 20, lingerMs: 0, maxInFlight: 4, ...options },
    {
      placeOf: place,
      sendOne: (r, deadlineMs) => record([r], deadlineMs, () => idOf(r)),
      sendBatch: (rs, deadlineMs) => record(rs, deadlineMs, () => rs.map(idOf)),
    },
  );
  return {
    coalescer,
    sent,
    get outstanding() {
      return outstanding;
    },
    get maxOutstanding() {
      return maxOutstanding;
    },
    add: (payload: string, o: { queue?: string; dedupKey?: string; headers?: Record<string, string>; deadlineMs?: number } = {}) =>
      coalescer.add(toEnqueueRequest(o.queue ?? "q", payload, o), o.deadlineMs ?? 10_000),
  };
}

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));
const names = (n: number, prefix = "j") => Array.from({ length: n }, (_, i) => `${prefix}${i}`);

describe("the coalescer's flush rules (stubbed sender)", () => {
  test("batchMaxJobs 10 with 35 jobs: batches of at most 10, in call order", async () => {
    const s = stubbed({ maxJobs: 10, maxInFlight: 100 }, true);
    const payloads = names(35);
    const results = await Promise.all(payloads.map((p) => s.add(p)));
    assert.deepEqual(
      s.sent.map((b) => b.jobs.length),
      [10, 10, 10, 5],
    );
    assert.deepEqual(s.sent.flatMap((b) => b.jobs), payloads, "the jobs went in the order of their calls");
    assert.deepEqual(
      results.map((r) => r.jobId),
      payloads.map((p) => `id-${p}`),
      "the i-th result answers the i-th caller",
    );
  });

  test("the jobs of one turn go together (linger 0), a lone job as unary", async () => {
    const s = stubbed({}, true);
    const first = [s.add("a"), s.add("b"), s.add("c")];
    assert.equal(s.sent.length, 0, "nothing is sent before the turn ends");
    await turn();
    assert.deepEqual(s.sent.map((b) => b.jobs), [["a", "b", "c"]]);
    await Promise.all(first);
    await s.add("d");
    assert.deepEqual(s.sent.map((b) => b.jobs), [["a", "b", "c"], ["d"]]);
  });

  test("batchMaxBytes counts payload and header bytes; a job that would pass it starts the next batch", async () => {
    assert.equal(jobBytes(toEnqueueRequest("q", "0123456789", { headers: { ab: "cd", "é": "" } })), 10 + 4 + 2);
    const s = stubbed({ maxBytes: 100, maxInFlight: 100 }, true);
    const payload = (i: number) => `${i}`.padEnd(40, ".");
    await Promise.all([0, 1, 2, 3, 4].map((i) => s.add(payload(i))));
    // 40 + 40 = 80; a third would make 120 > 100.
    assert.deepEqual(
      s.sent.map((b) => b.jobs.length),
      [2, 2, 1],
    );
    // A batch that reaches the cap exactly is sent at once, without waiting for the turn's end.
    const exact = stubbed({ maxBytes: 100, maxInFlight: 100 });
    void exact.add("x".repeat(60));
    void exact.add("y".repeat(20), { headers: { k: "v".repeat(19) } });
    assert.deepEqual(
      exact.sent.map((b) => b.jobs.length),
      [2],
      "sent once it held 100 bytes",
    );
    exact.sent[0].answer();
    // A job larger than the cap on its own goes alone.
    const big = stubbed({ maxBytes: 10 }, true);
    await Promise.all([big.add("small"), big.add("x".repeat(50)), big.add("tiny")]);
    assert.deepEqual(big.sent.map((b) => b.jobs), [["small"], ["x".repeat(50)], ["tiny"]]);
  });

  test("never more than batchMaxInFlight batches of a key outstanding; the others wait, in order", async () => {
    const s = stubbed({ maxJobs: 5, maxInFlight: 2 });
    const payloads = names(32);
    const all = Promise.all(payloads.map((p) => s.add(p)));
    await turn();
    assert.equal(s.outstanding, 2, "two batches in flight, the rest waiting");
    // Answer the oldest outstanding batch until every job is answered, checking the limit holds.
    let answered = 0;
    while (answered < s.sent.length) {
      s.sent[answered++].answer();
      await turn();
      assert.ok(s.outstanding <= 2, `at most 2 outstanding, saw ${s.outstanding}`);
    }
    await all;
    assert.equal(s.maxOutstanding, 2);
    assert.deepEqual(s.sent.flatMap((b) => b.jobs), payloads, "sent in call order");
    assert.ok(s.sent.every((b) => b.jobs.length <= 5));
    assert.equal(s.sent.length, 7, "six full batches of 5, then the 2 left");
  });

  test("a batch waiting for the in-flight limit gathers the jobs that come meanwhile", async () => {
    const s = stubbed({ maxInFlight: 1 });
    const first = s.add("a");
    await turn();
    assert.equal(s.sent.length, 1);
    const later = [s.add("b"), s.add("c")];
    await turn();
    const more = s.add("d");
    await turn();
    assert.equal(s.sent.length, 1, "the open batch waits while one is in flight");
    s.sent[0].answer();
    await first;
    await turn();
    assert.deepEqual(s.sent.map((b) => b.jobs), [["a"], ["b", "c", "d"]]);
    s.sent[1].answer();
    await Promise.all([...later, more]);
  });

  test("jobs with and without a dedup key, and of different places, are kept apart", async () => {
    const s = stubbed({}, true);
    await Promise.all([s.add("a"), s.add("b", { dedupKey: "kb" }), s.add("c"), s.add("d", { dedupKey: "kd" }), s.add("e", { queue: "other" })]);
    assert.deepEqual(
      s.sent.map((b) => b.jobs),
      [["a", "c"], ["b", "d"], ["e"]],
    );
  });

  test("a batch's deadline is the earliest of its callers'", async () => {
    const s = stubbed({}, true);
    await Promise.all([s.add("a", { deadlineMs: 5000 }), s.add("b", { deadlineMs: 1000 }), s.add("c", { deadlineMs: Infinity })]);
    assert.ok(s.sent[0].deadlineMs <= 1000 && s.sent[0].deadlineMs > 500, `deadline ${s.sent[0].deadlineMs}`);
    const none = stubbed({}, true);
    await Promise.all([none.add("a", { deadlineMs: Infinity }), none.add("b", { deadlineMs: Infinity })]);
    assert.equal(none.sent[0].deadlineMs, Infinity);
  });

  test("a refused batch is sent again one job at a time; any other failure reaches every caller", async () => {
    const s = stubbed({});
    const calls = ["a", "b", "c"].map((p) => s.add(p));
    await turn();
    s.sent[0].answer(new JobBrokerError(Status.INVALID_ARGUMENT, "jobs[1].headers must not have an empty name"));
    await turn();
    assert.deepEqual(s.sent.slice(1).map((b) => b.jobs), [["a"], ["b"], ["c"]], "each job alone, all at once");
    s.sent[1].answer();
    s.sent[2].answer(new JobBrokerError(Status.INVALID_ARGUMENT, "headers must not have an empty name"));
    s.sent[3].answer();
    const settled = await Promise.allSettled(calls);
    assert.deepEqual(
      settled.map((r) => r.status),
      ["fulfilled", "rejected", "fulfilled"],
    );
    assert.match(String((settled[1] as PromiseRejectedResult).reason), /^JobBrokerError: INVALID_ARGUMENT: headers/);

    const down = stubbed({});
    const failing = ["a", "b"].map((p) => down.add(p));
    await turn();
    down.sent[0].answer(new JobBrokerError(Status.UNAVAILABLE, "gone"));
    for (const r of await Promise.allSettled(failing)) {
      assert.equal(r.status, "rejected");
      assert.equal((r.reason as JobBrokerError).code, Status.UNAVAILABLE);
    }
    assert.equal(down.sent.length, 1, "not split");
  });

  test("close() sends the open batches at once and waits for those in flight", async () => {
    const s = stubbed({ lingerMs: 60_000, maxInFlight: 1 });
    const calls = ["a", "b", "c"].map((p) => s.add(p));
    assert.equal(s.sent.length, 0, "lingering");
    let closed = false;
    const closing = s.coalescer.close()!.then(() => (closed = true));
    assert.deepEqual(s.sent.map((b) => b.jobs), [["a", "b", "c"]], "sent by close(), before the linger");
    await turn();
    assert.equal(closed, false, "close() waits for the batch in flight");
    s.sent[0].answer();
    await closing;
    await Promise.all(calls);
    assert.equal(stubbed({}).coalescer.close(), undefined, "nothing to wait for");
  });
});

// ---- Options ---------------------------------------------------------------------------------

describe("the coalescing options", () => {
  test("a bad value is refused at construction, naming the option", () => {
    const refused: [object, RegExp][] = [
      [{ batchMaxJobs: 0 }, /batchMaxJobs must be an integer from 1 to 1000, not 0/],
      [{ batchMaxJobs: 1001 }, /batchMaxJobs .* not 1001/],
      [{ batchMaxJobs: 2.5 }, /batchMaxJobs/],
      [{ batchMaxBytes: 0 }, /batchMaxBytes must be an integer at least 1/],
      [{ batchLingerMs: -1 }, /batchLingerMs/],
      [{ batchLingerMs: Infinity }, /batchLingerMs/],
      [{ batchMaxInFlight: 0 }, /batchMaxInFlight/],
      [{ batching: "yes" }, /batching must be true or false/],
    ];
    for (const [options, message] of refused) {
      assert.throws(() => new Client({ address: "127.0.0.1:1", ...options }), message, JSON.stringify(options));
    }
    // The bounds themselves are fine.
    for (const options of [{ batchMaxJobs: 1 }, { batchMaxJobs: 1000, batchLingerMs: 0.5, batchMaxInFlight: 1, batchMaxBytes: 1 }, { batching: false }]) {
      void new Client({ address: "127.0.0.1:1", ...options }).close();
    }
  });
});

// ---- Against the real broker -----------------------------------------------------------------

/**
 * The Enqueue and batch counts of `broker`, for differences: a batch is an EnqueueBatch call or
 * a batch on an EnqueueStream (the default transport; the broker times each as a call).
 */
async function counts(broker: Broker, code?: string): Promise<{ enqueue: number; batch: number }> {
  const batch = (await broker.rpcCount("EnqueueBatch", code)) + (await broker.rpcCount("EnqueueStream", code));
  return { enqueue: await broker.rpcCount("Enqueue", code), batch };
}

/** The counts' rise since `before`, once it reached `atLeast` calls in all (the counter may trail the answer). */
async function rise(broker: Broker, before: { enqueue: number; batch: number }, atLeast = 1): Promise<{ enqueue: number; batch: number }> {
  return eventually(async () => {
    const now = await counts(broker);
    const d = { enqueue: now.enqueue - before.enqueue, batch: now.batch - before.batch };
    return d.enqueue + d.batch >= atLeast ? d : undefined;
  }, `${atLeast} enqueue calls in /metrics`);
}

/** Every job of `ids` exists on the broker `client` talks to. */
async function assertJobs(client: Client, ids: string[]): Promise<void> {
  const jobs = await Promise.all(ids.map((id) => client.getJob(id)));
  assert.deepEqual(
    jobs.map((j) => j.id),
    ids,
  );
}

function isCode(code: number) {
  return (e: unknown) => e instanceof JobBrokerError && e.code === code;
}

describe("coalescing against the broker", () => {
  let broker: Broker;

  before(async () => {
    broker = await Broker.start();
  });
  after(async () => {
    await broker?.dispose();
  });

  /** Every job of `ids` exists on the broker. */
  async function assertExist(client: Client, ids: string[]): Promise<void> {
    const jobs = await Promise.all(ids.map((id) => client.getJob(id)));
    assert.deepEqual(
      jobs.map((j) => j.id),
      ids,
    );
  }

  test("200 concurrent enqueues with a 50 ms linger go in at most 100 calls", async () => {
    const client = new Client({ address: broker.address, batchLingerMs: 50 });
    try {
      await client.getCluster(); // the routing table, so that every enqueue keys alike
      const before = await counts(broker);
      const results = await Promise.all(names(200).map((p) => client.enqueue("linger", p)));
      const ids = results.map((r) => r.jobId);
      assert.equal(new Set(ids).size, 200, "200 distinct ids");
      assert.ok(results.every((r) => !r.deduplicated));
      await assertExist(client, ids);
      const d = await rise(broker, before);
      assert.ok(d.enqueue + d.batch <= 100, `${d.enqueue} Enqueue + ${d.batch} EnqueueBatch calls`);
      assert.ok(d.batch >= 1, "at least one EnqueueBatch");
      assert.equal((await client.getQueue("linger")).counts["JOB_STATE_READY"], 200);
    } finally {
      await client.close();
    }
  });

  test("with the default options (linger 0) 200 concurrent enqueues take fewer than 200 calls", async () => {
    const client = new Client({ address: broker.address });
    try {
      const before = await counts(broker);
      const results = await Promise.all(names(200).map((p) => client.enqueue("defaults", p)));
      assert.equal(new Set(results.map((r) => r.jobId)).size, 200);
      await assertExist(client, results.map((r) => r.jobId));
      const d = await rise(broker, before);
      assert.ok(d.enqueue + d.batch < 200, `${d.enqueue} Enqueue + ${d.batch} EnqueueBatch calls`);
    } finally {
      await client.close();
    }
  });

  test("one bad job among 50 fails only its own call, with the unary message", async () => {
    const client = new Client({ address: broker.address, batchLingerMs: 50 });
    try {
      const before = await counts(broker, "INVALID_ARGUMENT");
      const bad = 17;
      const settled = await Promise.allSettled(
        names(50).map((p, i) => client.enqueue("one-bad", p, i === bad ? { headers: { "": "no name" } } : {})),
      );
      const failed = settled.flatMap((r, i) => (r.status === "rejected" ? [i] : []));
      assert.deepEqual(failed, [bad], "only the bad job's call failed");
      const error = (settled[bad] as PromiseRejectedResult).reason as unknown;
      assert.ok(isCode(Status.INVALID_ARGUMENT)(error), String(error));
      const message = (error as JobBrokerError).message;
      assert.match(message, /headers/);
      assert.doesNotMatch(message, /jobs\[/);
      const ids = settled.flatMap((r) => (r.status === "fulfilled" ? [r.value.jobId] : []));
      assert.equal(new Set(ids).size, 49);
      await assertExist(client, ids);
      // The batch was refused whole, then split: each of its jobs sent again alone.
      await eventually(async () => (await counts(broker, "INVALID_ARGUMENT")).batch - before.batch >= 1, "a refused batch in /metrics");
    } finally {
      await client.close();
    }
  });

  test("batch: false sends that call alone; batching: false sends every call alone", async () => {
    const client = new Client({ address: broker.address });
    const unbatched = new Client({ address: broker.address, batching: false });
    try {
      let before = await counts(broker);
      await client.enqueue("opt-out", "alone", { batch: false });
      let d = await rise(broker, before, 1);
      assert.deepEqual(d, { enqueue: 1, batch: 0 });

      before = await counts(broker);
      await Promise.all(names(20).map((p) => client.enqueue("opt-out", p, { batch: false })));
      d = await rise(broker, before, 20);
      assert.deepEqual(d, { enqueue: 20, batch: 0 }, "20 concurrent calls with batch: false");

      before = await counts(broker);
      const results = await Promise.all(names(20).map((p) => unbatched.enqueue("opt-out", p)));
      assert.equal(new Set(results.map((r) => r.jobId)).size, 20);
      d = await rise(broker, before, 20);
      assert.deepEqual(d, { enqueue: 20, batch: 0 }, "20 concurrent calls of a client with batching: false");
    } finally {
      await client.close();
      await unbatched.close();
    }
  });

  test("batches go as EnqueueStream messages by default, as EnqueueBatch calls with batchStream: false", async () => {
    const streamed = new Client({ address: broker.address, batchLingerMs: 20 });
    const unary = new Client({ address: broker.address, batchLingerMs: 20, batchStream: false });
    try {
      const method = async () => ({ stream: await broker.rpcCount("EnqueueStream"), call: await broker.rpcCount("EnqueueBatch") });
      for (const [client, expected] of [
        [streamed, "stream"],
        [unary, "call"],
      ] as const) {
        const before = await method();
        const results = await Promise.all(names(30).map((p) => client.enqueue(`transport-${expected}`, p)));
        assert.equal(new Set(results.map((r) => r.jobId)).size, 30);
        await assertExist(client, results.map((r) => r.jobId));
        const d = await eventually(async () => {
          const now = await method();
          const rise = { stream: now.stream - before.stream, call: now.call - before.call };
          return rise.stream + rise.call >= 1 ? rise : undefined;
        }, "a batch in /metrics");
        if (expected === "stream") assert.equal(d.call, 0, `no EnqueueBatch call: ${JSON.stringify(d)}`);
        else assert.equal(d.stream, 0, `no EnqueueStream batch: ${JSON.stringify(d)}`);
      }
      assert.throws(() => new Client({ address: broker.address, batchStream: "yes" as unknown as boolean }), /batchStream must be true or false/);
    } finally {
      await streamed.close();
      await unary.close();
    }
  });

  test("a script that enqueues batches and never calls close() still exits: an idle stream is closed", async () => {
    // The stream is what would keep it alive (grpc-js holds a connection with an open call).
    const script = `
      const { Client } = require(${JSON.stringify(path.join(__dirname, "../src/index.js"))});
      const client = new Client({ address: ${JSON.stringify(broker.address)} });
      Promise.all(Array.from({ length: 10 }, (_, i) => client.enqueue("no-close", "job " + i))).then(
        (results) => console.log("enqueued " + results.length),
      );`;
    const child = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    // A hang fails the test; its length is not measured.
    const code = await new Promise<number | null>((resolve) => {
      const giveUp = setTimeout(() => child.kill("SIGKILL"), 30_000);
      child.once("exit", (c) => {
        clearTimeout(giveUp);
        resolve(c);
      });
    });
    assert.equal(code, 0, `exit code ${code}: ${out}`);
    assert.match(out, /enqueued 10/);
    assert.ok((await broker.rpcCount("EnqueueStream")) >= 1, "the batch went on a stream");
  });

  test("explicit enqueueBatch calls go on the stream too, each answered whole or refused whole", async () => {
    const client = new Client({ address: broker.address });
    try {
      const [a, b] = await Promise.all([
        client.enqueueBatch(names(3, "a").map((p) => ({ queue: "explicit", payload: p }))),
        client.enqueueBatch(names(2, "b").map((p) => ({ queue: "explicit", payload: p }))),
      ]);
      assert.equal(a.length, 3);
      assert.equal(b.length, 2);
      const jobs = await Promise.all([...a, ...b].map((r) => client.getJob(r.jobId)));
      assert.deepEqual(
        jobs.map((j) => Buffer.from(j.payload).toString()),
        ["a0", "a1", "a2", "b0", "b1"],
      );
      await assert.rejects(
        client.enqueueBatch([{ queue: "explicit", payload: "x" }, { queue: "", payload: "y" }]),
        (e: unknown) => isCode(Status.INVALID_ARGUMENT)(e) && /jobs\[1\]\.queue/.test((e as Error).message),
      );
      assert.equal((await client.getQueue("explicit")).counts["JOB_STATE_READY"], 5);
    } finally {
      await client.close();
    }
  });

  test("20 concurrent enqueues with one dedup key: one job, created once", async () => {
    const client = new Client({ address: broker.address });
    try {
      const results = await Promise.all(names(20).map(() => client.enqueue("dedup", "same", { dedupKey: "one-key" })));
      assert.equal(new Set(results.map((r) => r.jobId)).size, 1, "one job id for all");
      assert.equal(results.filter((r) => !r.deduplicated).length, 1, "exactly one not deduplicated");
      await assertExist(client, [results[0].jobId]);
    } finally {
      await client.close();
    }
  });

  test("producer middleware runs per enqueue() call, above the coalescer", async () => {
    const client = new Client({ address: broker.address });
    let runs = 0;
    client.use(async (request, next) => {
      runs++;
      request.headers["x-call"] = request.payload.toString();
      return next(request);
    });
    try {
      const before = await counts(broker);
      const results = await Promise.all(names(10).map((p) => client.enqueue("middleware", p)));
      assert.equal(runs, 10);
      const jobs = await Promise.all(results.map((r) => client.getJob(r.jobId)));
      assert.deepEqual(
        jobs.map((j) => j.headers["x-call"]),
        names(10),
      );
      const d = await rise(broker, before);
      assert.ok(d.batch >= 1 && d.enqueue + d.batch < 10, `${d.enqueue} Enqueue + ${d.batch} EnqueueBatch calls`);
    } finally {
      await client.close();
    }
  });

  test("close() sends the lingering batch and waits for its answer", async () => {
    const client = new Client({ address: broker.address, batchLingerMs: 60_000 });
    const calls = names(5).map((p) => client.enqueue("closing", p));
    await client.close();
    const results = await Promise.all(calls);
    assert.equal(new Set(results.map((r) => r.jobId)).size, 5);
    const reader = new Client({ address: broker.address });
    try {
      await assertExist(reader, results.map((r) => r.jobId));
    } finally {
      await reader.close();
    }
    await assert.rejects(client.enqueue("closing", "after"), "calls after close() fail");
  });
});

describe("the enqueue stream across a broker restart", () => {
  test("a kill -9 fails the batches in flight with UNAVAILABLE; the next enqueue opens a new stream", async () => {
    const b = await Broker.start();
    const client = new Client({ address: b.address, batchLingerMs: 20 });
    let restarted: Broker | undefined;
    try {
      const before = await Promise.all(names(10, "before").map((p) => client.enqueue("restart", p)));
      // Answers still owed when the broker dies: each caller gets the stream's end, not a hang.
      const inFlight = Promise.allSettled(names(10, "cut").map((p) => client.enqueue("restart", p)));
      await b.kill();
      for (const r of await inFlight) {
        // A batch that made it before the kill is answered; the others fail as a unary call cut
        // off would (no dedup key: not retried).
        if (r.status === "rejected") assert.ok(isCode(Status.UNAVAILABLE)(r.reason), String(r.reason));
      }
      restarted = await Broker.start({ dataDir: b.dataDir, listen: b.address }, b.tempDir);
      const after = await eventually(
        () => Promise.all(names(10, "after").map((p) => client.enqueue("restart", p))).catch(() => undefined),
        "enqueues after the restart",
      );
      await assertJobs(client, [...before, ...after].map((r) => r.jobId));
    } finally {
      await client.close();
      await restarted?.stop();
      await b.dispose();
    }
  });
});

describe("coalescing against a broker with 4 partitions", () => {
  let broker: Broker;

  before(async () => {
    broker = await Broker.start({ args: ["--partitions", "4"] });
  });
  after(async () => {
    await broker?.dispose();
  });

  test("8 queues over the 4 partitions, 25 concurrent enqueues each: all 200 succeed", async () => {
    // Two queues of each partition, by the client's own partition function.
    const queues: string[] = [];
    for (let partition = 0; partition < 4; partition++) {
      for (let i = 0; queues.filter((q) => partitionOfQueue(q, 4) === partition).length < 2; i++) {
        if (partitionOfQueue(`spread-${i}`, 4) === partition && !queues.includes(`spread-${i}`)) queues.push(`spread-${i}`);
      }
    }
    assert.deepEqual(new Set(queues.map((q) => partitionOfQueue(q, 4))), new Set([0, 1, 2, 3]));
    const client = new Client({ address: broker.address });
    try {
      const before = await counts(broker);
      const settled = await Promise.allSettled(queues.flatMap((q) => names(25).map((p) => client.enqueue(q, p))));
      const errors = settled.flatMap((r) => (r.status === "rejected" ? [String(r.reason)] : []));
      assert.deepEqual(errors, [], "none refused (a batch spanning partitions would be)");
      assert.equal(new Set(settled.map((r) => (r as PromiseFulfilledResult<EnqueueResult>).value.jobId)).size, 200);
      const d = await rise(broker, before);
      assert.ok(d.batch >= 1 && d.enqueue + d.batch < 200, `${d.enqueue} Enqueue + ${d.batch} EnqueueBatch calls`);
    } finally {
      await client.close();
    }
  });
});
