// Where a new cluster puts its partitions, between real processes: a real etcd and three real
// nodes at RF 1. With --cluster-initial-nodes 3 the partitions wait for the third node and are
// then spread over all three (one each), instead of all landing on the first node up, which
// would leave the other two with nothing to do.
#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/cluster_node_options.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/queue_names.h"

namespace jobbroker::testing {
namespace {

constexpr uint32_t kPartitions = 3;
// A hang fails, a slow machine does not: never asserted as a duration.
constexpr absl::Duration kGiveUp = absl::Seconds(60);

BrokerProcessOptions RfOneNode(const EtcdProcess& etcd, int n) {
  BrokerProcessOptions options = ClusterNodeOptions(etcd, n, kPartitions);
  options.extra_args.insert(options.extra_args.end(), {"--replication-factor", "1", "--min-in-sync",
                                                       "1", "--cluster-initial-nodes", "3"});
  return options;
}

grpc::Status Enqueue(const BrokerProcess& node, const std::string& queue, std::string* id) {
  auto stub = node.NewBrokerStub();
  grpc::ClientContext context;
  WithDeadline(context);
  v1::EnqueueRequest request;
  request.set_queue(queue);
  request.set_payload("p");
  v1::EnqueueResponse response;
  grpc::Status status = stub->Enqueue(&context, request, &response);
  *id = response.job_id();
  return status;
}

// A queue name whose partition is `partition`.
std::string QueueOfPartition(uint32_t partition) {
  return QueueInPartition(partition, kPartitions);
}

TEST(PlacementTest, ANewClusterWaitsForItsInitialNodesAndSpreadsThePartitionsOverThem) {
  auto dir = TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto etcd = EtcdProcess::Start((*dir)->path() + "/etcd");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::vector<std::unique_ptr<BrokerProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    auto node = BrokerProcess::Start(RfOneNode(**etcd, n));
    ASSERT_TRUE(node.ok()) << node.status();
    nodes.push_back(*std::move(node));
  }

  // Two of three nodes up: both registered (as node-0 sees it), nothing placed, and a write is
  // refused naming its partition and why; it changed nothing.
  absl::StatusOr<v1::ClusterInfo> info;
  const absl::Time registered_by = absl::Now() + kGiveUp;
  do {
    info = GetClusterOf(*nodes[0]);
    if (info.ok() && info->nodes_size() == 2) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < registered_by);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->nodes_size(), 2) << info->DebugString();
  for (const v1::PartitionInfo& partition : info->partitions()) {
    EXPECT_THAT(partition.replicas(), ::testing::IsEmpty()) << partition.DebugString();
    EXPECT_EQ(partition.leader_node_id(), "") << partition.DebugString();
  }
  std::string id;
  grpc::Status refused = Enqueue(*nodes[1], QueueOfPartition(2), &id);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(),
              ::testing::HasSubstr("partition 2 is not placed on any node yet"));
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("and 2 have"));

  // The third node: each node holds and leads one partition.
  auto third = BrokerProcess::Start(RfOneNode(**etcd, 2));
  ASSERT_TRUE(third.ok()) << third.status();
  nodes.push_back(*std::move(third));
  auto all_led = [&] {
    info = GetClusterOf(*nodes[2]);
    if (!info.ok() || info->partitions_size() != static_cast<int>(kPartitions)) return false;
    for (const v1::PartitionInfo& partition : info->partitions()) {
      if (partition.leader_node_id().empty()) return false;
    }
    return true;
  };
  const absl::Time led_by = absl::Now() + kGiveUp;
  while (!all_led() && absl::Now() < led_by) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(all_led()) << (info.ok() ? info->DebugString() : info.status().ToString());
  std::map<std::string, int> held;
  for (const v1::PartitionInfo& partition : info->partitions()) {
    ASSERT_EQ(partition.replicas_size(), 1) << partition.DebugString();
    EXPECT_EQ(partition.leader_node_id(), partition.replicas(0));
    ++held[partition.replicas(0)];
  }
  EXPECT_THAT(held, ::testing::UnorderedElementsAre(::testing::Pair("node-0", 1),
                                                    ::testing::Pair("node-1", 1),
                                                    ::testing::Pair("node-2", 1)));

  // Every partition takes writes now, through any node.
  for (uint32_t p = 0; p < kPartitions; ++p) {
    grpc::Status status;
    const absl::Time until = absl::Now() + kGiveUp;
    do {
      status = Enqueue(*nodes[0], QueueOfPartition(p), &id);
      if (status.ok()) break;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < until);
    ASSERT_TRUE(status.ok()) << "partition " << p << ": " << status.error_message();
    EXPECT_EQ(core::PartitionOfJobId(id, kPartitions), p);
  }
}

}  // namespace
}  // namespace jobbroker::testing
