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
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
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

TEST(WorkerRoutingTest, QueuesOfSeveralLeadersGetOneStreamOnEachLeader) {
  FakeCluster cluster(3, kPartitions);
  const std::string first = QueueOf(1), second = QueueOf(2);  // led by nodes 1 and 2
  Worker worker(WorkerOptions{.addresses = cluster.addresses()});
  worker.Handle(first, [](JobContext&) { return absl::OkStatus(); });
  worker.Handle(second, [](JobContext&) { return absl::OkStatus(); });
  cluster.node(1).PushJob(first, "job-1");
  cluster.node(2).PushJob(second, "job-2");
  ASSERT_TRUE(worker.Start().ok());
  EXPECT_TRUE(Eventually([&] {
    return NodesThatGot(cluster, "Work " + first) == std::vector{1} &&
           NodesThatGot(cluster, "Work " + second) == std::vector{2};
  })) << "no stream on each leader";
  EXPECT_EQ(cluster.node(0).Count("Work"), 0) << "a node that leads neither got a stream";
  // Each job's ack goes on the stream that pushed it.
  EXPECT_TRUE(Eventually([&] {
    return NodesThatGot(cluster, "Ack job-1") == std::vector{1} &&
           NodesThatGot(cluster, "Ack job-2") == std::vector{2};
  }));
  worker.Stop(absl::Seconds(1));
}

TEST(WorkerRoutingTest, AfterOneOfTwoLeadersDiedTheWorkerRegroups) {
  FakeCluster cluster(3, kPartitions);
  const std::string first = QueueOf(1), second = QueueOf(2);  // led by nodes 1 and 2
  Worker worker(WorkerOptions{.addresses = cluster.addresses()});
  worker.Handle(first, [](JobContext&) { return absl::OkStatus(); });
  worker.Handle(second, [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());
  EXPECT_TRUE(Eventually([&] { return cluster.node(2).Count("Work") == 1; }));

  cluster.SetLeader(1, 2);
  cluster.SetAlive(1, false);
  cluster.node(1).Stop();
  // Node 2 now leads both queues: one stream there, subscribed to both.
  const std::string both =
      absl::StrCat("Work ", std::min(first, second), ",", std::max(first, second));
  EXPECT_TRUE(Eventually([&] { return NodesThatGot(cluster, both) == std::vector{2}; }))
      << "the worker did not regroup on the new leader";
  EXPECT_EQ(cluster.node(0).Count("Work"), 0);
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

// docs/worker-contract.md §6: a stream that ends during a graceful stop is reopened as usual
// (§5, regrouped), so that the answers still to come reach the broker; a stream opened then
// subscribes to nothing. Both leaders die while the stop waits for a running handler; their
// partitions move to node 0, where the worker opens one stream, on which the handler's ack goes.
TEST(WorkerRoutingTest, StreamsThatEndDuringAStopAreRegroupedForTheAnswersStillToCome) {
  FakeCluster cluster(3, kPartitions);
  const std::string first = QueueOf(1), second = QueueOf(2);  // led by nodes 1 and 2
  Worker worker(WorkerOptions{.addresses = cluster.addresses(),
                              .concurrency = 1,
                              .prefetch = 1,
                              .reconnect_max = absl::Seconds(1)});
  absl::Notification started, finish;
  auto handler = [&](JobContext& job) {
    if (job.job_id() != "running") return absl::OkStatus();
    started.Notify();
    while (!finish.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
      if (job.cancelled()) return absl::CancelledError("stopping");
    }
    return absl::OkStatus();
  };
  worker.Handle(first, handler);
  worker.Handle(second, handler);
  cluster.node(1).PushJob(first, "running");
  cluster.node(1).PushJob(first, "held");  // waits beside it (prefetch)
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(Eventually([&] { return cluster.node(2).Count("Work") == 1; }));

  constexpr absl::Duration kGrace = absl::Seconds(30);
  absl::Duration stop_took;
  absl::Notification stopped;
  std::thread stopper([&] {
    const absl::Time start = absl::Now();
    worker.Stop(kGrace);
    stop_took = absl::Now() - start;
    stopped.Notify();
  });
  // The stop has begun: the job not started went back.
  EXPECT_TRUE(Eventually([&] { return cluster.node(1).Count("Release held") == 1; }));

  cluster.SetLeader(1, 0);
  cluster.SetLeader(2, 0);
  for (int n : {1, 2}) {
    cluster.SetAlive(n, false);
    cluster.node(n).Stop();
  }
  EXPECT_FALSE(stopped.HasBeenNotified()) << "the stop did not wait for the running handler";
  finish.Notify();
  EXPECT_TRUE(Eventually([&] { return cluster.node(0).Count("Ack running") == 1; }))
      << "the ack did not go out on a stream reopened on the new leader; node 0 got "
      << ::testing::PrintToString(cluster.node(0).Calls());
  EXPECT_EQ(cluster.node(0).Count("Work"), 0) << "a stream opened during the stop subscribed";
  stopper.join();
  EXPECT_LT(stop_took, kGrace) << "the stop did not end once the answers were in";
  EXPECT_EQ(worker.stats().acked, 1);
  EXPECT_EQ(worker.stats().released, 1);
}

// docs/worker-contract.md §5: while the worker has a group for any node it fetches the table
// again after each backoff delay and regroups. The table first shows a partition without a
// leader, so its queue goes to any node, which (as a node that already knows the new leader
// would) takes the stream instead of refusing it; nothing ends that stream. Once the table
// shows the leader, the queue moves to the leader's own stream, and the stream on the other
// leader, whose group did not change, stays.
TEST(WorkerRoutingTest, AQueueSentToAnyNodeMovesToItsLeaderOnceTheTableShowsOne) {
  FakeCluster cluster(3, kPartitions);
  const std::string leaderless = QueueOf(1), led = QueueOf(2);  // partition 2 led by node 2
  cluster.SetLeader(1, -1);
  Worker worker(WorkerOptions{.addresses = cluster.addresses(), .reconnect_max = absl::Seconds(1)});
  worker.Handle(leaderless, [](JobContext&) { return absl::OkStatus(); });
  worker.Handle(led, [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());
  // The first address answered GetCluster: it is the node for any node.
  ASSERT_TRUE(Eventually([&] {
    return NodesThatGot(cluster, "Work " + leaderless) == std::vector{0} &&
           NodesThatGot(cluster, "Work " + led) == std::vector{2};
  })) << "no stream to any node and one on the leader";

  cluster.SetLeader(1, 1);
  cluster.node(1).PushJob(leaderless, "moved");
  EXPECT_TRUE(Eventually([&] { return cluster.node(1).Count("Ack moved") == 1; }))
      << "the queue did not move to its leader's stream; node 1 got "
      << ::testing::PrintToString(cluster.node(1).Calls());
  EXPECT_EQ(cluster.node(1).Count("Work"), 1);
  EXPECT_EQ(cluster.node(2).Count("Work"), 1) << "the stream on the unchanged leader was reopened";
  EXPECT_EQ(cluster.node(0).Count("Work"), 1);
  worker.Stop(absl::Seconds(1));
  EXPECT_EQ(worker.stats().reconnects, 0) << "a stream ended by itself";
}

}  // namespace
}  // namespace jobbroker::client
