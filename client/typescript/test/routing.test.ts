// Cluster routing without a broker: the partition functions against every line of
// tests/client/partition_vectors.tsv (checked against the broker's own code), and the routing
// table built from hand-made GetCluster answers.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import { ClusterInfo } from "../src/gen/jobbroker/v1/admin";
import { partitionOfJobId, partitionOfQueue } from "../src/partition";
import { RoutingTable, workGroups } from "../src/routing-table";
import { repoRoot } from "./broker";

describe("partitions", () => {
  const vectors = readFileSync(path.join(repoRoot(), "tests/client/partition_vectors.tsv"), "utf8")
    .split("\n")
    .filter((line) => line !== "" && !line.startsWith("#"))
    .map((line) => line.split("\t"));

  test("queues and job ids land where the broker puts them, for every line of the vectors file", () => {
    let queues = 0;
    let jobs = 0;
    for (const [kind, name, count, want] of vectors) {
      const where = `${kind} ${JSON.stringify(name)} of ${count}`;
      if (kind === "queue") {
        assert.equal(partitionOfQueue(name, Number(count)), Number(want), where);
        queues++;
      } else {
        assert.equal(kind, "job", `a line of an unknown kind: ${kind}`);
        assert.equal(partitionOfJobId(name, Number(count)), want === "none" ? undefined : Number(want), where);
        jobs++;
      }
    }
    assert.ok(queues > 0 && jobs > 0, `the file holds ${queues} queue and ${jobs} job lines`);
  });
});

describe("the routing table", () => {
  const nodes = [
    { nodeId: "n0", address: "10.0.0.1:7070", alive: true },
    { nodeId: "n1", address: "10.0.0.2:7070", alive: true },
    { nodeId: "n2", address: "10.0.0.3:7070", alive: false },
  ];
  const queueOf = (partition: number, count: number) => {
    for (let i = 0; ; i++) if (partitionOfQueue(`q${i}`, count) === partition) return `q${i}`;
  };
  // A job id of partition field 1 (characters 10..12 = "001").
  const jobOfPartition1 = "01J0000000001ZZZZZZZZZZZZZ";

  test("a call goes to its partition's live leader, by queue or by job id", () => {
    const info = ClusterInfo.fromPartial({
      clusterName: "c",
      partitionCount: 4,
      nodes,
      partitions: [
        { partition: 0, leaderNodeId: "n0", leaderAddress: "10.0.0.1:7070" },
        // No leader_address: the node's.
        { partition: 1, leaderNodeId: "n1" },
        // Led by a node listed as not alive: any node.
        { partition: 2, leaderNodeId: "n2", leaderAddress: "10.0.0.3:7070" },
        // No leader: any node.
        { partition: 3, leaderNodeId: "" },
      ],
    });
    const table = RoutingTable.fromClusterInfo(info, "10.0.0.2:7070");
    assert.ok(table.isCluster);
    assert.equal(table.partitionCount, 4);
    assert.equal(table.addressOfQueue(queueOf(0, 4)), "10.0.0.1:7070");
    assert.equal(table.addressOfQueue(queueOf(1, 4)), "10.0.0.2:7070");
    assert.equal(table.addressOfPartition(2), "10.0.0.2:7070");
    assert.equal(table.addressOfPartition(3), "10.0.0.2:7070");
    assert.equal(table.addressOfPartition(9), "10.0.0.2:7070");
    assert.equal(table.addressOfJob(jobOfPartition1), "10.0.0.2:7070");
    assert.equal(table.addressOfJob("not-a-job-id"), "10.0.0.2:7070");
    assert.equal(table.anyAddress, "10.0.0.2:7070");
    assert.deepEqual(table.nodeAddresses(), ["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]);
  });

  test("a job id goes to the leader of its own partition", () => {
    const info = ClusterInfo.fromPartial({
      clusterName: "c",
      partitionCount: 2,
      nodes,
      partitions: [
        { partition: 0, leaderNodeId: "n0", leaderAddress: "10.0.0.1:7070" },
        { partition: 1, leaderNodeId: "n1", leaderAddress: "10.0.0.2:7070" },
      ],
    });
    const table = RoutingTable.fromClusterInfo(info, "10.0.0.1:7070");
    assert.equal(table.addressOfJob(jobOfPartition1), "10.0.0.2:7070");
    assert.equal(table.addressOfJob("01J0000000002ZZZZZZZZZZZZZ"), "10.0.0.1:7070");
  });

  test("a broker that is not part of a cluster is reached where it answered, for every call", () => {
    // Its own idea of its address may be a listen address such as 0.0.0.0:7070.
    const info = ClusterInfo.fromPartial({
      clusterName: "",
      partitionCount: 1,
      nodes: [{ nodeId: "solo", address: "0.0.0.0:7070", alive: true }],
      partitions: [{ partition: 0, leaderNodeId: "solo", leaderAddress: "0.0.0.0:7070" }],
    });
    const table = RoutingTable.fromClusterInfo(info, "broker.example:7070");
    assert.equal(table.isCluster, false);
    assert.equal(table.addressOfQueue("q"), "broker.example:7070");
    assert.equal(table.addressOfJob(jobOfPartition1), "broker.example:7070");
    assert.deepEqual(table.nodeAddresses(), ["broker.example:7070"]);
    const refused = RoutingTable.singleBroker("older:7070");
    assert.equal(refused.isCluster, false);
    assert.equal(refused.addressOfQueue("q"), "older:7070");
    assert.ok(RoutingTable.unknown.empty);
    assert.deepEqual(RoutingTable.unknown.nodeAddresses(), []);
  });
});

describe("a worker's stream groups", () => {
  const nodes = [
    { nodeId: "n0", address: "10.0.0.1:7070", alive: true },
    { nodeId: "n1", address: "10.0.0.2:7070", alive: true },
    { nodeId: "n2", address: "10.0.0.3:7070", alive: true },
  ];
  // Queue names by partition of 4, two of each, found by the broker's placement.
  const byPartition: string[][] = [[], [], [], []];
  for (let i = 0; byPartition.some((qs) => qs.length < 2); i++) {
    const qs = byPartition[partitionOfQueue(`w${i}`, 4)];
    if (qs.length < 2) qs.push(`w${i}`);
  }
  // Partition 0 and 2 on n1, 1 on n0, 3 without a leader; listed out of address order.
  const table = RoutingTable.fromClusterInfo(
    ClusterInfo.fromPartial({
      clusterName: "c",
      partitionCount: 4,
      nodes,
      partitions: [
        { partition: 0, leaderNodeId: "n1", leaderAddress: "10.0.0.2:7070" },
        { partition: 1, leaderNodeId: "n0", leaderAddress: "10.0.0.1:7070" },
        { partition: 2, leaderNodeId: "n1", leaderAddress: "10.0.0.2:7070" },
        { partition: 3, leaderNodeId: "" },
      ],
    }),
    "10.0.0.3:7070",
  );
  const every = byPartition.flat().reverse(); // handled in no particular order
  const sorted = (...qs: string[]) => [...qs].sort();

  test("one group per leader, sorted by address, its queues sorted; the leaderless ones on any node", () => {
    const groups = workGroups(table, every, 9);
    assert.deepEqual(
      groups.map((g) => ({ address: g.address, queues: g.queues })),
      [
        { address: "10.0.0.1:7070", queues: sorted(...byPartition[1]) },
        { address: "10.0.0.2:7070", queues: sorted(...byPartition[0], ...byPartition[2]) },
        { address: "", queues: sorted(...byPartition[3]) },
      ],
    );
  });

  test("max_in_flight is shared out as the broker shares a relayed stream's, at least 1 each", () => {
    const shares = (max: number) => workGroups(table, every, max).map((g) => g.share);
    assert.deepEqual(shares(2), [1, 1, 1], "smaller than the 3 groups: 1 each");
    assert.deepEqual(shares(3), [1, 1, 1], "equal");
    assert.deepEqual(shares(8), [3, 3, 2], "larger: the first max % k get one more");
    assert.deepEqual(shares(256), [86, 85, 85]);
  });

  test("queues of one leader are one group with the whole max_in_flight", () => {
    const groups = workGroups(table, sorted(...byPartition[2], ...byPartition[0]).reverse(), 5);
    assert.deepEqual(groups, [{ address: "10.0.0.2:7070", queues: sorted(...byPartition[0], ...byPartition[2]), share: 5 }]);
  });

  test("without a cluster's table: one group of every queue on any node", () => {
    for (const t of [RoutingTable.unknown, RoutingTable.singleBroker("older:7070")]) {
      assert.deepEqual(workGroups(t, ["b", "a", "c"], 4), [{ address: "", queues: ["a", "b", "c"], share: 4 }]);
    }
  });
});
