// The Admin calls that move jobs by hand and switch queues: RetryJob (one job and bulk redrive),
// DeleteJob, SetQueuePaused and PurgeQueue, on a FakeClock and a MemoryStore.
#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/broker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Le;
using ::testing::SizeIs;
using ::testing::StartsWith;
using Code = absl::StatusCode;

// What one transition changed, as the store saw it.
struct Written {
  size_t put_jobs = 0;
  size_t delete_jobs = 0;
};

// A Store in front of a MemoryStore that records every transition it is given, and can hold
// writes back (Close) to show what happens while one is in progress.
class RecordingStore final : public Store {
 public:
  explicit RecordingStore(Store& inner) : inner_(inner) {}

  absl::Status Write(absl::Span<const Transition> transitions) override {
    {
      absl::MutexLock lock(&mu_);
      ++blocked_;
      mu_.Await(absl::Condition(
          +[](bool* open) { return *open; }, &open_));
      --blocked_;
      for (const Transition& t : transitions)
        written_.push_back({t.put_jobs.size(), t.delete_jobs.size()});
    }
    return inner_.Write(transitions);
  }
  absl::Status Recover(uint32_t partition, RecoveryVisitor& visitor) override {
    return inner_.Recover(partition, visitor);
  }
  absl::Status Resume() override { return inner_.Resume(); }
  absl::StatusOr<Job> ReadJob(uint32_t partition, const std::string& id) override {
    return inner_.ReadJob(partition, id);
  }

  // Writes wait until Open().
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Waits until a write is held back by Close().
  void AwaitBlockedWrite() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n > 0; }, &blocked_));
  }
  // The transitions written so far, then forgets them.
  std::vector<Written> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(written_, {});
  }

 private:
  Store& inner_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Written> written_ ABSL_GUARDED_BY(mu_);
};

std::vector<size_t> PutSizes(const std::vector<Written>& w) {
  std::vector<size_t> out;
  for (const Written& x : w) out.push_back(x.put_jobs);
  return out;
}

std::vector<size_t> DeleteSizes(const std::vector<Written>& w) {
  std::vector<size_t> out;
  for (const Written& x : w) out.push_back(x.delete_jobs);
  return out;
}

class BrokerAdminTest : public BrokerFixture {
 protected:
  void SetUp() override { OpenOver(recorder_); }

  // Like Reopen() (a restart), but over the recording store.
  void OpenOver(Store& store, CommitPipeline::Mode mode = CommitPipeline::Mode::kInline) {
    broker_.reset();
    BrokerOptions options = Options();
    options.commit_mode = mode;
    auto opened = BlockingBroker::Open(store, clock_, std::move(options));
    ASSERT_TRUE(opened.ok()) << opened.status();
    broker_ = std::move(*opened);
  }

  // `n` jobs of `queue` that failed for good (one attempt each), oldest first, one clock second
  // apart when `spaced`.
  std::vector<std::string> FailedJobs(const std::string& queue, int n, bool spaced = false) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      EnqueueSpec s{.queue = queue, .payload = absl::StrCat("job-", i)};
      s.max_attempts = 1;
      auto r = broker_->Enqueue(std::move(s));
      EXPECT_TRUE(r.ok()) << r.status();
      LeasedJob j = LeaseOne(queue);
      EXPECT_EQ(j.job_id, r->job_id);
      auto failed = Fail(j, absl::StrCat("boom ", i));
      EXPECT_TRUE(failed.ok()) << failed.status();
      EXPECT_EQ(failed->state, JobState::kFailed);
      ids.push_back(r->job_id);
      if (spaced) clock_.Advance(absl::Seconds(1));
    }
    return ids;
  }

  // `n` READY jobs of `queue` cancelled at once.
  std::vector<std::string> CancelledJobs(const std::string& queue, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      ids.push_back(Enqueue(queue, absl::StrCat("c-", i)));
      EXPECT_TRUE(broker_->CancelJob(ids.back()).ok());
    }
    return ids;
  }

  int64_t Count(const std::string& queue, JobState state) {
    auto info = broker_->GetQueue(queue);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->counts[state] : -1;
  }

  RecordingStore recorder_{store_};
};

// ---------------------------------------------------------------------------------------------
// RetryJob, one job

TEST_F(BrokerAdminTest, RetryPutsAFailedJobBackToReadyAndKeepsItsHistory) {
  EnqueueSpec s{.queue = "q", .payload = "p"};
  s.max_attempts = 2;
  std::string id = broker_->Enqueue(s)->job_id;
  LeasedJob first = LeaseOne("q", "w1");
  ASSERT_EQ(Fail(first, "first error")->state, JobState::kScheduled);
  clock_.Advance(absl::Minutes(1));
  LeasedJob second = LeaseOne("q", "w2");
  ASSERT_EQ(Fail(second, "second error")->state, JobState::kFailed);
  ASSERT_EQ(Get(id).fail_reason, FailReason::kAttemptsExhausted);

  clock_.Advance(absl::Minutes(5));
  auto retried = broker_->RetryJob(id);
  ASSERT_TRUE(retried.ok()) << retried.status();
  for (const Job& job : {*retried, Get(id)}) {
    EXPECT_EQ(job.state, JobState::kReady);
    EXPECT_EQ(job.attempt, 0);
    EXPECT_EQ(job.max_attempts, 2);
    EXPECT_EQ(job.fail_reason, FailReason::kNone);
    EXPECT_EQ(job.last_error, "second error") << "kept: it says why the job was dead";
    EXPECT_EQ(job.run_at, clock_.Now());
    EXPECT_EQ(job.completed_at, absl::InfinitePast());
    EXPECT_EQ(job.lease_id, "");
    ASSERT_THAT(job.attempts, SizeIs(2));
  }
  EXPECT_EQ(store_.FindJob(id)->state, JobState::kReady) << "persisted";

  // The old leases fence nothing any more.
  EXPECT_THAT(broker_->Ack(AckSpec{id, second.lease_id, ""}), StatusIs(Code::kFailedPrecondition));

  // New attempts count from 1 again and are appended after the old ones; a full set of attempts
  // is available again.
  LeasedJob third = LeaseOne("q", "w3");
  EXPECT_EQ(third.attempt, 1);
  EXPECT_THAT(third.lease_id, StartsWith("1-"));
  ASSERT_EQ(Fail(third, "third error")->state, JobState::kScheduled);
  clock_.Advance(absl::Minutes(1));
  LeasedJob fourth = LeaseOne("q", "w4");
  EXPECT_EQ(fourth.attempt, 2);
  ASSERT_TRUE(broker_->Ack(AckSpec{id, fourth.lease_id, "done"}).ok());
  Job done = Get(id);
  EXPECT_EQ(done.state, JobState::kCompleted);
  std::vector<int> numbers;
  std::vector<std::string> workers;
  for (const AttemptRecord& a : done.attempts) {
    numbers.push_back(a.attempt);
    workers.push_back(a.worker_id);
  }
  EXPECT_THAT(numbers, ElementsAre(1, 2, 1, 2));
  EXPECT_THAT(workers, ElementsAre("w1", "w2", "w3", "w4"));
  EXPECT_TRUE(std::is_sorted(
      done.attempts.begin(), done.attempts.end(),
      [](const AttemptRecord& a, const AttemptRecord& b) { return a.started_at < b.started_at; }))
      << "records stay in start order across the retry";
}

TEST_F(BrokerAdminTest, RetryPutsACancelledJobBackAndClearsTheCancelRequest) {
  std::string id = Enqueue("q");
  LeasedJob j = LeaseOne("q");
  ASSERT_TRUE(broker_->CancelJob(id)->cancel_requested);
  ASSERT_EQ(Fail(j, "stopped")->state, JobState::kCancelled);

  auto retried = broker_->RetryJob(id);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->state, JobState::kReady);
  EXPECT_FALSE(retried->cancel_requested);
  // Without the reset, the next failure would cancel it again instead of retrying it.
  LeasedJob again = LeaseOne("q");
  EXPECT_EQ(Fail(again, "transient")->state, JobState::kScheduled);
}

TEST_F(BrokerAdminTest, RetryRefusesJobsThatAreNotDeadAndChangesNothing) {
  std::string active = Enqueue("q");
  std::string completed = Enqueue("q");
  auto leased = broker_->Lease(LeaseSpec{"q", "w", 2, {}});
  ASSERT_TRUE(leased.ok());
  ASSERT_THAT(*leased, SizeIs(2));
  ASSERT_TRUE(broker_->Ack(AckSpec{completed, (*leased)[1].lease_id, ""}).ok());
  std::string ready = Enqueue("q");
  EnqueueSpec later{.queue = "q"};
  later.delay = absl::Hours(1);
  std::string scheduled = broker_->Enqueue(later)->job_id;

  for (const auto& [id, state] :
       std::vector<std::pair<std::string, std::string>>{{ready, "JOB_STATE_READY"},
                                                        {scheduled, "JOB_STATE_SCHEDULED"},
                                                        {active, "JOB_STATE_ACTIVE"},
                                                        {completed, "JOB_STATE_COMPLETED"}}) {
    Job before = Get(id);
    auto r = broker_->RetryJob(id);
    EXPECT_THAT(r, StatusIs(Code::kFailedPrecondition)) << state;
    EXPECT_THAT(r.status().message(), HasSubstr(state));
    EXPECT_EQ(Get(id), before) << state;
  }
  EXPECT_THAT(broker_->RetryJob("no-such-job"), StatusIs(Code::kNotFound));
  EXPECT_THAT(broker_->RetryJob(""), StatusIs(Code::kInvalidArgument));
}

TEST_F(BrokerAdminTest, ARetriedJobGoesToAWaitingWorkerAtOnce) {
  std::string id = FailedJobs("q", 1)[0];
  std::optional<absl::StatusOr<std::vector<LeasedJob>>> got;
  broker_->Lease(LeaseSpec{"q", "w", 1, {}}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { got = std::move(r); });
  ASSERT_FALSE(got.has_value());
  ASSERT_TRUE(broker_->RetryJob(id).ok());
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok());
  ASSERT_THAT(**got, SizeIs(1));
  EXPECT_EQ((*got)->front().job_id, id);
  EXPECT_EQ((*got)->front().attempt, 1);
}

TEST_F(BrokerAdminTest, ARetriedJobSurvivesARestart) {
  std::string id = FailedJobs("q", 1)[0];
  ASSERT_TRUE(broker_->RetryJob(id).ok());
  OpenOver(recorder_);
  Job job = Get(id);
  EXPECT_EQ(job.state, JobState::kReady);
  EXPECT_EQ(job.attempt, 0);
  EXPECT_THAT(job.attempts, SizeIs(1));
  EXPECT_EQ(LeaseOne("q").job_id, id);
}

TEST_F(BrokerAdminTest, RetryHoldsAFreedDedupKeyAgainWhileTheJobRuns) {
  EnqueueSpec s{.queue = "q", .payload = "same", .dedup_key = "k"};
  s.dedup_ttl = absl::Minutes(10);
  s.max_attempts = 1;
  std::string id = broker_->Enqueue(s)->job_id;
  ASSERT_EQ(Fail(LeaseOne("q"), "boom")->state, JobState::kFailed);
  clock_.Advance(absl::Hours(1));
  broker_->Tick();  // the TTL has passed and the job has ended: the key is freed
  ASSERT_EQ(store_.dedup_count(), 0u);

  ASSERT_TRUE(broker_->RetryJob(id).ok());
  auto again = broker_->Enqueue(s);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->job_id, id) << "the retried job holds its key again";
  EXPECT_TRUE(again->deduplicated);

  // Once it has ended, the key is free at once (its TTL passed long ago).
  ASSERT_TRUE(broker_->Ack(AckSpec{id, LeaseOne("q").lease_id, ""}).ok());
  broker_->Tick();
  auto fresh = broker_->Enqueue(s);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->job_id, id);
  EXPECT_FALSE(fresh->deduplicated);
}

TEST_F(BrokerAdminTest, RetryLeavesADedupKeyThatAnotherJobTookSince) {
  EnqueueSpec s{.queue = "q", .payload = "same", .dedup_key = "k"};
  s.dedup_ttl = absl::Minutes(10);
  s.max_attempts = 1;
  std::string old_id = broker_->Enqueue(s)->job_id;
  ASSERT_EQ(Fail(LeaseOne("q"), "boom")->state, JobState::kFailed);
  clock_.Advance(absl::Hours(1));
  broker_->Tick();
  std::string new_id = broker_->Enqueue(s)->job_id;
  ASSERT_NE(new_id, old_id);

  ASSERT_TRUE(broker_->RetryJob(old_id).ok());
  EXPECT_EQ(broker_->Enqueue(s)->job_id, new_id);
}

// ---------------------------------------------------------------------------------------------
// RetryJob, bulk redrive

TEST_F(BrokerAdminTest, RedriveRetriesEveryFailedJobOfTheQueueInBatches) {
  std::vector<std::string> failed = FailedJobs("q", 1200);
  std::vector<std::string> cancelled = CancelledJobs("q", 3);
  std::vector<std::string> elsewhere = FailedJobs("other", 2);
  recorder_.Take();

  auto r = broker_->RetryJobs(RetryJobsSpec{.queue = "q", .limit = 5000});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, 1200);
  EXPECT_EQ(r->retried, 1200);
  // One transition per batch of at most kRetryBatch jobs.
  EXPECT_THAT(PutSizes(recorder_.Take()), ElementsAre(500, 500, 200));

  for (const std::string& id : failed) {
    Job job = Get(id);
    EXPECT_EQ(job.state, JobState::kReady);
    EXPECT_EQ(job.attempt, 0);
  }
  for (const std::string& id : cancelled) EXPECT_EQ(Get(id).state, JobState::kCancelled);
  for (const std::string& id : elsewhere) EXPECT_EQ(Get(id).state, JobState::kFailed);
  EXPECT_EQ(Count("q", JobState::kFailed), 0);
  EXPECT_EQ(Count("q", JobState::kReady), 1200);
  EXPECT_EQ(Leasable("q", 1000) + Leasable("q", 1000), 1200u);

  // Nothing left to retry: an empty answer, not an error.
  r = broker_->RetryJobs(RetryJobsSpec{.queue = "q"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, 0);
  EXPECT_EQ(r->retried, 0);
}

TEST_F(BrokerAdminTest, RedriveOfCancelledJobsLeavesFailedOnes) {
  std::vector<std::string> failed = FailedJobs("q", 2);
  std::vector<std::string> cancelled = CancelledJobs("q", 3);
  auto r = broker_->RetryJobs(RetryJobsSpec{.queue = "q", .state = JobState::kCancelled});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->retried, 3);
  for (const std::string& id : cancelled) EXPECT_EQ(Get(id).state, JobState::kReady);
  for (const std::string& id : failed) EXPECT_EQ(Get(id).state, JobState::kFailed);
}

TEST_F(BrokerAdminTest, RedriveDryRunCountsAndChangesNothing) {
  FailedJobs("q", 7);
  CancelledJobs("q", 2);
  const int64_t writes = store_.successful_writes();
  auto r = broker_->RetryJobs(RetryJobsSpec{.queue = "q", .dry_run = true});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, 7);
  EXPECT_EQ(r->retried, 0);
  r = broker_->RetryJobs(RetryJobsSpec{.queue = "q", .dry_run = true, .limit = 5});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, 5);
  r = broker_->RetryJobs(
      RetryJobsSpec{.queue = "q", .state = JobState::kCancelled, .dry_run = true});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, 2);
  EXPECT_EQ(Count("q", JobState::kFailed), 7);
  EXPECT_EQ(store_.successful_writes(), writes);
  EXPECT_EQ(Leasable("q"), 0u);
}

TEST_F(BrokerAdminTest, RedriveLimitTakesTheOldestEndedFirst) {
  // Enqueued in one order, failed in the reverse one: the redrive goes by when they died.
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    EnqueueSpec s{.queue = "q", .payload = absl::StrCat(i)};
    s.max_attempts = 1;
    ids.push_back(broker_->Enqueue(s)->job_id);
  }
  auto leased = broker_->Lease(LeaseSpec{"q", "w", 4, {}});
  ASSERT_TRUE(leased.ok());
  ASSERT_THAT(*leased, SizeIs(4));
  for (int i = 3; i >= 0; --i) {
    ASSERT_EQ(Fail((*leased)[i], "boom")->state, JobState::kFailed);
    clock_.Advance(absl::Seconds(1));
  }
  auto r = broker_->RetryJobs(RetryJobsSpec{.queue = "q", .limit = 2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, 2);
  EXPECT_EQ(r->retried, 2);
  EXPECT_EQ(Get(ids[3]).state, JobState::kReady);
  EXPECT_EQ(Get(ids[2]).state, JobState::kReady);
  EXPECT_EQ(Get(ids[1]).state, JobState::kFailed);
  EXPECT_EQ(Get(ids[0]).state, JobState::kFailed);
}

TEST_F(BrokerAdminTest, RedriveDefaultLimitIsAThousand) {
  FailedJobs("q", 1001);
  auto r = broker_->RetryJobs(RetryJobsSpec{.queue = "q"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->retried, kDefaultRetryLimit);
  EXPECT_EQ(Count("q", JobState::kFailed), 1);
}

TEST_F(BrokerAdminTest, RedriveRefusesBadRequestsNamingTheField) {
  FailedJobs("q", 1);
  auto r = broker_->RetryJobs(RetryJobsSpec{.queue = "q", .state = JobState::kCompleted});
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), StartsWith("state"));
  for (int64_t limit : {int64_t{-1}, kMaxRetryLimit + 1}) {
    r = broker_->RetryJobs(RetryJobsSpec{.queue = "q", .limit = limit});
    EXPECT_THAT(r, StatusIs(Code::kInvalidArgument)) << limit;
    EXPECT_THAT(std::string(r.status().message()), StartsWith("limit")) << limit;
  }
  r = broker_->RetryJobs(RetryJobsSpec{.queue = "bad queue!"});
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("queue"));
  for (bool dry_run : {false, true}) {
    r = broker_->RetryJobs(RetryJobsSpec{.queue = "nobody", .dry_run = dry_run});
    EXPECT_THAT(r, StatusIs(Code::kNotFound)) << dry_run;
  }
  EXPECT_EQ(Count("q", JobState::kFailed), 1);
  EXPECT_THAT(broker_->GetQueue("nobody"), StatusIs(Code::kNotFound)) << "not created";
}

TEST_F(BrokerAdminTest, RedriveLetsOtherCallsInBetweenItsBatches) {
  OpenOver(recorder_, CommitPipeline::Mode::kBackground);
  CancelledJobs("q", 1200);
  recorder_.Take();

  // Hold the first batch's write: the redrive must not hold the broker meanwhile.
  recorder_.Close();
  absl::Notification redriven;
  absl::StatusOr<RetryJobsResult> result;
  broker_->RetryJobs(RetryJobsSpec{.queue = "q", .state = JobState::kCancelled, .limit = 5000},
                     [&](absl::StatusOr<RetryJobsResult> r) {
                       result = std::move(r);
                       redriven.Notify();
                     });
  recorder_.AwaitBlockedWrite();
  EXPECT_EQ(Count("q", JobState::kReady), 500) << "reads see the first batch";
  absl::Notification enqueued;
  EnqueueSpec s{.queue = "q", .payload = "between"};
  std::vector<EnqueueSpec> one{s};
  broker_->EnqueueBatch(std::move(one), [&](absl::StatusOr<std::vector<EnqueueResult>> r) {
    EXPECT_TRUE(r.ok()) << r.status();
    enqueued.Notify();
  });
  recorder_.Open();
  redriven.WaitForNotification();
  enqueued.WaitForNotification();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->retried, 1200);
  // The enqueue was taken between the first and the second batch.
  EXPECT_THAT(PutSizes(recorder_.Take()), ElementsAre(500, 1, 500, 200));
}

TEST_F(BrokerAdminTest, RedriveStoppedByAFailedWriteSaysHowFarItGot) {
  FailedJobs("q", 1200);
  store_.FailWritesAfter(1);  // the first batch is written, the second is not
  auto r = broker_->RetryJobs(RetryJobsSpec{.queue = "q"});
  EXPECT_THAT(r, StatusIs(Code::kUnavailable));
  EXPECT_THAT(r.status().message(), HasSubstr("500 jobs were retried before it"));
  store_.FailWritesAfter(-1);
  OpenOver(recorder_);  // recovers what is on disk
  EXPECT_EQ(Count("q", JobState::kReady), 500);
  EXPECT_EQ(Count("q", JobState::kFailed), 700);
}

TEST_F(BrokerAdminTest, RedriveAfterShutdownIsUnavailable) {
  FailedJobs("q", 2);
  broker_->Shutdown();
  auto r = broker_->RetryJobs(RetryJobsSpec{.queue = "q"});
  EXPECT_THAT(r, StatusIs(Code::kUnavailable));
  EXPECT_THAT(broker_->RetryJob("any"), StatusIs(Code::kUnavailable));
  EXPECT_EQ(Count("q", JobState::kFailed), 2);
}

// ---------------------------------------------------------------------------------------------
// DeleteJob

TEST_F(BrokerAdminTest, DeleteRemovesAJobThatIsNotActive) {
  std::string dead = FailedJobs("q", 1)[0];
  std::string cancelled = CancelledJobs("q", 1)[0];
  std::string completed = Enqueue("q");
  ASSERT_TRUE(broker_->Ack(AckSpec{completed, LeaseOne("q").lease_id, ""}).ok());
  std::string ready = Enqueue("q");
  EnqueueSpec later{.queue = "q"};
  later.delay = absl::Hours(1);
  std::string scheduled = broker_->Enqueue(later)->job_id;

  for (const std::string& id : {ready, scheduled, dead, cancelled, completed}) {
    ASSERT_TRUE(broker_->DeleteJob(id).ok()) << id;
    EXPECT_THAT(broker_->GetJob(id), StatusIs(Code::kNotFound));
    EXPECT_FALSE(store_.FindJob(id).has_value()) << "removed from the store too";
    EXPECT_THAT(broker_->DeleteJob(id), StatusIs(Code::kNotFound)) << "a repeat";
  }
  auto info = broker_->GetQueue("q");
  ASSERT_TRUE(info.ok());
  for (const auto& [state, n] : info->counts) EXPECT_EQ(n, 0) << JobStateName(state);
  EXPECT_EQ(Leasable("q"), 0u);
  clock_.Advance(absl::Hours(2));
  EXPECT_EQ(Leasable("q"), 0u) << "the deleted scheduled job never comes due";
}

TEST_F(BrokerAdminTest, DeleteRefusesAnActiveJob) {
  std::string id = Enqueue("q");
  LeasedJob j = LeaseOne("q");
  absl::Status s = broker_->DeleteJob(id);
  EXPECT_THAT(s, StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(s.message(), HasSubstr("cancel it first"));
  EXPECT_EQ(Get(id).state, JobState::kActive);
  EXPECT_TRUE(broker_->Ack(AckSpec{id, j.lease_id, ""}).ok());
  EXPECT_THAT(broker_->DeleteJob(""), StatusIs(Code::kInvalidArgument));
}

TEST_F(BrokerAdminTest, ADeletedJobsDedupKeyHoldsUntilItsTtl) {
  EnqueueSpec s{.queue = "q", .payload = "x", .dedup_key = "k"};
  s.dedup_ttl = absl::Minutes(10);
  std::string id = broker_->Enqueue(s)->job_id;
  ASSERT_TRUE(broker_->DeleteJob(id).ok());
  auto again = broker_->Enqueue(s);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->job_id, id);
  EXPECT_TRUE(again->deduplicated);
  clock_.Advance(absl::Minutes(11));
  broker_->Tick();
  again = broker_->Enqueue(s);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->deduplicated);
}

// ---------------------------------------------------------------------------------------------
// SetQueuePaused

TEST_F(BrokerAdminTest, PauseStopsLeasingAndResumeServesWaitingWorkers) {
  Enqueue("q");
  PolicyOverride p;
  p.max_concurrency = 3;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());

  auto paused = broker_->SetQueuePaused("q", true);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_TRUE(paused->policy.paused);
  EXPECT_EQ(paused->policy.max_concurrency, 3) << "other run-time changes stay";
  EXPECT_EQ(Leasable("q"), 0u);
  Enqueue("q");  // still accepted
  EXPECT_EQ(Leasable("q"), 0u);

  std::optional<absl::StatusOr<std::vector<LeasedJob>>> got;
  broker_->Lease(LeaseSpec{"q", "w", 5, {}}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { got = std::move(r); });
  ASSERT_FALSE(got.has_value());
  auto resumed = broker_->SetQueuePaused("q", false);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(resumed->policy.paused);
  ASSERT_TRUE(got.has_value()) << "a waiting Lease is served as soon as the queue resumes";
  ASSERT_TRUE(got->ok());
  EXPECT_THAT(**got, SizeIs(2));
}

TEST_F(BrokerAdminTest, APauseLeavesRunningJobsAloneAndResumeServesTheLineInOrder) {
  for (int i = 0; i < 3; ++i) Enqueue("q");
  LeasedJob running = LeaseOne("q");
  ASSERT_TRUE(broker_->SetQueuePaused("q", true).ok());
  EXPECT_TRUE(broker_->Ack(AckSpec{running.job_id, running.lease_id, ""}).ok())
      << "a job leased before the pause finishes as usual";
  EXPECT_EQ(Get(running.job_id).state, JobState::kCompleted);
  Enqueue("q");

  std::optional<absl::StatusOr<std::vector<LeasedJob>>> first, second;
  broker_->Lease(LeaseSpec{"q", "first", 1, {}}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { first = std::move(r); });
  broker_->Lease(LeaseSpec{"q", "second", 10, {}}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { second = std::move(r); });
  EXPECT_EQ(broker_->GetQueue("q")->waiting_leases, 2);
  ASSERT_TRUE(broker_->SetQueuePaused("q", false).ok());
  ASSERT_TRUE(first.has_value() && first->ok());
  ASSERT_TRUE(second.has_value() && second->ok());
  EXPECT_THAT(**first, SizeIs(1)) << "the first in line is served first, with what it asked";
  EXPECT_THAT(**second, SizeIs(2)) << "the next takes the rest";
}

TEST_F(BrokerAdminTest, PauseIsPersistedAndSurvivesARestart) {
  Enqueue("q");
  ASSERT_TRUE(broker_->SetQueuePaused("q", true).ok());
  OpenOver(recorder_);
  EXPECT_TRUE(broker_->GetQueue("q")->policy.paused);
  EXPECT_EQ(Leasable("q"), 0u);
  ASSERT_TRUE(broker_->SetQueuePaused("q", false).ok());
  OpenOver(recorder_);
  EXPECT_EQ(Leasable("q"), 1u);
}

TEST_F(BrokerAdminTest, PauseOfAnUnknownQueueIsNotFoundAndCreatesNothing) {
  for (bool paused : {true, false}) {
    EXPECT_THAT(broker_->SetQueuePaused("nobody", paused), StatusIs(Code::kNotFound));
  }
  EXPECT_THAT(broker_->ListQueues(), SizeIs(0));
  EXPECT_EQ(store_.policy_count(), 0u);
  auto bad = broker_->SetQueuePaused("", true);
  EXPECT_THAT(bad, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(bad.status().message(), HasSubstr("queue"));
}

// ---------------------------------------------------------------------------------------------
// PurgeQueue

TEST_F(BrokerAdminTest, PurgeRemovesEndedJobsByDefault) {
  std::string completed = Enqueue("q");
  ASSERT_TRUE(broker_->Ack(AckSpec{completed, LeaseOne("q").lease_id, ""}).ok());
  std::vector<std::string> dead = FailedJobs("q", 2);
  std::string cancelled = CancelledJobs("q", 1)[0];
  std::string active = Enqueue("q");
  LeaseOne("q");
  std::string other = FailedJobs("other", 1)[0];
  std::string ready = Enqueue("q");
  EnqueueSpec later{.queue = "q"};
  later.delay = absl::Hours(1);
  std::string scheduled = broker_->Enqueue(later)->job_id;

  auto purged = broker_->PurgeQueue("q");
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 4);
  for (const std::string& id : {completed, dead[0], dead[1], cancelled}) {
    EXPECT_THAT(broker_->GetJob(id), StatusIs(Code::kNotFound));
    EXPECT_FALSE(store_.FindJob(id).has_value());
  }
  for (const std::string& id : {ready, scheduled, active, other})
    EXPECT_TRUE(broker_->GetJob(id).ok());
  auto info = broker_->GetQueue("q");
  EXPECT_EQ(info->counts[JobState::kReady], 1);
  EXPECT_EQ(info->counts[JobState::kScheduled], 1);
  EXPECT_EQ(info->counts[JobState::kActive], 1);
  EXPECT_EQ(info->counts[JobState::kCompleted] + info->counts[JobState::kFailed] +
                info->counts[JobState::kCancelled],
            0);
}

TEST_F(BrokerAdminTest, PurgeRemovesWaitingJobsOnlyWhenNamed) {
  std::string dead = FailedJobs("q", 1)[0];
  std::vector<std::string> ready = {Enqueue("q"), Enqueue("q")};
  EnqueueSpec later{.queue = "q"};
  later.delay = absl::Hours(1);
  std::string scheduled = broker_->Enqueue(later)->job_id;

  auto purged = broker_->PurgeQueue("q", {JobState::kReady});
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 2);
  EXPECT_EQ(Get(scheduled).state, JobState::kScheduled);
  EXPECT_EQ(Get(dead).state, JobState::kFailed);
  purged = broker_->PurgeQueue("q", {JobState::kScheduled, JobState::kFailed});
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 2);
  clock_.Advance(absl::Hours(2));
  EXPECT_EQ(Leasable("q"), 0u);
}

TEST_F(BrokerAdminTest, PurgeRefusesActiveAndUnknownQueues) {
  std::string active = Enqueue("q");
  LeaseOne("q");
  auto r = broker_->PurgeQueue("q", {JobState::kReady, JobState::kActive});
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), StartsWith("states"));
  EXPECT_EQ(Get(active).state, JobState::kActive);
  EXPECT_THAT(broker_->PurgeQueue("nobody"), StatusIs(Code::kNotFound));
  EXPECT_THAT(broker_->GetQueue("nobody"), StatusIs(Code::kNotFound)) << "not created";
  EXPECT_THAT(broker_->PurgeQueue(""), StatusIs(Code::kInvalidArgument));
}

TEST_F(BrokerAdminTest, PurgeWorksInBatchesOfAThousand) {
  PolicyOverride keep_all;
  keep_all.completed_max_count = 0;  // no retention limit: keep every completed job
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", keep_all).ok());
  std::vector<EnqueueSpec> batch(1000, EnqueueSpec{.queue = "q", .payload = "x"});
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(broker_->EnqueueBatch(batch).ok());
  for (int i = 0; i < 2; ++i) {
    auto leased = broker_->Lease(LeaseSpec{"q", "w", 1000, {}});
    ASSERT_TRUE(leased.ok());
    for (const LeasedJob& j : *leased)
      ASSERT_TRUE(broker_->Ack(AckSpec{j.job_id, j.lease_id, ""}).ok());
  }
  std::vector<EnqueueSpec> waiting(500, EnqueueSpec{.queue = "q", .payload = "y"});
  ASSERT_TRUE(broker_->EnqueueBatch(waiting).ok());
  recorder_.Take();

  auto purged = broker_->PurgeQueue("q");
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 2000);
  EXPECT_THAT(DeleteSizes(recorder_.Take()), ElementsAre(1000, 1000));
  EXPECT_EQ(store_.job_count(), 500u);
  EXPECT_EQ(Count("q", JobState::kReady), 500);
}

TEST_F(BrokerAdminTest, PurgeFindsEndedJobsBehindALongBacklog) {
  // 25000 waiting jobs and 3 ended ones behind them: the purge looks at no more than
  // kBulkVisitsPerBatch jobs per turn under the lock, so it takes several turns to reach them.
  std::vector<EnqueueSpec> batch(1000, EnqueueSpec{.queue = "q", .payload = "x"});
  for (int i = 0; i < 25; ++i) ASSERT_TRUE(broker_->EnqueueBatch(batch).ok());
  std::vector<std::string> cancelled = CancelledJobs("q", 3);
  recorder_.Take();
  const int64_t writes = store_.successful_writes();
  auto purged = broker_->PurgeQueue("q");
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 3);
  // Turns that removed nothing write nothing: one write, for the turn that found them.
  EXPECT_THAT(DeleteSizes(recorder_.Take()), ElementsAre(3));
  EXPECT_EQ(store_.successful_writes(), writes + 1);
  EXPECT_EQ(Count("q", JobState::kReady), 25000);
}

TEST_F(BrokerAdminTest, PurgeKeepsJobsEnqueuedAfterItStarted) {
  OpenOver(recorder_, CommitPipeline::Mode::kBackground);
  std::vector<EnqueueSpec> batch(1000, EnqueueSpec{.queue = "q", .payload = "x"});
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(broker_->EnqueueBatch(batch).ok());

  recorder_.Close();
  absl::Notification done;
  absl::StatusOr<int64_t> purged;
  broker_->PurgeQueue("q", {JobState::kReady}, [&](absl::StatusOr<int64_t> r) {
    purged = std::move(r);
    done.Notify();
  });
  recorder_.AwaitBlockedWrite();  // the first batch is being written
  absl::Notification enqueued;
  std::string late;
  std::vector<EnqueueSpec> one{EnqueueSpec{.queue = "q", .payload = "late"}};
  broker_->EnqueueBatch(std::move(one), [&](absl::StatusOr<std::vector<EnqueueResult>> r) {
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) late = r->front().job_id;
    enqueued.Notify();
  });
  recorder_.Open();
  done.WaitForNotification();
  enqueued.WaitForNotification();
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 2000);
  EXPECT_EQ(Get(late).state, JobState::kReady);
  EXPECT_EQ(Count("q", JobState::kReady), 1);
}

// ---------------------------------------------------------------------------------------------
// GetQueue

TEST_F(BrokerAdminTest, QueueInfoCountsActiveAndDeadJobs) {
  FailedJobs("q", 2);
  CancelledJobs("q", 1);
  Enqueue("q");
  Enqueue("q");
  LeaseOne("q");
  auto info = broker_->GetQueue("q");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->active, 1);
  EXPECT_EQ(info->dead, 2) << "FAILED only";
  EXPECT_EQ(info->active, info->counts[JobState::kActive]);
  EXPECT_EQ(info->dead, info->counts[JobState::kFailed]);
}

TEST_F(BrokerAdminTest, QueueInfoCountsEnqueuesAndAcksSinceStart) {
  FailedJobs("q", 1);
  Enqueue("q", "a");
  Enqueue("q", "b");
  EnqueueSpec dup{.queue = "q", .payload = "a"};
  dup.dedup_key = "k";
  ASSERT_TRUE(broker_->Enqueue(dup).ok());
  ASSERT_TRUE(broker_->Enqueue(dup).ok());  // deduplicated: nothing created
  const LeasedJob a = LeaseOne("q");
  ASSERT_TRUE(broker_->Ack(AckSpec{a.job_id, a.lease_id}).ok());
  auto info = broker_->GetQueue("q");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->enqueued_total, 4) << "the failed job, a, b and the first dedup enqueue";
  EXPECT_EQ(info->completed_total, 1) << "a failed attempt is not a completion";

  // Counters of this process: a restart starts them again, though the jobs are still there.
  OpenOver(recorder_);
  info = broker_->GetQueue("q");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->enqueued_total, 0);
  EXPECT_EQ(info->completed_total, 0);
  EXPECT_EQ(info->counts[JobState::kReady], 2) << "b and the dedup job";
}

TEST_F(BrokerAdminTest, ListJobsByDedupKeyFindsTheJobHoldingIt) {
  Enqueue("q", "other");
  EnqueueSpec keyed{.queue = "q", .payload = "p"};
  keyed.dedup_key = "order-7";
  auto r = broker_->Enqueue(keyed);
  ASSERT_TRUE(r.ok()) << r.status();
  Enqueue("q2", "same key, other queue");

  auto found = broker_->ListJobs({.queue = "q", .dedup_key = "order-7"});
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_THAT(found->jobs, SizeIs(1));
  EXPECT_EQ(found->jobs[0].id, r->job_id);
  EXPECT_EQ(found->next_page_token, "");

  // With a state the job is not in, or a key nobody holds, or in another queue: no job.
  auto wrong_state =
      broker_->ListJobs({.queue = "q", .state = JobState::kFailed, .dedup_key = "order-7"});
  ASSERT_TRUE(wrong_state.ok());
  EXPECT_THAT(wrong_state->jobs, SizeIs(0));
  auto unknown = broker_->ListJobs({.queue = "q", .dedup_key = "order-8"});
  ASSERT_TRUE(unknown.ok());
  EXPECT_THAT(unknown->jobs, SizeIs(0));
  auto other_queue = broker_->ListJobs({.queue = "q2", .dedup_key = "order-7"});
  ASSERT_TRUE(other_queue.ok());
  EXPECT_THAT(other_queue->jobs, SizeIs(0));
}

}  // namespace
}  // namespace jobbroker::core
