// Keepalive pings: the options, and a worker against the real broker frozen with SIGSTOP (as a
// broker that hangs, loses power or sits behind a firewall that drops packets looks to TCP: the
// connection stays ESTABLISHED and nothing ever arrives on it).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";
import { Client, JobState, Worker } from "../src";
import { channelOptionsOf } from "../src/client";
import { Broker, eventually } from "./broker";

describe("the keepalive options", () => {
  test("every channel pings after 10 s, gives up after 5 s, also with no call open", () => {
    assert.deepEqual(pick(channelOptionsOf({})), {
      "grpc.keepalive_time_ms": 10_000,
      "grpc.keepalive_timeout_ms": 5_000,
      "grpc.keepalive_permit_without_calls": 1,
    });
    assert.deepEqual(pick(channelOptionsOf({ keepaliveTimeMs: 1000, keepaliveTimeoutMs: 2000 })), {
      "grpc.keepalive_time_ms": 1000,
      "grpc.keepalive_timeout_ms": 2000,
      "grpc.keepalive_permit_without_calls": 1,
    });
    // keepalive: false, or a time of 0, sends no pings (grpc-js's default).
    assert.deepEqual(pick(channelOptionsOf({ keepalive: false })), {});
    assert.deepEqual(pick(channelOptionsOf({ keepaliveTimeMs: 0 })), {});
    // The caller's channelOptions win over the library's.
    const mine = channelOptionsOf({ channelOptions: { "grpc.keepalive_time_ms": 30_000, "grpc.keepalive_permit_without_calls": 0 } });
    assert.equal(mine["grpc.keepalive_time_ms"], 30_000);
    assert.equal(mine["grpc.keepalive_permit_without_calls"], 0);
    assert.equal(mine["grpc.keepalive_timeout_ms"], 5_000);
  });

  test("a bad value is refused at construction, naming the option (keepalive: false too)", () => {
    const refused: [object, RegExp][] = [
      [{ keepaliveTimeMs: 999 }, /keepaliveTimeMs must be an integer from 1000 to 3600000, not 999/],
      [{ keepaliveTimeMs: -1 }, /keepaliveTimeMs/],
      [{ keepaliveTimeMs: 3_600_001 }, /keepaliveTimeMs/],
      [{ keepaliveTimeMs: 1500.5 }, /keepaliveTimeMs/],
      [{ keepaliveTimeMs: Infinity }, /keepaliveTimeMs/],
      [{ keepaliveTimeoutMs: 0 }, /keepaliveTimeoutMs must be an integer from 1000 to 600000, not 0/],
      [{ keepaliveTimeoutMs: 600_001 }, /keepaliveTimeoutMs/],
      [{ keepalive: false, keepaliveTimeoutMs: 10 }, /keepaliveTimeoutMs/],
      [{ keepalive: "no" }, /keepalive must be true or false/],
    ];
    for (const [options, message] of refused) {
      assert.throws(() => new Client({ address: "127.0.0.1:1", ...options }), message, JSON.stringify(options));
      assert.throws(() => new Worker({ address: "127.0.0.1:1", ...options }), message, JSON.stringify(options));
    }
    for (const options of [{ keepaliveTimeMs: 1000, keepaliveTimeoutMs: 1000 }, { keepaliveTimeMs: 3_600_000, keepaliveTimeoutMs: 600_000 }, { keepalive: false }, { keepaliveTimeMs: 0 }]) {
      void new Client({ address: "127.0.0.1:1", ...options }).close();
    }
  });
});

function pick(options: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(options).filter(([k]) => k.startsWith("grpc.keepalive_")));
}

/** The port of "ipv4:127.0.0.1:PORT" or "127.0.0.1:PORT". */
function portOf(address: string): number {
  const port = Number(address.slice(address.lastIndexOf(":") + 1));
  assert.ok(Number.isInteger(port) && port > 0, `no port in ${address}`);
  return port;
}

/**
 * Whether a TCP connection from local port `from` to remote port `to` is ESTABLISHED on this
 * host (/proc/net/tcp and tcp6: local and remote "ADDR:PORT" in hex, then the state, 01).
 */
function established(from: number, to: number): boolean {
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch {
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const [, local, remote, state] = line.trim().split(/\s+/);
      if (!state) continue;
      const port = (a: string) => parseInt(a.slice(a.lastIndexOf(":") + 1), 16);
      if (port(local) === from && port(remote) === to && state === "01") return true;
    }
  }
  return false;
}

describe("keepalive against a frozen broker", () => {
  test("a worker gives up the connection of a broker that stopped answering, and comes back once it runs again", async (t) => {
    const broker = await Broker.start();
    const client = new Client(broker.address);
    const workerId = `keepalive-${process.pid}`;
    const logged: string[] = [];
    const worker = new Worker({
      address: broker.address,
      workerId,
      keepaliveTimeMs: 1000,
      keepaliveTimeoutMs: 1000,
      reconnectMaxMs: 500,
      // 2 s leases: should the job after the thaw go to a connection the worker tried while the
      // broker was frozen, and closed just as the broker answered it, it comes back in seconds.
      leaseDurationMs: 2000,
      log: (m) => logged.push(m),
    });
    worker.handle("keepalive", (job) => `done: ${job.text()}`);
    const ranBy = async (jobId: string) =>
      eventually(async () => {
        const j = await client.getJob(jobId);
        return j.state === JobState.JOB_STATE_COMPLETED ? j : undefined;
      }, `job ${jobId} completed`);
    let frozen = false;
    try {
      await worker.start();
      const before = await ranBy((await client.enqueue("keepalive", "before")).jobId);
      assert.equal(before.attempts[0].workerId, workerId);
      // The worker's connection: its source port is the port of its peer in ListWorkers.
      const me = await eventually(async () => (await client.listWorkers("keepalive")).find((w) => w.workerId === workerId && w.streams > 0), "the worker in ListWorkers");
      const from = portOf(me.peer);
      const to = portOf(broker.address);
      assert.ok(established(from, to), `no ESTABLISHED connection ${from} -> ${to} in /proc/net/tcp (peer ${me.peer})`);

      broker.proc.kill("SIGSTOP");
      frozen = true;
      const frozenAt = Date.now();
      // TCP alone never notices (the kernel still acknowledges what is sent); the unanswered
      // pings do: the worker closes the connection and its stream ends UNAVAILABLE.
      await eventually(() => !established(from, to), `the worker to give up its connection ${from} -> ${to} to the frozen broker`, 40_000);
      t.diagnostic(`the worker gave up the frozen broker's connection after ${Date.now() - frozenAt} ms`);
      await eventually(() => logged.some((m) => /ended \(UNAVAILABLE/.test(m)), "the worker to log its stream ended UNAVAILABLE", 10_000);

      broker.proc.kill("SIGCONT");
      frozen = false;
      // It comes back on its own: a job enqueued now is run by the same worker.
      const after = await ranBy((await client.enqueue("keepalive", "after")).jobId);
      assert.equal(after.attempts[after.attempts.length - 1].workerId, workerId);
      assert.ok(worker.stats.reconnects >= 1, `reconnects: ${worker.stats.reconnects}`);
    } finally {
      if (frozen) broker.proc.kill("SIGCONT");
      await worker.stop();
      client.close();
      await broker.dispose();
    }
  });
});
