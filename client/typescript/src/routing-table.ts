import type { ClusterInfo } from "./gen/jobbroker/v1/admin.js";
import { partitionOfJobId, partitionOfQueue } from "./partition.js";

/**
 * Which broker address a call goes to, from one answer of Admin.GetCluster: the leader of the
 * call's partition, found by the queue's name or the job id (partition.ts). A value: it never
 * changes once built; the router builds a new one when leadership moves.
 *
 * Every lookup answers an address to send to: a partition without a leader, a leader that is not
 * alive, or a job id of no known form go to `anyAddress`, a live node that forwards the call or
 * answers UNAVAILABLE naming the partition. A broker that is not part of a cluster (empty
 * `clusterName`) is reached only at the address it answered on: its own idea of its address may
 * be a listen address such as 0.0.0.0:7070.
 */
export class RoutingTable {
  /** The table before any broker answered: it knows no address. */
  static readonly unknown = new RoutingTable(false, 1, "", [], [], []);

  private constructor(
    /** False for a table from an empty `clusterName` or from `singleBroker`. */
    readonly isCluster: boolean,
    readonly partitionCount: number,
    /** The node that answered GetCluster, reachable a moment ago: where any call may go. */
    readonly anyAddress: string,
    // By partition number; "" where the partition has no live leader with a known address.
    private readonly leaders: readonly string[],
    private readonly aliveNodes: readonly string[],
    private readonly otherNodes: readonly string[],
  ) {}

  /** From `info`, answered by the broker the client reached at `answeredBy`. */
  static fromClusterInfo(info: ClusterInfo, answeredBy: string): RoutingTable {
    if (info.clusterName === "") return RoutingTable.singleBroker(answeredBy);
    const partitionCount = Math.max(1, info.partitionCount);
    const nodes = new Map(info.nodes.map((n) => [n.nodeId, n]));
    const leaders: string[] = new Array<string>(partitionCount).fill("");
    for (const p of info.partitions) {
      if (p.partition >= partitionCount || p.leaderNodeId === "") continue;
      const node = nodes.get(p.leaderNodeId);
      // A leader listed as not alive is about to lose its partition: any node knows better.
      if (node && !node.alive) continue;
      leaders[p.partition] = p.leaderAddress || node?.address || "";
    }
    const listed = info.nodes.filter((n) => n.address !== "");
    return new RoutingTable(
      true,
      partitionCount,
      answeredBy,
      leaders,
      listed.filter((n) => n.alive).map((n) => n.address),
      listed.filter((n) => !n.alive).map((n) => n.address),
    );
  }

  /**
   * For a broker that answered GetCluster with an error (UNIMPLEMENTED from a broker older than
   * cluster mode, PERMISSION_DENIED for a token without the admin role): every call goes to
   * `address`, which forwards what it does not lead.
   */
  static singleBroker(address: string): RoutingTable {
    return new RoutingTable(false, 1, address, [], [], []);
  }

  /** True until a broker answered. */
  get empty(): boolean {
    return this.anyAddress === "";
  }

  /** The address of `partition`'s leader; `anyAddress` if it has none (or is out of range). */
  addressOfPartition(partition: number): string {
    return (this.isCluster && this.leaders[partition]) || this.anyAddress;
  }

  /** The leader of the partition `queue` lives in. */
  addressOfQueue(queue: string): string {
    if (!this.isCluster) return this.anyAddress;
    return this.addressOfPartition(partitionOfQueue(queue, this.partitionCount));
  }

  /** The live leader of `queue`'s partition in a cluster's table; "" when it has none. */
  leaderOfQueue(queue: string): string {
    if (!this.isCluster) return "";
    return this.leaders[partitionOfQueue(queue, this.partitionCount)] ?? "";
  }

  /**
   * The leader of the partition job `jobId` lives in; `anyAddress` for an id of another form (the
   * broker answers NOT_FOUND or INVALID_ARGUMENT for it).
   */
  addressOfJob(jobId: string): string {
    if (!this.isCluster) return this.anyAddress;
    const partition = partitionOfJobId(jobId, this.partitionCount);
    return partition === undefined ? this.anyAddress : this.addressOfPartition(partition);
  }

  /**
   * Every node listed alive, in GetCluster's order, then those not alive: where to ask again when
   * the one that answered is gone. Only `anyAddress` outside a cluster.
   */
  nodeAddresses(): string[] {
    if (!this.isCluster) return this.empty ? [] : [this.anyAddress];
    return [...this.aliveNodes, ...this.otherNodes];
  }
}

/**
 * One Work stream of a worker (docs/worker-contract.md §5 "One stream per leading node"): the
 * node it goes to ("" for any node), the handled queues it subscribes to (sorted) and its share
 * of the worker's max_in_flight. Two groups are the same stream when all three are equal.
 */
export interface WorkGroup {
  readonly address: string;
  readonly queues: readonly string[];
  readonly share: number;
}

/**
 * Splits a worker's `queues` into the groups it opens one Work stream each for: one per leader
 * address in `table`, sorted by address, then one more for the queues whose partition has no
 * leader in the table (address "": any node, which relays them or answers UNAVAILABLE). The i-th
 * of the k groups gets `maxInFlight / k`, plus 1 when `i < maxInFlight % k`, at least 1: as the
 * broker shares a relayed stream's. Without a cluster table (a single broker, a broker that
 * refused GetCluster, or none answered yet) it is one group of every queue on any node: the
 * stream then moves through the addresses as the router does.
 */
export function workGroups(table: RoutingTable, queues: readonly string[], maxInFlight: number): WorkGroup[] {
  const sorted = [...new Set(queues)].sort();
  const byAddress = new Map<string, string[]>();
  const leaderless: string[] = [];
  for (const queue of sorted) {
    const leader = table.isCluster ? table.leaderOfQueue(queue) : "";
    if (leader === "") {
      leaderless.push(queue);
      continue;
    }
    let group = byAddress.get(leader);
    if (!group) byAddress.set(leader, (group = []));
    group.push(queue);
  }
  const layout: [string, string[]][] = [...byAddress.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  if (leaderless.length > 0) layout.push(["", leaderless]);
  const k = layout.length;
  return layout.map(([address, grouped], i) => ({
    address,
    queues: grouped,
    share: Math.max(1, Math.floor(maxInFlight / k) + (i < maxInFlight % k ? 1 : 0)),
  }));
}

/** True when `a` and `b` are the same stream: same node, same queues, same share. */
export function sameWorkGroup(a: WorkGroup, b: WorkGroup): boolean {
  return a.address === b.address && a.share === b.share && a.queues.length === b.queues.length && a.queues.every((q, i) => q === b.queues[i]);
}
