// Restarts: a new Broker over the same store must see exactly what the old one acknowledged.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::StatusIs;

namespace {

using Code = absl::StatusCode;

class BrokerRecoveryTest : public BrokerFixture {};

TEST_F(BrokerRecoveryTest, JobsAndTheirOrderSurviveARestart) {
  std::string a = Enqueue("q", "a");
  std::string b = Enqueue("q", "b", /*priority=*/1);
  Reopen();
  std::string c = Enqueue("q", "c", /*priority=*/1);
  EXPECT_EQ(LeaseOne("q").job_id, b);
  EXPECT_EQ(LeaseOne("q").job_id, c) << "sequence numbers continue after a restart";
  EXPECT_EQ(LeaseOne("q").job_id, a);
}

TEST_F(BrokerRecoveryTest, LeaseThatRanOutWhileDownIsAFailedAttemptWithItsCheckpoint) {
  default_policy_.jitter = Jitter::kNone;
  std::string id = Enqueue("q");
  Reopen();
  LeasedJob first = LeaseOne("q", "w", absl::Seconds(1));
  ASSERT_TRUE(
      broker_->Heartbeat(HeartbeatSpec{id, first.lease_id, absl::ZeroDuration(), "row 500"}).ok());
  broker_.reset();  // the broker "crashes" with the lease held
  clock_.Advance(absl::Minutes(5));
  Reopen();
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kScheduled);
  EXPECT_EQ(job.attempts.at(0).outcome, AttemptOutcome::kLeaseExpired);
  EXPECT_EQ(job.attempts.at(0).ended_at, first.lease_deadline);
  // The expiry itself was persisted: a second restart does not count it again.
  Reopen();
  EXPECT_EQ(Get(id).attempts.size(), 1u);
  clock_.Advance(absl::Seconds(1));
  LeasedJob second = LeaseOne("q");
  EXPECT_EQ(second.attempt, 2);
  EXPECT_EQ(second.checkpoint, "row 500");
  EXPECT_THAT(broker_->Ack(AckSpec{id, first.lease_id, ""}), StatusIs(Code::kFailedPrecondition));
}

TEST_F(BrokerRecoveryTest, LiveLeaseSurvivesARestartAndCanBeAcked) {
  std::string id = Enqueue("q");
  LeasedJob j = LeaseOne("q", "w", absl::Minutes(5));
  Reopen();
  EXPECT_EQ(Get(id).state, JobState::kActive);
  EXPECT_EQ(Leasable("q"), 0u);
  EXPECT_TRUE(broker_->Ack(AckSpec{id, j.lease_id, "ok"}).ok());
  Reopen();
  EXPECT_EQ(Get(id).state, JobState::kCompleted);
  EXPECT_EQ(Get(id).result, "ok");
}

TEST_F(BrokerRecoveryTest, ScheduledJobsComeDueAfterARestart) {
  EnqueueSpec s{.queue = "q"};
  s.delay = absl::Seconds(10);
  std::string id = broker_->Enqueue(s)->job_id;
  clock_.Advance(absl::Seconds(11));
  Reopen();
  EXPECT_EQ(LeaseOne("q").job_id, id);
}

TEST_F(BrokerRecoveryTest, RunTimePolicyAndDedupKeysSurviveARestart) {
  PolicyOverride p;
  p.max_concurrency = 1;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());
  EnqueueSpec s{.queue = "q", .payload = "p"};
  s.dedup_key = "k";
  std::string id = broker_->Enqueue(s)->job_id;
  Reopen();
  EXPECT_EQ(broker_->GetQueue("q")->policy.max_concurrency, 1);
  auto again = broker_->Enqueue(s);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->deduplicated);
  EXPECT_EQ(again->job_id, id);
}

TEST_F(BrokerRecoveryTest, ConfigPoliciesAreLayeredUnderRunTimeChanges) {
  queue_policies_["q"].max_concurrency = 3;
  queue_policies_["q"].max_attempts = 7;
  Reopen();
  EXPECT_EQ(broker_->GetQueue("q")->policy.max_concurrency, 3) << "config queues exist at start";
  PolicyOverride p;
  p.max_concurrency = 9;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());
  Reopen();
  QueuePolicy effective = broker_->GetQueue("q")->policy;
  EXPECT_EQ(effective.max_concurrency, 9);
  EXPECT_EQ(effective.retry.max_attempts, 7);
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", {}, /*reset=*/true).ok());
  EXPECT_EQ(broker_->GetQueue("q")->policy.max_concurrency, 3);
}

TEST_F(BrokerRecoveryTest, BadConfigPolicyRefusesToOpenNamingTheField) {
  queue_policies_["q"].max_attempts = 0;
  auto r = BlockingBroker::Open(store_, clock_, Options());
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("queues[\"q\"].retry.max_attempts"));
}

}  // namespace
}  // namespace jobbroker::core
