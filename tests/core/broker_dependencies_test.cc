// Jobs that wait for other jobs: WAITING until every dependency completed, then READY with their
// results; FAILED (DEPENDENCY_FAILED) down the graph when one fails, is cancelled or removed;
// whole graphs in one batch (depends_on_index), refused cycles and unknown ids, and restarts.
#include <string>
#include <vector>

#include "core/ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {
namespace {

using ::jobbroker::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

class BrokerDependenciesTest : public BrokerFixture {
 protected:
  std::string EnqueueAfter(const std::string& queue, std::vector<std::string> deps,
                           const std::string& payload = "p") {
    auto r = broker_->Enqueue(
        EnqueueSpec{.queue = queue, .payload = payload, .depends_on = std::move(deps)});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id : "";
  }
  // Leases `id` (the only ready job of its queue) and acks it with `result`.
  void Complete(const std::string& queue, const std::string& id, const std::string& result) {
    LeasedJob j = LeaseOne(queue);
    ASSERT_EQ(j.job_id, id);
    ASSERT_TRUE(broker_->Ack(AckSpec{j.job_id, j.lease_id, result}).ok());
  }
  JobState StateOf(const std::string& id) { return Get(id).state; }
};

TEST_F(BrokerDependenciesTest, ADependentListsTheJobsThatWaitForItAlsoAfterARestart) {
  const std::string a = Enqueue("top");
  const std::string b = EnqueueAfter("mid", {a});
  const std::string c = EnqueueAfter("mid", {a});
  const std::string d = EnqueueAfter("end", {b});
  EXPECT_THAT(Get(a).dependents, ElementsAre(std::min(b, c), std::max(b, c)));
  EXPECT_THAT(Get(b).dependents, ElementsAre(d));
  EXPECT_THAT(Get(d).dependents, IsEmpty());
  Complete("top", a, "");
  Reopen();
  EXPECT_THAT(Get(a).dependents, ElementsAre(std::min(b, c), std::max(b, c)))
      << "kept after a released them, rebuilt at recovery";
  ASSERT_TRUE(broker_->CancelJob(d).ok());
  ASSERT_TRUE(broker_->DeleteJob(d).ok());
  EXPECT_THAT(Get(b).dependents, IsEmpty()) << "a removed dependent is no longer listed";
}

TEST_F(BrokerDependenciesTest, RetentionHoldsBackWhatAWaitingFanInNeedsThenRemovesIt) {
  queue_policies_["work"].completed_max_count = 2;
  Reopen();
  std::vector<std::string> parts;
  for (int i = 0; i < 6; ++i) parts.push_back(Enqueue("work", absl::StrCat("part-", i)));
  const std::string join = EnqueueAfter("join", parts);
  const std::string other = Enqueue("work", "not a dependency");
  for (int i = 0; i < 5; ++i) {
    LeasedJob leased = LeaseOne("work");
    ASSERT_TRUE(broker_->Ack(AckSpec{leased.job_id, leased.lease_id, absl::StrCat("r", i)}).ok());
    broker_->Tick();  // retention: the last 2 completed, but the join still needs these
  }
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(broker_->GetJob(parts[i]).ok()) << "part " << i;
  Reopen();
  broker_->Tick();
  EXPECT_TRUE(broker_->GetJob(parts[0]).ok()) << "held back after a restart too";
  LeasedJob last = LeaseOne("work");
  ASSERT_EQ(last.job_id, parts[5]);
  ASSERT_TRUE(broker_->Ack(AckSpec{last.job_id, last.lease_id, "r5"}).ok());
  EXPECT_EQ(StateOf(join), JobState::kReady);
  EXPECT_EQ(LeaseOne("join").dependency_results.size(), 6u);

  // Released: the parts are retention's again, and the queue keeps its last 2 completed.
  LeasedJob unrelated = LeaseOne("work");
  ASSERT_EQ(unrelated.job_id, other);
  ASSERT_TRUE(broker_->Ack(AckSpec{unrelated.job_id, unrelated.lease_id, ""}).ok());
  broker_->Tick();
  int kept = 0;
  for (const std::string& id : parts) kept += broker_->GetJob(id).ok() ? 1 : 0;
  EXPECT_EQ(kept, 1) << "the newest part and the unrelated job are the last 2";
  EXPECT_TRUE(broker_->GetJob(other).ok());
}

TEST_F(BrokerDependenciesTest, ADeletedDependencyLeavesItsResultWithTheWaitingJobAcrossARestart) {
  const std::string a = Enqueue("top");
  const std::string b = Enqueue("top");
  const std::string join = EnqueueAfter("end", {a, b});
  Complete("top", a, "ra");
  ASSERT_TRUE(broker_->DeleteJob(a).ok());
  Reopen();
  EXPECT_EQ(StateOf(join), JobState::kWaiting);
  Complete("top", b, "rb");
  EXPECT_THAT(LeaseOne("end").dependency_results,
              UnorderedElementsAre(Pair(a, "ra"), Pair(b, "rb")));
}

// Jobs of another partition: this broker is partition 0 of 2 and cannot see them; the node's
// relay (server/grpc/dependency_relay.h) delivers their outcomes through SettleRemoteJobs.
class RemoteDependenciesTest : public BrokerDependenciesTest {
 protected:
  void SetUp() override {}  // Open after choosing the partition count
  void OpenAsPartition0Of2() {
    broker_.reset();
    BrokerOptions options = Options();
    options.partition_count = 2;
    auto opened = BlockingBroker::Open(store_, clock_, std::move(options));
    ASSERT_TRUE(opened.ok()) << opened.status();
    broker_ = std::move(*opened);
  }
  std::string OtherPartitionsJob() { return NewJobId(clock_.Now(), 1, gen_); }

  absl::BitGen gen_;
};

TEST_F(RemoteDependenciesTest, AnOtherPartitionsJobIsAwaitedUntilItsResultArrivesOnce) {
  OpenAsPartition0Of2();
  const std::string remote = OtherPartitionsJob();
  const std::string local = Enqueue("top");
  const std::string join = EnqueueAfter("end", {remote, local});
  EXPECT_EQ(StateOf(join), JobState::kWaiting);
  EXPECT_THAT(broker_->AwaitedRemoteJobs(), ElementsAre(remote));

  ASSERT_TRUE(broker_->SettleRemoteJobs({{.job_id = remote, .result = "rr"}}).ok());
  EXPECT_EQ(StateOf(join), JobState::kWaiting) << "the local one is left";
  EXPECT_THAT(broker_->AwaitedRemoteJobs(), IsEmpty());
  OpenAsPartition0Of2();
  EXPECT_THAT(broker_->AwaitedRemoteJobs(), IsEmpty()) << "the delivered result was stored";
  ASSERT_TRUE(broker_->SettleRemoteJobs({{.job_id = remote, .result = "again"}}).ok());

  Complete("top", local, "rl");
  LeasedJob leased = LeaseOne("end");
  EXPECT_EQ(leased.job_id, join);
  EXPECT_THAT(leased.dependency_results,
              UnorderedElementsAre(Pair(remote, "rr"), Pair(local, "rl")))
      << "a second delivery changes nothing";
  EXPECT_EQ(Leasable("end"), 0u) << "released once";
}

TEST_F(RemoteDependenciesTest, AnAwaitedJobIsAwaitedAgainAfterARestartUntilDelivered) {
  OpenAsPartition0Of2();
  const std::string remote = OtherPartitionsJob();
  const std::string join = EnqueueAfter("end", {remote});
  OpenAsPartition0Of2();
  EXPECT_EQ(StateOf(join), JobState::kWaiting);
  EXPECT_THAT(broker_->AwaitedRemoteJobs(), ElementsAre(remote));
  ASSERT_TRUE(broker_->SettleRemoteJobs({{.job_id = remote, .result = "r"}}).ok());
  EXPECT_EQ(StateOf(join), JobState::kReady);
  EXPECT_THAT(LeaseOne("end").dependency_results, ElementsAre(Pair(remote, "r")));
}

TEST_F(RemoteDependenciesTest, AFailedCancelledOrMissingJobFailsItsDependentsDownTheGraph) {
  OpenAsPartition0Of2();
  const std::string failed = OtherPartitionsJob();
  const std::string cancelled = OtherPartitionsJob();
  const std::string missing = OtherPartitionsJob();
  const std::string a = EnqueueAfter("mid", {failed});
  const std::string a_next = EnqueueAfter("end", {a});
  const std::string b = EnqueueAfter("mid", {cancelled});
  const std::string c = EnqueueAfter("mid", {missing});
  ASSERT_TRUE(broker_
                  ->SettleRemoteJobs({{.job_id = failed, .state = JobState::kFailed},
                                      {.job_id = cancelled, .state = JobState::kCancelled},
                                      {.job_id = missing, .gone = true}})
                  .ok());
  for (const std::string& id : {a, a_next, b, c}) {
    EXPECT_EQ(StateOf(id), JobState::kFailed) << id;
    EXPECT_EQ(Get(id).fail_reason, FailReason::kDependencyFailed) << id;
  }
  EXPECT_THAT(Get(a).last_error, HasSubstr(absl::StrCat(failed, " ended JOB_STATE_FAILED")));
  EXPECT_THAT(Get(b).last_error, HasSubstr(absl::StrCat(cancelled, " ended JOB_STATE_CANCELLED")));
  EXPECT_THAT(Get(c).last_error, HasSubstr(absl::StrCat(missing, " is not in partition 1")));
  EXPECT_THAT(broker_->AwaitedRemoteJobs(), IsEmpty());
}

TEST_F(RemoteDependenciesTest, NobodyAwaitsAJobWhoseDependentsWereCancelled) {
  OpenAsPartition0Of2();
  const std::string remote = OtherPartitionsJob();
  const std::string join = EnqueueAfter("end", {remote});
  ASSERT_TRUE(broker_->CancelJob(join).ok());
  EXPECT_THAT(broker_->AwaitedRemoteJobs(), IsEmpty());
  ASSERT_TRUE(broker_->SettleRemoteJobs({{.job_id = remote, .result = "late"}}).ok());
  EXPECT_EQ(StateOf(join), JobState::kCancelled);
}

TEST_F(BrokerDependenciesTest, AThreeLevelGraphRunsInOrderAndTheLastGetsItsDependenciesResults) {
  const std::string a = Enqueue("top");
  const std::string b1 = EnqueueAfter("mid", {a});
  const std::string b2 = EnqueueAfter("mid", {a});
  const std::string c = EnqueueAfter("end", {b1, b2});
  EXPECT_EQ(StateOf(b1), JobState::kWaiting);
  EXPECT_EQ(StateOf(c), JobState::kWaiting);
  EXPECT_EQ(Leasable("mid"), 0u);
  EXPECT_THAT(Get(c).depends_on, UnorderedElementsAre(b1, b2));

  Complete("top", a, "ra");
  EXPECT_EQ(StateOf(b1), JobState::kReady);
  EXPECT_EQ(StateOf(b2), JobState::kReady);
  EXPECT_EQ(StateOf(c), JobState::kWaiting);
  LeasedJob first = LeaseOne("mid");
  EXPECT_THAT(first.dependency_results, ElementsAre(Pair(a, "ra")));
  ASSERT_TRUE(broker_->Ack(AckSpec{first.job_id, first.lease_id, "r1"}).ok());
  EXPECT_EQ(StateOf(c), JobState::kWaiting) << "one of its two dependencies is left";
  LeasedJob second = LeaseOne("mid");
  ASSERT_TRUE(broker_->Ack(AckSpec{second.job_id, second.lease_id, "r2"}).ok());
  EXPECT_EQ(StateOf(c), JobState::kReady);
  LeasedJob last = LeaseOne("end");
  EXPECT_EQ(last.job_id, c);
  EXPECT_THAT(last.dependency_results,
              UnorderedElementsAre(Pair(first.job_id, "r1"), Pair(second.job_id, "r2")));
}

TEST_F(BrokerDependenciesTest, AFailureFailsEveryJobDownTheGraphAndLeavesTheOthers) {
  const std::string a = Enqueue("top");
  const std::string b1 = EnqueueAfter("mid", {a});
  const std::string b2 = EnqueueAfter("other", {a});
  const std::string c = EnqueueAfter("end", {b1, b2});
  const std::string d = EnqueueAfter("end", {c});
  Complete("top", a, "ra");
  LeasedJob leased = LeaseOne("mid");
  ASSERT_EQ(leased.job_id, b1);
  ASSERT_TRUE(Fail(leased, "boom", /*permanent=*/true).ok());
  for (const std::string& id : {c, d}) {
    Job job = Get(id);
    EXPECT_EQ(job.state, JobState::kFailed) << id;
    EXPECT_EQ(job.fail_reason, FailReason::kDependencyFailed) << id;
  }
  EXPECT_THAT(Get(c).last_error,
              HasSubstr(absl::StrCat("dependency ", b1, " ended JOB_STATE_FAILED")));
  EXPECT_THAT(Get(d).last_error,
              HasSubstr(absl::StrCat("dependency ", c, " ended JOB_STATE_FAILED")));
  EXPECT_EQ(StateOf(b2), JobState::kReady) << "a sibling is not a dependent";
  Reopen();
  EXPECT_EQ(StateOf(d), JobState::kFailed) << "stored in the failing transition";
}

TEST_F(BrokerDependenciesTest, AWholeFanOutFanInIsOneBatch) {
  std::vector<EnqueueSpec> specs;
  specs.push_back({.queue = "split", .payload = "root"});
  for (int i = 0; i < 3; ++i)
    specs.push_back(
        {.queue = "work", .payload = absl::StrCat("part-", i), .depends_on_index = {0}});
  specs.push_back({.queue = "join", .payload = "sum", .depends_on_index = {1, 2, 3}});
  auto ids = broker_->EnqueueBatch(std::move(specs));
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 5u);
  const std::string join = (*ids)[4].job_id;
  EXPECT_EQ(StateOf(join), JobState::kWaiting);
  Complete("split", (*ids)[0].job_id, "");
  for (int i = 0; i < 3; ++i) {
    LeasedJob part = LeaseOne("work");
    ASSERT_TRUE(broker_->Ack(AckSpec{part.job_id, part.lease_id, absl::StrCat(i)}).ok());
  }
  EXPECT_EQ(StateOf(join), JobState::kReady);
  EXPECT_EQ(LeaseOne("join").dependency_results.size(), 3u);
}

TEST_F(BrokerDependenciesTest,
       ACycleAnUnknownIdOrASingleEnqueueWithAnIndexIsRefusedAndChangesNothing) {
  auto self = broker_->EnqueueBatch(
      {{.queue = "q", .payload = "a"}, {.queue = "q", .payload = "b", .depends_on_index = {1}}});
  EXPECT_THAT(self, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("jobs[1].depends_on_index[0] 1 is not an earlier job")));
  auto forward = broker_->EnqueueBatch(
      {{.queue = "q", .payload = "a", .depends_on_index = {1}}, {.queue = "q", .payload = "b"}});
  EXPECT_THAT(forward, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("jobs[0].depends_on_index[0]")));
  auto unknown = broker_->Enqueue(
      EnqueueSpec{.queue = "q", .payload = "c", .depends_on = {"01ARZ3NDEKTSV4RRFFQ69G5FAV"}});
  EXPECT_THAT(unknown, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("depends_on[0]: no job 01ARZ3NDEKTSV4RRFFQ69G5FAV")));
  auto single =
      broker_->Enqueue(EnqueueSpec{.queue = "q", .payload = "d", .depends_on_index = {0}});
  EXPECT_THAT(single, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("depends_on_index")));
  EXPECT_THAT(broker_->ListQueues(), IsEmpty()) << "a refused enqueue creates nothing";
}

TEST_F(BrokerDependenciesTest, WaitingSurvivesARestartAndIsReleasedOnce) {
  const std::string a = Enqueue("top");
  const std::string b = Enqueue("top");
  const std::string c = EnqueueAfter("end", {a, b});
  Complete("top", a, "ra");
  Reopen();
  EXPECT_EQ(StateOf(c), JobState::kWaiting) << "b has not completed";
  Complete("top", b, "rb");
  EXPECT_EQ(StateOf(c), JobState::kReady);
  Reopen();
  LeasedJob leased = LeaseOne("end");
  EXPECT_EQ(leased.job_id, c);
  EXPECT_THAT(leased.dependency_results, UnorderedElementsAre(Pair(a, "ra"), Pair(b, "rb")));
  EXPECT_EQ(Leasable("end"), 0u) << "released once";
}

TEST_F(BrokerDependenciesTest,
       CancellingOrDeletingADependencyFailsItsDependentsCancellingOneDoesNot) {
  const std::string a = Enqueue("top");
  const std::string b = EnqueueAfter("end", {a});
  const std::string x = Enqueue("top");
  const std::string y = EnqueueAfter("end", {x});
  ASSERT_TRUE(broker_->CancelJob(b).ok());
  EXPECT_EQ(StateOf(b), JobState::kCancelled) << "a WAITING job is cancelled at once";
  ASSERT_TRUE(broker_->CancelJob(a).ok());
  ASSERT_TRUE(broker_->DeleteJob(x).ok());
  Job failed = Get(y);
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_THAT(failed.last_error, HasSubstr("was removed before it completed"));
}

TEST_F(BrokerDependenciesTest, DependingOnAnEndedJobIsSettledAtEnqueue) {
  const std::string done = Enqueue("top");
  Complete("top", done, "42");
  const std::string dead = Enqueue("top");
  ASSERT_TRUE(Fail(LeaseOne("top"), "no", /*permanent=*/true).ok());
  const std::string after_done = EnqueueAfter("end", {done});
  EXPECT_EQ(StateOf(after_done), JobState::kReady);
  EXPECT_THAT(LeaseOne("end").dependency_results, ElementsAre(Pair(done, "42")));
  const std::string after_dead = EnqueueAfter("end", {dead, done});
  EXPECT_EQ(Get(after_dead).fail_reason, FailReason::kDependencyFailed);
}

}  // namespace
}  // namespace jobbroker::core
