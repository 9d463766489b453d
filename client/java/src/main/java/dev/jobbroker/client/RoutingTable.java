package dev.jobbroker.client;

import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.NodeInfo;
import dev.jobbroker.v1.PartitionInfo;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalInt;

/**
 * Which broker address a call goes to, from one answer of Admin.GetCluster: the leader of the
 * call's partition, found by the queue's name or the job id ({@link Partitions}). Immutable: the
 * {@link Router} builds a new one when leadership moves.
 *
 * <p>Every lookup answers an address, never nothing: a partition without a leader, a leader
 * listed as not alive, or a job id of another form go to {@link #anyAddress()}, the live node
 * that answered, which forwards the call or answers UNAVAILABLE naming the partition. A broker
 * that is not part of a cluster (empty cluster_name) is reached only at the address it answered
 * on: its own idea of its address may be a listen address such as 0.0.0.0:7070.
 */
final class RoutingTable {
  /** No broker has answered yet: every lookup answers "". */
  static final RoutingTable NONE = new RoutingTable(false, 1, "", new String[0], List.of());

  private final boolean cluster;
  private final int partitionCount;
  private final String answeredBy;
  // By partition number; null where the partition has no live leader with a known address.
  private final String[] leaders;
  // Alive nodes first, in the order GetCluster listed them, then the others.
  private final List<String> nodeAddresses;

  private RoutingTable(
      boolean cluster,
      int partitionCount,
      String answeredBy,
      String[] leaders,
      List<String> nodeAddresses) {
    this.cluster = cluster;
    this.partitionCount = partitionCount;
    this.answeredBy = answeredBy;
    this.leaders = leaders;
    this.nodeAddresses = nodeAddresses;
  }

  /** From {@code info}, answered by the broker the client reached at {@code answeredBy}. */
  static RoutingTable fromClusterInfo(ClusterInfo info, String answeredBy) {
    if (info.getClusterName().isEmpty()) {
      return singleBroker(answeredBy);
    }
    int partitionCount = Math.max(1, info.getPartitionCount());
    Map<String, NodeInfo> nodes = new HashMap<>();
    List<String> alive = new ArrayList<>();
    List<String> notAlive = new ArrayList<>();
    for (NodeInfo node : info.getNodesList()) {
      nodes.put(node.getNodeId(), node);
      if (!node.getAddress().isEmpty()) {
        (node.getAlive() ? alive : notAlive).add(node.getAddress());
      }
    }
    String[] leaders = new String[partitionCount];
    for (PartitionInfo p : info.getPartitionsList()) {
      // uint32 on the wire: a number above 2^31 arrives negative, and is out of range too.
      if (p.getPartition() < 0
          || p.getPartition() >= partitionCount
          || p.getLeaderNodeId().isEmpty()) {
        continue;
      }
      NodeInfo leader = nodes.get(p.getLeaderNodeId());
      // A leader listed as not alive is about to lose its partition: any node knows better.
      if (leader != null && !leader.getAlive()) {
        continue;
      }
      String address = p.getLeaderAddress();
      if (address.isEmpty() && leader != null) {
        address = leader.getAddress();
      }
      leaders[p.getPartition()] = address.isEmpty() ? null : address;
    }
    List<String> all = new ArrayList<>(alive);
    all.addAll(notAlive);
    return new RoutingTable(true, partitionCount, answeredBy, leaders, List.copyOf(all));
  }

  /**
   * For a broker that answered GetCluster with an error (UNIMPLEMENTED from one older than
   * cluster mode, PERMISSION_DENIED for a token without the admin role): every call goes to
   * {@code address}, which forwards what it does not lead.
   */
  static RoutingTable singleBroker(String address) {
    return new RoutingTable(false, 1, address, new String[0], List.of(address));
  }

  /** False for a table from an empty cluster_name, from {@link #singleBroker}, and NONE. */
  boolean isCluster() {
    return cluster;
  }

  /** True only for {@link #NONE}. */
  boolean isEmpty() {
    return answeredBy.isEmpty();
  }

  int partitionCount() {
    return partitionCount;
  }

  /** The address of partition {@code partition}'s leader; {@link #anyAddress()} if none. */
  String addressOfPartition(int partition) {
    String leader = leaderOfPartition(partition);
    return leader == null ? anyAddress() : leader;
  }

  /**
   * The address of partition {@code partition}'s live leader; null if the table names none (or is
   * not a cluster's): a Worker's stream for its queues then goes to any node.
   */
  String leaderOfPartition(int partition) {
    if (!cluster || partition < 0 || partition >= leaders.length) {
      return null;
    }
    return leaders[partition];
  }

  /** The leader of the partition {@code queue} lives in. */
  String addressOfQueue(String queue) {
    return cluster ? addressOfPartition(Partitions.ofQueue(queue, partitionCount)) : anyAddress();
  }

  /**
   * The leader of the partition job {@code jobId} lives in; {@link #anyAddress()} for an id of
   * another form (the broker answers NOT_FOUND or INVALID_ARGUMENT for it).
   */
  String addressOfJob(String jobId) {
    if (!cluster) {
      return anyAddress();
    }
    OptionalInt partition = Partitions.ofJobId(jobId, partitionCount);
    return partition.isPresent() ? addressOfPartition(partition.getAsInt()) : anyAddress();
  }

  /** A live node, for calls any node serves: the one that answered, which was reachable. */
  String anyAddress() {
    return answeredBy;
  }

  /**
   * Where to ask for the next table when the node that answered is gone: every node listed
   * alive, then the others; only the one that answered outside a cluster.
   */
  List<String> nodeAddresses() {
    return isEmpty() ? List.of() : nodeAddresses;
  }

  @Override
  public String toString() {
    return cluster
        ? "cluster of " + partitionCount + " partitions, leaders " + Arrays.toString(leaders)
        : "single broker at " + answeredBy;
  }
}
