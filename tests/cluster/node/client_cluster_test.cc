// The C++ client and worker against a real cluster: a real etcd and three real jobbroker nodes
// on loopback (as three_nodes_test.cc), the client given all three addresses. Every call lands
// (enqueue, get, a worker's ack), and after kill -9 of a partition's leader the client's
// enqueues with dedup keys succeed again at the new leader. How fast is bench/'s to measure
// (bench/cluster-failover.sh); here a hang fails and a slow machine does not.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "jobbroker/partition.h"
#include "jobbroker/worker.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/cluster_node_options.h"
#include "tests/testing/etcd_process.h"

namespace jobbroker::testing {
namespace {

constexpr int kNodes = 3;
constexpr uint32_t kPartitions = 4;
// How long an election or a failover may take before the test gives up on it: far above the
// lease TTL (3 s), and never asserted as a speed.
constexpr absl::Duration kGiveUp = absl::Seconds(60);

class ClientClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = StartTestCluster(kNodes, kPartitions);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    dir_ = std::move(cluster->dir);
    etcd_ = std::move(cluster->etcd);
    nodes_ = std::move(cluster->nodes);
    for (const auto& node : nodes_) addresses_.push_back(node->address());
  }

  // Enqueues with `dedup_key` until it succeeds or `until`; the last result.
  static absl::StatusOr<client::Enqueued> EnqueueUntil(client::Client& client,
                                                       const std::string& queue,
                                                       const std::string& dedup_key,
                                                       absl::Time until) {
    absl::StatusOr<client::Enqueued> result;
    do {
      result = client.Enqueue(queue, dedup_key, {.dedup_key = dedup_key});
      if (result.ok()) break;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < until);
    return result;
  }

  // The surviving nodes' logs, for a failure's message: what each replica did after the kill.
  std::string NodeLogs(int killed) const {
    std::string logs;
    for (int n = 0; n < kNodes; ++n) {
      if (n == killed) continue;
      absl::StrAppend(&logs, "\nnode ", n, "'s log:\n", nodes_[n]->ReadStderr());
    }
    return logs;
  }

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
  std::vector<std::string> addresses_;
};

TEST_F(ClientClusterTest, CallsLandOnEveryPartitionAndSurviveKillingALeader) {
  client::Client client(client::ClientOptions{.addresses = addresses_, .max_attempts = 3});
  // One queue per partition; each enqueue, get and worker ack must land.
  std::vector<std::string> queues(kPartitions);
  for (int i = 0; std::find(queues.begin(), queues.end(), "") != queues.end(); ++i) {
    const std::string queue = absl::StrCat("queue-", i);
    std::string& slot = queues[client::PartitionOfQueue(queue, kPartitions)];
    if (slot.empty()) slot = queue;
  }
  std::vector<std::string> ids;
  for (const std::string& queue : queues) {
    absl::StatusOr<client::Enqueued> enqueued =
        EnqueueUntil(client, queue, "first-" + queue, absl::Now() + kGiveUp);
    ASSERT_TRUE(enqueued.ok()) << queue << ": " << enqueued.status() << "\nnode 0's log:\n"
                               << nodes_[0]->ReadStderr();
    absl::StatusOr<v1::Job> job = client.GetJob(enqueued->job_id);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->queue(), queue);
    ids.push_back(enqueued->job_id);
  }

  client::Worker worker(client::WorkerOptions{.addresses = addresses_});
  for (const std::string& queue : queues) {
    worker.Handle(queue, [](client::JobContext&) { return absl::OkStatus(); });
  }
  ASSERT_TRUE(worker.Start().ok());
  for (const std::string& id : ids) {
    absl::StatusOr<v1::Job> job;
    const absl::Time until = absl::Now() + kGiveUp;
    do {
      job = client.GetJob(id);
      if (job.ok() && job->state() == v1::JOB_STATE_COMPLETED) break;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < until);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::JOB_STATE_COMPLETED) << id << " was not acked";
  }
  worker.Stop(absl::Seconds(5));

  // Kill the leader of queues[0]'s partition, found through the client's own GetCluster.
  absl::StatusOr<v1::ClusterInfo> info = client.GetCluster();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->partition_count(), kPartitions);
  const std::string leader_address = info->partitions(0).leader_address();
  int leader = -1;
  for (int n = 0; n < kNodes; ++n) {
    if (addresses_[n] == leader_address) leader = n;
  }
  ASSERT_GE(leader, 0) << "partition 0's leader " << leader_address << " is none of the nodes";
  nodes_[leader]->Kill9();
  const absl::Time killed = absl::Now();

  absl::StatusOr<client::Enqueued> after =
      EnqueueUntil(client, queues[0], "after-the-kill", killed + kGiveUp);
  ASSERT_TRUE(after.ok()) << "no enqueue within " << kGiveUp << " of the kill: " << after.status()
                          << NodeLogs(leader);
  absl::StatusOr<v1::Job> job = client.GetJob(ids[0]);
  ASSERT_TRUE(job.ok()) << "the acked job is gone: " << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_COMPLETED);
  // The repeat finds the same job: the dedup key made the retries safe.
  absl::StatusOr<client::Enqueued> again =
      client.Enqueue(queues[0], "after-the-kill", {.dedup_key = "after-the-kill"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->job_id, after->job_id);
  EXPECT_TRUE(again->deduplicated);
}

}  // namespace
}  // namespace jobbroker::testing
