// RecoveredState: what a store's Recover reports, with waiting jobs past the hot limit kept as
// index fields only.
#include "core/recovered_state.h"

#include "absl/random/random.h"
#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

Job StoredJob(absl::BitGen& gen, uint64_t seq, JobState state) {
  Job job;
  job.id = NewJobId(absl::FromUnixSeconds(1'800'000'000), 0, gen);
  job.queue = seq % 2 == 0 ? "even" : "odd";
  job.seq = seq;
  job.state = state;
  job.payload = "a payload that a cold job does not keep";
  return job;
}

TEST(RecoveredStateTest, WaitingJobsPastTheHotLimitAreKeptColdWithTheirQueueNamedOnce) {
  absl::BitGen gen;
  RecoveredState found(/*hot_limit=*/1);
  for (uint64_t seq = 1; seq <= 5; ++seq) found.OnJob(StoredJob(gen, seq, JobState::kReady));
  EXPECT_EQ(found.jobs.size(), 1u);
  ASSERT_EQ(found.cold.size(), 4u);
  EXPECT_EQ(found.queue_names.size(), 2u);
  EXPECT_EQ(found.queue_names[found.cold[0].queue], "even");
  EXPECT_EQ(found.job_count(), 5u);
}

TEST(RecoveredStateTest, ActiveAndEndedJobsStayWholeWhateverTheLimit) {
  absl::BitGen gen;
  RecoveredState found(/*hot_limit=*/0);
  found.OnJob(StoredJob(gen, 1, JobState::kActive));
  found.OnJob(StoredJob(gen, 2, JobState::kFailed));
  found.OnJob(StoredJob(gen, 3, JobState::kScheduled));
  EXPECT_EQ(found.jobs.size(), 2u);
  EXPECT_EQ(found.cold.size(), 1u);
}

TEST(RecoveredStateTest, AnIdThatCannotBePackedStaysWhole) {
  absl::BitGen gen;
  RecoveredState found(/*hot_limit=*/0);
  Job job = StoredJob(gen, 1, JobState::kReady);
  job.id = "not-a-ulid";
  found.OnJob(job);
  EXPECT_EQ(found.jobs.size(), 1u);
  EXPECT_TRUE(found.cold.empty());
}

}  // namespace
}  // namespace jobbroker::core
