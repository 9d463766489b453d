// Limits in time that a job carries: the run-time limit of an attempt (timeout), snoozing (a
// Release with a delay), and expiry of a job that did not start in time. All on the fake clock.
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/recording_sink.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {
namespace {

using ::jobbroker::testing::RecordingSink;
using ::jobbroker::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class BrokerTimeLimitsTest : public BrokerFixture {
 protected:
  std::string EnqueueSpecOk(EnqueueSpec spec) {
    auto r = broker_->Enqueue(std::move(spec));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id : "";
  }
  absl::Status Heartbeat(const LeasedJob& j) {
    return broker_->Heartbeat(HeartbeatSpec{j.job_id, j.lease_id}).status();
  }
  absl::Status Snooze(const LeasedJob& j, absl::Duration delay) {
    return broker_->Release(ReleaseSpec{j.job_id, j.lease_id, delay});
  }
  void SetPolicy(const std::string& queue, PolicyOverride p) {
    auto r = broker_->UpdateQueuePolicy(queue, p);
    ASSERT_TRUE(r.ok()) << r.status();
  }
};

// --- Run-time limit ------------------------------------------------------------------------

TEST_F(BrokerTimeLimitsTest, AnAttemptStillRunningAtItsTimeoutEndsTimedOutEvenWhileHeartbeating) {
  const std::string id =
      EnqueueSpecOk({.queue = "q", .payload = "p", .timeout = absl::Seconds(60)});
  LeasedJob leased = LeaseOne("q", "w1", absl::Seconds(10));
  EXPECT_EQ(leased.timeout_at, kStart + absl::Seconds(60));
  // Heartbeats keep the lease alive, but never past the limit.
  for (int i = 0; i < 6; ++i) {
    clock_.Advance(absl::Seconds(9));
    ASSERT_TRUE(Heartbeat(leased).ok());
  }
  clock_.Advance(absl::Seconds(5));  // t = 59 s: still within the limit
  broker_->Tick();
  EXPECT_EQ(Get(id).state, JobState::kActive);
  clock_.Advance(absl::Seconds(1));  // t = 60 s
  broker_->Tick();
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kScheduled) << "a timed-out attempt is retried after a backoff";
  ASSERT_EQ(job.attempts.size(), 1u);
  EXPECT_EQ(job.attempts[0].outcome, AttemptOutcome::kTimedOut);
  EXPECT_EQ(job.attempts[0].ended_at, kStart + absl::Seconds(60));
  EXPECT_THAT(job.last_error, HasSubstr("timed out"));
  EXPECT_THAT(Heartbeat(leased), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("timed out at its run-time limit")));
  EXPECT_THAT(broker_->Ack(AckSpec{leased.job_id, leased.lease_id, "late"}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("timed out")))
      << "unlike a lease that ran out, a timed-out attempt's late ack is not salvaged";
  EXPECT_THAT(Fail(leased, "too late").status(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(BrokerTimeLimitsTest, ATimeoutIsAFailedAttemptThatUsesUpTheAttemptLimit) {
  const std::string id =
      EnqueueSpecOk({.queue = "q", .payload = "p", .max_attempts = 2, .timeout = absl::Seconds(5)});
  for (int attempt = 1; attempt <= 2; ++attempt) {
    LeasedJob leased = LeaseOne("q", "w1", absl::Minutes(1));
    EXPECT_EQ(leased.attempt, attempt);
    clock_.Advance(absl::Seconds(5));
    broker_->Tick();
    clock_.Advance(absl::Minutes(10));  // past any backoff
    broker_->Tick();
  }
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.fail_reason, FailReason::kAttemptsExhausted);
  ASSERT_EQ(job.attempts.size(), 2u);
  EXPECT_EQ(job.attempts[1].outcome, AttemptOutcome::kTimedOut);
}

TEST_F(BrokerTimeLimitsTest, TheQueuesTimeoutAppliesUnlessTheJobNamesItsOwn) {
  SetPolicy("q", PolicyOverride{.timeout = absl::Seconds(30)});
  EnqueueSpecOk({.queue = "q", .payload = "queue's"});
  EnqueueSpecOk({.queue = "q", .payload = "own", .timeout = absl::Seconds(5)});
  LeasedJob first = LeaseOne("q");
  LeasedJob second = LeaseOne("q");
  EXPECT_EQ(first.timeout_at, kStart + absl::Seconds(30));
  EXPECT_EQ(second.timeout_at, kStart + absl::Seconds(5));
  // No limit at all: the attempt runs as long as its heartbeats keep it.
  EnqueueSpecOk({.queue = "free", .payload = "p"});
  EXPECT_EQ(LeaseOne("free").timeout_at, absl::InfiniteFuture());
}

TEST_F(BrokerTimeLimitsTest, AStreamIsToldAtOnceThatItsAttemptTimedOut) {
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(broker_->Subscribe(SubscribeSpec{{"q"}, "w1", 4, absl::Minutes(5)}, sink).ok());
  const std::string id = EnqueueSpecOk({.queue = "q", .payload = "p", .timeout = absl::Seconds(2)});
  ASSERT_EQ(sink->jobs().size(), 1u);
  clock_.Advance(absl::Seconds(2));
  broker_->Tick();
  EXPECT_THAT(sink->lost(), ElementsAre(id));
  EXPECT_THAT(sink->lost_outcomes(), ElementsAre(AttemptOutcome::kTimedOut));
}

TEST_F(BrokerTimeLimitsTest, ALeaseThatRunsOutBeforeTheLimitIsStillALeaseExpiry) {
  EnqueueSpecOk({.queue = "q", .payload = "p", .timeout = absl::Minutes(5)});
  LeasedJob leased = LeaseOne("q", "w1", absl::Seconds(10));
  clock_.Advance(absl::Seconds(10));
  broker_->Tick();
  Job job = Get(leased.job_id);
  ASSERT_EQ(job.attempts.size(), 1u);
  EXPECT_EQ(job.attempts[0].outcome, AttemptOutcome::kLeaseExpired);
}

TEST_F(BrokerTimeLimitsTest, AnAttemptThatTimedOutWhileTheBrokerWasDownEndsTimedOutAtRecovery) {
  const std::string id = EnqueueSpecOk({.queue = "q", .payload = "p", .timeout = absl::Seconds(3)});
  LeaseOne("q", "w1", absl::Minutes(1));
  clock_.Advance(absl::Seconds(20));
  Reopen();
  Job job = Get(id);
  ASSERT_EQ(job.attempts.size(), 1u);
  EXPECT_EQ(job.attempts[0].outcome, AttemptOutcome::kTimedOut);
  EXPECT_EQ(job.attempts[0].ended_at, kStart + absl::Seconds(3));
}

// --- Snooze ----------------------------------------------------------------------------------

TEST_F(BrokerTimeLimitsTest, ASnoozeBringsTheJobBackLaterWithoutSpendingAnAttempt) {
  const std::string id = EnqueueSpecOk({.queue = "q", .payload = "p", .max_attempts = 1});
  LeasedJob first = LeaseOne("q");
  ASSERT_TRUE(Snooze(first, absl::Seconds(30)).ok());
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kScheduled);
  EXPECT_EQ(job.run_at, kStart + absl::Seconds(30));
  EXPECT_EQ(job.snoozes, 1);
  EXPECT_EQ(job.attempt, 0);
  ASSERT_EQ(job.attempts.size(), 1u) << "the snooze shows in the history";
  EXPECT_EQ(job.attempts[0].outcome, AttemptOutcome::kSnoozed);
  EXPECT_EQ(Leasable("q"), 0u);
  clock_.Advance(absl::Seconds(30));
  LeasedJob second = LeaseOne("q");
  EXPECT_EQ(second.attempt, 1) << "the snooze did not count: max_attempts 1 still allows a run";
  ASSERT_TRUE(broker_->Ack(AckSpec{second.job_id, second.lease_id, ""}).ok());
  EXPECT_EQ(Get(id).state, JobState::kCompleted);
  EXPECT_THAT(Snooze(first, absl::Seconds(1)), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(BrokerTimeLimitsTest, OneSnoozeMoreThanTheQueuesMaxSnoozesFailsTheJob) {
  SetPolicy("q", PolicyOverride{.max_snoozes = 2});
  const std::string id = EnqueueSpecOk({.queue = "q", .payload = "p"});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Snooze(LeaseOne("q"), absl::Seconds(1)).ok());
    clock_.Advance(absl::Seconds(1));
  }
  broker_->Tick();
  EXPECT_EQ(Get(id).state, JobState::kReady);
  ASSERT_TRUE(Snooze(LeaseOne("q"), absl::Seconds(1)).ok());
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.fail_reason, FailReason::kSnoozeLimit);
  EXPECT_EQ(job.snoozes, 3);
  EXPECT_THAT(job.last_error, HasSubstr("max_snoozes"));
}

TEST_F(BrokerTimeLimitsTest, AReleaseWithoutDelayIsNoSnooze) {
  const std::string id = EnqueueSpecOk({.queue = "q", .payload = "p"});
  LeasedJob leased = LeaseOne("q");
  ASSERT_TRUE(broker_->Release(ReleaseSpec{leased.job_id, leased.lease_id, std::nullopt}).ok());
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kReady);
  EXPECT_EQ(job.snoozes, 0);
}

TEST_F(BrokerTimeLimitsTest, ANegativeOrTooLongSnoozeIsRefusedAndChangesNothing) {
  EnqueueSpecOk({.queue = "q", .payload = "p"});
  LeasedJob leased = LeaseOne("q");
  EXPECT_THAT(Snooze(leased, absl::Seconds(-1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("delay")));
  EXPECT_THAT(Snooze(leased, absl::Hours(24 * 31)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("delay")));
  EXPECT_EQ(Get(leased.job_id).state, JobState::kActive);
}

// --- Expiry ----------------------------------------------------------------------------------

TEST_F(BrokerTimeLimitsTest, ADelayedJobNotStartedByItsExpireAtFailsExpired) {
  const std::string id = EnqueueSpecOk({.queue = "q",
                                        .payload = "p",
                                        .delay = absl::Minutes(1),
                                        .expire_at = kStart + absl::Minutes(5)});
  SetPolicy("q", PolicyOverride{.paused = true});  // nobody leases it in time
  clock_.Advance(absl::Minutes(1));
  broker_->Tick();
  EXPECT_EQ(Get(id).state, JobState::kReady);
  clock_.Advance(absl::Minutes(4));
  broker_->Tick();
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.fail_reason, FailReason::kExpired);
  EXPECT_EQ(job.completed_at, kStart + absl::Minutes(5));
  SetPolicy("q", PolicyOverride{.paused = false});
  EXPECT_EQ(Leasable("q"), 0u);
}

TEST_F(BrokerTimeLimitsTest, AJobInBackoffPastItsExpireAtDoesNotStartAgain) {
  const std::string id = EnqueueSpecOk(
      {.queue = "q", .payload = "p", .max_attempts = 5, .expire_at = kStart + absl::Seconds(10)});
  LeasedJob leased = LeaseOne("q");
  ASSERT_TRUE(
      broker_->Fail(FailSpec{leased.job_id, leased.lease_id, "boom", false, absl::Seconds(30)})
          .ok());
  clock_.Advance(absl::Seconds(30));
  EXPECT_EQ(Leasable("q"), 0u);
  EXPECT_EQ(Get(id).fail_reason, FailReason::kExpired);
}

TEST_F(BrokerTimeLimitsTest, AnExpireAtThatLeavesTheJobNoTimeToStartIsRefused) {
  EXPECT_THAT(broker_->Enqueue({.queue = "q", .payload = "p", .expire_at = kStart}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expire_at")));
  EXPECT_THAT(broker_
                  ->Enqueue({.queue = "q",
                             .payload = "p",
                             .delay = absl::Minutes(2),
                             .expire_at = kStart + absl::Minutes(1)})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expire_at")));
  EXPECT_THAT(broker_->GetQueue("q").status(), StatusIs(absl::StatusCode::kNotFound))
      << "a refused enqueue creates nothing";
}

TEST_F(BrokerTimeLimitsTest, ExpiryHoldsAcrossARestart) {
  const std::string id = EnqueueSpecOk({.queue = "q",
                                        .payload = "p",
                                        .delay = absl::Minutes(1),
                                        .expire_at = kStart + absl::Minutes(2)});
  Reopen();
  clock_.Advance(absl::Minutes(3));
  broker_->Tick();
  EXPECT_EQ(Get(id).fail_reason, FailReason::kExpired);
}

TEST_F(BrokerTimeLimitsTest, AnOperatorsRetryLiftsTheExpiryAndTheSnoozes) {
  const std::string id =
      EnqueueSpecOk({.queue = "q", .payload = "p", .expire_at = kStart + absl::Seconds(1)});
  clock_.Advance(absl::Seconds(1));
  broker_->Tick();
  ASSERT_EQ(Get(id).state, JobState::kFailed);
  ASSERT_TRUE(broker_->RetryJob(id).ok());
  clock_.Advance(absl::Hours(1));
  broker_->Tick();
  EXPECT_EQ(LeaseOne("q").job_id, id);
}

TEST_F(BrokerTimeLimitsTest, TimeoutBoundsAreChecked) {
  EXPECT_THAT(
      broker_->Enqueue({.queue = "q", .payload = "p", .timeout = absl::Seconds(-1)}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
  EXPECT_THAT(
      broker_->Enqueue({.queue = "q", .payload = "p", .timeout = absl::Milliseconds(10)}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
  EXPECT_THAT(
      broker_->UpdateQueuePolicy("q", PolicyOverride{.timeout = absl::Hours(24 * 31)}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.timeout")));
  EXPECT_THAT(broker_->UpdateQueuePolicy("q", PolicyOverride{.max_snoozes = -1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.max_snoozes")));
}

}  // namespace
}  // namespace jobbroker::core
