// The C++ client and worker in front of several broker nodes: each call goes straight to the
// leader of its partition, found with one GetCluster, and a call that fails because the leader
// moved or died asks again and reaches the new one. The nodes are fakes in this process
// (tests/testing/fake_cluster.h) that record what they receive; the real cluster's own test is
// tests/cluster/node/client_cluster_test.cc.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "jobbroker/partition.h"
#include "jobbroker/worker.h"
#include "tests/testing/fake_cluster.h"

namespace jobbroker::client {
namespace {

using ::jobbroker::testing::FakeCluster;
using ::testing::ElementsAre;

constexpr uint32_t kPartitions = 6;

// The nodes of `cluster` that received `call`, by index.
std::vector<int> NodesThatGot(FakeCluster& cluster, const std::string& call) {
  std::vector<int> nodes;
  for (int n = 0; n < cluster.size(); ++n) {
    for (const std::string& c : cluster.node(n).Calls()) {
      if (c == call) {
        nodes.push_back(n);
        break;
      }
    }
  }
  return nodes;
}

int GetClusterCalls(FakeCluster& cluster) {
  int calls = 0;
  for (int n = 0; n < cluster.size(); ++n) calls += cluster.node(n).Count("GetCluster");
  return calls;
}

// A queue name whose partition among kPartitions is `partition`.
std::string QueueOf(uint32_t partition) {
  for (int i = 0;; ++i) {
    std::string queue = absl::StrCat("queue-", i);
    if (PartitionOfQueue(queue, kPartitions) == partition) return queue;
  }
}

// A loopback port that refuses connections: a node that is down.
class ClosedPort {
 public:
  ClosedPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  }
  ~ClosedPort() { close(fd_); }
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

TEST(ClientRoutingTest, EveryCallGoesToTheLeaderOfItsPartitionAfterOneGetCluster) {
  FakeCluster cluster(3, kPartitions);
  Client client(ClientOptions{.addresses = cluster.addresses()});
  absl::BitGen gen;
  for (uint32_t p = 0; p < kPartitions; ++p) {
    const std::string queue = QueueOf(p);
    const std::vector<int> leader = {cluster.LeaderOf(p)};
    ASSERT_TRUE(client.Enqueue(queue, "x").ok());
    EXPECT_EQ(NodesThatGot(cluster, "Enqueue " + queue), leader) << queue;
    ASSERT_TRUE(client.GetQueue(queue).ok());
    EXPECT_EQ(NodesThatGot(cluster, "GetQueue " + queue), leader);
    v1::ListJobsRequest list;
    list.set_queue(queue);
    ASSERT_TRUE(client.ListJobs(list).ok());
    EXPECT_EQ(NodesThatGot(cluster, "ListJobs " + queue), leader);
    v1::UpdateQueuePolicyRequest update;
    update.set_queue(queue);
    ASSERT_TRUE(client.UpdateQueuePolicy(update).ok());
    EXPECT_EQ(NodesThatGot(cluster, "UpdateQueuePolicy " + queue), leader);
    ASSERT_TRUE(client.PauseQueue(queue).ok());
    EXPECT_EQ(NodesThatGot(cluster, "PauseQueue " + queue), leader);
    ASSERT_TRUE(client.ResumeQueue(queue).ok());
    EXPECT_EQ(NodesThatGot(cluster, "ResumeQueue " + queue), leader);
    ASSERT_TRUE(client.PurgeQueue(queue).ok());
    EXPECT_EQ(NodesThatGot(cluster, "PurgeQueue " + queue), leader);
    v1::RetryJobRequest redrive;
    redrive.set_queue(queue);
    ASSERT_TRUE(client.RetryJob(redrive).ok());
    EXPECT_EQ(NodesThatGot(cluster, "RetryJob " + queue), leader);

    const std::string id = core::NewJobId(absl::Now(), p, gen);
    ASSERT_TRUE(client.GetJob(id).ok());
    EXPECT_EQ(NodesThatGot(cluster, "GetJob " + id), leader);
    ASSERT_TRUE(client.CancelJob(id).ok());
    EXPECT_EQ(NodesThatGot(cluster, "CancelJob " + id), leader);
    ASSERT_TRUE(client.RetryJob(id).ok());
    EXPECT_EQ(NodesThatGot(cluster, "RetryJob " + id), leader);
    ASSERT_TRUE(client.DeleteJob(id).ok());
    EXPECT_EQ(NodesThatGot(cluster, "DeleteJob " + id), leader);

    v1::EnqueueBatchRequest batch;
    *batch.add_jobs() = MakeEnqueueRequest(queue, "a", {});
    *batch.add_jobs() = MakeEnqueueRequest(queue, "b", {});
    ASSERT_TRUE(client.EnqueueBatch(batch).ok());
    EXPECT_EQ(NodesThatGot(cluster, absl::StrCat("EnqueueBatch ", queue, ",", queue)), leader);
  }
  ASSERT_TRUE(client.ListQueues().ok());
  EXPECT_EQ(NodesThatGot(cluster, "ListQueues").size(), 1u);
  EXPECT_EQ(GetClusterCalls(cluster), 1) << "the layout is asked for once, not per call";
}

TEST(ClientRoutingTest, ABrokerOutsideAClusterGetsEveryCallAtTheAddressGiven) {
  // Its GetCluster names itself at 0.0.0.0:1, where nothing listens.
  FakeCluster single(1, 4, /*cluster_name=*/"");
  Client client(ClientOptions{.address = single.node(0).address()});
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(client.Enqueue(absl::StrCat("q", i), "x").ok());
  }
  EXPECT_EQ(single.node(0).Count("Enqueue"), 10);
  EXPECT_EQ(single.node(0).Count("GetCluster"), 1);
}

TEST(ClientRoutingTest, ABrokerWithoutGetClusterGetsEveryCallAndIsAskedOnce) {
  FakeCluster older(1, 4);
  older.node(0).SetGetClusterUnimplemented(true);
  Client client(ClientOptions{.address = older.node(0).address()});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(client.GetQueue(absl::StrCat("q", i)).ok());
  EXPECT_EQ(older.node(0).Count("GetQueue"), 10);
  EXPECT_EQ(older.node(0).Count("GetCluster"), 1);
}

TEST(ClientRoutingTest, AddressesComeFromACommaSeparatedListToo) {
  FakeCluster cluster(3, kPartitions);
  const std::vector<std::string> a = cluster.addresses();
  ClosedPort down;
  // The first address is down: the layout comes from the next one that answers.
  Client client(
      ClientOptions{.address = absl::StrCat(down.address(), ", ", a[1]), .addresses = {a[2]}});
  const std::string queue = QueueOf(0);
  ASSERT_TRUE(client.Enqueue(queue, "x").ok());
  EXPECT_EQ(NodesThatGot(cluster, "Enqueue " + queue), std::vector{cluster.LeaderOf(0)});
  EXPECT_EQ(cluster.node(1).Count("GetCluster"), 1);
}

TEST(ClientRoutingTest, ARetriedCallFindsTheLeaderThatTookOver) {
  FakeCluster cluster(3, kPartitions);
  int retries = 0;
  Client client(
      ClientOptions{.addresses = cluster.addresses(),
                    .on_retry = [&](int, const absl::Status&, absl::Duration) { ++retries; }});
  const uint32_t p = 1;
  const std::string queue = QueueOf(p);
  const int old_leader = cluster.LeaderOf(p);
  const int new_leader = (old_leader + 1) % 3;
  ASSERT_TRUE(client.Enqueue(queue, "x", {.dedup_key = "k1"}).ok());

  // The old leader is alive but leads nothing now: it refuses with UNAVAILABLE.
  cluster.SetLeader(p, new_leader);
  cluster.node(old_leader).SetRefusing(true);
  cluster.node(old_leader).ClearCalls();
  ASSERT_TRUE(client.Enqueue(queue, "x", {.dedup_key = "k2"}).ok());
  EXPECT_EQ(retries, 1);
  EXPECT_EQ(cluster.node(old_leader).Count("Enqueue"), 1);
  EXPECT_EQ(cluster.node(new_leader).Count("Enqueue"), 1);
  EXPECT_EQ(GetClusterCalls(cluster), 2);

  // Without a dedup key the failed enqueue is not repeated, but the next call goes right.
  cluster.node(new_leader).SetRefusing(true);
  cluster.SetLeader(p, old_leader);
  cluster.node(old_leader).SetRefusing(false);
  absl::StatusOr<Enqueued> plain = client.Enqueue(queue, "x");
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable) << plain.status();
  EXPECT_EQ(retries, 1);
  ASSERT_TRUE(client.GetQueue(queue).ok());
  EXPECT_EQ(NodesThatGot(cluster, "GetQueue " + queue), std::vector{old_leader});
  EXPECT_EQ(GetClusterCalls(cluster), 3);
}

TEST(ClientRoutingTest, AfterTheLeaderDiedTheLayoutComesFromAnotherNode) {
  FakeCluster cluster(3, kPartitions);
  Client client(ClientOptions{.addresses = cluster.addresses()});
  absl::BitGen gen;
  const uint32_t p = 0;  // led by node 0, the first address given
  const std::string id = core::NewJobId(absl::Now(), p, gen);
  ASSERT_TRUE(client.GetJob(id).ok());
  ASSERT_EQ(NodesThatGot(cluster, "GetJob " + id), std::vector{0});

  cluster.node(0).Stop();
  cluster.SetAlive(0, false);
  cluster.SetLeader(p, 2);
  ASSERT_TRUE(client.GetJob(id).ok());
  EXPECT_EQ(NodesThatGot(cluster, "GetJob " + id), (std::vector{0, 2}));
  EXPECT_EQ(cluster.node(1).Count("GetCluster") + cluster.node(2).Count("GetCluster"), 1);
}

TEST(ClientRoutingTest, APartitionWithoutALeaderIsSentToANodeThatAnswered) {
  FakeCluster cluster(3, kPartitions);
  cluster.SetLeader(2, -1);
  Client client(ClientOptions{.addresses = cluster.addresses()});
  const std::string queue = QueueOf(2);
  ASSERT_TRUE(client.GetQueue(queue).ok());
  EXPECT_EQ(NodesThatGot(cluster, "GetQueue " + queue), std::vector{0});
}

TEST(ClientRoutingTest, AGivenChannelTakesEveryCallWithoutRouting) {
  FakeCluster cluster(3, kPartitions);
  Client client(ClientOptions{.channel = grpc::CreateChannel(cluster.node(1).address(),
                                                             grpc::InsecureChannelCredentials())});
  const std::string queue = QueueOf(0);  // led by node 0
  ASSERT_TRUE(client.GetQueue(queue).ok());
  EXPECT_EQ(NodesThatGot(cluster, "GetQueue " + queue), std::vector{1});
  EXPECT_EQ(GetClusterCalls(cluster), 0);
}

TEST(ClientRoutingTest, GetClusterReturnsTheLayout) {
  FakeCluster cluster(3, kPartitions);
  Client client(ClientOptions{.addresses = cluster.addresses()});
  absl::StatusOr<v1::ClusterInfo> info = client.GetCluster();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->cluster_name(), "fake");
  EXPECT_EQ(info->nodes_size(), 3);
  EXPECT_EQ(info->partitions_size(), static_cast<int>(kPartitions));
}

// Waits up to 10 s (a hang fails, a slow machine does not) for `done`.
template <typename Done>
bool Eventually(Done done) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(WorkerRoutingTest, TheStreamGoesToTheLeaderOfTheQueuesAndAcksThere) {
  FakeCluster cluster(3, kPartitions);
  const uint32_t p = 2;
  const int leader = cluster.LeaderOf(p);
  const std::string queue = QueueOf(p);
  absl::BitGen gen;
  const std::string id = core::NewJobId(absl::Now(), p, gen);
  cluster.node(leader).PushJob(queue, id);

  Worker worker(WorkerOptions{.addresses = cluster.addresses()});
  absl::Mutex mu;
  std::vector<std::string> ran;
  worker.Handle(queue, [&](JobContext& job) {
    absl::MutexLock lock(&mu);
    ran.push_back(job.job_id());
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(Eventually([&] { return cluster.node(leader).Count("Ack") == 1; }))
      << "calls at the leader: " << ::testing::PrintToString(cluster.node(leader).Calls());
  EXPECT_EQ(NodesThatGot(cluster, "Work " + queue), std::vector{leader});
  EXPECT_EQ(NodesThatGot(cluster, "Ack " + id), std::vector{leader});
  worker.Stop(absl::Seconds(1));
  absl::MutexLock lock(&mu);
  EXPECT_THAT(ran, ElementsAre(id));
}

TEST(WorkerRoutingTest, QueuesOfSeveralLeadersShareOneStreamToANode) {
  FakeCluster cluster(3, kPartitions);
  const std::string first = QueueOf(1), second = QueueOf(2);  // led by nodes 1 and 2
  Worker worker(WorkerOptions{.addresses = cluster.addresses()});
  worker.Handle(first, [](JobContext&) { return absl::OkStatus(); });
  worker.Handle(second, [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());
  const std::string subscribe =
      absl::StrCat("Work ", std::min(first, second), ",", std::max(first, second));
  EXPECT_EQ(NodesThatGot(cluster, subscribe), std::vector{0});
  worker.Stop(absl::Seconds(1));
}

TEST(WorkerRoutingTest, AfterTheLeaderDiedTheStreamGoesToTheNewOne) {
  FakeCluster cluster(3, kPartitions);
  const uint32_t p = 1;  // led by node 1
  const std::string queue = QueueOf(p);
  Worker worker(WorkerOptions{.addresses = cluster.addresses()});
  worker.Handle(queue, [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());
  EXPECT_EQ(NodesThatGot(cluster, "Work " + queue), std::vector{1});

  cluster.SetLeader(p, 2);
  cluster.SetAlive(1, false);
  cluster.node(1).Stop();
  EXPECT_TRUE(Eventually([&] { return cluster.node(2).Count("Work") == 1; }))
      << "the worker did not reconnect to the new leader";
  EXPECT_EQ(cluster.node(0).Count("Work"), 0);
  worker.Stop(absl::Seconds(1));
}

}  // namespace
}  // namespace jobbroker::client
