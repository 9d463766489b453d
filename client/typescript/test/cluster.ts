// A real cluster for a test file: etcd (Debian's `etcd` on PATH) and three jobbroker nodes on
// loopback, as tests/lib/cluster.sh starts them, with 4 partitions each replicated on all three.
// Each node serves its /metrics on a port of its own (`metric()`).
import http from "node:http";
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Client, JobBrokerError, Status, type ClusterInfo } from "../src";
import { partitionOfQueue } from "../src/partition";
import { brokerBinary, eventually } from "./broker";

/**
 * `count` distinct ports free right now on 127.0.0.1, below the kernel's ephemeral range (as the
 * C++ harnesses pick theirs, tests/testing/process_util.h): the nodes' addresses are fixed before
 * they start. A port that listen(0) handed out is released at once, so it can be handed out again
 * (two processes of one cluster were once given the same port, and a node exited "cannot listen")
 * or become an outgoing connection's local port before the process given it binds.
 */
async function freePorts(count: number): Promise<number[]> {
  let low = 32768;
  try {
    low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]) || low;
  } catch {
    // not Linux: the default range
  }
  const hi = Math.min(low, 32768) - 1;
  const lo = Math.max(1024, hi - 12000);
  const picked: number[] = [];
  for (let i = 0; i < 100 * count && picked.length < count; i++) {
    const port = lo + Math.floor(Math.random() * (hi - lo + 1));
    if (!picked.includes(port) && (await bindable(port))) picked.push(port);
  }
  if (picked.length < count) throw new Error(`no ${count} free ports in ${lo}..${hi}`);
  return picked;
}

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

function startProcess(command: string, args: string[], logFile: string): ChildProcess {
  const proc = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"] });
  const log = createWriteStream(logFile, { flags: "a" });
  proc.stdout!.pipe(log);
  proc.stderr!.pipe(log);
  return proc;
}

async function killAndWait(proc: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  proc.kill(signal);
  await exited;
}

export class Cluster {
  static readonly partitions = 4;

  private constructor(
    private readonly etcd: ChildProcess,
    private readonly nodes: ChildProcess[],
    /** The nodes' "127.0.0.1:PORT", by index. */
    readonly addresses: string[],
    /** Where each node serves /metrics ("127.0.0.1:PORT"), by index. */
    readonly httpAddresses: string[],
    readonly dir: string,
  ) {}

  /** Starts etcd and the nodes; resolves once every partition has a leader and 3 in sync. */
  static async start(): Promise<Cluster> {
    const dir = mkdtempSync(path.join(os.tmpdir(), "jobbroker-ts-cluster-"));
    // All of the cluster's ports at once, so that no two are the same.
    const ports = (await freePorts(8)).map((port) => `127.0.0.1:${port}`);
    const etcdUrl = `http://${ports[0]}`;
    const etcd = startProcess(
      "etcd",
      ["--data-dir", path.join(dir, "etcd"), "--listen-client-urls", etcdUrl, "--advertise-client-urls", etcdUrl,
        "--listen-peer-urls", `http://${ports[1]}`],
      path.join(dir, "etcd.log"),
    );
    const addresses = ports.slice(2, 5);
    const httpAddresses = ports.slice(5, 8);
    const nodes = addresses.map((address, n) =>
      startProcess(
        brokerBinary(),
        ["--listen", address, "--http-listen", httpAddresses[n], "--data-dir", path.join(dir, `node-${n}`),
          "--partitions", String(Cluster.partitions), "--cluster-etcd", etcdUrl, "--node-id", `node-${n}`,
          "--cluster-initial-nodes", "3", "--log-level", "warn"],
        path.join(dir, `node-${n}.log`),
      ),
    );
    const cluster = new Cluster(etcd, nodes, addresses, httpAddresses, dir);
    const client = new Client({ addresses, deadlineMs: 5000 });
    try {
      await eventually(async () => {
        const info = await client.getCluster();
        return info.partitions.length === Cluster.partitions && info.partitions.every((p) => p.leaderNodeId && p.inSync.length === 3);
      }, `every partition with a leader and 3 nodes in sync (logs in ${dir})`, 60_000);
      // A leader named in etcd may still be starting its partition: wait until each serves.
      const served = (queue: string) =>
        client.getQueue(queue).then(
          () => true,
          (e) => e instanceof JobBrokerError && e.code !== Status.UNAVAILABLE,
        );
      for (const queue of queueOfEachPartition("ready")) {
        await eventually(() => served(queue), `the leader of queue ${queue}'s partition serving it (logs in ${dir})`, 60_000);
      }
    } catch (e) {
      await cluster.stop();
      throw e;
    } finally {
      client.close();
    }
    return cluster;
  }

  /** kill -9 of node `n`: a dead machine. */
  async kill9(n: number): Promise<void> {
    await killAndWait(this.nodes[n], "SIGKILL");
  }

  /** A gauge of node `n`, from its /metrics (a line "NAME VALUE"). */
  metric(n: number, name: string): Promise<number> {
    return new Promise((resolve, reject) => {
      const request = http.get(`http://${this.httpAddresses[n]}/metrics`, { timeout: 5000 }, (answer) => {
        let text = "";
        answer.setEncoding("utf8");
        answer.on("data", (chunk: string) => (text += chunk));
        answer.on("end", () => {
          const line = text.split("\n").find((l) => l.startsWith(`${name} `));
          if (line === undefined) reject(new Error(`node-${n} has no ${name} in its /metrics`));
          else resolve(Number(line.split(" ")[1]));
        });
      });
      request.on("timeout", () => request.destroy(new Error(`node-${n}'s /metrics did not answer`)));
      request.on("error", reject);
    });
  }

  /** The index of the node at `address`. */
  indexOf(address: string): number {
    const n = this.addresses.indexOf(address);
    if (n < 0) throw new Error(`no node of this cluster at ${address}`);
    return n;
  }

  /** Kills the nodes, then etcd, and removes their data. */
  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((node) => killAndWait(node, "SIGKILL")));
    await killAndWait(this.etcd, "SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** The address of `partition`'s leader in `info`, or "" while it has none. */
export function leaderAddress(info: ClusterInfo, partition: number): string {
  return info.partitions.find((p) => p.partition === partition)?.leaderAddress ?? "";
}

/** A queue name of each partition, by partition number: `prefix`-N for the smallest N found. */
export function queueOfEachPartition(prefix: string): string[] {
  const queues: string[] = [];
  for (let i = 0; queues.filter(Boolean).length < Cluster.partitions; i++) {
    const name = `${prefix}-${i}`;
    queues[partitionOfQueue(name, Cluster.partitions)] ??= name;
  }
  return queues;
}
