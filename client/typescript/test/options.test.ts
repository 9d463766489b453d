// The client options against the real broker: TLS, mutual TLS and a bearer token (a throwaway
// CA made by openssl), the safe-retry rule, several addresses, deadlines, enqueueAndWait,
// schedules, ListWorkers and GetCluster.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { InterceptingCall, type Interceptor } from "@grpc/grpc-js";
import {
  Client,
  FailReason,
  JobBrokerError,
  JobEndedError,
  JobState,
  PermanentError,
  Status,
  Worker,
  clientName,
  type ClientOptions,
} from "../src";
import { Broker, eventually } from "./broker";

const quiet = () => {};

function isCode(code: number) {
  return (e: unknown) => e instanceof JobBrokerError && e.code === code;
}

/**
 * Records the method of every call the client starts (each retry is a call of its own), but for
 * the GetCluster calls the client makes to learn where to route: those land in `routing`.
 */
function callRecorder(): { calls: string[]; routing: string[]; interceptor: Interceptor } {
  const calls: string[] = [];
  const routing: string[] = [];
  return {
    calls,
    routing,
    interceptor: (options, nextCall) => {
      const method = path.basename(options.method_definition.path);
      (method === "GetCluster" ? routing : calls).push(method);
      return new InterceptingCall(nextCall(options));
    },
  };
}

/** A broker that was started and stopped: its address refuses connections (UNAVAILABLE). */
async function deadAddress(): Promise<string> {
  const b = await Broker.start();
  await b.dispose();
  return b.address;
}

/**
 * A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, made by openssl
 * in `dir` (EC keys: quick to make).
 */
function makeCertificates(dir: string): { ca: string; serverCert: string; serverKey: string; clientCert: string; clientKey: string } {
  const f = (name: string) => path.join(dir, name);
  const openssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  openssl("req", "-x509", ...ec, "-keyout", f("ca.key"), "-out", f("ca.pem"), "-days", "1", "-subj", "/CN=jobbroker test CA");
  writeFileSync(f("server.ext"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
  writeFileSync(f("client.ext"), "extendedKeyUsage=clientAuth\n");
  for (const who of ["server", "client"]) {
    openssl("req", ...ec, "-keyout", f(`${who}.key`), "-out", f(`${who}.csr`), "-subj", `/CN=jobbroker test ${who}`);
    openssl("x509", "-req", "-in", f(`${who}.csr`), "-CA", f("ca.pem"), "-CAkey", f("ca.key"), "-CAcreateserial",
      "-out", f(`${who}.pem`), "-days", "1", "-extfile", f(`${who}.ext`));
  }
  return { ca: f("ca.pem"), serverCert: f("server.pem"), serverKey: f("server.key"), clientCert: f("client.pem"), clientKey: f("client.key") };
}

describe("TLS, mutual TLS and a bearer token", () => {
  const token = "tls-test-token-0123456789";
  let dir: string;
  let certs: ReturnType<typeof makeCertificates>;
  let broker: Broker;
  let secure: ClientOptions;

  before(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), "jobbroker-ts-tls-"));
    certs = makeCertificates(dir);
    const tokens = path.join(dir, "tokens.json");
    const sha256 = createHash("sha256").update(token).digest("hex");
    writeFileSync(tokens, JSON.stringify({ tokens: [{ name: "everything", sha256, roles: ["producer", "worker", "admin"], queues: ["*"] }] }));
    broker = await Broker.start({
      args: ["--tls-cert", certs.serverCert, "--tls-key", certs.serverKey, "--tls-client-ca", certs.ca, "--auth-tokens", tokens],
    });
    secure = { address: broker.address, tls: certs.ca, clientCert: certs.clientCert, clientKey: certs.clientKey, token };
  });
  after(async () => {
    await broker?.dispose();
    rmSync(dir, { recursive: true, force: true });
  });

  test("a worker with the CA, a client certificate and the token completes a job and is listed", async () => {
    const client = new Client(secure);
    const worker = new Worker({ ...secure, log: quiet }).handle("secure", (job) => ({ echo: job.text() }));
    await worker.start();
    try {
      const job = await client.enqueueAndWait("secure", "over TLS", { waitTimeoutMs: 30_000 });
      assert.equal(job.state, JobState.JOB_STATE_COMPLETED);
      assert.deepEqual(JSON.parse(job.result.toString()), { echo: "over TLS" });
      const workers = await client.listWorkers("secure");
      assert.equal(workers.length, 1);
      assert.equal(workers[0].client, clientName);
    } finally {
      await worker.stop();
      client.close();
    }
  });

  test("PEM text works as well as file paths, and the token comes from $JOBBROKER_TOKEN", async () => {
    process.env.JOBBROKER_TOKEN = token;
    try {
      const client = new Client({
        address: broker.address,
        tls: readFileSync(certs.ca, "utf8"),
        clientCert: readFileSync(certs.clientCert),
        clientKey: readFileSync(certs.clientKey, "utf8"),
      });
      try {
        assert.ok((await client.enqueue("secure", "pem")).jobId);
      } finally {
        client.close();
      }
    } finally {
      delete process.env.JOBBROKER_TOKEN;
    }
  });

  test("a wrong token is UNAUTHENTICATED: the call fails and the worker's start rejects", async () => {
    const wrong = { ...secure, token: "not-the-token" };
    const client = new Client(wrong);
    try {
      await assert.rejects(client.enqueue("secure", "x"), isCode(Status.UNAUTHENTICATED));
    } finally {
      client.close();
    }
    let ran = false;
    const worker = new Worker({ ...wrong, log: quiet }).handle("secure", () => {
      ran = true;
    });
    await assert.rejects(worker.start(), isCode(Status.UNAUTHENTICATED));
    assert.equal(ran, false);
  });

  test("without a client certificate the broker refuses the connection", async () => {
    const client = new Client({ address: broker.address, tls: certs.ca, token });
    try {
      await assert.rejects(client.getCluster(), isCode(Status.UNAVAILABLE));
    } finally {
      client.close();
    }
  });
});

describe("safe retries and several addresses", () => {
  let broker: Broker;
  let dead: string;

  before(async () => {
    dead = await deadAddress();
    broker = await Broker.start();
  });
  after(async () => {
    await broker?.dispose();
  });

  test("an enqueue without a dedup key against a stopped broker is attempted once", async () => {
    const { calls, interceptor } = callRecorder();
    const client = new Client({ address: dead, interceptors: [interceptor] });
    try {
      await assert.rejects(client.enqueue("q", "x"), isCode(Status.UNAVAILABLE));
      assert.deepEqual(calls, ["Enqueue"]);
      calls.length = 0;
      await assert.rejects(
        client.enqueueBatch([{ queue: "q", payload: "a", dedupKey: "a" }, { queue: "q", payload: "b" }]),
        isCode(Status.UNAVAILABLE),
      );
      assert.deepEqual(calls, ["EnqueueStream"]); // batches go on a stream (batchStream)
    } finally {
      client.close();
    }
  });

  test("enqueues whose every job has a dedup key, reads and acks are attempted three times", async () => {
    const { calls, interceptor } = callRecorder();
    const client = new Client({ address: dead, interceptors: [interceptor] });
    try {
      await assert.rejects(client.enqueue("q", "x", { dedupKey: "k" }), isCode(Status.UNAVAILABLE));
      await assert.rejects(client.enqueueBatch([{ queue: "q", payload: "a", dedupKey: "a" }]), isCode(Status.UNAVAILABLE));
      await assert.rejects(client.getJob("01J00000000000000000000000"), isCode(Status.UNAVAILABLE));
      await assert.rejects(client.ack({ jobId: "j", leaseId: "l" }), isCode(Status.UNAVAILABLE));
      await assert.rejects(client.lease("q"), isCode(Status.UNAVAILABLE));
      await assert.rejects(client.cancelJob("j"), isCode(Status.UNAVAILABLE));
      assert.deepEqual(calls, [
        ...Array(3).fill("Enqueue"),
        ...Array(3).fill("EnqueueStream"), // each attempt on a new stream: the last one broke
        ...Array(3).fill("GetJob"),
        ...Array(3).fill("Ack"),
        "Lease", // a lost answer would strand the leased jobs
        "CancelJob",
      ]);
    } finally {
      client.close();
    }
  });

  test("a comma-separated address, or $JOBBROKER_ADDRESS, names several", () => {
    const listed = new Client(`${dead}, ${broker.address}`);
    try {
      assert.deepEqual(listed.addresses, [dead, broker.address]);
      assert.equal(listed.address, dead);
    } finally {
      listed.close();
    }
    const saved = process.env.JOBBROKER_ADDRESS;
    process.env.JOBBROKER_ADDRESS = `n1:7070,n2:7070`;
    try {
      const fromEnv = new Client();
      assert.deepEqual(fromEnv.addresses, ["n1:7070", "n2:7070"]);
      fromEnv.close();
    } finally {
      if (saved === undefined) delete process.env.JOBBROKER_ADDRESS;
      else process.env.JOBBROKER_ADDRESS = saved;
    }
  });

  test("with several addresses, calls go to the first that answers, and move on when it stops", async () => {
    const { calls, interceptor } = callRecorder();
    const client = new Client({ addresses: [dead, broker.address], interceptors: [interceptor] });
    try {
      // Asking for the layout finds the live address: the read goes there at once.
      await assert.rejects(client.getJob("01J00000000000000000000000"), isCode(Status.NOT_FOUND));
      assert.deepEqual(calls, ["GetJob"]);
      // The client stays on the address that answered.
      const { jobId } = await client.enqueue("moved", "x");
      assert.equal((await client.getJob(jobId)).queue, "moved");
    } finally {
      client.close();
    }
    const first = await Broker.start();
    const producer = new Client({ addresses: [first.address, broker.address] });
    try {
      assert.ok((await producer.enqueue("moved", "y")).jobId);
      await first.dispose();
      // An enqueue without a key is not retried, but the next call goes to the next address.
      await assert.rejects(producer.enqueue("moved", "y"), isCode(Status.UNAVAILABLE));
      assert.ok((await producer.enqueue("moved", "y")).jobId);
    } finally {
      producer.close();
      await first.dispose();
    }
  });

  test("concurrent first calls share one look-up of the layout, asked once of a single broker", async () => {
    const { calls, routing, interceptor } = callRecorder();
    const client = new Client({ address: broker.address, interceptors: [interceptor] });
    try {
      await Promise.all([1, 2, 3].map(() => client.listQueues()));
      assert.deepEqual(routing, ["GetCluster"]);
      // Outside a cluster, at its one address, a failed call gives nothing new to ask.
      await assert.rejects(client.getJob("01J00000000000000000000000", { deadlineMs: 0 }), isCode(Status.DEADLINE_EXCEEDED));
      await client.listQueues();
      assert.deepEqual(routing, ["GetCluster"]);
      assert.equal(calls.length, 5);
    } finally {
      client.close();
    }
  });

  test("a worker whose first address is down subscribes on the next", async () => {
    const worker = new Worker({ addresses: [dead, broker.address], log: quiet, reconnectInitialMs: 10 }).handle("failover", () => "done");
    const client = new Client(broker.address);
    try {
      await worker.start();
      const job = await client.enqueueAndWait("failover", "x", { waitTimeoutMs: 30_000 });
      assert.equal(job.result.toString(), "done");
    } finally {
      await worker.stop();
      client.close();
    }
  });

  test("the address and the token come from the environment when not given", async () => {
    process.env.JOBBROKER_ADDRESS = broker.address;
    try {
      const client = new Client();
      try {
        assert.equal(client.address, broker.address);
        assert.ok((await client.enqueue("env", "x")).jobId);
      } finally {
        client.close();
      }
    } finally {
      delete process.env.JOBBROKER_ADDRESS;
    }
  });

  test("a per-call deadline overrides the client's", async () => {
    const client = new Client({ address: broker.address, deadlineMs: 30_000 });
    try {
      // A deadline already spent: no broker answers in time, whatever the client's default.
      await assert.rejects(client.getQueue("nowhere", { deadlineMs: -1 }), isCode(Status.DEADLINE_EXCEEDED));
    } finally {
      client.close();
    }
  });
});

describe("enqueueAndWait, schedules, workers and the cluster", () => {
  let broker: Broker;
  let client: Client;
  let worker: Worker<{ action: string; message?: string; ms?: number }>;

  before(async () => {
    broker = await Broker.start({ config: { queues: { wait: { retry: { maxAttempts: 1 } } } } });
    client = new Client(broker.address);
    worker = new Worker<{ action: string; message?: string; ms?: number }>({ address: broker.address, log: quiet, concurrency: 4 });
    worker.handle("wait", async (job) => {
      const p = job.data;
      if (p.action === "fail") throw new PermanentError(p.message ?? "failed");
      if (p.action === "sleep") await new Promise((resolve) => setTimeout(resolve, p.ms));
      return { done: p.action };
    });
    await worker.start();
  });
  after(async () => {
    await worker?.stop();
    client?.close();
    await broker?.dispose();
  });

  test("enqueueAndWait resolves with the completed job and its result", async () => {
    const job = await client.enqueueAndWait("wait", { action: "ok" }, { waitTimeoutMs: 30_000, priority: 3 });
    assert.equal(job.state, JobState.JOB_STATE_COMPLETED);
    assert.equal(job.priority, 3);
    assert.deepEqual(JSON.parse(job.result.toString()), { done: "ok" });
  });

  test("enqueueAndWait rejects with the state of a job that failed", async () => {
    const err = await client.enqueueAndWait("wait", { action: "fail", message: "bad input" }, { waitTimeoutMs: 30_000 }).then(
      () => assert.fail("the job should have failed"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof JobEndedError);
    assert.equal(err.state, JobState.JOB_STATE_FAILED);
    assert.equal(err.job.failReason, FailReason.FAIL_REASON_PERMANENT);
    assert.match(err.message, /JOB_STATE_FAILED: bad input/);
  });

  test("enqueueAndWait rejects with CANCELLED for a cancelled job", async () => {
    // Its outcome is taken at once: the rejection may come before the cancel call returns.
    const outcome = client.enqueueAndWait("wait-cancel", "never worked", { waitTimeoutMs: 30_000 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    const [ready] = await eventually(async () => (await client.listJobs("wait-cancel")).jobs, "the job");
    await client.cancelJob(ready.id);
    const err = await outcome;
    assert.ok(err instanceof JobEndedError);
    assert.equal(err.state, JobState.JOB_STATE_CANCELLED);
  });

  test("enqueueAndWait gives up after waitTimeoutMs with DEADLINE_EXCEEDED naming the state", async () => {
    await assert.rejects(
      client.enqueueAndWait("nobody-works-this", "x", { waitTimeoutMs: 300 }),
      (e: unknown) => isCode(Status.DEADLINE_EXCEEDED)(e) && /JOB_STATE_READY/.test((e as Error).message),
    );
  });

  test("watchJob shows the job until it ends", async () => {
    const { jobId } = await client.enqueue("wait", { action: "sleep", ms: 200 });
    const states: JobState[] = [];
    for await (const job of client.watchJob(jobId)) states.push(job.state);
    assert.equal(states.at(-1), JobState.JOB_STATE_COMPLETED);
  });

  test("a schedule round trip: put, get, list, trigger, delete", async () => {
    const put = await client.putSchedule({
      scheduleId: "hourly-report",
      everyMs: 3_600_000,
      queue: "reports",
      payload: { report: "hourly" },
      template: { priority: 2, headers: { from: "schedule" } },
    });
    assert.equal(put.scheduleId, "hourly-report");
    assert.ok(put.nextRunAt instanceof Date);
    assert.equal(Number(put.every!.seconds), 3600);

    const got = await client.getSchedule("hourly-report");
    assert.equal(got.template!.queue, "reports");
    assert.equal(got.template!.priority, 2);
    assert.deepEqual(JSON.parse(Buffer.from(got.template!.payload).toString()), { report: "hourly" });
    assert.deepEqual((await client.listSchedules()).map((s) => s.scheduleId), ["hourly-report"]);
    assert.deepEqual(await client.listSchedules("elsewhere"), []);

    const run = await client.triggerSchedule("hourly-report");
    const job = await client.getJob(run.jobId);
    assert.equal(job.queue, "reports");
    assert.deepEqual(job.headers, { from: "schedule" });
    assert.match(job.dedupKey, /^hourly-report@/);

    await client.deleteSchedule("hourly-report");
    await assert.rejects(client.getSchedule("hourly-report"), isCode(Status.NOT_FOUND));
    await assert.rejects(client.putSchedule({ scheduleId: "no-timing", queue: "reports" }), isCode(Status.INVALID_ARGUMENT));
  });

  test("listWorkers shows the running worker and its library; getCluster a cluster of one", async () => {
    const workers = await client.listWorkers("wait");
    assert.equal(workers.length, 1);
    assert.equal(workers[0].client, clientName);
    assert.deepEqual(workers[0].queues, ["wait"]);
    assert.equal(workers[0].streams, 1);
    const cluster = await client.getCluster();
    assert.equal(cluster.replicationFactor, 1);
    assert.ok(cluster.partitions.length >= 1);
  });
});
