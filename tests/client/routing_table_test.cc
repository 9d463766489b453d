// client/cpp/jobbroker/routing_table.h: which address each call goes to, from one GetCluster
// answer. No server: the answers are built here.
#include "jobbroker/routing_table.h"

#include <string>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/partition.h"

namespace jobbroker::client {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr uint32_t kPartitions = 8;

// Three live nodes a, b, c at a:1, b:2, c:3; partition p led by node p % 3.
v1::ClusterInfo ThreeNodes() {
  v1::ClusterInfo info;
  info.set_cluster_name("test");
  info.set_partition_count(kPartitions);
  info.set_node_id("b");
  const char* const ids[] = {"a", "b", "c"};
  for (int n = 0; n < 3; ++n) {
    v1::NodeInfo* node = info.add_nodes();
    node->set_node_id(ids[n]);
    node->set_address(absl::StrCat(ids[n], ":", n + 1));
    node->set_alive(true);
  }
  for (uint32_t p = 0; p < kPartitions; ++p) {
    v1::PartitionInfo* partition = info.add_partitions();
    partition->set_partition(p);
    partition->set_leader_node_id(ids[p % 3]);
    partition->set_leader_address(absl::StrCat(ids[p % 3], ":", p % 3 + 1));
    partition->set_epoch(100 + p);
  }
  return info;
}

std::string LeaderOf(uint32_t partition) {
  const char* const addresses[] = {"a:1", "b:2", "c:3"};
  return addresses[partition % 3];
}

TEST(RoutingTableTest, QueuesGoToTheLeaderOfTheirPartition) {
  const RoutingTable table = RoutingTable::FromClusterInfo(ThreeNodes(), "seed:9");
  EXPECT_TRUE(table.is_cluster());
  EXPECT_EQ(table.partition_count(), kPartitions);
  for (uint32_t p = 0; p < kPartitions; ++p) EXPECT_EQ(table.AddressOfPartition(p), LeaderOf(p));
  absl::BitGen gen;
  for (int i = 0; i < 1000; ++i) {
    const std::string queue = absl::StrCat("queue-", absl::Uniform<uint64_t>(gen));
    EXPECT_EQ(table.AddressOfQueue(queue), LeaderOf(PartitionOfQueue(queue, kPartitions))) << queue;
  }
}

TEST(RoutingTableTest, JobsGoToTheLeaderOfThePartitionTheirIdCarries) {
  const RoutingTable table = RoutingTable::FromClusterInfo(ThreeNodes(), "seed:9");
  absl::BitGen gen;
  for (uint32_t p = 0; p < kPartitions; ++p) {
    EXPECT_EQ(table.AddressOfJob(core::NewJobId(absl::Now(), p, gen)), LeaderOf(p)) << p;
  }
  // Ids name partitions up to 2^15: beyond the cluster's count they wrap around, as in core.
  EXPECT_EQ(table.AddressOfJob(core::NewJobId(absl::Now(), kPartitions + 1, gen)), LeaderOf(1));
  // Not an id: any node answers (NOT_FOUND, INVALID_ARGUMENT), the one that answered last.
  EXPECT_EQ(table.AddressOfJob("no-such-job"), "seed:9");
  EXPECT_EQ(table.AnyAddress(), "seed:9");
}

TEST(RoutingTableTest, APartitionWithoutALiveLeaderGoesToAnyNode) {
  v1::ClusterInfo info = ThreeNodes();
  info.mutable_partitions(1)->clear_leader_node_id();  // between two leaders
  info.mutable_partitions(1)->clear_leader_address();
  info.mutable_nodes(2)->set_alive(false);  // c lost its lease: partitions 2 and 5 are orphans
  const RoutingTable table = RoutingTable::FromClusterInfo(info, "b:2");
  EXPECT_EQ(table.AddressOfPartition(0), "a:1");
  EXPECT_EQ(table.AddressOfPartition(1), "b:2");
  EXPECT_EQ(table.AddressOfPartition(2), "b:2");
  EXPECT_EQ(table.AddressOfPartition(5), "b:2");
  EXPECT_EQ(table.AddressOfPartition(kPartitions), "b:2");               // out of range
  EXPECT_THAT(table.NodeAddresses(), ElementsAre("a:1", "b:2", "c:3"));  // the dead one last

  info.mutable_nodes(0)->set_alive(false);
  EXPECT_THAT(RoutingTable::FromClusterInfo(info, "b:2").NodeAddresses(),
              ElementsAre("b:2", "a:1", "c:3"));
}

TEST(RoutingTableTest, ALeaderWithoutItsAddressIsFoundAmongTheNodes) {
  v1::ClusterInfo info = ThreeNodes();
  for (v1::PartitionInfo& p : *info.mutable_partitions()) p.clear_leader_address();
  const RoutingTable table = RoutingTable::FromClusterInfo(info, "seed:9");
  for (uint32_t p = 0; p < kPartitions; ++p) EXPECT_EQ(table.AddressOfPartition(p), LeaderOf(p));

  // A leader that is not among the nodes, without an address: any node.
  info.mutable_partitions(4)->set_leader_node_id("d");
  EXPECT_EQ(RoutingTable::FromClusterInfo(info, "seed:9").AddressOfPartition(4), "seed:9");
}

TEST(RoutingTableTest, ABrokerOutsideAClusterGetsEveryCallAtTheAddressItAnsweredOn) {
  // What a single broker answers: no cluster name, itself (at its listen address) leading all.
  v1::ClusterInfo info;
  info.set_partition_count(4);
  v1::NodeInfo* self = info.add_nodes();
  self->set_node_id("solo");
  self->set_address("0.0.0.0:7070");
  self->set_alive(true);
  for (uint32_t p = 0; p < 4; ++p) {
    v1::PartitionInfo* partition = info.add_partitions();
    partition->set_partition(p);
    partition->set_leader_node_id("solo");
    partition->set_leader_address("0.0.0.0:7070");
  }
  absl::BitGen gen;
  for (const RoutingTable& table : {RoutingTable::FromClusterInfo(info, "broker.example:7070"),
                                    RoutingTable::SingleBroker("broker.example:7070")}) {
    EXPECT_FALSE(table.is_cluster());
    EXPECT_FALSE(table.empty());
    EXPECT_EQ(table.AddressOfQueue("emails"), "broker.example:7070");
    EXPECT_EQ(table.AddressOfJob(core::NewJobId(absl::Now(), 3, gen)), "broker.example:7070");
    EXPECT_EQ(table.AddressOfPartition(2), "broker.example:7070");
    EXPECT_THAT(table.NodeAddresses(), ElementsAre("broker.example:7070"));
  }
}

TEST(RoutingTableTest, AnEmptyTableKnowsNoAddress) {
  const RoutingTable table;
  EXPECT_TRUE(table.empty());
  EXPECT_FALSE(table.is_cluster());
  EXPECT_EQ(table.AddressOfQueue("emails"), "");
  EXPECT_THAT(table.NodeAddresses(), IsEmpty());
}

TEST(RoutingTableTest, ASingleNodeTellsItsPartitionCountButRoutesNothing) {
  v1::ClusterInfo info = ThreeNodes();
  info.clear_cluster_name();
  const RoutingTable table = RoutingTable::FromClusterInfo(info, "local:7");
  EXPECT_FALSE(table.is_cluster());
  // The producer's coalescer keys batches by it: a single node refuses a batch over its
  // partitions too.
  EXPECT_EQ(table.broker_partition_count(), kPartitions);
  EXPECT_EQ(table.AddressOfQueue("anything"), "local:7");
  EXPECT_EQ(RoutingTable().broker_partition_count(), 0u);
  EXPECT_EQ(RoutingTable::SingleBroker("old:1").broker_partition_count(), 0u);
  EXPECT_EQ(RoutingTable::FromClusterInfo(ThreeNodes(), "seed:9").broker_partition_count(),
            kPartitions);
}

TEST(RoutingTableTest, AZeroPartitionCountMeansOnePartition) {
  v1::ClusterInfo info = ThreeNodes();
  info.set_partition_count(0);
  const RoutingTable table = RoutingTable::FromClusterInfo(info, "seed:9");
  EXPECT_EQ(table.partition_count(), 1u);
  EXPECT_EQ(table.AddressOfQueue("anything"), "a:1");
}

}  // namespace
}  // namespace jobbroker::client
