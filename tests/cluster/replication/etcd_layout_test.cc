#include "cluster/replication/etcd_layout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::cluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(EtcdLayoutTest, APartitionsKeysLiveUnderTheClusterName) {
  PartitionKeys keys = KeysOfPartition("prod", 17);
  EXPECT_EQ(keys.leader, "prod/partitions/17/leader");
  EXPECT_EQ(keys.sync, "prod/partitions/17/sync");
  EXPECT_EQ(keys.replicas, "prod/partitions/17/replicas");
}

TEST(EtcdLayoutTest, ValuesAreJsonAnOperatorCanRead) {
  EXPECT_EQ(EncodeLeader({"node-a", 42}), R"({"node":"node-a","start_seq":"42"})");
  EXPECT_EQ(EncodeSync({{"a", "b"}, 7}), R"({"members":["a","b"],"epoch":"7"})");
  EXPECT_EQ(EncodeReplicas({"a", "b", "c"}), R"({"nodes":["a","b","c"]})");
}

TEST(EtcdLayoutTest, ValuesReadBackAsWritten) {
  auto leader = DecodeLeader(EncodeLeader({"node-a", 42}));
  ASSERT_TRUE(leader.ok()) << leader.status();
  EXPECT_EQ(leader->node, "node-a");
  EXPECT_EQ(leader->start_seq, 42u);
  auto sync = DecodeSync(EncodeSync({{"a", "b"}, 7}));
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_THAT(sync->members, ElementsAre("a", "b"));
  EXPECT_EQ(sync->epoch, 7);
  auto replicas = DecodeReplicas(EncodeReplicas({"a", "c"}));
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_THAT(*replicas, ElementsAre("a", "c"));
}

TEST(EtcdLayoutTest, TheConfigAndEachNodeLiveUnderTheClusterName) {
  EXPECT_EQ(ConfigKey("prod"), "prod/config");
  EXPECT_EQ(NodeKey("prod", "node-a"), "prod/nodes/node-a");
  EXPECT_EQ(NodesPrefix("prod"), "prod/nodes/");
  EXPECT_EQ(PartitionsPrefix("prod"), "prod/partitions/");
  EXPECT_EQ(EncodeConfig({8, 3, 2}), R"({"partitions":8,"replication_factor":3,"min_in_sync":2})");
  EXPECT_EQ(EncodeNode({"10.0.0.7:7000"}), R"({"grpc":"10.0.0.7:7000","leaving":false})");
  auto config = DecodeConfig(EncodeConfig({8, 3, 2}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, (ClusterConfig{8, 3, 2}));
  auto node = DecodeNode(EncodeNode({"10.0.0.7:7000"}));
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->grpc, "10.0.0.7:7000");
  EXPECT_FALSE(node->leaving);
  // A node handing over says so; a value written before the field existed reads as staying.
  node = DecodeNode(EncodeNode({"10.0.0.7:7000", /*leaving=*/true}));
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_TRUE(node->leaving);
  node = DecodeNode(R"({"grpc":"10.0.0.7:7000"})");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_FALSE(node->leaving);
  EXPECT_THAT(DecodeConfig("[]"),
              testing::StatusIs(absl::StatusCode::kDataLoss, HasSubstr("config")));
}

TEST(EtcdLayoutTest, AValueThatDoesNotParseIsDataLossNamingItsKind) {
  EXPECT_THAT(DecodeSync("{not json"),
              testing::StatusIs(absl::StatusCode::kDataLoss, HasSubstr("sync")));
  EXPECT_THAT(DecodeLeader(R"({"node": 3})"),
              testing::StatusIs(absl::StatusCode::kDataLoss, HasSubstr("leader")));
}

}  // namespace
}  // namespace jobbroker::cluster
