// Cluster mode with --auth-tokens, between real processes (a real etcd, three real nodes): the
// nodes replicate to each other with a token of the peer role, and nothing else may replicate:
// a client's token (whatever its roles) and no token are refused by the replication service,
// and the peer token opens no client call. And a second process with a node id already in use
// refuses to start instead of sharing the first one's partitions.
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
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/cluster_node_options.h"
#include "tests/testing/etcd_process.h"

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
  void SetUp() override {
    // The token files live beside the cluster's own directory (the test reads them again).
    auto files = TempDir::Create();
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *std::move(files);
    auto tokens = files_->WriteFile("tokens.json", kTokens);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    auto peer = files_->WriteFile("peer.token", "peer-secret\n");
    ASSERT_TRUE(peer.ok()) << peer.status();
    auto cluster = StartTestCluster(kNodes, kPartitions,
                                    {"--auth-tokens", *tokens, "--cluster-peer-token-file", *peer});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    dir_ = std::move(cluster->dir);
    etcd_ = std::move(cluster->etcd);
    nodes_ = std::move(cluster->nodes);
  }

  grpc::Status EnqueueAt(int n, const std::string& token) {
    auto stub = nodes_[n]->NewBrokerStub();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    context.AddMetadata("authorization", "Bearer " + token);
    v1::EnqueueRequest request;
    request.set_queue("secured");
    request.set_payload("x");
    v1::EnqueueResponse response;
    return stub->Enqueue(&context, request, &response);
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

}  // namespace
}  // namespace jobbroker::testing
