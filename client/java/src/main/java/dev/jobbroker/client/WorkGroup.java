package dev.jobbroker.client;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * One Work stream of a {@link Worker} (contract §5, "One stream per leading node"): the node it
 * goes to, the queues it subscribes to, and its share of the worker's {@code max_in_flight}. Two
 * groups are the same stream when all three are equal, which is how a regrouping tells the
 * streams that keep running from those it ends.
 *
 * @param address the leader's address; "" for any node (the queues whose partition has no
 *     leader in the table, or every queue outside a cluster)
 * @param queues sorted
 * @param maxInFlight this stream's share
 */
record WorkGroup(String address, List<String> queues, int maxInFlight) {
  /** The address of a group that any node serves (it relays what it does not lead). */
  static final String ANY_NODE = "";

  WorkGroup {
    queues = List.copyOf(queues);
  }

  /**
   * {@code queues} grouped by the leader {@code table} names for their partitions: one group per
   * leader address, sorted by address, then one more (address {@link #ANY_NODE}) for the queues
   * whose partition has no leader in the table. {@code maxInFlight} is shared out as the broker
   * shares a relayed stream's ({@link #shares}). Outside a cluster, and without a table, one group
   * of every queue with the whole {@code maxInFlight}, to any node: the one stream a worker had
   * before there were several.
   */
  static List<WorkGroup> of(RoutingTable table, Collection<String> queues, int maxInFlight) {
    if (!table.isCluster()) {
      return List.of(new WorkGroup(ANY_NODE, new ArrayList<>(new TreeSet<>(queues)), maxInFlight));
    }
    Map<String, TreeSet<String>> byLeader = new TreeMap<>();
    TreeSet<String> leaderless = new TreeSet<>();
    for (String queue : queues) {
      int partition = Partitions.ofQueue(queue, table.partitionCount());
      String leader = table.leaderOfPartition(partition);
      if (leader == null) {
        leaderless.add(queue);
      } else {
        byLeader.computeIfAbsent(leader, a -> new TreeSet<>()).add(queue);
      }
    }
    List<Map.Entry<String, TreeSet<String>>> ordered = new ArrayList<>(byLeader.entrySet());
    if (!leaderless.isEmpty()) {
      ordered.add(Map.entry(ANY_NODE, leaderless));
    }
    int[] shares = shares(maxInFlight, ordered.size());
    List<WorkGroup> groups = new ArrayList<>();
    for (int i = 0; i < ordered.size(); i++) {
      Map.Entry<String, TreeSet<String>> e = ordered.get(i);
      groups.add(new WorkGroup(e.getKey(), new ArrayList<>(e.getValue()), shares[i]));
    }
    return List.copyOf(groups);
  }

  /**
   * Whether a worker holding {@code groups}, grouped by {@code table}, fetches the table again
   * after each backoff delay though no stream ended (contract §5): true while one group goes to
   * any node in a cluster (queues whose partition had no leader). A node that already knows the
   * new leader relays that group's stream instead of refusing it, and no leader change would end
   * that relay; the next table names the leader, and the regrouping moves the queues to its own
   * stream. False outside a cluster, where the one group to any node is every queue.
   */
  static boolean refreshesTable(RoutingTable table, List<WorkGroup> groups) {
    return table.isCluster() && groups.stream().anyMatch(g -> g.address().equals(ANY_NODE));
  }

  /**
   * {@code maxInFlight} shared over {@code k} streams as the broker shares a relayed stream's:
   * the i-th gets {@code maxInFlight / k}, plus 1 when {@code i < maxInFlight % k}, and at least
   * 1, so a worker over k leaders may hold max(maxInFlight, k) jobs; 0 (drained) stays 0 for all.
   */
  static int[] shares(int maxInFlight, int k) {
    int[] shares = new int[k];
    if (maxInFlight <= 0) {
      return shares;
    }
    for (int i = 0; i < k; i++) {
      shares[i] = Math.max(1, maxInFlight / k + (i < maxInFlight % k ? 1 : 0));
    }
    return shares;
  }
}
