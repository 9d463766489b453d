// Cluster routing against a real 3-node cluster (4 partitions): each call goes straight to its
// partition's leader, the client and a worker follow a leader's death, and a worker over queues
// led by different nodes opens a stream on each leader (no node relays one), also after a death.
import assert from "node:assert/strict";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { InterceptingCall, type Interceptor } from "@grpc/grpc-js";
import { Client, JobState, Worker } from "../src";
import { partitionOfJobId, partitionOfQueue } from "../src/partition";
import { eventually } from "./broker";
import { Cluster, leaderAddress, queueOfEachPartition } from "./cluster";

const quiet = () => {};
const giveUpMs = 60_000;

interface Sent {
  method: string;
  /** The node that served the call: the peer of its connection ("127.0.0.1:PORT"). */
  address: string;
}

/** Records the method and the serving node of every call the client made. */
function targetRecorder(): { sent: Sent[]; interceptor: Interceptor } {
  const sent: Sent[] = [];
  const interceptor: Interceptor = (options, nextCall) => {
    const method = path.basename(options.method_definition.path);
    const call: InterceptingCall = new InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        next(metadata, {
          onReceiveStatus(status, nextStatus) {
            sent.push({ method, address: call.getPeer() });
            nextStatus(status);
          },
        });
      },
    });
    return call;
  };
  return { sent, interceptor };
}

describe("a client of a 3-node cluster", { timeout: 5 * giveUpMs }, () => {
  let cluster: Cluster;

  /** The batches node `n` answered: on an EnqueueStream, and as EnqueueBatch calls. */
  async function batchesAt(n: number): Promise<{ stream: number; calls: number }> {
    const count = (method: string) =>
      cluster.metric(n, `jobbroker_rpc_duration_seconds_count{code="OK",method="/jobbroker.v1.Broker/${method}"}`).catch(() => 0);
    return { stream: await count("EnqueueStream"), calls: await count("EnqueueBatch") };
  }

  before(async () => {
    cluster = await Cluster.start();
  });
  after(async () => {
    await cluster?.stop();
  });

  test("sends each call to the leader of its queue's or job's partition", async () => {
    const { sent, interceptor } = targetRecorder();
    const client = new Client({ addresses: cluster.addresses, interceptors: [interceptor] });
    try {
      const info = await client.getCluster();
      for (const [partition, queue] of queueOfEachPartition("routed").entries()) {
        const leader = leaderAddress(info, partition);
        assert.ok(leader, `partition ${partition} has a leader`);
        sent.length = 0;
        const { jobId } = await client.enqueue(queue, "x");
        assert.equal(partitionOfJobId(jobId, Cluster.partitions), partition);
        await client.getJob(jobId);
        await client.getQueue(queue);
        await client.pauseQueue(queue);
        assert.deepEqual(
          sent.filter((s) => s.method !== "GetCluster"),
          ["Enqueue", "GetJob", "GetQueue", "PauseQueue"].map((method) => ({ method, address: leader })),
          `the calls of queue ${queue} (partition ${partition})`,
        );
      }
    } finally {
      client.close();
    }
  });

  test("coalesces the enqueues of one partition, over queues, into one batch sent to its leader", async () => {
    const client = new Client({ addresses: cluster.addresses });
    try {
      const info = await client.getCluster(); // the table the batches are keyed by
      // Two queues of each partition: jobs of different queues share a batch when they share a partition.
      const queues = [...queueOfEachPartition("merged-a"), ...queueOfEachPartition("merged-b")];
      const before = await Promise.all(cluster.addresses.map((_, n) => batchesAt(n)));
      const jobs = queues.flatMap((queue) => [1, 2, 3, 4, 5].map((i) => ({ queue, payload: `${queue}-${i}` })));
      const results = await Promise.all(jobs.map((j) => client.enqueue(j.queue, j.payload)));
      results.forEach((r, i) => assert.equal(partitionOfJobId(r.jobId, Cluster.partitions), partitionOfQueue(jobs[i].queue, Cluster.partitions)));
      // One turn of the event loop, 40 jobs: one batch per partition, each on a stream to its
      // leader (no call forwarded), as each node's own counts say.
      const led = cluster.addresses.map((address) => [0, 1, 2, 3].filter((p) => leaderAddress(info, p) === address).length);
      const rise = await eventually(async () => {
        const now = await Promise.all(cluster.addresses.map((_, n) => batchesAt(n)));
        const d = now.map((c, n) => ({ stream: c.stream - before[n].stream, calls: c.calls - before[n].calls }));
        return d.reduce((sum, x) => sum + x.stream, 0) >= Cluster.partitions ? d : undefined;
      }, "a batch per partition in the nodes' /metrics");
      assert.deepEqual(
        rise,
        led.map((n) => ({ stream: n, calls: 0 })),
        `batches per node, against the partitions each leads (${JSON.stringify(led)})`,
      );
      const stored = await Promise.all(results.map((r) => client.getJob(r.jobId)));
      assert.deepEqual(
        stored.map((j) => j.payload.toString()),
        jobs.map((j) => j.payload),
      );
    } finally {
      await client.close();
    }
  });

  test("follows the move of a partition whose leader died, as does a worker", async () => {
    const queue = queueOfEachPartition("moving")[0];
    const { sent, interceptor } = targetRecorder();
    const client = new Client({ addresses: cluster.addresses, interceptors: [interceptor] });
    const worker = new Worker({ addresses: cluster.addresses, log: quiet, reconnectInitialMs: 50, reconnectMaxMs: 1000 }).handle(
      queue,
      (job) => `done ${job.payload.toString()}`,
    );
    try {
      await worker.start();
      const before = await Promise.all([1, 2, 3].map((i) => client.enqueue(queue, `before-${i}`, { dedupKey: `before-${i}` })));
      for (const { jobId } of before) {
        await eventually(async () => (await client.getJob(jobId)).state === JobState.JOB_STATE_COMPLETED, `job ${jobId} completed`, giveUpMs);
      }
      const oldLeader = leaderAddress(await client.getCluster(), partitionOfQueue(queue, Cluster.partitions));
      await cluster.kill9(cluster.indexOf(oldLeader));

      // Retried (with a dedup key, so never twice) until a new leader takes the partition.
      sent.length = 0;
      const { jobId } = await eventually(
        () => client.enqueue(queue, "after", { dedupKey: "after" }),
        "an enqueue after the leader's death",
        giveUpMs,
      );
      const enqueuedAt = sent.filter((s) => s.method === "Enqueue").at(-1)!.address;
      const newLeader = await eventually(async () => {
        const info = await client.getCluster();
        const leader = leaderAddress(info, partitionOfQueue(queue, Cluster.partitions));
        return leader !== oldLeader && leader;
      }, "a new leader in GetCluster", giveUpMs);
      assert.equal(enqueuedAt, newLeader, "the enqueue that succeeded went to the new leader");

      for (const done of before) {
        const job = await eventually(() => client.getJob(done.jobId), `job ${done.jobId} after the death`, giveUpMs);
        assert.equal(job.state, JobState.JOB_STATE_COMPLETED, `acked job ${done.jobId} stays completed`);
      }
      const after = await eventually(
        async () => {
          const job = await client.getJob(jobId);
          return job.state === JobState.JOB_STATE_COMPLETED ? job : undefined;
        },
        "the worker completing the job enqueued after the death",
        giveUpMs,
      );
      assert.equal(after.result.toString(), "done after");
    } finally {
      await worker.stop();
      client.close();
    }
  });
});

describe("a worker of a 3-node cluster", { timeout: 5 * giveUpMs }, () => {
  let cluster: Cluster;

  before(async () => {
    cluster = await Cluster.start();
  });
  after(async () => {
    await cluster?.stop();
  });

  /** The gauge on each node of `nodes`, by node index. */
  const gauges = (name: string, nodes: number[]) => Promise.all(nodes.map((n) => cluster.metric(n, name)));

  test("opens one stream per leading node, none relayed, and regroups after a leader's death", async () => {
    const client = new Client({ addresses: cluster.addresses });
    const nodeOf = (address: string) => cluster.indexOf(address);
    // Once the controller has balanced the leaders, every node leads a partition: two of them
    // with different leaders, and a third node that leads neither.
    const info = await eventually(async () => {
      const info = await client.getCluster();
      const leaders = new Set(info.partitions.map((p) => p.leaderAddress).filter(Boolean));
      return info.partitions.length === Cluster.partitions && leaders.size === cluster.addresses.length ? info : undefined;
    }, "every node leading a partition", giveUpMs);
    const queues = queueOfEachPartition("per-leader");
    const la = leaderAddress(info, 0);
    const pb = [...queues.keys()].find((p) => leaderAddress(info, p) !== la)!;
    const lb = leaderAddress(info, pb);
    const [qa, qb] = [queues[0], queues[pb]];
    const neither = [0, 1, 2].find((n) => n !== nodeOf(la) && n !== nodeOf(lb))!;

    const worker = new Worker({
      // The node that leads neither queue first: a worker that opened one stream there would be relayed.
      addresses: [cluster.addresses[neither], la, lb],
      concurrency: 4,
      log: quiet,
      reconnectInitialMs: 50,
      reconnectMaxMs: 1000,
    });
    for (const queue of [qa, qb]) worker.handle(queue, (job) => `done ${job.payload.toString()}`);
    const completed = async (jobIds: string[]) => {
      for (const jobId of jobIds) {
        await eventually(async () => (await client.getJob(jobId)).state === JobState.JOB_STATE_COMPLETED, `job ${jobId} completed`, giveUpMs);
      }
    };
    // Retried (with a dedup key, so never twice) while a partition is between leaders.
    const enqueue = (round: string) =>
      Promise.all(
        [qa, qb].flatMap((queue) =>
          Array.from({ length: 10 }, async (_, i) => {
            const key = `${round}-${queue}-${i}`;
            return (await eventually(() => client.enqueue(queue, key, { dedupKey: key }), `enqueue ${key}`, giveUpMs)).jobId;
          }),
        ),
      );
    try {
      await worker.start();
      await completed(await enqueue("first"));
      assert.deepEqual(await gauges("jobbroker_work_streams_relaying", [0, 1, 2]), [0, 0, 0], "no node relays a stream");
      const open = await gauges("jobbroker_work_streams_open", [0, 1, 2]);
      assert.ok(
        open[nodeOf(la)] >= 1 && open[nodeOf(lb)] >= 1 && open[neither] === 0,
        `open streams per node ${JSON.stringify(open)}: want one or more on node-${nodeOf(la)} and node-${nodeOf(lb)} (the leaders), none on node-${neither}`,
      );

      await cluster.kill9(nodeOf(la));
      await completed(await enqueue("after"));
      // Regrouped: the dead leader's queue is on its new leader's stream, relayed by none.
      const alive = [0, 1, 2].filter((n) => n !== nodeOf(la));
      await eventually(
        async () => (await gauges("jobbroker_work_streams_relaying", alive)).every((v) => v === 0),
        "no live node relaying a stream after the leader's death",
        30_000,
      );
    } finally {
      await worker.stop();
      client.close();
    }
  });
});
