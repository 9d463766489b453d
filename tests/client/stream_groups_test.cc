// client/cpp/jobbroker/routing_table.h's GroupQueuesByLeader: which Work streams a worker over a
// cluster holds (docs/worker-contract.md §5, "One stream per leading node"). No server: the
// GetCluster answers are built here.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/partition.h"
#include "jobbroker/routing_table.h"

namespace jobbroker::client {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr uint32_t kPartitions = 4;

// Live nodes a, b, c at a:1, b:2, c:3; partition p led by the node `leaders[p]` names ("" for
// none).
v1::ClusterInfo Cluster(const std::vector<std::string>& leaders) {
  v1::ClusterInfo info;
  info.set_cluster_name("test");
  info.set_partition_count(kPartitions);
  const std::map<std::string, std::string> addresses = {{"a", "a:1"}, {"b", "b:2"}, {"c", "c:3"}};
  for (const auto& [id, address] : addresses) {
    v1::NodeInfo* node = info.add_nodes();
    node->set_node_id(id);
    node->set_address(address);
    node->set_alive(true);
  }
  for (uint32_t p = 0; p < kPartitions; ++p) {
    v1::PartitionInfo* partition = info.add_partitions();
    partition->set_partition(p);
    if (leaders[p].empty()) continue;
    partition->set_leader_node_id(leaders[p]);
    partition->set_leader_address(addresses.at(leaders[p]));
  }
  return info;
}

// `n` queue names in partition `p`, in descending order (so that sorting shows).
std::vector<std::string> QueuesIn(uint32_t p, int n) {
  std::vector<std::string> queues;
  for (int i = 0; static_cast<int>(queues.size()) < n; ++i) {
    const std::string queue = absl::StrCat("q", 1000 - i);
    if (PartitionOfQueue(queue, kPartitions) == p) queues.push_back(queue);
  }
  return queues;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int> Shares(const std::vector<StreamGroup>& groups) {
  std::vector<int> shares;
  for (const StreamGroup& g : groups) shares.push_back(g.max_in_flight);
  return shares;
}

TEST(StreamGroupsTest, OneGroupPerLeaderSortedByAddressThenTheLeaderless) {
  // Partitions 0 and 2 led by c, 1 by a, 3 by none.
  const RoutingTable table = RoutingTable::FromClusterInfo(Cluster({"c", "a", "c", ""}), "b:2");
  const std::vector<std::string> p0 = QueuesIn(0, 2), p1 = QueuesIn(1, 2), p2 = QueuesIn(2, 1),
                                 p3 = QueuesIn(3, 2);
  const std::vector<std::string> queues = Concat(Concat(Concat(p3, p2), p1), p0);
  const std::vector<StreamGroup> groups = GroupQueuesByLeader(table, queues, 10);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].address, "a:1");
  EXPECT_EQ(groups[0].queues, Sorted(p1));
  EXPECT_EQ(groups[1].address, "c:3");
  EXPECT_EQ(groups[1].queues, Sorted(Concat(p0, p2)));
  EXPECT_EQ(groups[2].address, "");  // any node
  EXPECT_EQ(groups[2].queues, Sorted(p3));
  // 10 over 3: 4, 3, 3.
  EXPECT_THAT(Shares(groups), ElementsAre(4, 3, 3));
}

TEST(StreamGroupsTest, SharesBelowAtAndAboveTheGroupCount) {
  const RoutingTable table = RoutingTable::FromClusterInfo(Cluster({"a", "b", "c", ""}), "a:1");
  std::vector<std::string> queues;
  for (uint32_t p = 0; p < kPartitions; ++p) queues = Concat(queues, QueuesIn(p, 1));
  // k = 4 groups.
  EXPECT_THAT(Shares(GroupQueuesByLeader(table, queues, 2)), ElementsAre(1, 1, 1, 1));
  EXPECT_THAT(Shares(GroupQueuesByLeader(table, queues, 1)), ElementsAre(1, 1, 1, 1));
  EXPECT_THAT(Shares(GroupQueuesByLeader(table, queues, 4)), ElementsAre(1, 1, 1, 1));
  EXPECT_THAT(Shares(GroupQueuesByLeader(table, queues, 6)), ElementsAre(2, 2, 1, 1));
  EXPECT_THAT(Shares(GroupQueuesByLeader(table, queues, 9)), ElementsAre(3, 2, 2, 2));
  EXPECT_THAT(Shares(GroupQueuesByLeader(table, queues, 0)), ElementsAre(0, 0, 0, 0));
}

TEST(StreamGroupsTest, OneLeaderIsOneGroup) {
  const RoutingTable table = RoutingTable::FromClusterInfo(Cluster({"b", "b", "b", "b"}), "a:1");
  const std::vector<std::string> queues = Concat(QueuesIn(0, 2), QueuesIn(3, 1));
  const std::vector<StreamGroup> groups = GroupQueuesByLeader(table, queues, 5);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0], (StreamGroup{"b:2", Sorted(queues), 5}));
}

TEST(StreamGroupsTest, WithoutAClusterOneGroupOfEveryQueueToAnyNode) {
  const std::vector<std::string> queues = {"zeta", "alpha", "mid"};
  for (const RoutingTable& table : {RoutingTable(), RoutingTable::SingleBroker("one:7070"),
                                    RoutingTable::FromClusterInfo(v1::ClusterInfo(), "one:7070")}) {
    const std::vector<StreamGroup> groups = GroupQueuesByLeader(table, queues, 3);
    ASSERT_EQ(groups.size(), 1u);
    EXPECT_EQ(groups[0], (StreamGroup{"", {"alpha", "mid", "zeta"}, 3}));
  }
  EXPECT_THAT(GroupQueuesByLeader(RoutingTable(), {}, 3), IsEmpty());
}

TEST(StreamGroupsTest, EveryPartitionLeaderlessIsOneGroupToAnyNode) {
  const RoutingTable table = RoutingTable::FromClusterInfo(Cluster({"", "", "", ""}), "a:1");
  const std::vector<std::string> queues = Concat(QueuesIn(0, 1), QueuesIn(2, 1));
  const std::vector<StreamGroup> groups = GroupQueuesByLeader(table, queues, 4);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0], (StreamGroup{"", Sorted(queues), 4}));
}

// docs/worker-contract.md §5: while the worker has a group for any node it fetches the table
// again after each backoff delay (a relayed stream would never end by itself).
TEST(StreamGroupsTest, AGroupForAnyNodeInAClusterCallsForRefreshingTheTable) {
  const RoutingTable table = RoutingTable::FromClusterInfo(Cluster({"a", "b", "", "c"}), "a:1");
  const std::vector<std::string> led = Concat(QueuesIn(0, 1), QueuesIn(1, 1));
  const std::vector<std::string> leaderless = QueuesIn(2, 1);
  const std::vector<StreamGroup> with_any = GroupQueuesByLeader(table, Concat(led, leaderless), 4);
  ASSERT_EQ(with_any.back().address, "");
  EXPECT_TRUE(RefreshesTableWhileGrouped(table, with_any));
  // Every partition leaderless: one group, to any node.
  const RoutingTable none = RoutingTable::FromClusterInfo(Cluster({"", "", "", ""}), "a:1");
  EXPECT_TRUE(RefreshesTableWhileGrouped(none, GroupQueuesByLeader(none, led, 4)));
  // No table yet (no node answered GetCluster): the one group goes to any node.
  EXPECT_TRUE(
      RefreshesTableWhileGrouped(RoutingTable(), GroupQueuesByLeader(RoutingTable(), led, 4)));
}

TEST(StreamGroupsTest, NoGroupForAnyNodeOrNoClusterCallsForNoRefresh) {
  // Every handled queue has a leader: the table is fetched again only when a stream ends.
  const RoutingTable table = RoutingTable::FromClusterInfo(Cluster({"a", "b", "", "c"}), "a:1");
  const std::vector<std::string> led =
      Concat(Concat(QueuesIn(0, 1), QueuesIn(1, 1)), QueuesIn(3, 2));
  const std::vector<StreamGroup> groups = GroupQueuesByLeader(table, led, 4);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_FALSE(RefreshesTableWhileGrouped(table, groups));
  EXPECT_FALSE(RefreshesTableWhileGrouped(table, {}));
  // A broker outside a cluster, or one that does not answer GetCluster: its answer cannot change.
  for (const RoutingTable& single :
       {RoutingTable::SingleBroker("one:7070"),
        RoutingTable::FromClusterInfo(v1::ClusterInfo(), "one:7070")}) {
    const std::vector<StreamGroup> one = GroupQueuesByLeader(single, led, 4);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_FALSE(RefreshesTableWhileGrouped(single, one));
  }
}

}  // namespace
}  // namespace jobbroker::client
