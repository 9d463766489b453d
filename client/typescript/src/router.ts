import { connectivityState, Metadata, type ServiceError } from "@grpc/grpc-js";
import { GetClusterRequest, type AdminClient, type ClusterInfo } from "./gen/jobbroker/v1/admin.js";
import type { BrokerClient } from "./gen/jobbroker/v1/broker.js";
import { Status } from "./errors.js";
import { RoutingTable } from "./routing-table.js";

/** The stubs of one broker address, on one channel. */
export interface Endpoint {
  readonly address: string;
  readonly broker: BrokerClient;
  readonly admin: AdminClient;
}

/** Which node a call is for: any node, the leader of a queue's partition, or of a job's. */
export type Route = { readonly queue: string } | { readonly jobId: string } | "any";

/** A failure that may mean the call went to a node that is gone or no longer leads. */
export function isTransient(code: number | undefined): boolean {
  return code === Status.UNAVAILABLE || code === Status.DEADLINE_EXCEEDED;
}

/**
 * What a Client (and the Worker on it) uses to reach a cluster's nodes: the addresses it was
 * given, one channel per node (dialled on first use and kept), and the RoutingTable from the
 * latest Admin.GetCluster answer. Internal to the library.
 *
 * The table is fetched before the first call, and again before the next call after
 * `markStale()` (a call failed UNAVAILABLE or DEADLINE_EXCEEDED: a leader moved, a node died),
 * from whichever address answers first: the nodes of the last table, then the given addresses,
 * those whose channel failed its last connect last. A broker that answers GetCluster with an
 * error (UNIMPLEMENTED, PERMISSION_DENIED) is used for every call: any node forwards a call to
 * its partition's leader. While no address has answered, calls go to the first given address and
 * every call asks again. A single broker outside a cluster, given alone, is asked once.
 *
 * Calls that find the table stale while a refresh is under way wait for that one.
 */
export class Router {
  private readonly nodes = new Map<string, Endpoint>();
  private state: "unknown" | "fresh" | "stale" = "unknown";
  private current = RoutingTable.unknown;
  private refreshing?: Promise<void>;

  constructor(
    /** The given addresses, in order, without repeats; at least one. */
    readonly addresses: readonly string[],
    private readonly dial: (address: string) => Endpoint,
    /** Deadline of each GetCluster attempt, in ms (Infinity for none). */
    private readonly timeoutMs: number,
  ) {}

  /** The node to send a call for `route` to, after fetching the table if it is stale. */
  async nodeFor(route: Route): Promise<Endpoint> {
    await this.refreshIfNeeded();
    return this.nodeAt(this.addressFor(this.current, route));
  }

  /** The table as it is now, after fetching it if it is stale. */
  async table(): Promise<RoutingTable> {
    await this.refreshIfNeeded();
    return this.current;
  }

  /**
   * The last table fetched, without asking again (RoutingTable.unknown before the first answer):
   * what the enqueue coalescer keys its batches by.
   */
  get lastTable(): RoutingTable {
    return this.current;
  }

  /** A node any call may go to, without asking: the one that answered last, else the first. */
  anyNode(): Endpoint {
    return this.nodeAt(this.current.anyAddress);
  }

  /** The node at `address`, dialled now if new; the first given address for "". */
  nodeAt(address: string): Endpoint {
    const key = address || this.addresses[0];
    let node = this.nodes.get(key);
    if (!node) {
      node = this.dial(key);
      this.nodes.set(key, node);
    }
    return node;
  }

  /**
   * After a call failed in a way that may mean it went to the wrong node (UNAVAILABLE,
   * DEADLINE_EXCEEDED): the next call fetches the table first.
   */
  markStale(): void {
    if (this.state === "fresh") this.state = "stale";
  }

  /** Closes every node's channel. */
  close(): void {
    for (const node of this.nodes.values()) node.broker.close();
  }

  private addressFor(table: RoutingTable, route: Route): string {
    if (route === "any") return table.anyAddress;
    if ("queue" in route) return table.addressOfQueue(route.queue);
    return table.addressOfJob(route.jobId);
  }

  private needsRefresh(): boolean {
    switch (this.state) {
      case "fresh":
        return false;
      case "unknown":
        return true;
      case "stale":
        // One broker outside a cluster, at the one address given: asking it again could only
        // tell the same.
        return this.current.isCluster || this.addresses.length > 1;
    }
  }

  private refreshIfNeeded(): Promise<void> {
    if (!this.needsRefresh()) return Promise.resolve();
    this.refreshing ??= this.refresh().finally(() => {
      this.refreshing = undefined;
    });
    return this.refreshing;
  }

  private async refresh(): Promise<void> {
    const candidates = [...new Set([...this.current.nodeAddresses(), ...this.addresses])].map((a) => this.nodeAt(a));
    // A channel in TRANSIENT_FAILURE failed its last connect: ask the others first (sort is stable).
    const failing = (node: Endpoint) =>
      node.broker.getChannel().getConnectivityState(false) === connectivityState.TRANSIENT_FAILURE ? 1 : 0;
    candidates.sort((a, b) => failing(a) - failing(b));
    for (const node of candidates) {
      const answer = await this.getCluster(node);
      if (answer === "unreachable") continue;
      this.current = answer === "refused" ? RoutingTable.singleBroker(node.address) : RoutingTable.fromClusterInfo(answer, node.address);
      this.state = "fresh";
      return;
    }
    // No node answered: the old table (or none) stays, and stays stale.
  }

  private getCluster(node: Endpoint): Promise<ClusterInfo | "unreachable" | "refused"> {
    const options = Number.isFinite(this.timeoutMs) ? { deadline: new Date(Date.now() + this.timeoutMs) } : {};
    return new Promise((resolve) => {
      node.admin.getCluster(GetClusterRequest.fromPartial({}), new Metadata(), options, (err: ServiceError | null, info: ClusterInfo) => {
        if (!err) resolve(info);
        else resolve(isTransient(err.code) ? "unreachable" : "refused");
      });
    });
  }
}
