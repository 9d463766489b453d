// Cluster mode between processes: a real etcd and three real jobbroker nodes on loopback, each
// with its own RocksDB data dir, partitions replicated over all three (RF 3, min_in_sync 2).
// What a user relies on: a job acknowledged by the partition's leader survives kill -9 of that
// leader and is served by the next one, and a partition with two of its three replicas down
// acknowledges nothing.
#include <grpcpp/grpcpp.h>

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
#include "tests/testing/etcd_process.h"

namespace jobbroker::testing {
namespace {

constexpr int kNodes = 3;
constexpr uint32_t kPartitions = 2;
// How long a step may take before the test gives up on it: a hang fails, a slow machine does not
// (a failover takes about the lease TTL, 3 s; the bound is far above it and never asserted).
constexpr absl::Duration kGiveUp = absl::Seconds(60);

template <typename Context>
void WithDeadline(Context& context) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
}

class ThreeNodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
    auto etcd = EtcdProcess::Start(dir_->path() + "/etcd");
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    for (int n = 0; n < kNodes; ++n) {
      BrokerProcessOptions options;
      options.extra_args = {"--cluster-etcd",
                            etcd_->client_url(),
                            "--cluster-name",
                            "test",
                            "--node-id",
                            absl::StrCat("node-", n),
                            "--partitions",
                            absl::StrCat(kPartitions),
                            "--replication-factor",
                            "3",
                            "--min-in-sync",
                            "2"};
      auto node = BrokerProcess::Start(options);
      ASSERT_TRUE(node.ok()) << node.status();
      nodes_.push_back(*std::move(node));
    }
  }

  // Enqueues to `queue` at node `n`: the job id, or the status.
  grpc::Status EnqueueAt(int n, const std::string& queue, const std::string& payload,
                         std::string* id) {
    auto stub = nodes_[n]->NewBrokerStub();
    grpc::ClientContext context;
    WithDeadline(context);
    v1::EnqueueRequest request;
    request.set_queue(queue);
    request.set_payload(payload);
    v1::EnqueueResponse response;
    grpc::Status status = stub->Enqueue(&context, request, &response);
    if (status.ok()) *id = response.job_id();
    return status;
  }

  // Enqueues at whichever running node leads the queue's partition, trying until one takes it.
  // The node that did, or -1 after kGiveUp.
  int EnqueueAtLeader(const std::string& queue, const std::string& payload, std::string* id) {
    const absl::Time give_up = absl::Now() + kGiveUp;
    while (absl::Now() < give_up) {
      for (int n = 0; n < kNodes; ++n) {
        if (nodes_[n]->running() && EnqueueAt(n, queue, payload, id).ok()) return n;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return -1;
  }

  absl::StatusOr<v1::Job> GetJobAt(int n, const std::string& id) {
    auto stub = nodes_[n]->NewAdminStub();
    grpc::ClientContext context;
    WithDeadline(context);
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job job;
    grpc::Status status = stub->GetJob(&context, request, &job);
    if (!status.ok()) return absl::UnavailableError(status.error_message());
    return job;
  }

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
};

TEST_F(ThreeNodesTest, EveryAcknowledgedJobSurvivesKillingItsPartitionsLeader) {
  const std::string queue = "emails";
  std::vector<std::string> acked;
  std::string id;
  const int leader = EnqueueAtLeader(queue, "first", &id);
  ASSERT_GE(leader, 0) << "no node took a write; node 0's log:\n" << nodes_[0]->ReadStderr();
  acked.push_back(id);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(EnqueueAt(leader, queue, absl::StrCat("job ", i), &id).ok());
    acked.push_back(id);
  }
  EXPECT_EQ(core::PartitionOfJobId(acked[0], kPartitions),
            core::PartitionOfQueue(queue, kPartitions));

  // Another node refuses the partition's writes (until routing forwards them), saying who leads
  // it and that it is not a storage failure. Its view follows etcd within a tick or so.
  const int other = (leader + 1) % kNodes;
  const std::string expected =
      absl::StrCat("is led by node-", leader, " at ", nodes_[leader]->address());
  grpc::Status refused;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  do {
    refused = EnqueueAt(other, queue, "to a follower", &id);
    if (refused.error_message().find(expected) != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < until);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr(expected));
  EXPECT_THAT(refused.error_message(), ::testing::Not(::testing::HasSubstr("storage")));

  nodes_[leader]->Kill9();
  const int next = EnqueueAtLeader(queue, "after the failover", &id);
  ASSERT_GE(next, 0) << "no new leader took a write";
  ASSERT_NE(next, leader);
  acked.push_back(id);
  for (const std::string& job : acked) {
    absl::StatusOr<v1::Job> found = GetJobAt(next, job);
    ASSERT_TRUE(found.ok()) << job << " was acknowledged and is gone: " << found.status();
    EXPECT_EQ(found->queue(), queue);
  }

  // The new leader leases and acks what the old one took.
  auto stub = nodes_[next]->NewBrokerStub();
  grpc::ClientContext lease_context;
  WithDeadline(lease_context);
  v1::LeaseRequest lease;
  lease.set_queue(queue);
  lease.set_worker_id("w");
  lease.set_max_jobs(1);
  v1::LeaseResponse leased;
  ASSERT_TRUE(stub->Lease(&lease_context, lease, &leased).ok());
  ASSERT_EQ(leased.jobs_size(), 1);
  EXPECT_EQ(leased.jobs(0).job_id(), acked[0]) << "oldest first, as before the failover";
  grpc::ClientContext ack_context;
  WithDeadline(ack_context);
  v1::AckRequest ack;
  ack.set_job_id(leased.jobs(0).job_id());
  ack.set_lease_id(leased.jobs(0).lease_id());
  v1::AckResponse acked_response;
  EXPECT_TRUE(stub->Ack(&ack_context, ack, &acked_response).ok());

  // The killed node comes back (on a new port), catches up, and can lead again: kill the
  // second leader too, and the jobs are still all there.
  ASSERT_TRUE(nodes_[leader]->Restart().ok());
  absl::SleepFor(absl::Seconds(2));  // lets it rejoin the in-sync set; not needed for safety
  nodes_[next]->Kill9();
  const int third = EnqueueAtLeader(queue, "after the second failover", &id);
  ASSERT_GE(third, 0) << "no third leader took a write";
  for (const std::string& job : acked) {
    EXPECT_TRUE(GetJobAt(third, job).ok()) << job << " lost at the second failover";
  }
}

TEST_F(ThreeNodesTest, APartitionWithTwoOfItsThreeReplicasDownAcknowledgesNothing) {
  const std::string queue = "reports";
  std::string id;
  const int leader = EnqueueAtLeader(queue, "before", &id);
  ASSERT_GE(leader, 0);
  const std::string before = id;
  const int survivor = (leader + 1) % kNodes;
  for (int n = 0; n < kNodes; ++n) {
    if (n != survivor) nodes_[n]->Kill9();
  }
  // Longer than the lease TTL and the lag timeout together: whatever the survivor does, it has
  // no second replica to make a write durable on.
  const absl::Time until = absl::Now() + absl::Seconds(8);
  int refused = 0;
  while (absl::Now() < until) {
    grpc::Status status = EnqueueAt(survivor, queue, "must not be acknowledged", &id);
    ASSERT_FALSE(status.ok()) << "acknowledged with one replica of three: " << id;
    EXPECT_THAT(status.error_code(), ::testing::AnyOf(grpc::StatusCode::UNAVAILABLE,
                                                      grpc::StatusCode::DEADLINE_EXCEEDED));
    ++refused;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GT(refused, 0);

  // One replica back: the partition takes writes again, with what was acknowledged before.
  ASSERT_TRUE(nodes_[leader]->Restart().ok());
  const int back = EnqueueAtLeader(queue, "after", &id);
  ASSERT_GE(back, 0) << "the partition did not come back with two replicas";
  EXPECT_TRUE(GetJobAt(back, before).ok());
}

}  // namespace
}  // namespace jobbroker::testing
