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

TEST(EtcdLayoutTest, AValueThatDoesNotParseIsDataLossNamingItsKind) {
  EXPECT_THAT(DecodeSync("{not json"),
              testing::StatusIs(absl::StatusCode::kDataLoss, HasSubstr("sync")));
  EXPECT_THAT(DecodeLeader(R"({"node": 3})"),
              testing::StatusIs(absl::StatusCode::kDataLoss, HasSubstr("leader")));
}

}  // namespace
}  // namespace jobbroker::cluster
