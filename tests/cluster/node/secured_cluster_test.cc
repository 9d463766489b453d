// Cluster mode with --auth-tokens, between real processes (a real etcd, three real nodes): the
// nodes replicate to each other with a token of the peer role, and nothing else may replicate:
// a client's token (whatever its roles) and no token are refused by the replication service,
// and the peer token opens no client call. And a second process with a node id already in use
// refuses to start instead of sharing the first one's partitions. With two partitions, a job
// waiting for a job of the other partition is released: the node's dependency relay watches it
// with the peer token, which WatchJob (and no other client call) accepts.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/transport/replication.grpc.pb.h"
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

constexpr int kNodes = 3;
constexpr uint32_t kPartitions = 1;
// An election may take this long before the test gives up: a hang fails, a slow machine not.
constexpr absl::Duration kGiveUp = absl::Seconds(60);

constexpr char kTokens[] = R"({"tokens": [
  {"name": "app", "token": "app-secret", "roles": ["producer", "worker", "admin"], "queues": ["*"]},
  {"name": "nodes", "token": "peer-secret", "roles": ["peer"]}]})";

class SecuredClusterTest : public ::testing::Test {
 protected:
  virtual uint32_t partitions() const { return kPartitions; }

  void SetUp() override {
    // The token files live beside the cluster's own directory (the test reads them again).
    auto files = TempDir::Create();
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *std::move(files);
    auto tokens = files_->WriteFile("tokens.json", kTokens);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    auto peer = files_->WriteFile("peer.token", "peer-secret\n");
    ASSERT_TRUE(peer.ok()) << peer.status();
    auto cluster = StartTestCluster(kNodes, partitions(),
                                    {"--auth-tokens", *tokens, "--cluster-peer-token-file", *peer});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    dir_ = std::move(cluster->dir);
    etcd_ = std::move(cluster->etcd);
    nodes_ = std::move(cluster->nodes);
  }

  grpc::Status EnqueueAt(int n, const std::string& token) {
    v1::EnqueueRequest request;
    request.set_queue("secured");
    request.set_payload("x");
    v1::EnqueueResponse response;
    return EnqueueAt(n, token, request, &response);
  }
  grpc::Status EnqueueAt(int n, const std::string& token, const v1::EnqueueRequest& request,
                         v1::EnqueueResponse* response) {
    auto stub = nodes_[n]->NewBrokerStub();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    context.AddMetadata("authorization", "Bearer " + token);
    return stub->Enqueue(&context, request, response);
  }

  // How the replication service answers a stream opened with `token` ("" for none).
  grpc::Status ReplicateTo(int n, const std::string& token) {
    auto stub = cluster::v1::Replication::NewStub(nodes_[n]->NewChannel());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    cluster::v1::StreamSummary summary;
    auto stream = stub->Stream(&context, &summary);
    stream->WritesDone();
    return stream->Finish();
  }

  std::unique_ptr<TempDir> files_;
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
};

TEST_F(SecuredClusterTest, NodesReplicateWithThePeerTokenAndNothingElseMayReplicate) {
  // A write is acknowledged only once it is on two replicas: the peers took each other's
  // streams.
  grpc::Status enqueued;
  const absl::Time until = absl::Now() + kGiveUp;
  do {
    enqueued = EnqueueAt(0, "app-secret");
    if (enqueued.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < until);
  ASSERT_TRUE(enqueued.ok()) << enqueued.error_message() << "\n" << nodes_[0]->ReadStderr();

  grpc::Status client = ReplicateTo(1, "app-secret");
  EXPECT_EQ(client.error_code(), grpc::StatusCode::PERMISSION_DENIED) << client.error_message();
  EXPECT_THAT(client.error_message(), ::testing::HasSubstr("peer"));
  grpc::Status anonymous = ReplicateTo(1, "");
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED) << anonymous.error_message();
  // The peer token is for replication only.
  grpc::Status peer_enqueue = EnqueueAt(0, "peer-secret");
  EXPECT_EQ(peer_enqueue.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << peer_enqueue.error_message();
}

TEST_F(SecuredClusterTest, ASecondProcessWithANodeIdInUseRefusesToStart) {
  BrokerProcessOptions options = ClusterNodeOptions(*etcd_, 1, kPartitions);
  // Its own data dir: it shares only the id (no lease file of node-1's to revoke).
  options.extra_args.insert(options.extra_args.end(),
                            {"--auth-tokens", files_->path() + "/tokens.json",
                             "--cluster-peer-token-file", files_->path() + "/peer.token"});
  auto twin = BrokerProcess::Start(options);
  ASSERT_FALSE(twin.ok()) << "a second node-1 started";
  EXPECT_THAT(std::string(twin.status().message()),
              ::testing::HasSubstr("node id node-1 is registered by another live node at " +
                                   nodes_[1]->address()));
  // The first node-1 still serves.
  grpc::Status still;
  const absl::Time until = absl::Now() + kGiveUp;
  do {
    still = EnqueueAt(1, "app-secret");
    if (still.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < until);
  EXPECT_TRUE(still.ok()) << still.error_message();
}

class SecuredTwoPartitionsTest : public SecuredClusterTest {
 protected:
  uint32_t partitions() const override { return 2; }

  static std::string QueueIn(uint32_t partition) { return QueueInPartition(partition, 2); }
  // Runs `call` (with a fresh context carrying the app token) at node 0 until it is OK or
  // kGiveUp passes: leadership may still be settling (UNAVAILABLE) when the test starts.
  template <typename Call>
  grpc::Status Until(Call call) {
    grpc::Status status;
    const absl::Time until = absl::Now() + kGiveUp;
    do {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      context.AddMetadata("authorization", "Bearer app-secret");
      status = call(context);
      if (status.ok()) break;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < until);
    return status;
  }
};

TEST_F(SecuredTwoPartitionsTest, AJobOfTheOtherPartitionReleasesItsDependentThroughThePeerToken) {
  auto broker = nodes_[0]->NewBrokerStub();
  auto admin = nodes_[0]->NewAdminStub();
  v1::EnqueueRequest first;
  first.set_queue(QueueIn(0));
  first.set_payload("d");
  v1::EnqueueResponse dep;
  ASSERT_TRUE(Until([&](grpc::ClientContext& c) { return broker->Enqueue(&c, first, &dep); }).ok());
  v1::EnqueueRequest then;
  then.set_queue(QueueIn(1));
  then.set_payload("after");
  then.add_depends_on(dep.job_id());
  v1::EnqueueResponse after;
  ASSERT_TRUE(
      Until([&](grpc::ClientContext& c) { return broker->Enqueue(&c, then, &after); }).ok());

  v1::LeaseRequest lease;
  lease.set_queue(first.queue());
  lease.set_worker_id("w");
  v1::LeaseResponse leased;
  ASSERT_TRUE(Until([&](grpc::ClientContext& c) {
                grpc::Status s = broker->Lease(&c, lease, &leased);
                return s.ok() && leased.jobs_size() == 0
                           ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "nothing leased yet")
                           : s;
              }).ok());
  ASSERT_EQ(leased.jobs(0).job_id(), dep.job_id());
  v1::AckRequest ack;
  ack.set_job_id(dep.job_id());
  ack.set_lease_id(leased.jobs(0).lease_id());
  ack.set_result("from partition 0");
  v1::AckResponse acked;
  ASSERT_TRUE(Until([&](grpc::ClientContext& c) { return broker->Ack(&c, ack, &acked); }).ok());

  v1::GetJobRequest get;
  get.set_job_id(after.job_id());
  v1::Job job;
  grpc::Status released = Until([&](grpc::ClientContext& c) {
    grpc::Status s = admin->GetJob(&c, get, &job);
    return s.ok() && job.state() != v1::JOB_STATE_READY
               ? grpc::Status(grpc::StatusCode::UNAVAILABLE, v1::JobState_Name(job.state()))
               : s;
  });
  ASSERT_TRUE(released.ok()) << "still " << released.error_message() << "\n"
                             << nodes_[0]->ReadStderr();
  EXPECT_EQ(job.dependency_results().at(dep.job_id()), "from partition 0");

  // The peer token reads a job's state with WatchJob, and still opens no other client call.
  grpc::ClientContext watch_context;
  watch_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  watch_context.AddMetadata("authorization", "Bearer peer-secret");
  v1::WatchJobRequest watch;
  watch.set_job_id(dep.job_id());
  auto reader = admin->WatchJob(&watch_context, watch);
  v1::Job seen;
  ASSERT_TRUE(reader->Read(&seen)) << reader->Finish().error_message();
  EXPECT_EQ(seen.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_TRUE(reader->Finish().ok());
  grpc::ClientContext get_context;
  get_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  get_context.AddMetadata("authorization", "Bearer peer-secret");
  EXPECT_EQ(admin->GetJob(&get_context, get, &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace jobbroker::testing
