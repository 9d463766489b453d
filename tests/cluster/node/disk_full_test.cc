// A cluster node whose disk fills: a real etcd and three real nodes, each with the fault shim of
// the cluster harness preloaded (tests/cluster/jepsen/faults/, inert until its marker file
// exists). What a user relies on: a follower that cannot write stops for good with exit code 74
// and says why, the partition's leader goes on acknowledging without it, and once the disk has
// room the restarted node catches up and is back in the in-sync set.
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/cluster_node_options.h"
#include "tests/testing/etcd_process.h"

#ifndef FAULTS_LIBRARY
#error "FAULTS_LIBRARY must name the fault shim (CMakeLists.txt)"
#endif

namespace jobbroker::testing {
namespace {

constexpr int kNodes = 3;
constexpr uint32_t kPartitions = 1;  // every node holds the one partition
// A hang fails after this; a slow machine does not (nothing here is a speed).
constexpr absl::Duration kGiveUp = absl::Seconds(60);

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
    auto etcd = EtcdProcess::Start(dir_->path() + "/etcd");
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    for (int n = 0; n < kNodes; ++n) {
      BrokerProcessOptions options = ClusterNodeOptions(*etcd_, n, kPartitions);
      options.data_dir = absl::StrCat(dir_->path(), "/node-", n, "/data");
      std::filesystem::create_directories(options.data_dir);
      markers_.push_back(absl::StrCat(dir_->path(), "/node-", n, "/disk-full"));
      // An ASan build wants its runtime first in the library list; the shim is not instrumented
      // and only passes calls on, so the order does not matter to it.
      const char* asan = std::getenv("ASAN_OPTIONS");
      options.environment = {
          absl::StrCat("LD_PRELOAD=", FAULTS_LIBRARY),
          absl::StrCat("JOBBROKER_FAULTS_ROOT=", options.data_dir),
          absl::StrCat("JOBBROKER_FAULTS_FULL=", markers_.back()),
          absl::StrCat("ASAN_OPTIONS=", asan != nullptr ? asan : "", ":verify_asan_link_order=0")};
      auto node = BrokerProcess::Start(options);
      ASSERT_TRUE(node.ok()) << node.status();
      nodes_.push_back(*std::move(node));
    }
  }

  // The node that leads the partition with all three replicas in sync, as node `asked` sees it;
  // -1 while there is none.
  int WholeLeader(int asked) {
    absl::StatusOr<v1::ClusterInfo> info = GetClusterOf(*nodes_[asked]);
    if (!info.ok() || info->partitions_size() != 1) return -1;
    const v1::PartitionInfo& p = info->partitions(0);
    if (p.in_sync_size() != kNodes) return -1;
    for (int n = 0; n < kNodes; ++n) {
      if (p.leader_node_id() == absl::StrCat("node-", n)) return n;
    }
    return -1;
  }

  int AwaitWholeLeader(int asked) {
    const absl::Time give_up = absl::Now() + kGiveUp;
    while (absl::Now() < give_up) {
      if (int leader = WholeLeader(asked); leader >= 0) return leader;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return -1;
  }

  grpc::Status EnqueueAt(int n, const std::string& payload, std::string* id) {
    auto stub = nodes_[n]->NewBrokerStub();
    grpc::ClientContext context;
    WithDeadline(context);
    v1::EnqueueRequest request;
    request.set_queue("reports");
    request.set_payload(payload);
    request.set_dedup_key(payload);  // a retry after an unknown outcome finds the same job
    v1::EnqueueResponse response;
    grpc::Status status = stub->Enqueue(&context, request, &response);
    if (status.ok()) *id = response.job_id();
    return status;
  }

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
  std::vector<std::string> markers_;
};

TEST_F(DiskFullTest, AFollowerWhoseDiskFillsExitsAndRejoinsOnceItHasRoom) {
  const int leader = AwaitWholeLeader(0);
  ASSERT_GE(leader, 0) << "no leader with three replicas in sync within " << kGiveUp;
  const int full = (leader + 1) % kNodes;
  std::ofstream(markers_[full]) << "full\n";

  // Enqueues at the leader go on; the first that reaches the full follower's disk stops it.
  std::vector<std::string> acknowledged;
  absl::StatusOr<int> exit_code = absl::DeadlineExceededError("not yet");
  const absl::Time give_up = absl::Now() + kGiveUp;
  for (int i = 0; absl::Now() < give_up; ++i) {
    std::string id;
    if (EnqueueAt(leader, absl::StrCat("report-", i), &id).ok()) acknowledged.push_back(id);
    exit_code = nodes_[full]->AwaitExit(absl::Milliseconds(50));
    if (exit_code.ok()) break;
  }
  ASSERT_TRUE(exit_code.ok()) << "node-" << full << " did not stop within " << kGiveUp
                              << " of its disk filling:\n"
                              << nodes_[full]->ReadStderr();
  EXPECT_EQ(*exit_code, 74);
  const std::string log = nodes_[full]->ReadStderr();
  EXPECT_THAT(log, ::testing::HasSubstr("\"event\":\"replica_failed\""));
  EXPECT_THAT(log, ::testing::HasSubstr("No space left on device"));

  // The leader drops it from the in-sync set (three replicas, min_in_sync two) and goes on.
  const absl::Time until = absl::Now() + kGiveUp;
  bool acknowledged_after = false;
  for (int i = 0; !acknowledged_after && absl::Now() < until; ++i) {
    std::string id;
    acknowledged_after = EnqueueAt(leader, absl::StrCat("after-", i), &id).ok();
    if (acknowledged_after) acknowledged.push_back(id);
  }
  ASSERT_TRUE(acknowledged_after) << "the leader acknowledged nothing after node-" << full
                                  << " stopped";

  // Room again: it restarts, catches up, and is a member of the in-sync set once more.
  std::filesystem::remove(markers_[full]);
  ASSERT_TRUE(nodes_[full]->Restart().ok()) << nodes_[full]->ReadStderr();
  ASSERT_GE(AwaitWholeLeader(full), 0)
      << "node-" << full << " did not rejoin the in-sync set within " << kGiveUp << ":\n"
      << nodes_[full]->ReadStderr();
  for (const std::string& id : acknowledged) {
    absl::StatusOr<v1::Job> job = GetJobOf(*nodes_[full], id);
    EXPECT_TRUE(job.ok()) << id << " was acknowledged and is gone: " << job.status();
  }
}

}  // namespace
}  // namespace jobbroker::testing
