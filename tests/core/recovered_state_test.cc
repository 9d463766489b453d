// RecoveredState: what a store's Recover reports, with waiting jobs past the hot limit kept as
// index fields only, in chunks; and ChunkQueue, which hands the chunks to the thread that builds
// the indexes.
#include "core/recovered_state.h"

#include <thread>
#include <vector>

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

// The one chunk of a finished RecoveredState without a sink.
const RecoveredState::Chunk& OnlyChunk(RecoveredState& found) {
  found.Finish();
  EXPECT_EQ(found.chunks.size(), 1u);
  return found.chunks.front();
}

TEST(RecoveredStateTest, WaitingJobsPastTheHotLimitAreKeptColdWithTheirQueueNamedOnce) {
  absl::BitGen gen;
  RecoveredState found(/*hot_limit=*/1);
  for (uint64_t seq = 1; seq <= 5; ++seq) found.OnJob(StoredJob(gen, seq, JobState::kReady));
  const RecoveredState::Chunk& chunk = OnlyChunk(found);
  EXPECT_EQ(chunk.jobs.size(), 1u);
  ASSERT_EQ(chunk.cold.size(), 4u);
  ASSERT_EQ(chunk.new_queue_names.size(), 2u);
  EXPECT_EQ(chunk.new_queue_names[chunk.cold[0].queue], "even");
  EXPECT_EQ(found.job_count(), 5u);
}

TEST(RecoveredStateTest, ActiveAndEndedJobsStayWholeWhateverTheLimit) {
  absl::BitGen gen;
  RecoveredState found(/*hot_limit=*/0);
  found.OnJob(StoredJob(gen, 1, JobState::kActive));
  found.OnJob(StoredJob(gen, 2, JobState::kFailed));
  found.OnJob(StoredJob(gen, 3, JobState::kScheduled));
  const RecoveredState::Chunk& chunk = OnlyChunk(found);
  EXPECT_EQ(chunk.jobs.size(), 2u);
  EXPECT_EQ(chunk.cold.size(), 1u);
}

TEST(RecoveredStateTest, AnIdThatCannotBePackedStaysWhole) {
  absl::BitGen gen;
  RecoveredState found(/*hot_limit=*/0);
  Job job = StoredJob(gen, 1, JobState::kReady);
  job.id = "not-a-ulid";
  found.OnJob(job);
  ColdJobFields fields{.id = "not-a-ulid", .queue = "q"};
  EXPECT_FALSE(found.OnColdJob(fields));  // the store then sends it whole
  const RecoveredState::Chunk& chunk = OnlyChunk(found);
  EXPECT_EQ(chunk.jobs.size(), 1u);
  EXPECT_TRUE(chunk.cold.empty());
}

// The sink gets full chunks as the scan goes, in the store's order, with each queue named once
// over all of them (a later chunk's ColdJob::queue counts on from the earlier chunks' names),
// and the policies in the first.
TEST(RecoveredStateTest, ChunksGoToTheSinkAsTheyFill) {
  absl::BitGen gen;
  std::vector<RecoveredState::Chunk> got;
  RecoveredState found(/*hot_limit=*/2, /*chunk_jobs=*/3,
                       [&got](RecoveredState::Chunk chunk) { got.push_back(std::move(chunk)); });
  found.OnPolicy("even", PolicyOverride{});
  for (uint64_t seq = 1; seq <= 7; ++seq) {
    found.OnJob(StoredJob(gen, seq, JobState::kReady));
    EXPECT_EQ(got.size(), seq / 3);
  }
  found.Finish();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].policies.size(), 1u);
  EXPECT_TRUE(got[1].policies.empty());
  EXPECT_EQ(got[0].jobs.size(), 2u);  // seq 1 and 2: hot
  ASSERT_EQ(got[0].cold.size(), 1u);  // seq 3 (odd)
  EXPECT_EQ(got[0].new_queue_names, std::vector<std::string>{"odd"});
  EXPECT_EQ(got[1].cold.size(), 3u);  // seq 4, 5, 6
  EXPECT_EQ(got[1].new_queue_names, std::vector<std::string>{"even"});
  EXPECT_EQ(got[1].cold[0].queue, 1u);  // "even", the second name over all chunks
  EXPECT_EQ(got[1].cold[1].queue, 0u);  // "odd", named in the first chunk
  EXPECT_EQ(got[2].cold.size(), 1u);    // seq 7, handed on by Finish
  uint64_t seq = 3;
  for (size_t c = 0; c < got.size(); ++c)
    for (const RecoveredState::ColdJob& cold : got[c].cold) EXPECT_EQ(cold.seq, seq++);
  EXPECT_EQ(found.job_count(), 7u);
  EXPECT_TRUE(found.chunks.empty());
}

TEST(RecoveredStateTest, AStoreWithoutJobsStillHandsOnItsPolicies) {
  std::vector<RecoveredState::Chunk> got;
  RecoveredState found(/*hot_limit=*/10, /*chunk_jobs=*/3,
                       [&got](RecoveredState::Chunk chunk) { got.push_back(std::move(chunk)); });
  found.OnPolicy("q", PolicyOverride{});
  found.Finish();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].policies.size(), 1u);
  EXPECT_EQ(got[0].size(), 0u);
}

TEST(ChunkQueueTest, HandsChunksOverInOrderAndEndsWhenClosed) {
  ChunkQueue queue(/*capacity=*/2);
  std::vector<size_t> sizes;
  std::thread consumer([&] {
    while (std::optional<RecoveredState::Chunk> chunk = queue.Pop())
      sizes.push_back(chunk->jobs.size());
  });
  // More chunks than the capacity: Push waits for the consumer instead of queueing them all.
  for (size_t n = 1; n <= 6; ++n) {
    RecoveredState::Chunk chunk;
    chunk.jobs.resize(n);
    queue.Push(std::move(chunk));
  }
  queue.Close();
  consumer.join();
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace jobbroker::core
