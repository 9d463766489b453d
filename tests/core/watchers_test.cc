#include "core/watchers.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

class NullWatcher : public JobWatcher {
 public:
  void Changed(Job) override {}
  void End(absl::Status) override {}
};

Job JobIn(JobState state, int attempt = 0, std::string progress = "") {
  Job j;
  j.id = "job-1";
  j.state = state;
  j.attempt = attempt;
  j.progress = std::move(progress);
  return j;
}

TEST(WatchersTest, AChangeNobodyWouldSeeCostsNoNotice) {
  Watchers w;
  w.Add(JobIn(JobState::kActive, 1), std::make_shared<NullWatcher>());
  std::vector<WatchNotice> out;
  Job heartbeat = JobIn(JobState::kActive, 1);
  heartbeat.lease_deadline = absl::FromUnixSeconds(99);  // only the lease moved
  w.Collect(heartbeat, out);
  EXPECT_TRUE(out.empty());
  w.Collect(JobIn(JobState::kActive, 1, R"({"percent":5})"), out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].job.has_value());
  EXPECT_FALSE(out[0].end.has_value());
}

TEST(WatchersTest, ATerminalStateIsShownThenEndsEveryWatchOfTheJob) {
  Watchers w;
  w.Add(JobIn(JobState::kReady), std::make_shared<NullWatcher>());
  w.Add(JobIn(JobState::kReady), std::make_shared<NullWatcher>());
  std::vector<WatchNotice> out;
  w.Collect(JobIn(JobState::kCompleted, 1), out);
  ASSERT_EQ(out.size(), 2u);
  for (const WatchNotice& n : out) {
    ASSERT_TRUE(n.job.has_value());
    EXPECT_EQ(n.job->state, JobState::kCompleted);
    ASSERT_TRUE(n.end.has_value());
    EXPECT_TRUE(n.end->ok());
  }
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.size(), 0u);
}

TEST(WatchersTest, ARemovedJobEndsItsWatchesNotFoundAndRemoveForgetsOne) {
  Watchers w;
  const uint64_t first = w.Add(JobIn(JobState::kReady), std::make_shared<NullWatcher>());
  w.Add(JobIn(JobState::kReady), std::make_shared<NullWatcher>());
  EXPECT_TRUE(w.Remove(first));
  EXPECT_FALSE(w.Remove(first));
  std::vector<WatchNotice> out;
  w.CollectRemoved("job-1", out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].end->code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(w.empty());
}

TEST(WatchersTest, DetachAllEndsEveryWatchWithTheReason) {
  Watchers w;
  w.Add(JobIn(JobState::kReady), std::make_shared<NullWatcher>());
  Job other = JobIn(JobState::kReady);
  other.id = "job-2";
  w.Add(other, std::make_shared<NullWatcher>());
  std::vector<WatchNotice> out;
  w.DetachAll(absl::UnavailableError("shutting down"), out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].end->code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(w.empty());
}

}  // namespace
}  // namespace jobbroker::core
