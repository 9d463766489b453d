// Jobs that wait for other jobs, against the real binary: a fan-out/fan-in graph enqueued in one
// EnqueueBatch, worked across a kill -9, its join released once with every result.
#include <grpcpp/grpcpp.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/queue_names.h"

namespace jobbroker::testing {
namespace {

// Fails the leased job for good (no retry): its dependents fail with DEPENDENCY_FAILED.
grpc::Status FailPermanently(BrokerClient& client, const v1::LeasedJob& leased) {
  v1::FailRequest fail;
  fail.set_job_id(leased.job_id());
  fail.set_lease_id(leased.lease_id());
  fail.set_error("no");
  fail.set_permanent(true);
  v1::FailResponse failed;
  return client.Fail(fail, &failed);
}

class DependenciesTest : public BrokerFixture {
 protected:
  // Leases and acks `n` jobs of `queue`, each with its payload as result; returns their ids.
  std::vector<std::string> Work(const std::string& queue, int n) {
    std::vector<std::string> done;
    for (int i = 0; i < n; ++i) {
      std::optional<v1::LeasedJob> job = client().LeaseOne(queue, "w");
      EXPECT_TRUE(job.has_value()) << "no job ready in " << queue;
      if (!job.has_value()) break;
      client().MustAck(*job, job->payload());
      done.push_back(job->job_id());
    }
    return done;
  }
};

TEST_F(DependenciesTest, AFanOutFanInInOneBatchIsReleasedOnceWithEveryResultAcrossAKill9) {
  constexpr int kWidth = 20;
  v1::EnqueueBatchRequest batch;
  v1::EnqueueRequest* root = batch.add_jobs();
  root->set_queue("split");
  root->set_payload("root");
  for (int i = 0; i < kWidth; ++i) {
    v1::EnqueueRequest* part = batch.add_jobs();
    part->set_queue("parts");
    part->set_payload(absl::StrCat("part-", i));
    part->add_depends_on_index(0);
  }
  v1::EnqueueRequest* join = batch.add_jobs();
  join->set_queue("join");
  join->set_payload("sum");
  for (int i = 1; i <= kWidth; ++i) join->add_depends_on_index(i);
  v1::EnqueueBatchResponse ids;
  ASSERT_TRUE(client().EnqueueBatch(batch, &ids).ok());
  const std::string join_id = ids.results(kWidth + 1).job_id();
  EXPECT_EQ(client().MustGetJob(join_id).state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(client().MustGetJob(join_id).depends_on_size(), kWidth);

  Work("split", 1);
  std::vector<std::string> before = Work("parts", kWidth / 2);
  Kill9AndRestart();
  EXPECT_EQ(client().MustGetJob(join_id).state(), v1::JOB_STATE_WAITING)
      << "half of its dependencies are left after the restart";
  std::vector<std::string> after = Work("parts", kWidth / 2);
  EXPECT_FALSE(client().LeaseOne("parts", "w").has_value()) << "each part ran once";

  std::optional<v1::LeasedJob> last = client().LeaseOne("join", "w");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->job_id(), join_id);
  ASSERT_EQ(last->dependency_results_size(), kWidth);
  for (const std::string& id : before)
    EXPECT_EQ(last->dependency_results().at(id).substr(0, 5), "part-");
  for (const std::string& id : after) EXPECT_TRUE(last->dependency_results().contains(id));
  EXPECT_FALSE(client().LeaseOne("join", "w").has_value()) << "released once";
}

TEST_F(DependenciesTest, AFailedDependencyFailsItsDependentsAndAnUnknownOneIsRefused) {
  const std::string a = client().MustEnqueue("top", "a");
  v1::EnqueueRequest after;
  after.set_queue("end");
  after.add_depends_on(a);
  const std::string b = client().MustEnqueue(after);
  std::optional<v1::LeasedJob> leased = client().LeaseOne("top", "w");
  ASSERT_TRUE(leased.has_value());
  ASSERT_TRUE(FailPermanently(client(), *leased).ok());
  const v1::Job dependent = client().MustGetJob(b);
  EXPECT_EQ(dependent.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(dependent.fail_reason(), v1::FAIL_REASON_DEPENDENCY_FAILED);

  v1::EnqueueRequest unknown;
  unknown.set_queue("end");
  unknown.add_depends_on("01ARZ3NDEKTSV4RRFFQ69G5FAV");
  v1::EnqueueResponse resp;
  grpc::Status refused = client().Enqueue(unknown, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), ::testing::StartsWith("depends_on[0]"));
}

// Partitions of one node: a job waits for a job of another partition, which the node's relay
// watches in its broker and delivers (server/grpc/dependency_relay.h).
class CrossPartitionDependenciesTest : public BrokerFixture {
 protected:
  static constexpr uint32_t kPartitions = 4;
  CrossPartitionDependenciesTest() : BrokerFixture({.extra_args = {"--partitions", "4"}}) {}

  static std::string QueueIn(uint32_t partition, const std::string& prefix) {
    return QueueInPartition(partition, kPartitions, prefix);
  }
  std::string EnqueueAfter(const std::string& queue, const std::vector<std::string>& deps) {
    v1::EnqueueRequest request;
    request.set_queue(queue);
    request.set_payload("after");
    for (const std::string& id : deps) request.add_depends_on(id);
    return client().MustEnqueue(request);
  }
  v1::JobState StateOf(const std::string& id) { return client().MustGetJob(id).state(); }
};

TEST_F(CrossPartitionDependenciesTest, AJobIsReleasedOnceWithTheResultAcrossAKill9) {
  const std::string top = QueueIn(1, "top");
  const std::string end = QueueIn(3, "end");
  const std::string dep = client().MustEnqueue(top, "d");
  const std::string local = client().MustEnqueue(end, "l");
  const std::string after = EnqueueAfter(end, {dep, local});
  EXPECT_EQ(StateOf(after), v1::JOB_STATE_WAITING);

  Kill9AndRestart();
  std::optional<v1::LeasedJob> leased = client().LeaseOne(top, "w");
  ASSERT_TRUE(leased.has_value());
  client().MustAck(*leased, "from partition 1");
  std::optional<v1::LeasedJob> own = client().LeaseOne(end, "w");
  ASSERT_TRUE(own.has_value());
  ASSERT_EQ(own->job_id(), local) << "the dependent waits";
  client().MustAck(*own, "local");
  ASSERT_TRUE(WaitFor([&] { return StateOf(after) == v1::JOB_STATE_READY; }))
      << "still " << v1::JobState_Name(StateOf(after));
  std::optional<v1::LeasedJob> released = client().LeaseOne(end, "w");
  ASSERT_TRUE(released.has_value());
  EXPECT_EQ(released->job_id(), after);
  EXPECT_EQ(released->dependency_results().at(dep), "from partition 1");
  EXPECT_EQ(released->dependency_results().at(local), "local");
  Kill9AndRestart();
  EXPECT_FALSE(client().LeaseOne(end, "w").has_value()) << "released once";
}

TEST_F(CrossPartitionDependenciesTest,
       AFailureAcrossPartitionsFailsTheDependentAndAnUnknownIdIsRefused) {
  const std::string top = QueueIn(0, "top");
  const std::string end = QueueIn(2, "end");
  const std::string dep = client().MustEnqueue(top, "d");
  const std::string after = EnqueueAfter(end, {dep});
  const std::string cancelled = client().MustEnqueue(top, "c");
  const std::string after_cancelled = EnqueueAfter(end, {cancelled});
  v1::Job cancelled_job;
  ASSERT_TRUE(client().CancelJob(cancelled, &cancelled_job).ok());
  std::optional<v1::LeasedJob> leased = client().LeaseOne(top, "w");
  ASSERT_TRUE(leased.has_value());
  ASSERT_TRUE(FailPermanently(client(), *leased).ok());
  for (const std::string& id : {after, after_cancelled}) {
    ASSERT_TRUE(WaitFor([&] { return StateOf(id) == v1::JOB_STATE_FAILED; })) << id;
    EXPECT_EQ(client().MustGetJob(id).fail_reason(), v1::FAIL_REASON_DEPENDENCY_FAILED);
  }

  // An id of another partition's form that no job has: refused, naming it.
  std::string made_up = dep;
  made_up.back() = made_up.back() == 'A' ? 'B' : 'A';
  v1::EnqueueRequest unknown;
  unknown.set_queue(end);
  unknown.add_depends_on(made_up);
  v1::EnqueueResponse resp;
  grpc::Status refused = client().Enqueue(unknown, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), absl::StrCat("depends_on[0]: no job ", made_up));
}

}  // namespace
}  // namespace jobbroker::testing
