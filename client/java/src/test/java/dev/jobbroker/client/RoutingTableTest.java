package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.NodeInfo;
import dev.jobbroker.v1.PartitionInfo;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The RoutingTable built from hand-made GetCluster answers. */
class RoutingTableTest {
  private static final String ANSWERED_BY = "10.0.0.9:7070";

  private static NodeInfo node(String id, String address, boolean alive) {
    return NodeInfo.newBuilder().setNodeId(id).setAddress(address).setAlive(alive).build();
  }

  private static PartitionInfo partition(int number, String leaderId, String leaderAddress) {
    return PartitionInfo.newBuilder()
        .setPartition(number)
        .setLeaderNodeId(leaderId)
        .setLeaderAddress(leaderAddress)
        .build();
  }

  /** Two partitions, three nodes; node-c is not alive. */
  private static ClusterInfo.Builder cluster() {
    return ClusterInfo.newBuilder()
        .setClusterName("prod")
        .setPartitionCount(2)
        .addNodes(node("node-a", "a:7070", true))
        .addNodes(node("node-b", "b:7070", true))
        .addNodes(node("node-c", "c:7070", false));
  }

  /** A queue name that lives in {@code partition} of 2. */
  private static String queueOfPartition(int partition) {
    for (int i = 0; ; i++) {
      if (Partitions.ofQueue("q" + i, 2) == partition) {
        return "q" + i;
      }
    }
  }

  @Test
  void aQueueAndAJobGoToTheLiveLeaderOfTheirPartition() {
    RoutingTable table =
        RoutingTable.fromClusterInfo(
            cluster()
                .addPartitions(partition(0, "node-a", "a:7070"))
                .addPartitions(partition(1, "node-b", "b:7070"))
                .build(),
            ANSWERED_BY);
    assertTrue(table.isCluster());
    assertEquals(2, table.partitionCount());
    assertEquals("a:7070", table.addressOfQueue(queueOfPartition(0)));
    assertEquals("b:7070", table.addressOfQueue(queueOfPartition(1)));
    // Characters 10..12 "001": partition 1 of 2.
    assertEquals("b:7070", table.addressOfJob("01HZX3K8QZ001ABCDEFGHJKMNP"));
    assertEquals("a:7070", table.addressOfJob("01HZX3K8QZ002ABCDEFGHJKMNP"));
    assertEquals(ANSWERED_BY, table.anyAddress());
  }

  @Test
  void aLeaderAddressMissingFromThePartitionIsTakenFromItsNode() {
    RoutingTable table =
        RoutingTable.fromClusterInfo(
            cluster().addPartitions(partition(1, "node-b", "")).build(), ANSWERED_BY);
    assertEquals("b:7070", table.addressOfPartition(1));
  }

  @Test
  void aLeaderListedAsNotAliveIsPassedOverForAnyNode() {
    RoutingTable table =
        RoutingTable.fromClusterInfo(
            cluster()
                .addPartitions(partition(0, "node-c", "c:7070"))
                .addPartitions(partition(1, "node-b", "b:7070"))
                .build(),
            ANSWERED_BY);
    assertEquals(ANSWERED_BY, table.addressOfQueue(queueOfPartition(0)));
    assertEquals("b:7070", table.addressOfQueue(queueOfPartition(1)));
  }

  @Test
  void aPartitionWithoutALeaderGoesToAnyNode() {
    RoutingTable table =
        RoutingTable.fromClusterInfo(
            cluster()
                .addPartitions(partition(0, "", ""))
                .addPartitions(partition(1, "node-b", "b:7070"))
                // Out of range: ignored, never a crash.
                .addPartitions(partition(7, "node-a", "a:7070"))
                .build(),
            ANSWERED_BY);
    assertEquals(ANSWERED_BY, table.addressOfPartition(0));
    assertEquals(ANSWERED_BY, table.addressOfPartition(7));
    assertEquals("b:7070", table.addressOfPartition(1));
  }

  @Test
  void aJobIdOfAnotherFormGoesToAnyNode() {
    RoutingTable table =
        RoutingTable.fromClusterInfo(
            cluster().addPartitions(partition(1, "node-b", "b:7070")).build(), ANSWERED_BY);
    assertEquals(ANSWERED_BY, table.addressOfJob("not-a-job-id"));
    assertEquals(ANSWERED_BY, table.addressOfJob("81HZX3K8QZ001ABCDEFGHJKMNP"));
  }

  @Test
  void theNodesToAskNextAreTheLiveOnesFirst() {
    RoutingTable table =
        RoutingTable.fromClusterInfo(
            ClusterInfo.newBuilder()
                .setClusterName("prod")
                .setPartitionCount(1)
                .addNodes(node("node-c", "c:7070", false))
                .addNodes(node("node-a", "a:7070", true))
                .addNodes(node("node-x", "", true))
                .build(),
            ANSWERED_BY);
    assertEquals(List.of("a:7070", "c:7070"), table.nodeAddresses());
  }

  @Test
  void anEmptyClusterNameIsNotAClusterEverythingGoesWhereItAnswered() {
    RoutingTable table =
        RoutingTable.fromClusterInfo(
            ClusterInfo.newBuilder()
                .setPartitionCount(1)
                .addNodes(node("node-1", "0.0.0.0:7070", true))
                .addPartitions(partition(0, "node-1", "0.0.0.0:7070"))
                .build(),
            ANSWERED_BY);
    assertFalse(table.isCluster());
    assertEquals(ANSWERED_BY, table.addressOfQueue("emails"));
    assertEquals(ANSWERED_BY, table.addressOfJob("01HZX3K8QZ001ABCDEFGHJKMNP"));
    assertEquals(List.of(ANSWERED_BY), table.nodeAddresses());
  }

  @Test
  void noAnswerYetKnowsNoAddress() {
    assertTrue(RoutingTable.NONE.isEmpty());
    assertEquals("", RoutingTable.NONE.anyAddress());
    assertEquals(List.of(), RoutingTable.NONE.nodeAddresses());
  }
}
