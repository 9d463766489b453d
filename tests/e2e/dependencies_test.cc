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

namespace jobbroker::testing {
namespace {

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
  v1::FailRequest fail;
  fail.set_job_id(leased->job_id());
  fail.set_lease_id(leased->lease_id());
  fail.set_error("no");
  fail.set_permanent(true);
  v1::FailResponse failed;
  ASSERT_TRUE(client().Fail(fail, &failed).ok());
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

}  // namespace
}  // namespace jobbroker::testing
