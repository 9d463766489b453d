// The C++ client and worker against a real cluster: a real etcd and three real jobbroker nodes
// on loopback (as three_nodes_test.cc), the client given all three addresses. Every call lands
// (enqueue, get, a worker's ack), and after kill -9 of a partition's leader the client's
// enqueues with dedup keys succeed again at the new leader. A worker over queues led by two
// nodes holds one Work stream on each (docs/worker-contract.md §5): no node relays it, before
// and after a leader's kill -9 (the nodes' /metrics tell). How fast is bench/'s to measure
// (bench/cluster-failover.sh); here a hang fails and a slow machine does not.
#include <algorithm>
#include <atomic>
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
#include "tests/testing/http_client.h"

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
    auto cluster = StartTestCluster(kNodes, partitions());
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    dir_ = std::move(cluster->dir);
    etcd_ = std::move(cluster->etcd);
    nodes_ = std::move(cluster->nodes);
    for (const auto& node : nodes_) addresses_.push_back(node->address());
  }

  virtual uint32_t partitions() const { return kPartitions; }

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

// Two partitions, which the controller places on two different leaders: a worker over one queue
// of each is over two leading nodes.
class WorkerStreamsClusterTest : public ClientClusterTest {
 protected:
  uint32_t partitions() const override { return 2; }

  // Node `n`'s gauge `name` (-1 if absent; -2 if /metrics did not answer).
  double Gauge(int n, const std::string& name) const {
    absl::StatusOr<HttpResponse> metrics = HttpGetResponse(nodes_[n]->http_address(), "/metrics");
    if (!metrics.ok() || metrics->status != 200) return -2;
    return Sample(metrics->body, name);
  }

  // Every gauge of every live node, for a failure's message.
  std::string Gauges() const {
    std::string out;
    for (int n = 0; n < kNodes; ++n) {
      if (!nodes_[n]->running()) continue;
      absl::StrAppend(&out, "\nnode ", n, ": open ", Gauge(n, "jobbroker_work_streams_open"),
                      ", relaying ", Gauge(n, "jobbroker_work_streams_relaying"));
    }
    return out;
  }

  // Until every job of `ids` completed or the give-up deadline; the first that did not.
  static std::string AwaitCompleted(client::Client& client, const std::vector<std::string>& ids) {
    const absl::Time until = absl::Now() + kGiveUp;
    for (const std::string& id : ids) {
      while (true) {
        absl::StatusOr<v1::Job> job = client.GetJob(id);
        if (job.ok() && job->state() == v1::JOB_STATE_COMPLETED) break;
        if (absl::Now() >= until) return id;
        absl::SleepFor(absl::Milliseconds(100));
      }
    }
    return "";
  }
};

TEST_F(WorkerStreamsClusterTest, OneStreamPerLeadingNodeAndNoRelayAfterAKill) {
  client::Client client(client::ClientOptions{.addresses = addresses_, .max_attempts = 3});
  // Until the two partitions have two different live leaders.
  std::vector<int> leader_of(2, -1);
  const absl::Time until = absl::Now() + kGiveUp;
  while (true) {
    leader_of.assign(2, -1);
    if (absl::StatusOr<v1::ClusterInfo> info = client.GetCluster(); info.ok()) {
      for (const v1::PartitionInfo& p : info->partitions()) {
        for (int n = 0; n < kNodes; ++n) {
          if (p.partition() < 2 && !p.leader_address().empty() &&
              p.leader_address() == addresses_[n])
            leader_of[p.partition()] = n;
        }
      }
    }
    if (leader_of[0] >= 0 && leader_of[1] >= 0 && leader_of[0] != leader_of[1]) break;
    ASSERT_LT(absl::Now(), until) << "the two partitions never had two different leaders";
    absl::SleepFor(absl::Milliseconds(200));
  }
  const int third = 3 - leader_of[0] - leader_of[1];
  // One queue in each partition.
  std::vector<std::string> queues(2);
  for (int i = 0; queues[0].empty() || queues[1].empty(); ++i) {
    const std::string queue = absl::StrCat("streams-", i);
    std::string& slot = queues[client::PartitionOfQueue(queue, 2)];
    if (slot.empty()) slot = queue;
  }

  // The node that leads neither is the worker's first address: the one it asks GetCluster.
  std::vector<std::string> addresses = {addresses_[third]};
  for (int n = 0; n < kNodes; ++n) {
    if (n != third) addresses.push_back(addresses_[n]);
  }
  client::Worker worker(client::WorkerOptions{.addresses = addresses, .concurrency = 4});
  std::atomic<int> done{0};
  for (const std::string& queue : queues) {
    worker.Handle(queue, [&done](client::JobContext&) {
      ++done;
      return absl::OkStatus();
    });
  }
  ASSERT_TRUE(worker.Start().ok());

  auto enqueue_round = [&](const std::string& round) -> std::vector<std::string> {
    std::vector<std::string> ids;
    for (const std::string& queue : queues) {
      for (int i = 0; i < 10; ++i) {
        const std::string key = absl::StrCat(round, "-", queue, "-", i);
        absl::StatusOr<client::Enqueued> enqueued =
            EnqueueUntil(client, queue, key, absl::Now() + kGiveUp);
        EXPECT_TRUE(enqueued.ok()) << key << ": " << enqueued.status();
        if (enqueued.ok()) ids.push_back(enqueued->job_id);
      }
    }
    return ids;
  };
  const std::vector<std::string> first = enqueue_round("first");
  ASSERT_EQ(first.size(), 20u);
  const std::string not_done = AwaitCompleted(client, first);
  ASSERT_EQ(not_done, "") << not_done << " was not completed" << Gauges();

  // The worker's streams are on the two leaders, none relayed. (A give-up deadline: the gauges
  // follow the streams as they open.)
  auto settled = [&] {
    for (int n = 0; n < kNodes; ++n) {
      if (Gauge(n, "jobbroker_work_streams_relaying") != 0) return false;
      const double open = Gauge(n, "jobbroker_work_streams_open");
      if (n == third ? open != 0 : open < 1) return false;
    }
    return true;
  };
  const absl::Time settle_until = absl::Now() + absl::Seconds(30);
  while (!settled() && absl::Now() < settle_until) absl::SleepFor(absl::Milliseconds(200));
  for (int n = 0; n < kNodes; ++n) {
    EXPECT_EQ(Gauge(n, "jobbroker_work_streams_relaying"), 0) << "node " << n << Gauges();
    if (n == third) {
      EXPECT_EQ(Gauge(n, "jobbroker_work_streams_open"), 0) << "node " << n << Gauges();
    } else {
      EXPECT_GE(Gauge(n, "jobbroker_work_streams_open"), 1) << "node " << n << Gauges();
    }
  }

  // Kill a leader: its partition's leadership moves, the worker regroups.
  const int killed = leader_of[0];
  nodes_[killed]->Kill9();
  const std::vector<std::string> second = enqueue_round("second");
  ASSERT_EQ(second.size(), 20u) << NodeLogs(killed);
  const std::string not_done_after = AwaitCompleted(client, second);
  ASSERT_EQ(not_done_after, "") << not_done_after << " was not completed after the kill" << Gauges()
                                << NodeLogs(killed);
  auto no_relay = [&] {
    for (int n = 0; n < kNodes; ++n) {
      if (n != killed && Gauge(n, "jobbroker_work_streams_relaying") != 0) return false;
    }
    return true;
  };
  const absl::Time relay_until = absl::Now() + absl::Seconds(30);
  while (!no_relay() && absl::Now() < relay_until) absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(no_relay()) << "a live node still relays the worker's streams" << Gauges();
  worker.Stop(absl::Seconds(5));
  EXPECT_GE(done.load(), 40);
}

}  // namespace
}  // namespace jobbroker::testing
