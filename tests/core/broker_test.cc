#include "core/broker.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Code = absl::StatusCode;

class BrokerTest : public BrokerFixture {};

TEST_F(BrokerTest, EnqueueLeaseAckCompletesTheJob) {
  std::string id = Enqueue("emails", "hello");
  EXPECT_EQ(Get(id).state, JobState::kReady);

  LeasedJob j = LeaseOne("emails", "worker-a");
  EXPECT_EQ(j.job_id, id);
  EXPECT_EQ(j.payload, "hello");
  EXPECT_EQ(j.attempt, 1);
  EXPECT_EQ(j.max_attempts, 5);
  EXPECT_EQ(j.idempotency_key, id);
  EXPECT_EQ(j.lease_deadline, clock_.Now() + absl::Seconds(30));
  EXPECT_EQ(Get(id).state, JobState::kActive);

  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(broker_->Ack(AckSpec{id, j.lease_id, "sent"}).ok());
  Job done = Get(id);
  EXPECT_EQ(done.state, JobState::kCompleted);
  EXPECT_EQ(done.result, "sent");
  EXPECT_EQ(done.completed_at, clock_.Now());
  ASSERT_EQ(done.attempts.size(), 1u);
  EXPECT_EQ(done.attempts[0].outcome, AttemptOutcome::kCompleted);
  EXPECT_EQ(done.attempts[0].worker_id, "worker-a");
  EXPECT_EQ(done.attempts[0].ended_at - done.attempts[0].started_at, absl::Seconds(2));
  EXPECT_EQ(Leasable("emails"), 0u);
}

TEST_F(BrokerTest, HigherPriorityFirstThenFifo) {
  std::string low1 = Enqueue("q", "low1", 0);
  std::string high = Enqueue("q", "high", 5);
  std::string low2 = Enqueue("q", "low2", 0);
  std::string mid = Enqueue("q", "mid", 1);
  auto r = broker_->Lease(LeaseSpec{"q", "w", 10, absl::ZeroDuration()});
  ASSERT_TRUE(r.ok());
  std::vector<std::string> order;
  for (const LeasedJob& j : *r) order.push_back(j.job_id);
  EXPECT_THAT(order, ElementsAre(high, mid, low1, low2));
}

TEST_F(BrokerTest, DelayedJobWaitsForItsTime) {
  EnqueueSpec delayed{.queue = "q", .payload = "d"};
  delayed.delay = absl::Seconds(10);
  auto id = broker_->Enqueue(delayed);
  ASSERT_TRUE(id.ok());
  EnqueueSpec at{.queue = "q", .payload = "a"};
  at.run_at = clock_.Now() + absl::Seconds(20);
  auto id2 = broker_->Enqueue(at);
  ASSERT_TRUE(id2.ok());
  EXPECT_EQ(Get(id->job_id).state, JobState::kScheduled);

  clock_.Advance(absl::Seconds(9));
  EXPECT_EQ(Leasable("q"), 0u);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(LeaseOne("q").job_id, id->job_id);
  EXPECT_EQ(Leasable("q"), 0u);
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(LeaseOne("q").job_id, id2->job_id);
}

TEST_F(BrokerTest, RunAtInThePastIsReadyAtOnce) {
  EnqueueSpec s{.queue = "q"};
  s.run_at = clock_.Now() - absl::Hours(1);
  ASSERT_TRUE(broker_->Enqueue(s).ok());
  EXPECT_EQ(Leasable("q"), 1u);
}

TEST_F(BrokerTest, FailRetriesAfterExponentialBackoff) {
  default_policy_.jitter = Jitter::kNone;
  Reopen();
  std::string id = Enqueue("q");
  absl::Duration expected[] = {absl::Seconds(1), absl::Seconds(2), absl::Seconds(4),
                               absl::Seconds(8)};
  for (int attempt = 1; attempt <= 4; ++attempt) {
    LeasedJob j = LeaseOne("q");
    EXPECT_EQ(j.attempt, attempt);
    auto r = Fail(j, "boom");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state, JobState::kScheduled);
    EXPECT_EQ(r->next_attempt_at, clock_.Now() + expected[attempt - 1]);
    clock_.Advance(expected[attempt - 1] - absl::Milliseconds(1));
    EXPECT_EQ(Leasable("q"), 0u) << "leased before its backoff ended, attempt " << attempt;
    clock_.Advance(absl::Milliseconds(1));
  }
  Job job = Get(id);
  EXPECT_EQ(job.attempt, 4);
  EXPECT_EQ(job.last_error, "boom");
  ASSERT_EQ(job.attempts.size(), 4u);
  EXPECT_EQ(job.attempts[3].outcome, AttemptOutcome::kError);
}

TEST_F(BrokerTest, JitterModesScaleTheBackoff) {
  struct Case {
    Jitter jitter;
    double uniform;
    absl::Duration wait;
  } cases[] = {
      {Jitter::kNone, 0.25, absl::Seconds(1)},
      {Jitter::kFull, 0.25, absl::Milliseconds(250)},
      {Jitter::kEqual, 0.25, absl::Milliseconds(625)},
  };
  for (const Case& c : cases) {
    PolicyOverride p;
    p.jitter = c.jitter;
    std::string queue = absl::StrCat("q", static_cast<int>(c.jitter));
    ASSERT_TRUE(broker_->UpdateQueuePolicy(queue, p).ok());
    uniform_ = c.uniform;
    Enqueue(queue);
    auto r = Fail(LeaseOne(queue), "x");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->next_attempt_at - clock_.Now(), c.wait) << queue;
  }
}

TEST_F(BrokerTest, RetryAfterReplacesTheBackoff) {
  Enqueue("q");
  LeasedJob j = LeaseOne("q");
  auto r = broker_->Fail(FailSpec{j.job_id, j.lease_id, "429", false, absl::Seconds(42)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->next_attempt_at, clock_.Now() + absl::Seconds(42));
}

TEST_F(BrokerTest, AFailDueAtOnceAnswersReadyEvenWhenAWaitingLeaseTakesTheJob) {
  std::string id = Enqueue("q");
  LeasedJob first = LeaseOne("q");
  std::vector<LeasedJob> taken;
  broker_->Lease(LeaseSpec{.queue = "q", .worker_id = "w2", .max_jobs = 1}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) {
                   ASSERT_TRUE(r.ok()) << r.status();
                   taken = *std::move(r);
                 });
  auto r = broker_->Fail(FailSpec{first.job_id, first.lease_id, "e", false, absl::ZeroDuration()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, JobState::kReady) << "what the Fail did, not what the next lease did";
  EXPECT_EQ(r->next_attempt_at, clock_.Now());
  ASSERT_EQ(taken.size(), 1u) << "the waiting lease got the job in the same transition";
  EXPECT_EQ(taken[0].job_id, id);
  EXPECT_EQ(taken[0].attempt, 2);
}

TEST_F(BrokerTest, JobQueueNamesTheQueueOfAKnownJobOnly) {
  std::string id = Enqueue("billing.eu");
  EXPECT_EQ(broker_->JobQueue(id).value_or(""), "billing.eu");
  EXPECT_THAT(broker_->JobQueue("nope"), StatusIs(Code::kNotFound));
  EXPECT_THAT(broker_->JobQueue(""), StatusIs(Code::kInvalidArgument));
}

TEST_F(BrokerTest, LastAttemptFailingKillsTheJob) {
  EnqueueSpec s{.queue = "q", .payload = "p"};
  s.max_attempts = 2;
  std::string id = broker_->Enqueue(s)->job_id;
  ASSERT_TRUE(Fail(LeaseOne("q"), "first").ok());
  clock_.Advance(absl::Minutes(10));
  auto r = Fail(LeaseOne("q"), "second");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, JobState::kFailed);
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.fail_reason, FailReason::kAttemptsExhausted);
  EXPECT_EQ(job.last_error, "second");
  EXPECT_EQ(Leasable("q"), 0u);
}

TEST_F(BrokerTest, PermanentFailureSkipsRetries) {
  std::string id = Enqueue("q");
  auto r = Fail(LeaseOne("q"), "bad address", /*permanent=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, JobState::kFailed);
  Job job = Get(id);
  EXPECT_EQ(job.fail_reason, FailReason::kPermanent);
  EXPECT_EQ(job.attempt, 1);
  EXPECT_EQ(job.attempts[0].outcome, AttemptOutcome::kPermanentError);
  EXPECT_EQ(job.attempts[0].error, "bad address");
}

TEST_F(BrokerTest, ErrorTextAndHistoryAreBounded) {
  EnqueueSpec s{.queue = "q"};
  s.max_attempts = 40;
  std::string id = broker_->Enqueue(s)->job_id;
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(Fail(LeaseOne("q"), std::string(10000, 'e')).ok());
    clock_.Advance(absl::Hours(1));
  }
  Job job = Get(id);
  EXPECT_EQ(job.attempts.size(), static_cast<size_t>(kMaxAttemptHistory));
  EXPECT_EQ(job.attempts.front().attempt, 6);
  EXPECT_EQ(job.attempts.back().attempt, 30);
  EXPECT_EQ(job.attempts.back().error.size(), kMaxErrorBytes);
}

TEST_F(BrokerTest, LeaseExpiryIsAFailedAttemptWithBackoff) {
  default_policy_.jitter = Jitter::kNone;
  Reopen();
  std::string id = Enqueue("q");
  LeasedJob first = LeaseOne("q", "dies", absl::Seconds(30));
  clock_.Advance(absl::Seconds(30));
  broker_->Tick();
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kScheduled);
  EXPECT_EQ(job.attempts[0].outcome, AttemptOutcome::kLeaseExpired);
  EXPECT_THAT(job.attempts[0].error, HasSubstr("lease expired"));
  // Not an instant requeue: the backoff of attempt 1 (1 s) applies.
  EXPECT_EQ(Leasable("q"), 0u);
  clock_.Advance(absl::Seconds(1));
  LeasedJob second = LeaseOne("q", "other");
  EXPECT_EQ(second.attempt, 2);
  EXPECT_NE(second.lease_id, first.lease_id);
}

TEST_F(BrokerTest, ExpiredLeaseOnLastAttemptKillsTheJob) {
  EnqueueSpec s{.queue = "q"};
  s.max_attempts = 1;
  std::string id = broker_->Enqueue(s)->job_id;
  LeaseOne("q");
  clock_.Advance(absl::Minutes(1));
  broker_->Tick();
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.fail_reason, FailReason::kAttemptsExhausted);
}

TEST_F(BrokerTest, StaleLeaseIsFencedAndChangesNothing) {
  uniform_ = 0;  // full jitter with 0: retry at once
  std::string id = Enqueue("q");
  LeasedJob first = LeaseOne("q", "a", absl::Seconds(1));
  clock_.Advance(absl::Seconds(2));
  LeasedJob second = LeaseOne("q", "b");
  ASSERT_EQ(second.attempt, 2);
  Job before = Get(id);

  auto hb = broker_->Heartbeat(HeartbeatSpec{id, first.lease_id, absl::ZeroDuration(), "cp"});
  EXPECT_THAT(hb, StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(hb.status().message(), HasSubstr("stale"));
  EXPECT_THAT(broker_->Ack(AckSpec{id, first.lease_id, ""}), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(Fail(first, "late"), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(broker_->Release(ReleaseSpec{id, first.lease_id}),
              StatusIs(Code::kFailedPrecondition));
  EXPECT_EQ(Get(id), before);
  EXPECT_TRUE(broker_->Ack(AckSpec{id, second.lease_id, ""}).ok());
}

TEST_F(BrokerTest, LateAckIsSalvagedWhileNoNewerAttemptStarted) {
  std::string id = Enqueue("q");
  LeasedJob j = LeaseOne("q", "slow", absl::Seconds(1));
  clock_.Advance(absl::Seconds(5));
  broker_->Tick();
  ASSERT_NE(Get(id).state, JobState::kActive);
  ASSERT_TRUE(broker_->Ack(AckSpec{id, j.lease_id, "done late"}).ok());
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kCompleted);
  EXPECT_EQ(job.result, "done late");
  EXPECT_EQ(job.attempts.back().outcome, AttemptOutcome::kCompleted);
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(Leasable("q"), 0u) << "a salvaged job must not run again";
}

TEST_F(BrokerTest, LateAckSalvagesAJobThatDiedOfExpiry) {
  EnqueueSpec s{.queue = "q"};
  s.max_attempts = 1;
  std::string id = broker_->Enqueue(s)->job_id;
  LeasedJob j = LeaseOne("q", "slow", absl::Seconds(1));
  clock_.Advance(absl::Seconds(5));
  broker_->Tick();
  ASSERT_EQ(Get(id).state, JobState::kFailed);
  ASSERT_TRUE(broker_->Ack(AckSpec{id, j.lease_id, ""}).ok());
  EXPECT_EQ(Get(id).state, JobState::kCompleted);
  EXPECT_EQ(Get(id).fail_reason, FailReason::kNone);
}

TEST_F(BrokerTest, AckBatchAppliesEachAckInOneWriteAndReportsEachOutcome) {
  std::string a = Enqueue("q"), b = Enqueue("q"), c = Enqueue("q");
  LeasedJob ja = LeaseOne("q"), jb = LeaseOne("q"), jc = LeaseOne("q");
  const uint64_t writes_before = broker_->store_writes();
  auto r =
      broker_->AckBatch({AckSpec{ja.job_id, ja.lease_id, "ra"}, AckSpec{jb.job_id, "stale", ""},
                         AckSpec{jc.job_id, jc.lease_id, "rc"}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_TRUE((*r)[0].ok()) << (*r)[0];
  EXPECT_THAT((*r)[1], StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string((*r)[1].message()), ::testing::StartsWith("acks[1]: lease stale"));
  EXPECT_TRUE((*r)[2].ok()) << (*r)[2];
  EXPECT_EQ(broker_->store_writes(), writes_before + 1) << "one durable write for the batch";
  EXPECT_EQ(Get(a).state, JobState::kCompleted);
  EXPECT_EQ(Get(a).result, "ra");
  EXPECT_EQ(Get(b).state, JobState::kActive);
  EXPECT_EQ(Get(c).state, JobState::kCompleted);
  // What was acked survives a restart.
  Reopen();
  EXPECT_EQ(Get(a).state, JobState::kCompleted);
  EXPECT_EQ(Get(c).result, "rc");
}

TEST_F(BrokerTest, AMalformedAckBatchIsRefusedWholeNamingTheItem) {
  std::string a = Enqueue("q");
  LeasedJob ja = LeaseOne("q");
  auto r = broker_->AckBatch({AckSpec{ja.job_id, ja.lease_id, ""}, AckSpec{"", "l", ""}});
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), ::testing::StartsWith("acks[1].job_id"));
  EXPECT_EQ(Get(a).state, JobState::kActive) << "nothing of a refused batch is applied";
  EXPECT_THAT(broker_->AckBatch({}), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<AckSpec> too_many(1001, AckSpec{ja.job_id, ja.lease_id, ""});
  EXPECT_THAT(broker_->AckBatch(std::move(too_many)), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(Get(a).state, JobState::kActive);
}

TEST_F(BrokerTest, AckAndFailAreIdempotentPerAttempt) {
  std::string a = Enqueue("q");
  LeasedJob ja = LeaseOne("q");
  ASSERT_TRUE(broker_->Ack(AckSpec{a, ja.lease_id, "r"}).ok());
  EXPECT_TRUE(broker_->Ack(AckSpec{a, ja.lease_id, "r"}).ok());
  EXPECT_THAT(Fail(ja, "after ack"), StatusIs(Code::kFailedPrecondition));

  std::string b = Enqueue("q");
  LeasedJob jb = LeaseOne("q");
  auto first = Fail(jb, "x");
  auto again = Fail(jb, "x");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->state, first->state);
  EXPECT_EQ(again->next_attempt_at, first->next_attempt_at);
  EXPECT_EQ(Get(b).attempts.size(), 1u);
  EXPECT_THAT(broker_->Ack(AckSpec{b, jb.lease_id, ""}), StatusIs(Code::kFailedPrecondition));
}

TEST_F(BrokerTest, HeartbeatExtendsTheLeaseAndSavesTheCheckpoint) {
  std::string id = Enqueue("q");
  LeasedJob j = LeaseOne("q", "w", absl::Seconds(10));
  clock_.Advance(absl::Seconds(8));
  auto hb = broker_->Heartbeat(HeartbeatSpec{id, j.lease_id, absl::ZeroDuration(), "page=3"});
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->lease_deadline, clock_.Now() + absl::Seconds(10));
  EXPECT_FALSE(hb->cancel_requested);
  clock_.Advance(absl::Seconds(8));
  auto hb2 = broker_->Heartbeat(HeartbeatSpec{id, j.lease_id, absl::Seconds(60), std::nullopt});
  ASSERT_TRUE(hb2.ok());
  EXPECT_EQ(hb2->lease_deadline, clock_.Now() + absl::Seconds(60));
  broker_->Tick();
  EXPECT_EQ(Get(id).state, JobState::kActive);
  EXPECT_EQ(Get(id).checkpoint, "page=3");

  // The next attempt starts from the checkpoint.
  uniform_ = 0;
  ASSERT_TRUE(Fail(j, "crash").ok());
  LeasedJob next = LeaseOne("q");
  EXPECT_EQ(next.attempt, 2);
  EXPECT_EQ(next.checkpoint, "page=3");
}

TEST_F(BrokerTest, HeartbeatAfterExpiryIsRefused) {
  std::string id = Enqueue("q");
  LeasedJob j = LeaseOne("q", "w", absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  auto hb = broker_->Heartbeat(HeartbeatSpec{id, j.lease_id, absl::ZeroDuration(), std::nullopt});
  EXPECT_THAT(hb, StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(hb.status().message(), HasSubstr("ended"));
}

TEST_F(BrokerTest, ReleaseGivesTheJobBackWithoutCountingAnAttempt) {
  std::string id = Enqueue("q");
  LeasedJob j = LeaseOne("q");
  ASSERT_TRUE(broker_->Release(ReleaseSpec{id, j.lease_id}).ok());
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kReady);
  EXPECT_EQ(job.attempt, 0);
  EXPECT_TRUE(job.attempts.empty());
  LeasedJob again = LeaseOne("q");
  EXPECT_EQ(again.attempt, 1);
  EXPECT_THAT(broker_->Ack(AckSpec{id, j.lease_id, ""}), StatusIs(Code::kFailedPrecondition));
}

TEST_F(BrokerTest, CancelEndsAWaitingJobAndAsksAnActiveOne) {
  std::string waiting = Enqueue("q");
  ASSERT_TRUE(broker_->CancelJob(waiting).ok());
  EXPECT_EQ(Get(waiting).state, JobState::kCancelled);
  EXPECT_EQ(Leasable("q"), 0u);
  EXPECT_THAT(broker_->CancelJob(waiting), StatusIs(Code::kFailedPrecondition));

  std::string active = Enqueue("q");
  LeasedJob j = LeaseOne("q");
  auto cancelled = broker_->CancelJob(active);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state, JobState::kActive);
  EXPECT_TRUE(cancelled->cancel_requested);
  auto hb = broker_->Heartbeat(HeartbeatSpec{active, j.lease_id, absl::ZeroDuration(), {}});
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->cancel_requested);
  // A fail of a cancelled job does not retry it.
  auto r = Fail(j, "stopped");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, JobState::kCancelled);
}

TEST_F(BrokerTest, DedupKeyReturnsTheExistingJob) {
  EnqueueSpec s{.queue = "q", .payload = "same"};
  s.dedup_key = "order-1";
  auto first = broker_->Enqueue(s);
  auto second = broker_->Enqueue(s);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(first->deduplicated);
  EXPECT_TRUE(second->deduplicated);
  EXPECT_EQ(second->job_id, first->job_id);
  EXPECT_EQ(Leasable("q"), 1u);
  EXPECT_EQ(Get(first->job_id).idempotency_key(), "order-1");
}

TEST_F(BrokerTest, DedupKeyWithAnotherPayloadIsAlreadyExists) {
  EnqueueSpec s{.queue = "q", .payload = "one"};
  s.dedup_key = "k";
  std::string id = broker_->Enqueue(s)->job_id;
  s.payload = "two";
  auto r = broker_->Enqueue(s);
  EXPECT_THAT(r, StatusIs(Code::kAlreadyExists));
  EXPECT_THAT(r.status().message(), HasSubstr(id));
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kReady], 1);
}

TEST_F(BrokerTest, DedupKeyIsFreeAfterTtlOnceTheJobEnded) {
  EnqueueSpec s{.queue = "q", .payload = "p"};
  s.dedup_key = "k";
  s.dedup_ttl = absl::Minutes(10);
  std::string first = broker_->Enqueue(s)->job_id;
  LeasedJob j = LeaseOne("q", "w", absl::Hours(1));
  clock_.Advance(absl::Minutes(11));
  // Past the TTL but the job still runs: the key still holds.
  EXPECT_EQ(broker_->Enqueue(s)->job_id, first);
  ASSERT_TRUE(broker_->Ack(AckSpec{first, j.lease_id, ""}).ok());
  auto fresh = broker_->Enqueue(s);
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(fresh->deduplicated);
  EXPECT_NE(fresh->job_id, first);
}

TEST_F(BrokerTest, DedupKeyIsFreeOnceItsJobEndsEvenAfterASweepSawItRunning) {
  EnqueueSpec s{.queue = "q", .payload = "p"};
  s.dedup_key = "k";
  s.dedup_ttl = absl::Minutes(10);
  std::string first = broker_->Enqueue(s)->job_id;
  LeasedJob j = LeaseOne("q", "w", absl::Hours(1));
  clock_.Advance(absl::Minutes(11));
  broker_->Tick();  // the sweep finds the TTL over but the job running: the key stays
  EXPECT_TRUE(broker_->Enqueue(s)->deduplicated);
  ASSERT_TRUE(broker_->Ack(AckSpec{first, j.lease_id, ""}).ok());
  EXPECT_FALSE(broker_->Enqueue(s)->deduplicated) << "free the moment the job ended";
}

TEST_F(BrokerTest, AFinishedJobWakesTheTickerForRetention) {
  int wakes = 0;
  BrokerOptions o = Options();
  o.wake = [&wakes] { ++wakes; };
  broker_.reset();
  broker_ = *BlockingBroker::Open(store_, clock_, o);
  PolicyOverride p;
  p.completed_max_count = 1;
  p.completed_max_age = absl::Hours(1);
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());
  Enqueue("q");
  LeasedJob j = LeaseOne("q", "w", absl::Hours(5));
  EXPECT_EQ(broker_->Tick(), clock_.Now() + absl::Hours(5)) << "the lease is the next deadline";
  wakes = 0;
  ASSERT_TRUE(broker_->Ack(AckSpec{j.job_id, j.lease_id, ""}).ok());
  EXPECT_EQ(wakes, 1) << "the job must be swept at 1 h, before the ticker's planned 5 h";
  EXPECT_EQ(broker_->Tick(), clock_.Now() + absl::Hours(1));
}

TEST_F(BrokerTest, DedupKeyOutlivesItsJobUntilTheTtl) {
  PolicyOverride keep_none;
  keep_none.completed_max_count = 1;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", keep_none).ok());
  EnqueueSpec s{.queue = "q", .payload = "p"};
  s.dedup_key = "k";
  s.dedup_ttl = absl::Hours(1);
  std::string first = broker_->Enqueue(s)->job_id;
  ASSERT_TRUE(broker_->Ack(AckSpec{first, LeaseOne("q").lease_id, ""}).ok());
  std::string other = Enqueue("q");
  ASSERT_TRUE(broker_->Ack(AckSpec{other, LeaseOne("q").lease_id, ""}).ok());
  broker_->Tick();  // retention keeps 1 completed job: `first` goes
  ASSERT_THAT(broker_->GetJob(first), StatusIs(Code::kNotFound));
  EXPECT_TRUE(broker_->Enqueue(s)->deduplicated);
  clock_.Advance(absl::Hours(1));
  broker_->Tick();
  EXPECT_FALSE(broker_->Enqueue(s)->deduplicated);
}

TEST_F(BrokerTest, MaxConcurrencyCapsActiveLeasesAndBackoffHoldsNoSlot) {
  PolicyOverride p;
  p.max_concurrency = 1;
  p.jitter = Jitter::kNone;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());
  std::string a = Enqueue("q", "a");
  std::string b = Enqueue("q", "b");
  LeasedJob ja = LeaseOne("q");
  EXPECT_EQ(Leasable("q"), 0u);
  ASSERT_EQ(Fail(ja, "retry later")->state, JobState::kScheduled);
  // `a` waits for its backoff in SCHEDULED: the slot is free for `b`.
  LeasedJob jb = LeaseOne("q");
  EXPECT_EQ(jb.job_id, b);
  EXPECT_EQ(Leasable("q"), 0u);
  ASSERT_TRUE(broker_->Ack(AckSpec{b, jb.lease_id, ""}).ok());
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(LeaseOne("q").job_id, a);
}

TEST_F(BrokerTest, PausedQueueAcceptsButLeasesNothing) {
  PolicyOverride pause;
  pause.paused = true;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", pause).ok());
  Enqueue("q");
  EXPECT_EQ(Leasable("q"), 0u);
  PolicyOverride resume;
  resume.paused = false;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", resume).ok());
  EXPECT_EQ(Leasable("q"), 1u);
}

TEST_F(BrokerTest, BatchIsAllOrNothing) {
  std::vector<EnqueueSpec> batch(3, EnqueueSpec{.queue = "q", .payload = "x"});
  batch[2].queue = "";
  auto r = broker_->EnqueueBatch(batch);
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("jobs[2].queue"));
  EXPECT_THAT(broker_->GetQueue("q"), StatusIs(Code::kNotFound));

  // A dedup conflict inside the batch refuses it whole too.
  batch[2] = batch[0];
  batch[0].dedup_key = batch[2].dedup_key = "k";
  batch[2].payload = "other";
  EXPECT_THAT(broker_->EnqueueBatch(batch), StatusIs(Code::kAlreadyExists));

  batch[2].payload = "x";
  auto ok = broker_->EnqueueBatch(batch);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*ok)[2].deduplicated);
  EXPECT_EQ((*ok)[2].job_id, (*ok)[0].job_id);
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kReady], 2);
}

TEST_F(BrokerTest, FullQueueRefusesEnqueue) {
  PolicyOverride p;
  p.max_length = 2;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());
  Enqueue("q");
  Enqueue("q");
  auto r = broker_->Enqueue(EnqueueSpec{.queue = "q"});
  EXPECT_THAT(r, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(r.status().message(), HasSubstr("max_length"));
  std::vector<EnqueueSpec> batch(2, EnqueueSpec{.queue = "other"});
  batch.push_back(EnqueueSpec{.queue = "q"});
  EXPECT_THAT(broker_->EnqueueBatch(batch), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(broker_->GetQueue("other"), StatusIs(Code::kNotFound));
}

// What counts toward max_length: every job not yet finished (READY, SCHEDULED, ACTIVE); an
// enqueue answered by its dedup key adds nothing, so a full queue still answers it; a finished
// job makes room for exactly one.
TEST_F(BrokerTest, MaxLengthCountsUnfinishedJobsOnly) {
  PolicyOverride p;
  p.max_length = 3;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());
  Enqueue("q");
  ASSERT_TRUE(broker_->Enqueue(EnqueueSpec{.queue = "q", .delay = absl::Hours(1)}).ok());
  const EnqueueSpec keyed{.queue = "q", .payload = "keyed", .dedup_key = "k"};
  auto first = broker_->Enqueue(keyed);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(broker_->Enqueue(EnqueueSpec{.queue = "q"}), StatusIs(Code::kResourceExhausted))
      << "READY, SCHEDULED and a keyed job make 3";

  auto again = broker_->Enqueue(keyed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->deduplicated);
  EXPECT_EQ(again->job_id, first->job_id);

  LeasedJob running = LeaseOne("q");
  EXPECT_THAT(broker_->Enqueue(EnqueueSpec{.queue = "q"}), StatusIs(Code::kResourceExhausted))
      << "an ACTIVE job still counts";
  ASSERT_TRUE(broker_->Ack(AckSpec{running.job_id, running.lease_id, ""}).ok());
  EXPECT_THAT(broker_->EnqueueBatch(std::vector<EnqueueSpec>(2, EnqueueSpec{.queue = "q"})),
              StatusIs(Code::kResourceExhausted))
      << "room for one, not two";
  EXPECT_TRUE(broker_->Enqueue(EnqueueSpec{.queue = "q"}).ok());
  EXPECT_THAT(broker_->Enqueue(EnqueueSpec{.queue = "q"}), StatusIs(Code::kResourceExhausted));
}

TEST_F(BrokerTest, PayloadsAreHeldToTheQueuesMaxPayloadBytes) {
  const std::string one_mib(1 << 20, 'x');
  EXPECT_TRUE(broker_->Enqueue(EnqueueSpec{.queue = "q", .payload = one_mib}).ok());
  auto over = broker_->Enqueue(EnqueueSpec{.queue = "q", .payload = one_mib + "x"});
  EXPECT_THAT(over, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(over.status().message(), HasSubstr("max_payload_bytes"));
  // Neither the refused job nor its queue exists.
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kReady], 1);
  EXPECT_THAT(broker_->Enqueue(EnqueueSpec{.queue = "new", .payload = one_mib + "x"}),
              StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(broker_->GetQueue("new"), StatusIs(Code::kNotFound));

  // A queue whose policy allows more takes more; one that allows less takes less.
  PolicyOverride big;
  big.max_payload_bytes = 4 << 20;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("big", big).ok());
  EXPECT_TRUE(broker_->Enqueue(EnqueueSpec{.queue = "big", .payload = one_mib + "x"}).ok());
  PolicyOverride tiny;
  tiny.max_payload_bytes = 10;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("tiny", tiny).ok());
  EXPECT_TRUE(broker_->Enqueue(EnqueueSpec{.queue = "tiny", .payload = "0123456789"}).ok());
  EXPECT_THAT(broker_->Enqueue(EnqueueSpec{.queue = "tiny", .payload = "0123456789!"}),
              StatusIs(Code::kResourceExhausted));
}

TEST_F(BrokerTest, BadInputNamesTheFieldAndChangesNothing) {
  struct Case {
    EnqueueSpec spec;
    Code code;
    const char* field;
  };
  EnqueueSpec both{.queue = "q"};
  both.delay = absl::Seconds(1);
  both.run_at = clock_.Now();
  EnqueueSpec negative{.queue = "q"};
  negative.delay = absl::Seconds(-1);
  std::vector<Case> cases = {
      {EnqueueSpec{.queue = ""}, Code::kInvalidArgument, "queue"},
      {EnqueueSpec{.queue = std::string(129, 'a')}, Code::kInvalidArgument, "queue"},
      {EnqueueSpec{.queue = "has space"}, Code::kInvalidArgument, "queue"},
      {both, Code::kInvalidArgument, "run_at"},
      {negative, Code::kInvalidArgument, "delay"},
      {EnqueueSpec{.queue = "q", .payload = std::string(kMaxPayloadBytes + 1, 'x')},
       Code::kResourceExhausted, "payload"},
      {EnqueueSpec{.queue = "q", .max_attempts = -1}, Code::kInvalidArgument, "max_attempts"},
      {EnqueueSpec{.queue = "q", .lease_duration = absl::Seconds(-1)}, Code::kInvalidArgument,
       "lease_duration"},
      {EnqueueSpec{.queue = "q", .dedup_key = std::string(300, 'k')}, Code::kInvalidArgument,
       "dedup_key"},
  };
  for (const Case& c : cases) {
    auto r = broker_->Enqueue(c.spec);
    EXPECT_THAT(r, StatusIs(c.code)) << c.field;
    EXPECT_THAT(r.status().message(), HasSubstr(c.field));
  }
  EXPECT_TRUE(broker_->ListQueues().empty());
  EXPECT_EQ(store_.job_count(), 0u);

  EXPECT_THAT(broker_->Ack(AckSpec{"", "l", ""}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(broker_->Ack(AckSpec{"nope", "l", ""}), StatusIs(Code::kNotFound));
  EXPECT_THAT(broker_->Lease(LeaseSpec{"q", "", 1, {}}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(broker_->GetJob("nope"), StatusIs(Code::kNotFound));
  EXPECT_THAT(broker_->GetQueue("nope"), StatusIs(Code::kNotFound));
}

TEST_F(BrokerTest, WaitingLeaseIsAnsweredByTheNextEnqueue) {
  std::optional<absl::StatusOr<std::vector<LeasedJob>>> got;
  uint64_t waiter = broker_->Lease(LeaseSpec{"q", "w", 1, {}}, absl::Seconds(30),
                                   [&](absl::StatusOr<std::vector<LeasedJob>> r) { got = r; });
  EXPECT_NE(waiter, 0u);
  EXPECT_FALSE(got.has_value());
  std::string id = Enqueue("q");
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok());
  ASSERT_EQ((*got)->size(), 1u);
  EXPECT_EQ((*got)->front().job_id, id);
  EXPECT_EQ(Get(id).state, JobState::kActive);
  EXPECT_FALSE(broker_->CancelWait(waiter));
}

TEST_F(BrokerTest, WaitingLeaseTimesOutEmptyOrIsCancelled) {
  std::optional<absl::StatusOr<std::vector<LeasedJob>>> got;
  broker_->Lease(LeaseSpec{"q", "w", 1, {}}, absl::Seconds(5),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { got = r; });
  clock_.Advance(absl::Seconds(4));
  broker_->Tick();
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(broker_->GetQueue("q")->waiting_leases, 1);
  clock_.Advance(absl::Seconds(1));
  broker_->Tick();
  EXPECT_EQ(broker_->GetQueue("q")->waiting_leases, 0);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok());
  EXPECT_TRUE((*got)->empty());

  std::optional<absl::StatusOr<std::vector<LeasedJob>>> cancelled;
  uint64_t w = broker_->Lease(LeaseSpec{"q", "w", 1, {}}, absl::Seconds(5),
                              [&](absl::StatusOr<std::vector<LeasedJob>> r) { cancelled = r; });
  EXPECT_TRUE(broker_->CancelWait(w));
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_THAT(cancelled->status(), StatusIs(Code::kCancelled));
  Enqueue("q");
  EXPECT_EQ(Leasable("q"), 1u) << "a cancelled waiter must not take the job";
}

TEST_F(BrokerTest, TickReportsTheNextDeadline) {
  EnqueueSpec s{.queue = "q"};
  s.delay = absl::Seconds(7);
  ASSERT_TRUE(broker_->Enqueue(s).ok());
  EXPECT_EQ(broker_->Tick(), clock_.Now() + absl::Seconds(7));
}

TEST_F(BrokerTest, RetentionKeepsAtMostCountAndAge) {
  PolicyOverride p;
  p.completed_max_count = 2;
  p.completed_max_age = absl::Hours(1);
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(Enqueue("q"));
    ASSERT_TRUE(broker_->Ack(AckSpec{ids.back(), LeaseOne("q").lease_id, ""}).ok());
    clock_.Advance(absl::Minutes(1));
  }
  broker_->Tick();
  EXPECT_THAT(broker_->GetJob(ids[0]), StatusIs(Code::kNotFound));
  EXPECT_THAT(broker_->GetJob(ids[1]), StatusIs(Code::kNotFound));
  EXPECT_TRUE(broker_->GetJob(ids[3]).ok());
  EXPECT_FALSE(store_.FindJob(ids[0]).has_value()) << "removed from the store too";
  clock_.Advance(absl::Hours(1));
  broker_->Tick();
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kCompleted], 0);
}

TEST_F(BrokerTest, ListJobsPagesByStateInEnqueueOrder) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Enqueue("q"));
  LeaseOne("q");  // ids[0] becomes ACTIVE
  ListJobsSpec spec{.queue = "q", .state = JobState::kReady, .page_size = 2};
  std::vector<std::string> seen;
  for (int page = 0; page < 5; ++page) {
    auto r = broker_->ListJobs(spec);
    ASSERT_TRUE(r.ok());
    for (const Job& j : r->jobs) seen.push_back(j.id);
    if (r->next_page_token.empty()) break;
    spec.page_token = r->next_page_token;
  }
  EXPECT_THAT(seen, ElementsAre(ids[1], ids[2], ids[3], ids[4]));
  auto newest = broker_->ListJobs(ListJobsSpec{.queue = "q", .page_size = 1, .newest_first = true});
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->jobs.at(0).id, ids[4]);
  EXPECT_THAT(broker_->ListJobs(ListJobsSpec{.queue = "q", .page_token = "x"}),
              StatusIs(Code::kInvalidArgument));
}

TEST_F(BrokerTest, GetQueueReportsCountsAndOldestReadyAge) {
  Enqueue("q");
  clock_.Advance(absl::Seconds(30));
  Enqueue("q");
  LeaseOne("q");
  auto info = broker_->GetQueue("q");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->counts[JobState::kReady], 1);
  EXPECT_EQ(info->counts[JobState::kActive], 1);
  EXPECT_EQ(info->oldest_ready_age, absl::ZeroDuration());
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(broker_->GetQueue("q")->oldest_ready_age, absl::Seconds(5));
}

TEST_F(BrokerTest, InvalidPolicyChangeIsRefusedAndChangesNothing) {
  PolicyOverride bad;
  bad.max_attempts = 0;
  auto r = broker_->UpdateQueuePolicy("q", bad);
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("retry.max_attempts"));
  EXPECT_EQ(store_.policy_count(), 0u);
}

TEST_F(BrokerTest, StorageFailureIsUnavailableAndStopsWrites) {
  store_.FailWritesAfter(0);
  auto r = broker_->Enqueue(EnqueueSpec{.queue = "q"});
  EXPECT_THAT(r, StatusIs(Code::kUnavailable));
  store_.FailWritesAfter(-1);
  EXPECT_THAT(broker_->Enqueue(EnqueueSpec{.queue = "q"}), StatusIs(Code::kUnavailable))
      << "after a failed write memory is ahead of disk: no more writes until it is rebuilt";
  Reopen();
  EXPECT_EQ(store_.job_count(), 0u);
  EXPECT_TRUE(broker_->Enqueue(EnqueueSpec{.queue = "q"}).ok());
}

TEST_F(BrokerTest, ShutdownAnswersWaitersAndRefusesChanges) {
  std::optional<absl::StatusOr<std::vector<LeasedJob>>> got;
  broker_->Lease(LeaseSpec{"q", "w", 1, {}}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { got = r; });
  broker_->Shutdown();
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->ok() && (*got)->empty());
  EXPECT_THAT(broker_->Enqueue(EnqueueSpec{.queue = "q"}), StatusIs(Code::kUnavailable));
}

// Brokers of one process can share one commit writer (one broker per partition, next): each
// broker's transitions go through the same pipeline, in one order, to the same store.
TEST(SharedPipelineTest, TwoBrokersOnOnePipelineWriteThroughItAndOutliveNeitherIt) {
  storage::MemoryStore store;
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  CommitPipeline pipeline(store, CommitPipeline::Mode::kInline, &clock);
  BrokerOptions options;
  options.pipeline = &pipeline;
  auto first = BlockingBroker::Open(store, clock, options);
  auto second = BlockingBroker::Open(store, clock, options);
  ASSERT_TRUE(first.ok() && second.ok());
  const uint64_t before = pipeline.writes();
  auto a = (*first)->Enqueue(EnqueueSpec{.queue = "a"});
  auto b = (*second)->Enqueue(EnqueueSpec{.queue = "b"});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(pipeline.writes(), before + 2);
  EXPECT_EQ((*first)->store_writes(), (*second)->store_writes()) << "one writer, one count";
  EXPECT_TRUE(store.FindJob(a->job_id).has_value());
  EXPECT_TRUE(store.FindJob(b->job_id).has_value());
  first->reset();  // the pipeline is borrowed: the other broker keeps writing through it
  EXPECT_TRUE((*second)->Enqueue(EnqueueSpec{.queue = "b"}).ok());
  EXPECT_EQ(pipeline.writes(), before + 3);
}

}  // namespace
}  // namespace jobbroker::core
