package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.NodeInfo;
import dev.jobbroker.v1.PartitionInfo;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/** The Worker's streams: its queues grouped by leader, from hand-made GetCluster answers. */
class WorkGroupTest {
  private static final int PARTITIONS = 4;

  private static NodeInfo node(String id, String address) {
    return NodeInfo.newBuilder().setNodeId(id).setAddress(address).setAlive(true).build();
  }

  private static PartitionInfo partition(int number, String leaderId, String leaderAddress) {
    return PartitionInfo.newBuilder()
        .setPartition(number)
        .setLeaderNodeId(leaderId)
        .setLeaderAddress(leaderAddress)
        .build();
  }

  /**
   * Four partitions: 0 and 3 led by c:7070, 1 by a:7070, 2 by none (listed in an order that is
   * not the addresses', so that the sorting shows).
   */
  private static RoutingTable table() {
    return RoutingTable.fromClusterInfo(
        ClusterInfo.newBuilder()
            .setClusterName("prod")
            .setPartitionCount(PARTITIONS)
            .addNodes(node("node-c", "c:7070"))
            .addNodes(node("node-a", "a:7070"))
            .addNodes(node("node-b", "b:7070"))
            .addPartitions(partition(0, "node-c", "c:7070"))
            .addPartitions(partition(1, "node-a", "a:7070"))
            .addPartitions(partition(3, "node-c", "c:7070"))
            .build(),
        "b:7070");
  }

  /** The first {@code n} queue names ("qN") that live in {@code partition}. */
  private static List<String> queuesOf(int partition, int n) {
    List<String> out = new ArrayList<>();
    for (int i = 0; out.size() < n; i++) {
      if (Partitions.ofQueue("q" + i, PARTITIONS) == partition) {
        out.add("q" + i);
      }
    }
    return out;
  }

  private static List<String> sorted(List<String> a, List<String> b) {
    return Stream.concat(a.stream(), b.stream()).sorted().toList();
  }

  @Test
  void oneGroupPerLeaderSortedByAddressThenTheLeaderless() {
    List<String> p0 = queuesOf(0, 2);
    List<String> p1 = queuesOf(1, 1);
    List<String> p2 = queuesOf(2, 2);
    List<String> p3 = queuesOf(3, 1);
    // Handled in an order that is neither the names' nor the partitions'.
    List<String> handled = new ArrayList<>();
    Stream.of(p3, p2, p1, p0).forEach(handled::addAll);
    Collections.reverse(handled);

    List<WorkGroup> groups = WorkGroup.of(table(), handled, 10);

    assertEquals(
        List.of(
            new WorkGroup("a:7070", p1, 4),
            new WorkGroup("c:7070", sorted(p0, p3), 3),
            new WorkGroup(WorkGroup.ANY_NODE, p2.stream().sorted().toList(), 3)),
        groups);
  }

  @Test
  void sharesAsTheBrokerSharesARelayedStreams() {
    List<String> handled = new ArrayList<>();
    handled.addAll(queuesOf(0, 1));
    handled.addAll(queuesOf(1, 1));
    handled.addAll(queuesOf(2, 1));
    // k = 3 groups: max_in_flight smaller than, equal to and larger than k.
    assertEquals(List.of(1, 1, 1), sharesOf(WorkGroup.of(table(), handled, 1)));
    assertEquals(List.of(1, 1, 1), sharesOf(WorkGroup.of(table(), handled, 2)));
    assertEquals(List.of(1, 1, 1), sharesOf(WorkGroup.of(table(), handled, 3)));
    assertEquals(List.of(2, 2, 1), sharesOf(WorkGroup.of(table(), handled, 5)));
    assertEquals(List.of(3, 3, 3), sharesOf(WorkGroup.of(table(), handled, 9)));

    assertArrayEquals(new int[] {1, 1}, WorkGroup.shares(1, 2));
    assertArrayEquals(new int[] {4, 3}, WorkGroup.shares(7, 2));
    assertArrayEquals(new int[] {0, 0, 0}, WorkGroup.shares(0, 3)); // drained stays drained
  }

  private static List<Integer> sharesOf(List<WorkGroup> groups) {
    return groups.stream().map(WorkGroup::maxInFlight).toList();
  }

  @Test
  void queuesOfOneLeaderAreOneGroupWithTheWholeShare() {
    List<String> handled = sorted(queuesOf(0, 2), queuesOf(3, 2));
    assertEquals(
        List.of(new WorkGroup("c:7070", handled, 6)), WorkGroup.of(table(), handled, 6));
  }

  @Test
  void withoutAClusterOneGroupOfEveryQueueToAnyNode() {
    List<String> handled = List.of("b", "a", "c");
    List<WorkGroup> expected =
        List.of(new WorkGroup(WorkGroup.ANY_NODE, List.of("a", "b", "c"), 5));
    assertEquals(expected, WorkGroup.of(RoutingTable.NONE, handled, 5));
    assertEquals(expected, WorkGroup.of(RoutingTable.singleBroker("x:7070"), handled, 5));
    ClusterInfo notACluster =
        ClusterInfo.newBuilder()
            .setPartitionCount(1)
            .addNodes(node("node-a", "0.0.0.0:7070"))
            .addPartitions(partition(0, "node-a", "0.0.0.0:7070"))
            .build();
    assertEquals(
        expected, WorkGroup.of(RoutingTable.fromClusterInfo(notACluster, "x:7070"), handled, 5));
  }

  @Test
  void aGroupForAnyNodeInAClusterHasTheTableFetchedAgain() {
    // Contract §5: while a group goes to any node, the worker asks for the table after each
    // backoff delay, so that a relayed stream moves to its leader once the table names it.
    List<String> someLeaderless = sorted(queuesOf(0, 1), queuesOf(2, 1));
    assertTrue(WorkGroup.refreshesTable(table(), WorkGroup.of(table(), someLeaderless, 4)));
    List<String> allLeaderless = queuesOf(2, 2);
    assertTrue(WorkGroup.refreshesTable(table(), WorkGroup.of(table(), allLeaderless, 4)));
    // Every queue has a leader: nothing to wait for.
    List<String> allLed = sorted(queuesOf(0, 1), queuesOf(1, 1));
    assertFalse(WorkGroup.refreshesTable(table(), WorkGroup.of(table(), allLed, 4)));
    // Outside a cluster the one group to any node is every queue, not queues without a leader.
    RoutingTable single = RoutingTable.singleBroker("x:7070");
    assertFalse(WorkGroup.refreshesTable(single, WorkGroup.of(single, allLeaderless, 4)));
    assertFalse(
        WorkGroup.refreshesTable(
            RoutingTable.NONE, WorkGroup.of(RoutingTable.NONE, allLeaderless, 4)));
  }

  @Test
  void everyQueueLeaderlessIsOneGroupToAnyNode() {
    List<String> handled = queuesOf(2, 3);
    assertEquals(
        List.of(new WorkGroup(WorkGroup.ANY_NODE, handled.stream().sorted().toList(), 4)),
        WorkGroup.of(table(), handled, 4));
  }
}
