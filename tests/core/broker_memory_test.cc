// The memory model: past max_hot_jobs, READY and SCHEDULED jobs are kept as index entries only
// and read back from the store when they are needed (core/broker_memory.cc).
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/broker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/gate_store.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::GateStore;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::ElementsAre;

class BrokerMemoryTest : public BrokerFixture {
 protected:
  void SetUp() override {}  // each test opens with its own limit

  void OpenWithLimit(int64_t max_hot_jobs) {
    max_hot_jobs_ = max_hot_jobs;
    broker_.reset();
    BrokerOptions o = Options();
    o.max_hot_jobs = max_hot_jobs_;
    auto opened = BlockingBroker::Open(store_, clock_, std::move(o));
    ASSERT_TRUE(opened.ok()) << opened.status();
    broker_ = std::move(*opened);
  }

  std::string EnqueueWith(EnqueueSpec spec) {
    auto r = broker_->Enqueue(std::move(spec));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id : "";
  }

  // Any mutating call gives the broker its chance to freeze what was written.
  void Touch() { ASSERT_TRUE(broker_->UpdateQueuePolicy("other", PolicyOverride{}).ok()); }

  int64_t max_hot_jobs_ = 0;
};

TEST_F(BrokerMemoryTest, ColdJobsAreLeasedWholeInPriorityThenFifoOrder) {
  OpenWithLimit(0);
  EnqueueSpec low{.queue = "q", .payload = "low", .headers = {{"k", "v"}}, .priority = 0};
  std::string a = EnqueueWith(low);
  std::string b = EnqueueWith({.queue = "q", .payload = "high", .priority = 5});
  std::string c = EnqueueWith({.queue = "q", .payload = "low too", .priority = 0});
  Touch();
  EXPECT_EQ(broker_->memory_counts().cold_jobs, 3);
  EXPECT_EQ(broker_->memory_counts().hot_jobs, 0);

  LeasedJob first = LeaseOne("q");
  LeasedJob second = LeaseOne("q");
  LeasedJob third = LeaseOne("q");
  EXPECT_EQ(first.job_id, b);
  EXPECT_EQ(second.job_id, a);
  EXPECT_EQ(third.job_id, c);
  EXPECT_EQ(second.payload, "low");
  EXPECT_EQ(second.headers, (std::map<std::string, std::string>{{"k", "v"}}));
  EXPECT_EQ(second.attempt, 1);
  // ACTIVE jobs are never cold.
  EXPECT_EQ(broker_->memory_counts().cold_jobs, 0);
  EXPECT_EQ(broker_->memory_counts().hot_jobs, 3);
  EXPECT_TRUE(broker_->Ack(AckSpec{first.job_id, first.lease_id, ""}).ok());
}

TEST_F(BrokerMemoryTest, OnlyJobsBeyondTheLimitGoCold) {
  OpenWithLimit(2);
  for (int i = 0; i < 5; ++i) Enqueue("q", absl::StrCat("p", i));
  Touch();
  EXPECT_EQ(broker_->memory_counts().hot_jobs, 2);
  EXPECT_EQ(broker_->memory_counts().cold_jobs, 3);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(LeaseOne("q").payload, absl::StrCat("p", i));
}

TEST_F(BrokerMemoryTest, ReadsAndAdminCallsSeeColdJobsWhole) {
  OpenWithLimit(0);
  std::string a = EnqueueWith({.queue = "q", .payload = "a", .headers = {{"h", "1"}}});
  std::string b = EnqueueWith({.queue = "q", .payload = "b"});
  std::string c = EnqueueWith({.queue = "q", .payload = "c"});
  std::string d = EnqueueWith({.queue = "q", .payload = "d"});
  clock_.Advance(absl::Seconds(3));
  Touch();
  ASSERT_EQ(broker_->memory_counts().cold_jobs, 4);

  Job got = Get(a);
  EXPECT_EQ(got.payload, "a");
  EXPECT_EQ(got.headers, (std::map<std::string, std::string>{{"h", "1"}}));
  EXPECT_EQ(got.state, JobState::kReady);
  EXPECT_EQ(*broker_->JobQueue(b), "q");

  auto info = broker_->GetQueue("q");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->counts[JobState::kReady], 4);
  EXPECT_EQ(info->oldest_ready_age, absl::Seconds(3));

  auto cancelled = broker_->CancelJob(b);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  EXPECT_EQ(cancelled->payload, "b");
  EXPECT_TRUE(broker_->DeleteJob(c).ok());
  EXPECT_THAT(broker_->GetJob(c), StatusIs(absl::StatusCode::kNotFound));

  Touch();  // a read back may go cold again
  auto listed = broker_->ListJobs({.queue = "q", .state = JobState::kReady});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->jobs.size(), 2u);
  EXPECT_EQ(listed->jobs[0].id, a);
  EXPECT_EQ(listed->jobs[1].id, d);
  EXPECT_EQ(listed->jobs[1].payload, "d");

  auto purged = broker_->PurgeQueue("q", {JobState::kReady});
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 2);
  EXPECT_EQ(broker_->memory_counts().cold_jobs, 0);
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kReady], 0);
  EXPECT_FALSE(store_.FindJob(a).has_value());
  EXPECT_EQ(Leasable("q"), 0u);
}

TEST_F(BrokerMemoryTest, TheOldestReadyAgeOfAColdJobComesFromItsIdWithoutAReadBack) {
  OpenWithLimit(0);
  Enqueue("q", "a");
  clock_.Advance(absl::Seconds(7));
  Touch();
  ASSERT_EQ(broker_->memory_counts().cold_jobs, 1);
  auto info = broker_->GetQueue("q");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->oldest_ready_age, absl::Seconds(7));
  EXPECT_EQ(broker_->memory_counts().hot_jobs, 0) << "a metrics scrape read a job back";
}

TEST_F(BrokerMemoryTest, AColdScheduledJobComesDue) {
  OpenWithLimit(0);
  std::string id = EnqueueWith({.queue = "q", .payload = "later", .delay = absl::Seconds(10)});
  Touch();
  ASSERT_EQ(broker_->memory_counts().cold_jobs, 1);
  EXPECT_EQ(Get(id).state, JobState::kScheduled);
  Touch();
  EXPECT_EQ(Leasable("q"), 0u);
  clock_.Advance(absl::Seconds(10));
  broker_->Tick();
  LeasedJob job = LeaseOne("q");
  EXPECT_EQ(job.job_id, id);
  EXPECT_EQ(job.payload, "later");
}

TEST_F(BrokerMemoryTest, ARestartKeepsJobsPastTheLimitCold) {
  OpenWithLimit(100);
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(Enqueue("q", absl::StrCat("p", i), i % 2));
  std::string later = EnqueueWith({.queue = "q", .payload = "s", .delay = absl::Seconds(5)});
  OpenWithLimit(2);
  EXPECT_EQ(broker_->memory_counts().hot_jobs, 2);
  EXPECT_EQ(broker_->memory_counts().cold_jobs, 5);
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kReady], 6);
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kScheduled], 1);
  // Priority 1 first (p1, p3, p5), then priority 0 (p0, p2, p4), FIFO inside each.
  std::vector<std::string> payloads;
  for (int i = 0; i < 6; ++i) payloads.push_back(LeaseOne("q").payload);
  EXPECT_THAT(payloads, ElementsAre("p1", "p3", "p5", "p0", "p2", "p4"));
  clock_.Advance(absl::Seconds(5));
  broker_->Tick();
  EXPECT_EQ(LeaseOne("q").job_id, later);
  // Enqueue after the restart still gets fresh sequence numbers (FIFO after the old jobs).
  std::string fresh = Enqueue("q", "fresh");
  EXPECT_EQ(LeaseOne("q").job_id, fresh);
}

TEST_F(BrokerMemoryTest, AColdJobThatCannotBeReadIsSetAsideAndTheRestAreServed) {
  OpenWithLimit(0);
  std::string a = Enqueue("q", "a");
  std::string b = Enqueue("q", "b");
  std::string c = Enqueue("q", "c");
  Touch();
  ASSERT_EQ(broker_->memory_counts().cold_jobs, 3);
  // The record goes missing behind the broker's back.
  Transition lose;
  lose.delete_jobs.push_back(a);
  ASSERT_TRUE(store_.Write({lose}).ok());

  EXPECT_EQ(LeaseOne("q").job_id, b);
  EXPECT_THAT(broker_->GetJob(a), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(broker_->corrupt_records(), 1);
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kReady], 1);
  EXPECT_EQ(LeaseOne("q").job_id, c);
  EXPECT_EQ(Leasable("q"), 0u);
}

TEST_F(BrokerMemoryTest, ARecordThatNoLongerMatchesTheIndexesIsNotTaken) {
  OpenWithLimit(0);
  std::string a = Enqueue("q", "a", 3);
  std::string b = Enqueue("q", "b");
  Touch();
  // The stored record of `a` changes behind the broker's back (another priority).
  Job changed = *store_.FindJob(a);
  changed.priority = 0;
  Transition t;
  t.put_jobs.push_back(changed);
  ASSERT_TRUE(store_.Write({t}).ok());

  EXPECT_EQ(LeaseOne("q").job_id, b);
  EXPECT_THAT(broker_->GetJob(a), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(Leasable("q"), 0u);
}

TEST(BrokerMemoryPipelineTest, AJobGoesColdOnlyOnceItsRecordIsInTheStore) {
  GateStore store;
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  BrokerOptions o;
  o.commit_mode = CommitPipeline::Mode::kBackground;
  o.max_hot_jobs = 0;
  auto opened = BlockingBroker::Open(store, clock, o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockingBroker& broker = **opened;
  const int before = store.entered();

  store.SetOpen(false);
  absl::Notification first_done, second_done;
  auto enqueue = [&](const std::string& payload, absl::Notification& done) {
    broker.EnqueueBatch({EnqueueSpec{.queue = "q", .payload = payload}},
                        [&done](absl::StatusOr<std::vector<EnqueueResult>> r) {
                          EXPECT_TRUE(r.ok()) << r.status();
                          done.Notify();
                        });
  };
  enqueue("first", first_done);
  store.AwaitEntered(before + 1);  // the writer holds the first job's put
  enqueue("second", second_done);  // an operation: it would freeze what is written
  EXPECT_EQ(broker.memory_counts().cold_jobs, 0);
  EXPECT_EQ(broker.memory_counts().hot_jobs, 2);

  store.SetOpen(true);
  first_done.WaitForNotification();
  second_done.WaitForNotification();
  ASSERT_TRUE(broker.Enqueue({.queue = "q", .payload = "third"}).ok());
  EXPECT_EQ(broker.memory_counts().cold_jobs, 2);

  auto leased = broker.Lease(LeaseSpec{"q", "w", 3, absl::ZeroDuration()});
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_EQ(leased->size(), 3u);
  EXPECT_EQ((*leased)[0].payload, "first");
  EXPECT_EQ((*leased)[1].payload, "second");
  EXPECT_EQ((*leased)[2].payload, "third");
  broker.Shutdown();
  ASSERT_TRUE(broker.Flush().ok());
}

}  // namespace
}  // namespace jobbroker::core
