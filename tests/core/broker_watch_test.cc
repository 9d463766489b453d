// Admin.WatchJob in core: what a watcher is told of its job and when, on the fake clock.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/recording_watcher.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {
namespace {

using ::jobbroker::testing::RecordingWatcher;
using ::jobbroker::testing::StatusIs;
using ::testing::ElementsAre;

class BrokerWatchTest : public BrokerFixture {
 protected:
  std::shared_ptr<RecordingWatcher> Watch(const std::string& id, uint64_t* handle = nullptr) {
    auto w = std::make_shared<RecordingWatcher>();
    absl::StatusOr<uint64_t> h = broker_->broker().WatchJob(id, w);
    EXPECT_TRUE(h.ok()) << h.status();
    if (handle != nullptr && h.ok()) *handle = *h;
    return w;
  }
};

TEST_F(BrokerWatchTest, AWatcherSeesTheJobNowThenEachChangeAndTheEnd) {
  const std::string id = Enqueue("q");
  auto w = Watch(id);
  EXPECT_THAT(w->states(), ElementsAre(JobState::kReady));
  LeasedJob leased = LeaseOne("q");
  ASSERT_TRUE(broker_->Heartbeat(HeartbeatSpec{leased.job_id, leased.lease_id}).ok())
      << "a heartbeat that changes nothing a watcher sees";
  HeartbeatSpec progress{leased.job_id, leased.lease_id};
  progress.progress = R"({"percent": 50})";
  ASSERT_TRUE(broker_->Heartbeat(progress).ok());
  EXPECT_FALSE(w->ended().has_value());
  ASSERT_TRUE(broker_->Ack(AckSpec{leased.job_id, leased.lease_id, "done"}).ok());
  EXPECT_THAT(w->states(), ElementsAre(JobState::kReady, JobState::kActive, JobState::kActive,
                                       JobState::kCompleted));
  EXPECT_EQ(w->seen()[2].progress, R"({"percent": 50})");
  EXPECT_EQ(w->seen()[3].result, "done");
  ASSERT_TRUE(w->ended().has_value());
  EXPECT_TRUE(w->ended()->ok());
}

TEST_F(BrokerWatchTest, ManyWatchersOfOneJobEachSeeItsRetriesAndDeath) {
  EnqueueSpec spec{.queue = "q", .payload = "p", .max_attempts = 2};
  const std::string id = broker_->Enqueue(spec)->job_id;
  std::vector<std::shared_ptr<RecordingWatcher>> watchers;
  for (int i = 0; i < 50; ++i) watchers.push_back(Watch(id));
  for (int attempt = 0; attempt < 2; ++attempt) {
    clock_.Advance(absl::Hours(1));
    ASSERT_TRUE(Fail(LeaseOne("q"), "boom").ok());
  }
  for (const auto& w : watchers) {
    ASSERT_TRUE(w->ended().has_value());
    EXPECT_EQ(w->seen().back().state, JobState::kFailed);
    EXPECT_EQ(w->seen().back().fail_reason, FailReason::kAttemptsExhausted);
  }
}

TEST_F(BrokerWatchTest, AnEndedJobIsShownAndEndsAtOnce) {
  const std::string id = Enqueue("q");
  LeasedJob leased = LeaseOne("q");
  ASSERT_TRUE(broker_->Ack(AckSpec{leased.job_id, leased.lease_id, ""}).ok());
  uint64_t handle = 1;
  auto w = Watch(id, &handle);
  EXPECT_EQ(handle, 0u);
  EXPECT_THAT(w->states(), ElementsAre(JobState::kCompleted));
  ASSERT_TRUE(w->ended().has_value());
  EXPECT_TRUE(w->ended()->ok());
}

TEST_F(BrokerWatchTest, UnknownJobsAreNotFoundAndARemovedJobEndsItsWatch) {
  EXPECT_THAT(broker_->broker().WatchJob("01ARZ3NDEKTSV4RRFFQ69G5FAV",
                                         std::make_shared<RecordingWatcher>()),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(broker_->broker().WatchJob("", std::make_shared<RecordingWatcher>()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const std::string id = Enqueue("q");
  auto w = Watch(id);
  ASSERT_TRUE(broker_->DeleteJob(id).ok());
  ASSERT_TRUE(w->ended().has_value());
  EXPECT_EQ(w->ended()->code(), absl::StatusCode::kNotFound);
}

TEST_F(BrokerWatchTest, AnUnwatchedWatcherHearsNothingMore) {
  const std::string id = Enqueue("q");
  uint64_t handle = 0;
  auto w = Watch(id, &handle);
  ASSERT_NE(handle, 0u);
  broker_->broker().Unwatch(handle);
  LeaseOne("q");
  EXPECT_THAT(w->states(), ElementsAre(JobState::kReady));
  EXPECT_FALSE(w->ended().has_value());
}

TEST_F(BrokerWatchTest, ShutdownEndsEveryWatchUnavailable) {
  auto w = Watch(Enqueue("q"));
  broker_->Shutdown();
  ASSERT_TRUE(w->ended().has_value());
  EXPECT_EQ(w->ended()->code(), absl::StatusCode::kUnavailable);
}

TEST_F(BrokerWatchTest, AWatchSeesTheTimeOutOfItsJob) {
  const std::string id =
      broker_
          ->Enqueue({.queue = "q", .payload = "p", .max_attempts = 1, .timeout = absl::Seconds(5)})
          ->job_id;
  auto w = Watch(id);
  LeaseOne("q", "w1", absl::Minutes(1));
  clock_.Advance(absl::Seconds(5));
  broker_->Tick();
  ASSERT_TRUE(w->ended().has_value());
  EXPECT_EQ(w->seen().back().attempts.back().outcome, AttemptOutcome::kTimedOut);
}

}  // namespace
}  // namespace jobbroker::core
