// A real cluster for a test file: etcd (Debian's `etcd` on PATH) and three jobbroker nodes on
// loopback, as tests/lib/cluster.sh starts them, with 4 partitions each replicated on all three.
// Each node serves its /metrics on a port of its own (`metric()`).
import http from "node:http";
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Client, JobBrokerError, Status, type ClusterInfo } from "../src";
import { partitionOfQueue } from "../src/partition";
import { brokerBinary, eventually } from "./broker";

/** A port free a moment ago on 127.0.0.1 (the nodes' addresses are fixed before they start). */
async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
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
    const etcdUrl = `http://127.0.0.1:${await freePort()}`;
    const etcd = startProcess(
      "etcd",
      ["--data-dir", path.join(dir, "etcd"), "--listen-client-urls", etcdUrl, "--advertise-client-urls", etcdUrl,
        "--listen-peer-urls", `http://127.0.0.1:${await freePort()}`],
      path.join(dir, "etcd.log"),
    );
    const addresses: string[] = [];
    const httpAddresses: string[] = [];
    for (let n = 0; n < 3; n++) {
      addresses.push(`127.0.0.1:${await freePort()}`);
      httpAddresses.push(`127.0.0.1:${await freePort()}`);
    }
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
