// The broker on a store that fails and heals (MemoryStore's fault injection), and on one that
// holds records it cannot decode: what is refused, with which code, what still answers, when
// the store is tried again, and what a rebuild does to waiting consumers.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/broker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/memory_store.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;
using ::jobbroker::testing::TickingClock;

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Code = absl::StatusCode;

// Counts the storage events.
class StorageEvents : public BrokerObserver {
 public:
  void StoreFailed(const absl::Status& s) override {
    absl::MutexLock lock(&mu_);
    failed.push_back(s);
  }
  void StoreResumed(const absl::Status& cause, absl::Duration outage) override {
    absl::MutexLock lock(&mu_);
    resumed.push_back(cause);
    outages.push_back(outage);
  }
  void CorruptRecordSkipped(const CorruptRecord& r) override {
    absl::MutexLock lock(&mu_);
    corrupt.push_back(absl::StrCat(RecordKindName(r.kind), ":", r.key));
  }
  void RecoveryStarted(uint32_t /*partition*/) override {
    absl::MutexLock lock(&mu_);
    recovery_events.push_back("started");
  }
  void RecoveryFailed(uint32_t /*partition*/, const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    recovery_events.push_back(absl::StrCat("failed: ", status.message()));
  }
  void Recovered(uint32_t /*partition*/, size_t jobs, size_t /*expired_leases*/,
                 absl::Duration /*took*/) override {
    absl::MutexLock lock(&mu_);
    recovered.push_back(jobs);
    recovery_events.push_back(absl::StrCat("recovered ", jobs));
  }
  void Recovering(uint32_t /*partition*/, size_t jobs, absl::Duration elapsed) override {
    absl::MutexLock lock(&mu_);
    progress.emplace_back(jobs, elapsed);
  }
  absl::Mutex mu_;
  std::vector<absl::Status> failed, resumed;
  std::vector<absl::Duration> outages;
  std::vector<std::string> corrupt;
  std::vector<size_t> recovered;  // the job count of each recovery (the "recovered" log line)
  // "started", "failed: <message>", "recovered <jobs>", in order (the recovery metrics' events)
  std::vector<std::string> recovery_events;
  std::vector<std::pair<size_t, absl::Duration>> progress;  // (jobs so far, elapsed)
};

class BrokerStorageTest : public BrokerFixture {
 protected:
  void SetUp() override {
    BrokerOptions o = Options();
    o.observer = &events_;
    o.store_retry_interval = absl::Seconds(2);
    auto opened = BlockingBroker::Open(store_, clock_, o);
    ASSERT_TRUE(opened.ok()) << opened.status();
    broker_ = std::move(*opened);
  }
  StorageEvents events_;
};

// The count a recovery reports (the "recovered" log line) is every job it found, cold ones too:
// before issue 23 it counted only the jobs kept whole, at a restart and at a rebuild alike.
TEST_F(BrokerStorageTest, ARecoveryCountsEveryJobItFoundHotOrCold) {
  for (int i = 0; i < 5; ++i) Enqueue("q", absl::StrCat("p", i));
  broker_.reset();
  BrokerOptions o = Options();
  o.observer = &events_;
  o.max_hot_jobs = 2;  // 2 whole, 3 as index entries
  auto opened = BlockingBroker::Open(store_, clock_, o);
  ASSERT_THAT(opened, IsOk());
  broker_ = std::move(*opened);
  EXPECT_EQ(broker_->memory_counts().cold_jobs, 3);
  ASSERT_EQ(events_.recovered.size(), 2u) << "the first open, then the restart";
  EXPECT_EQ(events_.recovered.back(), 5u);

  // A rebuild after a failed write counts the same way.
  store_.FailWritesAfter(0);
  EXPECT_FALSE(broker_->Enqueue(EnqueueSpec{.queue = "q", .payload = "lost"}).ok());
  store_.FailWritesAfter(-1);
  ASSERT_THAT(broker_->ResumeWrites(), IsOk());
  ASSERT_EQ(events_.recovered.size(), 3u);
  EXPECT_EQ(events_.recovered.back(), 5u) << "the refused job was never stored";
}

// A long recovery says it is moving (/metrics' loaded-jobs gauge, the "recovering" log line):
// between chunks, at most every kRecoveryProgressEvery, with the jobs loaded so far; a recovery
// quicker than that says nothing until it is done.
TEST_F(BrokerStorageTest, ALongRecoveryReportsItsProgressBetweenChunks) {
  for (int i = 0; i < 100; ++i) Enqueue("q", absl::StrCat("p", i));
  broker_.reset();
  EXPECT_THAT(events_.progress, ::testing::IsEmpty()) << "the first open found nothing";

  TickingClock ticking(absl::FromUnixSeconds(1'800'000'000));
  BrokerOptions o = Options();
  o.observer = &events_;
  o.recovery_chunk_jobs = 10;
  auto opened = BlockingBroker::Open(store_, ticking, o);
  ASSERT_THAT(opened, IsOk());
  broker_ = std::move(*opened);
  ASSERT_EQ(events_.recovered.back(), 100u);
  ASSERT_GE(events_.progress.size(), 2u) << "10 chunks, each read of the clock 2 s later";
  size_t last_jobs = 0;
  absl::Duration last_elapsed = absl::ZeroDuration();
  for (const auto& [jobs, elapsed] : events_.progress) {
    EXPECT_GT(jobs, last_jobs);
    EXPECT_LE(jobs, 100u);
    EXPECT_EQ(jobs % 10, 0u) << "reported between whole chunks";
    EXPECT_GE(elapsed - last_elapsed, kRecoveryProgressEvery);
    last_jobs = jobs;
    last_elapsed = elapsed;
  }

  // The same store on the fixture's clock, which stands still: no progress line.
  broker_.reset();
  const size_t reports = events_.progress.size();
  auto again = BlockingBroker::Open(store_, clock_, o);
  ASSERT_THAT(again, IsOk());
  broker_ = std::move(*again);
  EXPECT_EQ(events_.progress.size(), reports);
  EXPECT_EQ(events_.recovered.back(), 100u);
}

// What /metrics' jobbroker_recovering follows: a rebuild is announced only once the store takes
// writes again (a retry refused by a broken store recovers nothing), and ends once, failed or not.
TEST_F(BrokerStorageTest, ARebuildIsAnnouncedOnceTheStoreTakesWritesAndEndsOnceFailedOrNot) {
  Enqueue("q", "a");
  ASSERT_THAT(events_.recovery_events, ElementsAre("started", "recovered 0")) << "the open";
  store_.FailWritesAfter(0);
  EXPECT_THAT(broker_->Enqueue(EnqueueSpec{.queue = "q", .payload = "b"}),
              StatusIs(Code::kUnavailable));

  clock_.Advance(absl::Seconds(2));
  broker_->Tick();
  EXPECT_EQ(store_.resume_calls(), 1);
  EXPECT_EQ(events_.recovery_events.size(), 2u) << "the store refused: nothing recovered";

  store_.FailWritesAfter(-1);
  store_.FailRecoveries(absl::DataLossError("unreadable"));
  clock_.Advance(absl::Seconds(2));
  broker_->Tick();
  EXPECT_EQ(store_.resume_calls(), 2);
  EXPECT_FALSE(broker_->storage_status().ok());

  store_.FailRecoveries(absl::OkStatus());
  clock_.Advance(absl::Seconds(2));
  broker_->Tick();
  ASSERT_TRUE(broker_->storage_status().ok());
  EXPECT_THAT(events_.recovery_events, ElementsAre("started", "recovered 0", "started",
                                                   "failed: unreadable", "started", "recovered 1"));
}

TEST_F(BrokerStorageTest, AFailedRecoveryAtTheOpenIsReportedAndFailsTheOpen) {
  broker_.reset();
  store_.FailRecoveries(absl::DataLossError("unreadable"));
  EXPECT_THAT(BlockingBroker::Open(store_, clock_,
                                   [&] {
                                     BrokerOptions o = Options();
                                     o.observer = &events_;
                                     return o;
                                   }()),
              StatusIs(Code::kDataLoss));
  EXPECT_THAT(events_.recovery_events,
              ElementsAre("started", "recovered 0", "started", "failed: unreadable"));
}

TEST_F(BrokerStorageTest, AFullDiskRefusesChangesUntilTheStoreTakesWritesAgain) {
  const std::string a = Enqueue("q", "a");
  const int64_t writes = store_.successful_writes();
  store_.FailWritesAfter(0, absl::ResourceExhaustedError("disk full"));

  auto failed = broker_->Enqueue(EnqueueSpec{.queue = "q", .payload = "b"});
  EXPECT_THAT(failed, StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(failed.status().message(),
            "the change could not be made durable: storage is full: disk full; writes resume when "
            "space is freed");
  auto refused = broker_->Enqueue(EnqueueSpec{.queue = "q", .payload = "c"});
  EXPECT_THAT(refused, StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(refused.status().message(),
            "storage is full: disk full; writes resume when space is freed");
  EXPECT_THAT(broker_->Lease(LeaseSpec{"q", "w", 1, {}}), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(broker_->UpdateQueuePolicy("q", PolicyOverride{}),
              StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(store_.successful_writes(), writes) << "a refused change writes nothing";
  ASSERT_EQ(events_.failed.size(), 1u) << "one failure, reported once";
  EXPECT_THAT(events_.failed[0], StatusIs(Code::kResourceExhausted));

  // Reads answer.
  EXPECT_EQ(Get(a).payload, "a");
  EXPECT_TRUE(broker_->GetQueue("q").ok());
  EXPECT_TRUE(broker_->ListJobs(ListJobsSpec{.queue = "q"}).ok());

  // The store is tried again only every store_retry_interval, from Tick.
  broker_->Tick();
  clock_.Advance(absl::Seconds(1));
  broker_->Tick();
  EXPECT_EQ(store_.resume_calls(), 0);
  clock_.Advance(absl::Seconds(1));
  broker_->Tick();
  EXPECT_EQ(store_.resume_calls(), 1);
  EXPECT_THAT(broker_->storage_status(), StatusIs(Code::kResourceExhausted));
  broker_->Tick();
  EXPECT_EQ(store_.resume_calls(), 1) << "a failed try schedules the next one, 2 s on";

  store_.FailWritesAfter(-1);
  clock_.Advance(absl::Seconds(2));
  broker_->Tick();
  EXPECT_EQ(store_.resume_calls(), 2);
  ASSERT_TRUE(broker_->storage_status().ok());
  ASSERT_EQ(events_.resumed.size(), 1u);
  EXPECT_THAT(events_.resumed[0], StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(events_.outages[0], absl::Seconds(4));

  // Memory equals the store again: the enqueue whose write failed is gone.
  auto listed = broker_->ListJobs(ListJobsSpec{.queue = "q"});
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->jobs.size(), 1u);
  EXPECT_EQ(listed->jobs[0].id, a);
  const std::string d = Enqueue("q", "d");
  EXPECT_EQ(store_.job_count(), 2u);
  EXPECT_TRUE(store_.FindJob(d).has_value());
}

TEST_F(BrokerStorageTest, AnIoErrorIsUnavailable) {
  store_.FailWritesAfter(0);  // kUnavailable("injected write failure")
  auto failed = broker_->Enqueue(EnqueueSpec{.queue = "q"});
  EXPECT_THAT(failed, StatusIs(Code::kUnavailable));
  auto refused = broker_->Enqueue(EnqueueSpec{.queue = "q"});
  EXPECT_THAT(refused, StatusIs(Code::kUnavailable));
  EXPECT_EQ(refused.status().message(),
            "storage is failing: injected write failure; writes resume once the store recovers");
  store_.FailWritesAfter(-1);
  ASSERT_TRUE(broker_->ResumeWrites().ok());
  EXPECT_TRUE(broker_->Enqueue(EnqueueSpec{.queue = "q"}).ok());
}

TEST_F(BrokerStorageTest, NothingIsLeasedAndNothingExpiresWhileTheStoreFails) {
  const std::string a = Enqueue("q", "a");
  LeasedJob held = LeaseOne("q", "w", absl::Seconds(10));
  Enqueue("q", "b");
  store_.FailWritesAfter(0);
  EXPECT_FALSE(broker_->Enqueue(EnqueueSpec{.queue = "q"}).ok());
  clock_.Advance(absl::Seconds(30));  // the lease runs out meanwhile
  broker_->Tick();
  EXPECT_EQ(Get(a).state, JobState::kActive) << "an expiry would need a write";
  store_.FailWritesAfter(-1);
  clock_.Advance(absl::Seconds(2));
  broker_->Tick();
  ASSERT_TRUE(broker_->storage_status().ok());
  // The rebuild found the lease run out, like a restart would.
  EXPECT_EQ(Get(a).state, JobState::kScheduled);
  EXPECT_EQ(Get(a).attempts.back().outcome, AttemptOutcome::kLeaseExpired);
  EXPECT_EQ(store_.FindJob(a)->state, JobState::kScheduled) << "and wrote it";
  EXPECT_THAT(broker_->Ack(AckSpec{held.job_id, held.lease_id, ""}), IsOk())
      << "a late ack of the expired attempt is still taken";
}

// Records what a stream is told.
class EndSink : public StreamSink {
 public:
  void PushJob(LeasedJob) override {}
  void LeaseLost(std::string, core::AttemptOutcome) override {}
  void CancelRequested(std::string) override {}
  void End(absl::Status s) override { ended = s; }
  std::optional<absl::Status> ended;
};

TEST_F(BrokerStorageTest, TheRebuildEndsStreamsAndAnswersWaitingLeases) {
  auto sink = std::make_shared<EndSink>();
  ASSERT_TRUE(broker_->Subscribe(SubscribeSpec{{"streamed"}, "w", 1, {}}, sink).ok());
  std::optional<absl::StatusOr<std::vector<LeasedJob>>> polled;
  broker_->Lease(LeaseSpec{"polled", "w", 1, {}}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { polled = std::move(r); });
  store_.FailWritesAfter(0);
  EXPECT_FALSE(broker_->Enqueue(EnqueueSpec{.queue = "other"}).ok());
  EXPECT_FALSE(polled.has_value());
  EXPECT_FALSE(sink->ended.has_value());
  store_.FailWritesAfter(-1);
  ASSERT_TRUE(broker_->ResumeWrites().ok());
  ASSERT_TRUE(polled.has_value());
  ASSERT_TRUE(polled->ok());
  EXPECT_TRUE((*polled)->empty());
  ASSERT_TRUE(sink->ended.has_value());
  EXPECT_THAT(*sink->ended, StatusIs(Code::kUnavailable));
  EXPECT_THAT(sink->ended->message(), HasSubstr("subscribe again"));
}

// A MemoryStore that also reports corrupt records at Recover, as RocksDbStore does for records
// that do not decode.
class CorruptingStore final : public Store {
 public:
  absl::Status Write(absl::Span<const Transition> t) override {
    for (const Transition& x : t)
      for (const std::string& id : x.delete_jobs) deleted.push_back(id);
    return inner.Write(t);
  }
  absl::Status Recover(uint32_t partition, RecoveryVisitor& v) override {
    for (const CorruptRecord& r : corrupt) v.OnCorrupt(r);
    return inner.Recover(partition, v);
  }
  absl::Status Resume() override { return inner.Resume(); }
  absl::StatusOr<Job> ReadJob(uint32_t partition, const std::string& id) override {
    return inner.ReadJob(partition, id);
  }
  storage::MemoryStore inner;
  std::vector<CorruptRecord> corrupt;
  std::vector<std::string> deleted;
};

TEST(BrokerCorruptRecordTest, ACorruptJobIsSkippedAnsweredWithDataLossAndCanBeDeleted) {
  CorruptingStore store;
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  BrokerOptions o;
  o.commit_mode = CommitPipeline::Mode::kInline;
  StorageEvents events;
  o.observer = &events;
  std::string good;
  {
    auto broker = BlockingBroker::Open(store, clock, o);
    ASSERT_TRUE(broker.ok());
    good = (*broker)->Enqueue(EnqueueSpec{.queue = "q", .payload = "fine"})->job_id;
  }
  store.corrupt = {
      {RecordKind::kJob, "bad-job", absl::DataLossError("jobs record \"bad-job\": no parse")},
      {RecordKind::kPolicy, "q", absl::DataLossError("policies record \"q\": no parse")}};
  auto opened = BlockingBroker::Open(store, clock, o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockingBroker& broker = **opened;
  EXPECT_THAT(events.corrupt, ElementsAre("job:bad-job", "policy:q"));
  EXPECT_EQ(broker.corrupt_records(), 2);

  auto bad = broker.GetJob("bad-job");
  EXPECT_THAT(bad, StatusIs(Code::kDataLoss));
  EXPECT_THAT(bad.status().message(), HasSubstr("job bad-job is corrupt"));
  EXPECT_THAT(bad.status().message(), HasSubstr("no parse"));
  // Everything else works.
  EXPECT_EQ(broker.GetJob(good)->payload, "fine");
  auto leased = broker.Lease(LeaseSpec{"q", "w", 1, {}});
  ASSERT_TRUE(leased.ok() && leased->size() == 1u);
  EXPECT_TRUE(broker.Ack(AckSpec{good, leased->front().lease_id, ""}).ok());
  EXPECT_TRUE(broker.Enqueue(EnqueueSpec{.queue = "q"}).ok());

  // An operator deletes the record.
  ASSERT_TRUE(broker.DeleteJob("bad-job").ok());
  EXPECT_THAT(store.deleted, ElementsAre("bad-job"));
  EXPECT_EQ(broker.corrupt_records(), 1);
  EXPECT_THAT(broker.GetJob("bad-job"), StatusIs(Code::kNotFound));
}

}  // namespace
}  // namespace jobbroker::core
