// Cluster mode between processes: a real etcd and three real jobbroker nodes on loopback, each
// with its own RocksDB data dir, partitions replicated over all three (RF 3, min_in_sync 2).
// What a user relies on: a job acknowledged by the partition's leader survives kill -9 of that
// leader and is served by the next one, and a partition with two of its three replicas down
// acknowledges nothing.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <map>
#include <memory>
#include <set>
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
#include "tests/testing/frozen_link.h"
#include "tests/testing/http_client.h"
#include "tests/testing/queue_names.h"
#include "tests/testing/work_stream_client.h"

namespace jobbroker::testing {
namespace {

constexpr int kNodes = 3;
constexpr uint32_t kPartitions = 2;
// How long a step may take before the test gives up on it: a hang fails, a slow machine does not
// (a failover takes about the lease TTL, 3 s; the bound is far above it and never asserted).
constexpr absl::Duration kGiveUp = absl::Seconds(60);

// SIGSTOP for a node while this lives: it keeps its connections open and answers nothing, as a
// paused VM or a process stuck in the kernel would. SIGCONT when this goes, however the test
// ends, so that the teardown can stop the node.
class Frozen {
 public:
  explicit Frozen(const BrokerProcess& node)
      : pid_(node.pid()), stopped_(kill(pid_, SIGSTOP) == 0) {}
  ~Frozen() {
    if (stopped_) kill(pid_, SIGCONT);
  }
  Frozen(const Frozen&) = delete;
  Frozen& operator=(const Frozen&) = delete;
  bool ok() const { return stopped_; }

 private:
  const pid_t pid_;
  const bool stopped_;
};

class ThreeNodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = StartTestCluster(kNodes, kPartitions);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    dir_ = std::move(cluster->dir);
    etcd_ = std::move(cluster->etcd);
    nodes_ = std::move(cluster->nodes);
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

  absl::StatusOr<v1::ClusterInfo> GetClusterAt(int n) { return GetClusterOf(*nodes_[n]); }

  // The running node that leads the queue's partition as node `asked` sees it, or -1.
  int LeaderOf(const std::string& queue, int asked) {
    absl::StatusOr<v1::ClusterInfo> info = GetClusterAt(asked);
    if (!info.ok()) return -1;
    const uint32_t p = core::PartitionOfQueue(queue, kPartitions);
    if (p >= static_cast<uint32_t>(info->partitions_size())) return -1;
    const std::string& leader = info->partitions(p).leader_node_id();
    for (int n = 0; n < kNodes; ++n) {
      if (nodes_[n]->running() && leader == absl::StrCat("node-", n)) return n;
    }
    return -1;
  }

  // Every partition led by its preferred replica with all its replicas in sync, as node `asked`
  // sees it.
  bool Balanced(int asked) {
    absl::StatusOr<v1::ClusterInfo> info = GetClusterAt(asked);
    if (!info.ok() || info->partitions_size() != static_cast<int>(kPartitions)) return false;
    for (const v1::PartitionInfo& partition : info->partitions()) {
      if (partition.replicas().empty() || partition.leader_node_id() != partition.replicas(0) ||
          partition.in_sync_size() != partition.replicas_size()) {
        return false;
      }
    }
    return true;
  }
  // Waits until Balanced(asked), up to kGiveUp. A test that freezes or kills the leader it found
  // waits for this first: while the cluster starts, a partition that another node took first is
  // handed back to its preferred replica, and a leader found before that would move under the
  // test (the frozen node would then lead nothing, and the calls meant for it would be taken).
  bool AwaitBalanced(int asked = 0) {
    const absl::Time give_up = absl::Now() + kGiveUp;
    while (absl::Now() < give_up && !Balanced(asked)) absl::SleepFor(absl::Milliseconds(100));
    return Balanced(asked);
  }

  // Enqueues at the node that leads the queue's partition (as the running nodes see it), trying
  // until it takes the job. The node that did, or -1 after kGiveUp.
  int EnqueueAtLeader(const std::string& queue, const std::string& payload, std::string* id) {
    const absl::Time give_up = absl::Now() + kGiveUp;
    while (absl::Now() < give_up) {
      for (int n = 0; n < kNodes; ++n) {
        if (!nodes_[n]->running()) continue;
        const int leader = LeaderOf(queue, n);
        if (leader >= 0 && EnqueueAt(leader, queue, payload, id).ok()) return leader;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return -1;
  }

  absl::StatusOr<v1::Job> GetJobAt(int n, const std::string& id) {
    return GetJobOf(*nodes_[n], id);
  }

  // Leases one job of `queue` at node `n` and acks it with `result`: whether both were taken.
  bool LeaseAndAckAt(int n, const std::string& queue, const std::string& result) {
    auto stub = nodes_[n]->NewBrokerStub();
    grpc::ClientContext lease_context;
    WithDeadline(lease_context);
    v1::LeaseRequest lease;
    lease.set_queue(queue);
    lease.set_worker_id("w");
    v1::LeaseResponse leased;
    if (!stub->Lease(&lease_context, lease, &leased).ok() || leased.jobs_size() != 1) return false;
    grpc::ClientContext ack_context;
    WithDeadline(ack_context);
    v1::AckRequest ack;
    ack.set_job_id(leased.jobs(0).job_id());
    ack.set_lease_id(leased.jobs(0).lease_id());
    ack.set_result(result);
    v1::AckResponse response;
    return stub->Ack(&ack_context, ack, &response).ok();
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

  // Any other node serves the partition's calls: it forwards them to the leader. Its view follows
  // etcd within a tick or so, so the first tries may be refused with UNAVAILABLE.
  const int other = (leader + 1) % kNodes;
  grpc::Status forwarded;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  do {
    forwarded = EnqueueAt(other, queue, "through a follower", &id);
    if (forwarded.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < until);
  ASSERT_TRUE(forwarded.ok()) << forwarded.error_message();
  acked.push_back(id);
  absl::StatusOr<v1::Job> through_other = GetJobAt(other, id);
  ASSERT_TRUE(through_other.ok()) << through_other.status();
  EXPECT_EQ(through_other->payload(), "through a follower");

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

TEST_F(ThreeNodesTest, MetricsSayWhoLeadsEachPartitionAndHowFarItsFollowersLag) {
  const std::string queue = "invoices";
  std::string id;
  int leader = EnqueueAtLeader(queue, "first", &id);
  ASSERT_GE(leader, 0) << "no node took a write";
  const std::string p = absl::StrCat(core::PartitionOfQueue(queue, kPartitions));
  auto series = [&p](const std::string& name, const std::string& more = "") {
    return absl::StrCat(name, "{partition=\"", p, "\"", more, "}");
  };
  // The views follow etcd within a tick or so: scrape until every node reports the partition
  // whole (three replicas in sync) and led by the node that took the write, then check what each
  // says. The first node up may lead every partition for a few seconds before it hands each back
  // to its preferred replica: then the write is made again at the new leader.
  std::vector<std::string> scraped(kNodes);
  const absl::Time give_up = absl::Now() + kGiveUp;
  bool whole = false;
  while (!whole && absl::Now() < give_up) {
    whole = true;
    std::vector<int> leading;
    for (int n = 0; n < kNodes; ++n) {
      scraped[n] = HttpGet(nodes_[n]->http_address(), "/metrics");
      whole = whole &&
              Sample(scraped[n], series("jobbroker_cluster_partition_in_sync_replicas")) == kNodes;
      if (Sample(scraped[n], series("jobbroker_cluster_partition_leader")) == 1)
        leading.push_back(n);
    }
    whole = whole && leading.size() == 1 && leading[0] == leader;
    if (whole) break;
    if (leading.size() == 1 && leading[0] != leader) {
      leader = EnqueueAtLeader(queue, "again, at the new leader", &id);
      ASSERT_GE(leader, 0) << "no node took a write";
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(whole) << "node " << leader << "'s metrics:\n" << scraped[leader];
  for (int n = 0; n < kNodes; ++n) {
    SCOPED_TRACE(absl::StrCat("node-", n));
    EXPECT_EQ(Sample(scraped[n], series("jobbroker_cluster_partition_leader")),
              n == leader ? 1 : 0);
    EXPECT_EQ(Sample(scraped[n], series("jobbroker_cluster_partition_replicas")), kNodes);
    EXPECT_GT(Sample(scraped[n], series("jobbroker_cluster_partition_epoch")), 0);
    EXPECT_EQ(Sample(scraped[n], "jobbroker_cluster_nodes"), kNodes);
    EXPECT_EQ(Sample(scraped[n], "jobbroker_cluster_etcd_readable"), 1);
    for (int f = 0; f < kNodes; ++f) {
      if (f == leader) continue;
      // Only the leader knows its followers' lag; each holds everything acknowledged, so the
      // lag is at most the entries written since (none, or a tick's expiries).
      const double lag = Sample(scraped[n], series("jobbroker_cluster_replica_lag_entries",
                                                   absl::StrCat(",follower=\"node-", f, "\"")));
      if (n == leader) {
        EXPECT_GE(lag, 0) << "no lag series for node-" << f;
      } else {
        EXPECT_EQ(lag, -1) << "a follower reports lag";
      }
    }
  }
  // The enqueue waited for its followers' fsyncs: the leader counted that wait.
  EXPECT_GE(Sample(scraped[leader], "jobbroker_cluster_commit_wait_seconds_count"), 1);
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

// A queue name that lives in `partition`.
std::string QueueIn(uint32_t partition, const std::string& prefix) {
  return QueueInPartition(partition, kPartitions, prefix);
}

TEST_F(ThreeNodesTest, AnyNodeServesEveryCallOfEveryPartition) {
  const std::vector<std::string> queues = {QueueIn(0, "alpha"), QueueIn(1, "beta")};
  std::string id;
  std::vector<int> leaders;
  for (const std::string& queue : queues) {
    const int leader = EnqueueAtLeader(queue, "warm-up", &id);
    ASSERT_GE(leader, 0) << queue << " got no leader";
    leaders.push_back(leader);
  }

  // Every node tells the same story: the cluster, its nodes and who leads what, where.
  for (int n = 0; n < kNodes; ++n) {
    absl::StatusOr<v1::ClusterInfo> info;
    const absl::Time until = absl::Now() + absl::Seconds(10);
    do {
      info = GetClusterAt(n);
      if (info.ok() && info->nodes_size() == kNodes &&
          info->partitions(0).leader_node_id() == absl::StrCat("node-", leaders[0]) &&
          info->partitions(1).leader_node_id() == absl::StrCat("node-", leaders[1]))
        break;
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < until);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->cluster_name(), "test");
    EXPECT_EQ(info->node_id(), absl::StrCat("node-", n));
    EXPECT_EQ(info->partition_count(), kPartitions);
    EXPECT_EQ(info->replication_factor(), 3u);
    EXPECT_EQ(info->min_in_sync(), 2u);
    ASSERT_EQ(info->nodes_size(), kNodes);
    for (int m = 0; m < kNodes; ++m) {
      EXPECT_EQ(info->nodes(m).node_id(), absl::StrCat("node-", m));
      EXPECT_EQ(info->nodes(m).address(), nodes_[m]->address());
      EXPECT_TRUE(info->nodes(m).alive());
    }
    ASSERT_EQ(info->partitions_size(), static_cast<int>(kPartitions));
    for (uint32_t p = 0; p < kPartitions; ++p) {
      const v1::PartitionInfo& partition = info->partitions(p);
      EXPECT_EQ(partition.partition(), p);
      EXPECT_EQ(partition.leader_node_id(), absl::StrCat("node-", leaders[p]));
      EXPECT_EQ(partition.leader_address(), nodes_[leaders[p]]->address());
      EXPECT_GT(partition.epoch(), 0);
      EXPECT_EQ(partition.replicas_size(), 3);
      EXPECT_GE(partition.in_sync_size(), 2);
    }
  }

  // Two partitions, three nodes: one node leads neither, and serves both.
  int idle = 0;
  while (idle == leaders[0] || idle == leaders[1]) ++idle;
  std::vector<std::string> jobs;
  for (const std::string& queue : queues) {
    for (int n = 0; n < kNodes; ++n) {
      ASSERT_TRUE(EnqueueAt(n, queue, absl::StrCat("from node ", n), &id).ok()) << queue << n;
      jobs.push_back(id);
    }
  }
  auto admin = nodes_[idle]->NewAdminStub();
  for (size_t q = 0; q < queues.size(); ++q) {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::GetQueueRequest request;
    request.set_queue(queues[q]);
    v1::QueueInfo info;
    ASSERT_TRUE(admin->GetQueue(&context, request, &info).ok());
    EXPECT_EQ(info.partition(), q);
    EXPECT_EQ(info.leader_node_id(), absl::StrCat("node-", leaders[q]));
    EXPECT_EQ(info.counts().at("JOB_STATE_READY"), 1 + kNodes) << queues[q];
  }
  {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::ListQueuesResponse listed;
    ASSERT_TRUE(admin->ListQueues(&context, v1::ListQueuesRequest(), &listed).ok());
    std::vector<std::string> names;
    for (const v1::QueueInfo& q : listed.queues()) names.push_back(q.name());
    EXPECT_THAT(names, ::testing::ElementsAreArray(queues)) << "every leader's queues, by name";
  }
  {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::PauseQueueRequest request;
    request.set_queue(queues[1]);
    v1::QueueInfo paused;
    ASSERT_TRUE(admin->PauseQueue(&context, request, &paused).ok());
    EXPECT_TRUE(paused.policy().paused());
    grpc::ClientContext again;
    WithDeadline(again);
    v1::ResumeQueueRequest resume;
    resume.set_queue(queues[1]);
    ASSERT_TRUE(admin->ResumeQueue(&again, resume, &paused).ok());
    EXPECT_FALSE(paused.policy().paused());
  }
  {
    // Cancelled through the idle node: the leader's answer comes back whole.
    grpc::ClientContext context;
    WithDeadline(context);
    v1::CancelJobRequest request;
    request.set_job_id(jobs.back());
    v1::Job cancelled;
    ASSERT_TRUE(admin->CancelJob(&context, request, &cancelled).ok());
    EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
    jobs.pop_back();
  }

  // A forwarded call is never forwarded again: it is refused, naming the partition.
  {
    auto broker = nodes_[idle]->NewBrokerStub();
    grpc::ClientContext context;
    WithDeadline(context);
    context.AddMetadata("jobbroker-forwarded-by", "node-x");
    v1::EnqueueRequest request;
    request.set_queue(queues[0]);
    request.set_payload("bounced");
    v1::EnqueueResponse response;
    grpc::Status status = broker->Enqueue(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr("partition 0 is led by"));
  }

  // A Work stream at the idle node gets the jobs of both partitions and acks them there: one
  // alone, the rest in one batch spanning both partitions.
  auto broker = nodes_[idle]->NewBrokerStub();
  grpc::ClientContext work_context;
  work_context.set_deadline(absl::ToChronoTime(absl::Now() + kGiveUp));
  auto stream = broker->Work(&work_context);
  v1::WorkRequest subscribe;
  subscribe.set_request_id(1);
  for (const std::string& queue : queues) subscribe.mutable_subscribe()->add_queues(queue);
  subscribe.mutable_subscribe()->set_worker_id("w-idle");
  subscribe.mutable_subscribe()->set_max_in_flight(100);
  ASSERT_TRUE(stream->Write(subscribe));
  std::map<std::string, std::string> leases;  // job id -> lease id
  bool subscribed = false;
  const size_t expected = jobs.size() + queues.size();  // and the warm-ups
  v1::WorkResponse message;
  while (leases.size() < expected && stream->Read(&message)) {
    if (message.has_result()) {
      EXPECT_EQ(message.result().request_id(), 1u);
      ASSERT_EQ(message.result().code(), 0) << message.result().message();
      subscribed = true;
    } else if (message.has_job()) {
      EXPECT_TRUE(subscribed) << "a push before the subscribe's answer";
      leases[message.job().job_id()] = message.job().lease_id();
    }
  }
  ASSERT_EQ(leases.size(), expected);
  for (const std::string& job : jobs) EXPECT_EQ(leases.count(job), 1u) << job << " not pushed";
  v1::WorkRequest one;
  one.set_request_id(2);
  one.mutable_ack()->set_job_id(leases.begin()->first);
  one.mutable_ack()->set_lease_id(leases.begin()->second);
  ASSERT_TRUE(stream->Write(one));
  v1::WorkRequest batch;
  batch.set_request_id(3);
  for (auto it = std::next(leases.begin()); it != leases.end(); ++it) {
    v1::AckRequest* ack = batch.mutable_ack_batch()->add_acks();
    ack->set_job_id(it->first);
    ack->set_lease_id(it->second);
  }
  ASSERT_TRUE(stream->Write(batch));
  int answered = 0;
  while (answered < 2 && stream->Read(&message)) {
    if (!message.has_result()) continue;
    ++answered;
    EXPECT_EQ(message.result().code(), 0) << message.result().message();
    EXPECT_EQ(message.result().item_errors_size(), 0) << message.result().item_errors(0).message();
  }
  ASSERT_EQ(answered, 2);
  for (const auto& [job, lease] : leases) {
    absl::StatusOr<v1::Job> done = GetJobAt(idle, job);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::JOB_STATE_COMPLETED) << job;
  }

  // A stream at a leader of one of the partitions: that queue is subscribed in its own broker,
  // the other at the other leader, and both push to it.
  if (leaders[0] != leaders[1]) {
    auto at_leader = nodes_[leaders[0]]->NewBrokerStub();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kGiveUp));
    auto mixed = at_leader->Work(&context);
    // Queues of their own, in the same partitions: the idle node's stream must not take these.
    const std::vector<std::string> own = {QueueIn(0, "mixed"), QueueIn(1, "mixed")};
    v1::WorkRequest both;
    both.set_request_id(1);
    for (const std::string& queue : own) both.mutable_subscribe()->add_queues(queue);
    both.mutable_subscribe()->set_worker_id("w-leader");
    both.mutable_subscribe()->set_max_in_flight(10);
    ASSERT_TRUE(mixed->Write(both));
    std::vector<std::string> fresh;
    for (const std::string& queue : own) {
      ASSERT_TRUE(EnqueueAt(idle, queue, "to a leader's stream", &id).ok());
      fresh.push_back(id);
    }
    std::vector<std::string> pushed;
    v1::WorkResponse got;
    uint64_t next_id = 10;
    while (pushed.size() < fresh.size() && mixed->Read(&got)) {
      if (got.has_result()) {
        ASSERT_EQ(got.result().code(), 0) << got.result().message();
        continue;
      }
      if (!got.has_job()) continue;
      pushed.push_back(got.job().job_id());
      v1::WorkRequest ack;
      ack.set_request_id(next_id++);
      ack.mutable_ack()->set_job_id(got.job().job_id());
      ack.mutable_ack()->set_lease_id(got.job().lease_id());
      ASSERT_TRUE(mixed->Write(ack));
    }
    EXPECT_THAT(pushed, ::testing::UnorderedElementsAreArray(fresh));
    mixed->WritesDone();
    while (mixed->Read(&got)) {
      if (got.has_result()) {
        EXPECT_EQ(got.result().code(), 0) << got.result().message();
      }
    }
    grpc::Status finished = mixed->Finish();
    EXPECT_TRUE(finished.ok()) << finished.error_message();
    for (const std::string& job : fresh) {
      absl::StatusOr<v1::Job> done = GetJobAt(idle, job);
      ASSERT_TRUE(done.ok()) << done.status();
      EXPECT_EQ(done->state(), v1::JOB_STATE_COMPLETED) << job;
    }
  }

  // An EnqueueStream at the idle node: each batch goes to its partition's leader (as an
  // EnqueueBatch call would) and the leader's answer comes back on the stream, by request_id.
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kGiveUp));
    auto producer = nodes_[idle]->NewBrokerStub()->EnqueueStream(&context);
    for (uint32_t p = 0; p < kPartitions; ++p) {
      v1::EnqueueStreamRequest request;
      request.set_request_id(100 + p);
      for (const char* payload : {"first", "second"}) {
        v1::EnqueueRequest* job = request.mutable_batch()->add_jobs();
        job->set_queue(QueueIn(p, "streamed"));
        job->set_payload(absl::StrCat(payload, " of partition ", p));
      }
      ASSERT_TRUE(producer->Write(request));
    }
    producer->WritesDone();
    std::map<uint64_t, v1::EnqueueStreamResponse> answers;
    v1::EnqueueStreamResponse answer;
    while (producer->Read(&answer)) answers[answer.request_id()] = answer;
    grpc::Status finished = producer->Finish();
    EXPECT_TRUE(finished.ok()) << finished.error_message();
    ASSERT_EQ(answers.size(), kPartitions);
    for (uint32_t p = 0; p < kPartitions; ++p) {
      const v1::EnqueueStreamResponse& a = answers[100 + p];
      ASSERT_EQ(a.code(), 0) << a.message();
      ASSERT_EQ(a.results_size(), 2);
      absl::StatusOr<v1::Job> second = GetJobAt(leaders[p], a.results(1).job_id());
      ASSERT_TRUE(second.ok()) << second.status();
      EXPECT_EQ(second->payload(), absl::StrCat("second of partition ", p));
      EXPECT_EQ(second->queue(), QueueIn(p, "streamed"));
    }
  }

  // Its partition's leader dies: the stream ends with UNAVAILABLE, so the worker reconnects.
  nodes_[leaders[0]]->Kill9();
  while (stream->Read(&message)) {
  }
  grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
}

TEST_F(ThreeNodesTest, AnyNodeListsEveryLeadersWorkersAndRelaysAWatch) {
  const std::vector<std::string> queues = {QueueIn(0, "alpha"), QueueIn(1, "beta")};
  std::vector<std::string> ids(queues.size());
  std::vector<int> leaders;
  for (size_t q = 0; q < queues.size(); ++q) {
    const int leader = EnqueueAtLeader(queues[q], "p", &ids[q]);
    ASSERT_GE(leader, 0) << queues[q] << " got no leader";
    leaders.push_back(leader);
  }
  // One worker runs a job of each partition, leased through each partition's leader.
  std::vector<v1::LeasedJob> leased;
  for (size_t q = 0; q < queues.size(); ++q) {
    auto broker = nodes_[leaders[q]]->NewBrokerStub();
    grpc::ClientContext context;
    WithDeadline(context);
    v1::LeaseRequest request;
    request.set_queue(queues[q]);
    request.set_worker_id("w-both");
    v1::LeaseResponse response;
    ASSERT_TRUE(broker->Lease(&context, request, &response).ok());
    ASSERT_EQ(response.jobs_size(), 1) << queues[q];
    leased.push_back(response.jobs(0));
  }

  // A node that leads neither partition (or any node, if one leads both) merges what each
  // leader knows into one entry per worker.
  int asked = 0;
  while (asked < kNodes - 1 && (asked == leaders[0] || asked == leaders[1])) ++asked;
  auto admin = nodes_[asked]->NewAdminStub();
  {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::ListWorkersResponse listed;
    ASSERT_TRUE(admin->ListWorkers(&context, v1::ListWorkersRequest(), &listed).ok());
    ASSERT_EQ(listed.workers_size(), 1);
    const v1::WorkerInfo& w = listed.workers(0);
    EXPECT_EQ(w.worker_id(), "w-both");
    std::set<std::string> running;
    for (const v1::RunningJob& r : w.running()) running.insert(r.job_id());
    EXPECT_EQ(running, std::set<std::string>(ids.begin(), ids.end())) << "a job of each leader";
  }

  // A watch at a node that does not lead the job's partition is relayed from its leader.
  const int watcher = leaders[0] == 0 ? 1 : 0;
  auto watch_admin = nodes_[watcher]->NewAdminStub();
  grpc::ClientContext watch_context;
  WithDeadline(watch_context);
  v1::WatchJobRequest watch;
  watch.set_job_id(ids[0]);
  std::unique_ptr<grpc::ClientReader<v1::Job>> reader =
      watch_admin->WatchJob(&watch_context, watch);
  v1::Job seen;
  ASSERT_TRUE(reader->Read(&seen));
  EXPECT_EQ(seen.state(), v1::JOB_STATE_ACTIVE);
  {
    auto broker = nodes_[leaders[0]]->NewBrokerStub();
    grpc::ClientContext context;
    WithDeadline(context);
    v1::AckRequest ack;
    ack.set_job_id(leased[0].job_id());
    ack.set_lease_id(leased[0].lease_id());
    ack.set_result("done");
    v1::AckResponse response;
    ASSERT_TRUE(broker->Ack(&context, ack, &response).ok());
  }
  ASSERT_TRUE(reader->Read(&seen));
  EXPECT_EQ(seen.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(seen.result(), "done");
  EXPECT_FALSE(reader->Read(&seen)) << "the call ends after the terminal state";
  grpc::Status ended = reader->Finish();
  EXPECT_TRUE(ended.ok()) << ended.error_message();
}

TEST_F(ThreeNodesTest, SigtermHandsLeadershipOverBeforeTheNodeExits) {
  const std::vector<std::string> queues = {QueueIn(0, "gamma"), QueueIn(1, "delta")};
  std::string id;
  std::vector<std::string> acked;
  int leader = -1;
  for (const std::string& queue : queues) {
    leader = EnqueueAtLeader(queue, "before", &id);
    ASSERT_GE(leader, 0) << queue << " got no leader";
    acked.push_back(id);
  }
  // The leader of the second queue's partition stops as an upgrade stops it.
  absl::StatusOr<int> exit_code = nodes_[leader]->Terminate();
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0) << nodes_[leader]->ReadStderr();
  const std::string log = nodes_[leader]->ReadStderr();
  EXPECT_THAT(log, ::testing::HasSubstr("\"event\":\"handed_over\""));
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("did not hand over"))) << log;

  // Before it exited, every partition it held had another leader and an in-sync set without it:
  // the first view that no longer lists the node (its lease went last) shows both.
  const int survivor = (leader + 1) % kNodes;
  const std::string gone = absl::StrCat("node-", leader);
  absl::StatusOr<v1::ClusterInfo> info;
  const absl::Time until = absl::Now() + kGiveUp;
  bool listed = true;
  while (listed && absl::Now() < until) {
    info = GetClusterAt(survivor);
    ASSERT_TRUE(info.ok()) << info.status();
    listed = false;
    for (const v1::NodeInfo& node : info->nodes()) listed = listed || node.node_id() == gone;
    if (listed) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_FALSE(listed) << gone << " is still registered";
  for (const v1::PartitionInfo& partition : info->partitions()) {
    EXPECT_NE(partition.leader_node_id(), gone) << "partition " << partition.partition();
    EXPECT_FALSE(partition.leader_node_id().empty()) << "partition " << partition.partition();
    EXPECT_THAT(partition.in_sync(), ::testing::Not(::testing::Contains(gone)))
        << "partition " << partition.partition();
  }
  // Both partitions take writes from the two nodes left, and kept what was acknowledged.
  for (const std::string& queue : queues) {
    const int next = EnqueueAtLeader(queue, "after", &id);
    ASSERT_GE(next, 0) << queue;
    EXPECT_NE(next, leader);
  }
  for (const std::string& job : acked) EXPECT_TRUE(GetJobAt(survivor, job).ok()) << job;
}

// Leaders spread over the nodes as the placement put them (the first replica of each partition)
// and go back there after a failover: the first node up leads everything at first, and a
// restarted node gets its partitions back once it has caught up.
TEST_F(ThreeNodesTest, LeadershipGoesBackToEachPartitionsPreferredReplica) {
  ASSERT_TRUE(AwaitBalanced(0)) << GetClusterAt(0)->DebugString();
  absl::StatusOr<v1::ClusterInfo> info = GetClusterAt(0);
  ASSERT_TRUE(info.ok()) << info.status();
  std::set<std::string> leaders;
  for (const v1::PartitionInfo& partition : info->partitions())
    leaders.insert(partition.leader_node_id());
  EXPECT_EQ(leaders.size(), kPartitions) << "the placement spreads the preferred leaders";

  // Kill the preferred leader of partition 0; its partition moves, and comes back after restart.
  const std::string queue = QueueIn(0, "epsilon");
  std::string id;
  const int preferred = EnqueueAtLeader(queue, "before", &id);
  ASSERT_GE(preferred, 0);
  EXPECT_EQ(absl::StrCat("node-", preferred), info->partitions(0).replicas(0));
  std::vector<std::string> acked = {id};
  nodes_[preferred]->Kill9();
  const int stand_in = EnqueueAtLeader(queue, "during", &id);
  ASSERT_GE(stand_in, 0);
  EXPECT_NE(stand_in, preferred);
  acked.push_back(id);
  ASSERT_TRUE(nodes_[preferred]->Restart().ok());
  ASSERT_TRUE(AwaitBalanced(stand_in)) << GetClusterAt(stand_in)->DebugString();
  EXPECT_EQ(EnqueueAtLeader(queue, "after", &id), preferred);
  acked.push_back(id);
  for (const std::string& job : acked) EXPECT_TRUE(GetJobAt(preferred, job).ok()) << job;
}

// A node reports jobbroker.v1.Broker as serving (the service a readiness probe names), as a
// single broker does: it serves every call, forwarding what it does not lead.
TEST_F(ThreeNodesTest, EveryNodeReportsTheBrokerServiceServing) {
  for (int n = 0; n < kNodes; ++n) {
    int serving_status = 0;
    grpc::Status status =
        CheckHealth(nodes_[n]->NewChannel(), "jobbroker.v1.Broker", &serving_status);
    ASSERT_TRUE(status.ok()) << "node-" << n << ": " << status.error_message();
    EXPECT_EQ(serving_status, 1) << "node-" << n;  // SERVING
  }
}

// Dependencies across partitions: the node that leads the dependent's partition watches the
// dependency where its partition is led and delivers its result. Killing that node while the job
// waits moves the wait to the next leader, which watches again: released once, with the result.
TEST_F(ThreeNodesTest, AJobWaitsForAJobOfAnotherPartitionAcrossAKill9OfItsLeader) {
  const std::string first = QueueIn(0, "first");
  const std::string then = QueueIn(1, "then");
  std::string dep;
  ASSERT_GE(EnqueueAtLeader(first, "d", &dep), 0);
  // The dependent, at whichever node leads its partition (retried through a failover).
  auto enqueue_after = [&](const std::vector<std::string>& deps, std::string* id) {
    const absl::Time give_up = absl::Now() + kGiveUp;
    while (absl::Now() < give_up) {
      for (int n = 0; n < kNodes; ++n) {
        if (!nodes_[n]->running() || LeaderOf(then, n) < 0) continue;
        auto stub = nodes_[LeaderOf(then, n)]->NewBrokerStub();
        grpc::ClientContext context;
        WithDeadline(context);
        v1::EnqueueRequest request;
        request.set_queue(then);
        request.set_payload("after");
        for (const std::string& d : deps) request.add_depends_on(d);
        v1::EnqueueResponse response;
        if (stub->Enqueue(&context, request, &response).ok()) {
          *id = response.job_id();
          return true;
        }
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  };
  std::string after;
  ASSERT_TRUE(enqueue_after({dep}, &after));
  // A made-up id of partition 0's form: a node cannot check another leader's jobs at enqueue,
  // so the relay finds it missing and the dependent fails, naming it.
  std::string made_up = dep;
  made_up.back() = made_up.back() == 'A' ? 'B' : 'A';
  std::string orphan;
  ASSERT_TRUE(enqueue_after({made_up}, &orphan));

  // The first node up is asked; any node answers for any partition.
  auto job_at_any = [&](const std::string& id) -> std::optional<v1::Job> {
    for (int n = 0; n < kNodes; ++n) {
      if (!nodes_[n]->running()) continue;
      if (absl::StatusOr<v1::Job> job = GetJobAt(n, id); job.ok()) return *job;
    }
    return std::nullopt;
  };
  auto await_state = [&](const std::string& id, v1::JobState state) {
    const absl::Time give_up = absl::Now() + kGiveUp;
    while (absl::Now() < give_up) {
      std::optional<v1::Job> job = job_at_any(id);
      if (job.has_value() && job->state() == state) return *job;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return job_at_any(id).value_or(v1::Job());
  };
  v1::Job failed = await_state(orphan, v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.fail_reason(), v1::FAIL_REASON_DEPENDENCY_FAILED);
  EXPECT_THAT(failed.last_error(), ::testing::HasSubstr(made_up + " is not in partition 0"));
  EXPECT_EQ(await_state(after, v1::JOB_STATE_WAITING).state(), v1::JOB_STATE_WAITING);

  const int waiting_leader = LeaderOf(then, 0);
  ASSERT_GE(waiting_leader, 0);
  nodes_[waiting_leader]->Kill9();

  // The dependency completes (at its partition's leader, maybe a new one) with a result.
  const absl::Time give_up = absl::Now() + kGiveUp;
  bool acked = false;
  while (!acked && absl::Now() < give_up) {
    for (int n = 0; n < kNodes && !acked; ++n) {
      if (!nodes_[n]->running()) continue;
      const int leader = LeaderOf(first, n);
      if (leader >= 0) acked = LeaseAndAckAt(leader, first, "from partition 0");
    }
    if (!acked) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(acked) << "the dependency was never leased and acked";

  v1::Job released = await_state(after, v1::JOB_STATE_READY);
  ASSERT_EQ(released.state(), v1::JOB_STATE_READY)
      << "still " << v1::JobState_Name(released.state());
  // Leased at its partition's leader: once, with the result.
  std::vector<v1::LeasedJob> leases;
  const absl::Time until = absl::Now() + kGiveUp;
  while (leases.empty() && absl::Now() < until) {
    for (int n = 0; n < kNodes && leases.empty(); ++n) {
      if (!nodes_[n]->running()) continue;
      const int leader = LeaderOf(then, n);
      if (leader < 0) continue;
      auto stub = nodes_[leader]->NewBrokerStub();
      grpc::ClientContext context;
      WithDeadline(context);
      v1::LeaseRequest lease;
      lease.set_queue(then);
      lease.set_worker_id("w");
      lease.set_max_jobs(10);
      v1::LeaseResponse leased;
      if (stub->Lease(&context, lease, &leased).ok())
        leases.assign(leased.jobs().begin(), leased.jobs().end());
    }
    if (leases.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(leases.size(), 1u) << "one job, once";
  EXPECT_EQ(leases[0].job_id(), after);
  EXPECT_EQ(leases[0].dependency_results().at(dep), "from partition 0");
}

// A leader frozen by SIGSTOP (a VM paused, a process stuck in the kernel) keeps its connections
// open and answers nothing, so a dependency relay's watch on it would wait as long as the freeze.
// The relay moves the watch to the partition's new leader: the dependent is released while the
// former leader is still frozen.
TEST_F(ThreeNodesTest, ADependentIsReleasedWhileItsDependencysFormerLeaderIsFrozen) {
  ASSERT_TRUE(AwaitBalanced()) << GetClusterAt(0)->DebugString();
  const std::string first = QueueIn(0, "first");
  const std::string then = QueueIn(1, "then");
  // Each partition at its preferred replica (balanced above): two different nodes.
  const int dep_leader = LeaderOf(first, 0);
  const int waiting_leader = LeaderOf(then, 0);
  const absl::Time settle_by = absl::Now() + kGiveUp;
  ASSERT_GE(dep_leader, 0);
  ASSERT_GE(waiting_leader, 0);
  ASSERT_NE(dep_leader, waiting_leader) << "both partitions stayed on one node";
  const int third = kNodes - dep_leader - waiting_leader;

  // Each at its partition's leader, retried while it starts serving.
  auto enqueue = [&](int n, const std::string& queue, const std::string& depends_on) {
    grpc::Status status;
    while (absl::Now() < settle_by) {
      auto stub = nodes_[n]->NewBrokerStub();
      grpc::ClientContext context;
      WithDeadline(context);
      v1::EnqueueRequest request;
      request.set_queue(queue);
      if (!depends_on.empty()) request.add_depends_on(depends_on);
      v1::EnqueueResponse response;
      status = stub->Enqueue(&context, request, &response);
      if (status.ok()) return response.job_id();
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "node-" << n << " took no job of " << queue << ": " << status.error_message();
    return std::string();
  };
  const std::string dep = enqueue(dep_leader, first, "");
  ASSERT_FALSE(dep.empty());
  const std::string after = enqueue(waiting_leader, then, dep);
  ASSERT_FALSE(after.empty());
  absl::StatusOr<v1::Job> waiting = GetJobAt(waiting_leader, after);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->state(), v1::JOB_STATE_WAITING);
  // Several of the relay's rounds (DependencyRelay::kRound, 250 ms): its watch is open at the
  // dependency's leader when it freezes. Earlier would only make the test easier.
  absl::SleepFor(absl::Seconds(1));

  Frozen frozen(*nodes_[dep_leader]);
  ASSERT_TRUE(frozen.ok());

  // The dependency completes at its partition's new leader; the frozen node is never asked.
  bool acked = false;
  const absl::Time give_up = absl::Now() + kGiveUp;
  while (!acked && absl::Now() < give_up) {
    for (int n : {waiting_leader, third}) {
      if (!acked && LeaderOf(first, n) == n)
        acked = LeaseAndAckAt(n, first, "done while the old leader slept");
    }
    if (!acked) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(acked) << "no new leader leased and acked the dependency";

  // Released by the relay of the waiting partition's leader, which the freeze did not touch.
  v1::Job released;
  while (absl::Now() < give_up) {
    absl::StatusOr<v1::Job> job = GetJobAt(waiting_leader, after);
    if (job.ok()) released = *job;
    if (released.state() == v1::JOB_STATE_READY) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(released.state(), v1::JOB_STATE_READY)
      << "still " << v1::JobState_Name(released.state())
      << " while the dependency's former leader is frozen";
  ASSERT_EQ(released.dependency_results().count(dep), 1u);
  EXPECT_EQ(released.dependency_results().at(dep), "done while the old leader slept");
  // By the relay moving its watch off the frozen node, not by any other way round.
  EXPECT_THAT(nodes_[waiting_leader]->ReadStderr(),
              ::testing::HasSubstr("\"event\":\"dependency_watch_moved\""));
}

// The same freeze seen by a caller: a WatchJob at a node that relays it from the job's leader
// ends UNAVAILABLE once the partition has a new leader (the clients' wait-for-result helpers
// watch again on UNAVAILABLE), instead of waiting as long as the frozen node sleeps.
TEST_F(ThreeNodesTest, AWatchRelayedFromAFrozenLeaderEndsSoTheCallerWatchesAgain) {
  ASSERT_TRUE(AwaitBalanced()) << GetClusterAt(0)->DebugString();
  const std::string queue = QueueIn(0, "watched");
  std::string id;
  const int leader = EnqueueAtLeader(queue, "w", &id);
  ASSERT_GE(leader, 0);
  const int relay = (leader + 1) % kNodes;

  auto watch_at = [&](int n, grpc::ClientContext& context) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + kGiveUp));
    v1::WatchJobRequest request;
    request.set_job_id(id);
    return nodes_[n]->NewAdminStub()->WatchJob(&context, request);
  };
  grpc::ClientContext context;
  auto reader = watch_at(relay, context);
  v1::Job first;
  ASSERT_TRUE(reader->Read(&first)) << "the relayed watch sent nothing";
  EXPECT_EQ(first.id(), id);

  Frozen frozen(*nodes_[leader]);
  ASSERT_TRUE(frozen.ok());

  v1::Job more;
  while (reader->Read(&more)) {
  }
  const grpc::Status ended = reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_THAT(ended.error_message(), ::testing::HasSubstr("changed leader"));

  // Watched again at the same node: the new leader answers while the old one still sleeps.
  v1::Job again;
  const absl::Time give_up = absl::Now() + kGiveUp;
  bool answered = false;
  while (!answered && absl::Now() < give_up) {
    grpc::ClientContext retry;
    auto second = watch_at(relay, retry);
    answered = second->Read(&again);
    retry.TryCancel();
    second->Finish();
    if (!answered) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(answered) << "no node answered the watch again";
  EXPECT_EQ(again.id(), id);
  EXPECT_EQ(again.state(), v1::JOB_STATE_READY);
}

// And a producer's stream: a batch the node sent on to a leader that froze is answered (its
// outcome unknown, as a call's would be) within ProducerStream::kForwardDeadline rather than
// held, with its place on the stream, while the leader sleeps; the next batch reaches the new
// leader.
TEST_F(ThreeNodesTest, ABatchSentOnToAFrozenLeaderIsAnsweredAndTheStreamGoesOn) {
  ASSERT_TRUE(AwaitBalanced()) << GetClusterAt(0)->DebugString();
  const std::string queue = QueueIn(0, "streamed");
  std::string id;
  const int leader = EnqueueAtLeader(queue, "first", &id);
  ASSERT_GE(leader, 0);
  const int relay = (leader + 1) % kNodes;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + 2 * kGiveUp));
  auto producer = nodes_[relay]->NewBrokerStub()->EnqueueStream(&context);
  auto send = [&](uint64_t request_id) {
    v1::EnqueueStreamRequest request;
    request.set_request_id(request_id);
    v1::EnqueueRequest* job = request.mutable_batch()->add_jobs();
    job->set_queue(queue);
    job->set_payload(absl::StrCat("batch ", request_id));
    return producer->Write(request);
  };

  // The relaying node's connection to the leader is up: what a freeze leaves open.
  ASSERT_TRUE(send(0));
  v1::EnqueueStreamResponse answer;
  ASSERT_TRUE(producer->Read(&answer));
  ASSERT_EQ(answer.code(), 0) << answer.message();

  Frozen frozen(*nodes_[leader]);
  ASSERT_TRUE(frozen.ok());
  ASSERT_TRUE(send(1));  // routed by a view that still names the frozen leader
  ASSERT_TRUE(producer->Read(&answer)) << "the stream ended without answering the batch";
  EXPECT_EQ(answer.request_id(), 1u);
  EXPECT_THAT(answer.code(), ::testing::AnyOf(static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED),
                                              static_cast<int>(grpc::StatusCode::UNAVAILABLE)))
      << answer.message();

  // Once the partition has a new leader, batches are taken again on the same stream.
  bool taken = false;
  for (uint64_t request_id = 2; !taken && request_id < 200; ++request_id) {
    ASSERT_TRUE(send(request_id));
    ASSERT_TRUE(producer->Read(&answer));
    EXPECT_EQ(answer.request_id(), request_id);
    taken = answer.code() == 0;
    if (!taken) absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_TRUE(taken) << "no batch was taken after the failover: " << answer.message();
  producer->WritesDone();
  while (producer->Read(&answer)) {
  }
  EXPECT_TRUE(producer->Finish().ok());
}

// A unary call sent on to a leader that froze: the node's channel to it pings (--keepalive-time,
// default 10 s), and the unanswered ping ends the call UNAVAILABLE — what the caller retries on,
// at the new leader — instead of holding it until the caller's deadline, which may be far off or
// none. The call's outcome is unknown to the caller, as any UNAVAILABLE's (a dedup key makes its
// retry safe); here the leader froze before it could take it.
TEST_F(ThreeNodesTest, AUnaryCallSentOnToAFrozenLeaderEndsUnavailableBeforeItsDeadline) {
  ASSERT_TRUE(AwaitBalanced()) << GetClusterAt(0)->DebugString();
  const std::string queue = QueueIn(0, "forwarded");
  std::string id;
  const int leader = EnqueueAtLeader(queue, "first", &id);
  ASSERT_GE(leader, 0);
  const int relay = (leader + 1) % kNodes;
  // The relaying node's channel to the leader is up: what a freeze leaves open.
  std::string second;
  ASSERT_TRUE(EnqueueAt(relay, queue, "second", &second).ok());

  Frozen frozen(*nodes_[leader]);
  ASSERT_TRUE(frozen.ok());
  auto stub = nodes_[relay]->NewBrokerStub();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + 3 * kGiveUp));
  v1::EnqueueRequest request;
  request.set_queue(queue);
  request.set_payload("third");
  v1::EnqueueResponse response;
  const grpc::Status status = stub->Enqueue(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

// A link between two nodes that goes silent while both stay up and keep their etcd leases (a
// firewall that drops packets between them, not a freeze): no leader changes, so nothing but the
// pings on node-0's channel to node-1 tells that a Work stream node-0 relays to node-1 will never
// push again. It ends UNAVAILABLE ("reconnect"), as the worker contract says a relayed stream
// whose leader went away does. Node-0 dials node-1 through a FrozenLink
// (--cluster-peer-addresses), with pings after 1 s and 1 s for the answer.
// docs/worker-contract.md §5: jobs pushed that a worker never got go back to READY at once. Here
// the node the worker dialled relays them from the leader, which thinks them delivered (to that
// node); the relaying node gives them back there when its worker goes away.
TEST_F(ThreeNodesTest, JobsRelayedToAWorkerThatWentAwayUnreadAreGivenBackAtTheirLeader) {
  ASSERT_TRUE(AwaitBalanced()) << GetClusterAt(0)->DebugString();
  const std::string queue = QueueIn(0, "given-back");
  // Jobs larger than the worker's HTTP/2 window, so that all but the few in flight wait at the
  // relaying node behind a worker that does not read.
  constexpr int kJobs = 64;
  const std::string payload(256 << 10, 'x');
  std::string id;
  const int leader = EnqueueAtLeader(queue, payload, &id);
  ASSERT_GE(leader, 0) << "no leader took the first job";
  for (int i = 1; i < kJobs; ++i) {
    grpc::Status s = EnqueueAt(leader, queue, payload, &id);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto queue_at_leader = [&]() {
    auto admin = nodes_[leader]->NewAdminStub();
    grpc::ClientContext context;
    WithDeadline(context);
    v1::GetQueueRequest request;
    request.set_queue(queue);
    v1::QueueInfo info;
    EXPECT_TRUE(admin->GetQueue(&context, request, &info).ok());
    return info;
  };

  // A worker at another node, so that its stream is relayed from the leader: it reads the
  // subscribe's answer and one job, and nothing more. Leases of 10 minutes, far beyond the
  // test: a job READY again below was given back, not expired.
  const int relay = (leader + 1) % kNodes;
  // The window stays at HTTP/2's 64 KiB: gRPC's bandwidth probe would grow it to megabytes,
  // and the worker's transport would take in dozens of jobs it never reads.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetMaxReceiveMessageSize(-1);
  auto stub = v1::Broker::NewStub(grpc::CreateCustomChannel(
      nodes_[relay]->address(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + 2 * kGiveUp));
  auto stream = stub->Work(&context);
  v1::WorkRequest subscribe;
  subscribe.set_request_id(1);
  subscribe.mutable_subscribe()->add_queues(queue);
  subscribe.mutable_subscribe()->set_worker_id("reads-one");
  subscribe.mutable_subscribe()->set_max_in_flight(kJobs);
  subscribe.mutable_subscribe()->mutable_lease_duration()->set_seconds(600);
  ASSERT_TRUE(stream->Write(subscribe));
  v1::WorkResponse message;
  bool got_one = false;
  while (!got_one && stream->Read(&message)) {
    if (message.has_result()) {
      ASSERT_EQ(message.result().code(), 0) << message.result().message();
    }
    got_one = message.has_job() || message.has_job_batch();
  }
  ASSERT_TRUE(got_one) << "the relayed stream ended before its first job";
  // Every job leased to the stream: pushed, as far as the leader knows.
  int64_t active = 0;
  for (const absl::Time until = absl::Now() + kGiveUp; absl::Now() < until;) {
    active = queue_at_leader().active();
    if (active == kJobs) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(active, kJobs);

  context.TryCancel();  // the worker goes away
  int64_t ready = 0;
  for (const absl::Time until = absl::Now() + kGiveUp; absl::Now() < until;) {
    const v1::QueueInfo info = queue_at_leader();
    auto it = info.counts().find("JOB_STATE_READY");
    ready = it == info.counts().end() ? 0 : it->second;
    if (ready >= kJobs - 3) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  // All but the job it read and at most two whose writes had started (the window's worth).
  EXPECT_GE(ready, kJobs - 3) << "the jobs the worker never got are still leased to it";

  // Counted where the worker was connected, once the leader took each Release.
  double given_back = 0;
  for (const absl::Time until = absl::Now() + kGiveUp; absl::Now() < until;) {
    given_back = Sample(HttpGet(nodes_[relay]->http_address(), "/metrics"),
                        "jobbroker_work_given_back_total");
    if (given_back >= kJobs - 3) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GE(given_back, kJobs - 3);
}

TEST(ThreeNodesCutLinkTest, AWorkStreamRelayedOverALinkThatWentSilentEnds) {
  auto dir = TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto etcd = EtcdProcess::Start((*dir)->path() + "/etcd");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::vector<std::unique_ptr<BrokerProcess>> nodes(kNodes);
  for (int n : {1, 2}) {
    auto node = BrokerProcess::Start(ClusterNodeOptions(**etcd, n, kNodes));
    ASSERT_TRUE(node.ok()) << node.status();
    nodes[n] = *std::move(node);
  }
  auto link = FrozenLink::Start(nodes[1]->address());
  ASSERT_TRUE(link.ok()) << link.status();
  BrokerProcessOptions options = ClusterNodeOptions(**etcd, 0, kNodes);
  options.extra_args.insert(options.extra_args.end(),
                            {"--cluster-peer-addresses", "node-1=" + (*link)->address(),
                             "--keepalive-time", "1", "--keepalive-timeout", "1"});
  auto node0 = BrokerProcess::Start(options);
  ASSERT_TRUE(node0.ok()) << node0.status();
  nodes[0] = *std::move(node0);

  // A partition node-1 leads, as node-0 sees it (each node leads its preferred one).
  int led_by_1 = -1;
  const absl::Time give_up = absl::Now() + kGiveUp;
  while (led_by_1 < 0 && absl::Now() < give_up) {
    absl::StatusOr<v1::ClusterInfo> info = GetClusterOf(*nodes[0]);
    if (info.ok()) {
      for (int p = 0; p < info->partitions_size(); ++p) {
        if (info->partitions(p).leader_node_id() == "node-1") led_by_1 = p;
      }
    }
    if (led_by_1 < 0) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_GE(led_by_1, 0) << "node-1 leads no partition";
  const std::string queue = QueueInPartition(led_by_1, kNodes, "relayed");

  // A job, enqueued at node-2 and tried until the partition takes it (its leader may be in its
  // first moments, or node-2 not yet told who it is).
  auto producer = nodes[2]->NewBrokerStub();
  grpc::Status enqueued;
  for (const absl::Time until = absl::Now() + kGiveUp; absl::Now() < until;) {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::EnqueueRequest request;
    request.set_queue(queue);
    request.set_payload("through the link");
    v1::EnqueueResponse response;
    enqueued = producer->Enqueue(&context, request, &response);
    if (enqueued.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(enqueued.ok()) << enqueued.error_message();
  // A worker at node-0 on node-1's queue: node-0 relays its stream, and the job comes through.
  // A stream that ends first (the relay's first moments) is opened again, as a worker would.
  auto stub = nodes[0]->NewBrokerStub();
  std::unique_ptr<WorkStreamClient> worker;
  for (const absl::Time until = absl::Now() + kGiveUp; absl::Now() < until;) {
    worker = std::make_unique<WorkStreamClient>(*stub);
    if (worker->Subscribe({queue}, 4) == grpc::StatusCode::OK &&
        worker->NextJob(absl::Seconds(10)).has_value())
      break;
    worker->Cancel();
    worker.reset();
    absl::SleepFor(absl::Milliseconds(100));
    // The job may be leased to the stream that ended, until its lease runs out: another one.
    grpc::ClientContext context;
    WithDeadline(context);
    v1::EnqueueRequest request;
    request.set_queue(queue);
    request.set_payload("through the link, again");
    v1::EnqueueResponse response;
    producer->Enqueue(&context, request, &response);
  }
  ASSERT_NE(worker, nullptr) << "no job came through the relay";

  (*link)->Freeze();
  const absl::Time wait_until = absl::Now() + kGiveUp;
  while (!worker->ended() && absl::Now() < wait_until) absl::SleepFor(absl::Milliseconds(50));
  (*link)->Thaw();
  ASSERT_TRUE(worker->ended()) << "the relayed stream outlived a silent link for 60 s";
  const grpc::Status ended = worker->Close();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_THAT(ended.error_message(), ::testing::HasSubstr("reconnect"));
}

}  // namespace
}  // namespace jobbroker::testing
