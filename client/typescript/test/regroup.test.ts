// The worker's streams in a cluster, against stand-in nodes (docs/worker-contract.md §5 "One
// stream per leading node", §6 for several streams).
//
// The real cluster (cluster.test.ts) cannot be made to answer GetCluster without a leader and then
// with one on demand, nor to end one node's stream at a chosen moment of a stop; so each node here
// is a small gRPC server that answers Admin.GetCluster from a table the test sets and plays
// Broker.Work as the broker does (subscriptions and answers OK). No assertion here is on timing:
// the tests wait for what the worker sends.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Server, ServerCredentials, type ServerDuplexStream, type ServerUnaryCall, type sendUnaryData } from "@grpc/grpc-js";
import { Status, Worker } from "../src";
import { AdminService, ClusterInfo, type GetClusterRequest } from "../src/gen/jobbroker/v1/admin";
import { BrokerService, type LeasedJob, type WorkRequest, type WorkResponse, type WorkResult } from "../src/gen/jobbroker/v1/broker";
import { partitionOfQueue } from "../src/partition";
import { eventually } from "./broker";

type Call = ServerDuplexStream<WorkRequest, WorkResponse>;

/** One Work stream a node was opened, with what it was sent. */
interface StreamSeen {
  call: Call;
  requests: WorkRequest[];
  /** The worker half-closed it. */
  halfClosed: boolean;
}

/** A stand-in node: Admin.GetCluster from `cluster`, Broker.Work recorded and answered OK. */
class Node {
  readonly streams: StreamSeen[] = [];
  getClusterCalls = 0;
  /** Pushed on the first stream whose subscription is answered, right after the answer. */
  jobs: LeasedJob[] = [];
  private pushed = false;

  private constructor(
    private readonly server: Server,
    readonly address: string,
    private readonly cluster: { info: () => ClusterInfo },
  ) {}

  static async start(cluster: { info: () => ClusterInfo }): Promise<Node> {
    const server = new Server();
    let self!: Node;
    server.addService(BrokerService, { work: (call: Call) => self.onCall(call) } as never);
    server.addService(AdminService, {
      getCluster: (_call: ServerUnaryCall<GetClusterRequest, ClusterInfo>, done: sendUnaryData<ClusterInfo>) => {
        self.getClusterCalls++;
        done(null, self.cluster.info());
      },
    } as never);
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
    );
    self = new Node(server, `127.0.0.1:${port}`, cluster);
    return self;
  }

  private onCall(call: Call): void {
    const seen: StreamSeen = { call, requests: [], halfClosed: false };
    this.streams.push(seen);
    call.on("error", () => {});
    call.on("end", () => {
      seen.halfClosed = true;
      call.end();
    });
    call.on("data", (request: WorkRequest) => {
      seen.requests.push(request);
      if (request.flow) return;
      const result: WorkResult = { requestId: request.requestId, code: Status.OK, message: "", leaseDeadline: undefined, cancelRequested: false, itemErrors: [] };
      call.write({ result });
      if (request.subscribe && !this.pushed && this.jobs.length > 0) {
        this.pushed = true;
        for (const job of this.jobs) call.write({ job });
      }
    });
  }

  /** The requests of one kind sent on any of its streams. */
  of(kind: "ack" | "subscribe" | "flow"): WorkRequest[] {
    return this.streams.flatMap((s) => s.requests.filter((r) => r[kind] !== undefined));
  }

  close(): void {
    this.server.forceShutdown();
  }
}

function leased(jobId: string, queue: string): LeasedJob {
  return {
    jobId,
    leaseId: `lease-${jobId}`,
    queue,
    payload: Buffer.from("{}"),
    headers: {},
    attempt: 1,
    maxAttempts: 3,
    leaseDeadline: new Date(Date.now() + 60_000),
    idempotencyKey: jobId,
    checkpoint: Buffer.alloc(0),
    enqueuedAt: new Date(),
    timeoutAt: undefined,
    dependencyResults: {},
  };
}

/** A queue name whose partition (of `count`) is `partition`. */
function queueOf(partition: number, count: number): string {
  for (let i = 0; ; i++) if (partitionOfQueue(`q${i}`, count) === partition) return `q${i}`;
}

const quiet = () => {};

describe("Worker streams against stand-in cluster nodes", () => {
  // What GetCluster answers on every node; each test sets it.
  let info: () => ClusterInfo = () => ClusterInfo.fromPartial({});
  let a: Node;
  let b: Node;

  before(async () => {
    const cluster = { info: () => info() };
    a = await Node.start(cluster);
    b = await Node.start(cluster);
  });
  after(() => {
    a?.close();
    b?.close();
  });

  function layout(partitionCount: number, leaders: (Node | undefined)[]): ClusterInfo {
    return ClusterInfo.fromPartial({
      clusterName: "standin",
      partitionCount,
      nodes: [
        { nodeId: "a", address: a.address, alive: true },
        { nodeId: "b", address: b.address, alive: true },
      ],
      partitions: leaders.map((leader, partition) => ({
        partition,
        leaderNodeId: leader === a ? "a" : leader === b ? "b" : "",
        leaderAddress: leader?.address ?? "",
      })),
      nodeId: "a",
    });
  }

  test("a group for any node: the worker asks for the table again and moves the queues to their leader (§5)", async () => {
    // The first answer has no leader for q's partition, every later one names b.
    let asked = 0;
    info = () => layout(1, [asked++ === 0 ? undefined : b]);
    const worker = new Worker({ addresses: [a.address, b.address], concurrency: 3, reconnectInitialMs: 10, log: quiet });
    worker.handle("q", async () => {});
    await worker.start();
    try {
      // No stream ends: only the re-asked table moves the queue from a (which relays it) to b.
      await eventually(() => b.of("subscribe").length >= 1, "a subscription on the leader, b", 10_000);
      assert.deepEqual(b.of("subscribe").map((r) => [r.subscribe!.queues, r.subscribe!.maxInFlight]), [[["q"], 3]]);
      assert.equal(a.streams.length, 1);
      assert.deepEqual(a.of("subscribe").map((r) => r.subscribe!.queues), [["q"]], "first on any node: a, which answered");
      await eventually(() => a.streams[0].halfClosed, "the relayed stream on a ended by the worker", 10_000);
      assert.ok(asked >= 2, "the table was asked again");
      assert.equal(worker.stats.reconnects, 0, "no stream ended on its own");
    } finally {
      await worker.stop(0);
    }
  });

  test("several streams: one that ends during a stop is reopened without subscribing; none after the stop (§6)", async () => {
    const qa = queueOf(0, 2);
    const qb = queueOf(1, 2);
    info = () => layout(2, [a, b]);
    a.streams.length = 0;
    b.streams.length = 0;
    a.jobs = [leased("ja", qa)];
    let letGo!: () => void;
    const gate = new Promise<void>((resolve) => (letGo = resolve));
    let started = false;
    const worker = new Worker({ addresses: [a.address, b.address], concurrency: 2, reconnectInitialMs: 10, log: quiet });
    worker.handle(qa, async () => {
      started = true;
      await gate;
      return "done";
    });
    worker.handle(qb, async () => {});
    await worker.start();
    let stopping: Promise<void> | undefined;
    try {
      await eventually(() => started, "the job pushed on a's stream started", 10_000);
      assert.deepEqual(a.of("subscribe").map((r) => r.subscribe!.queues), [[qa]]);
      assert.deepEqual(b.of("subscribe").map((r) => r.subscribe!.queues), [[qb]]);
      stopping = worker.stop(60_000);
      // Step 1 on each stream.
      await eventually(() => a.of("flow").length === 1 && b.of("flow").length === 1, "flow 0 on both streams", 10_000);
      assert.deepEqual([...a.of("flow"), ...b.of("flow")].map((r) => r.flow!.maxInFlight), [0, 0]);
      // a ends its stream in the grace (status OK, as a broker that shut down): regrouped, the
      // worker opens a's stream again, to carry answers only.
      a.streams[0].call.end();
      await eventually(() => a.streams.length === 2, "a's stream reopened while stopping", 10_000);
      letGo();
      await eventually(() => a.of("ack").length + b.of("ack").length === 1, "the ack of ja", 10_000);
      assert.equal((a.of("ack")[0] ?? b.of("ack")[0]).ack!.leaseId, "lease-ja");
      await stopping;
      assert.deepEqual(a.streams[1].requests.filter((r) => r.subscribe || r.flow), [], "the reopened stream neither subscribes nor sets a flow");
      assert.equal(b.streams.length, 1, "b's stream, still open, was kept");
      assert.ok(a.streams.every((s) => s.halfClosed || s === a.streams[0]), "step 6 half-closed the reopened stream");
      assert.ok(b.streams[0].halfClosed, "step 6 half-closed b's stream");
      const after = a.streams.length + b.streams.length;
      await sleep(300);
      assert.equal(a.streams.length + b.streams.length, after, "nothing is reopened after step 6");
      assert.equal(worker.stats.acked, 1);
    } finally {
      letGo();
      await (stopping ?? worker.stop(0));
    }
  });
});
