// JobTable: hot and cold residency. A job goes cold only once the commit that put it is written
// and while it is unchanged since; the oldest puts go first; sequence numbers never go back.
#include "core/job_table.h"

#include <memory>

#include "absl/random/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

constexpr char kQueue[] = "q";

class JobTableTest : public ::testing::Test {
 protected:
  // A READY job with an id NewJobId writes (only those can be packed).
  std::unique_ptr<Job> NewJob(JobState state = JobState::kReady) {
    auto job = std::make_unique<Job>();
    job->id = NewJobId(absl::FromUnixSeconds(1'800'000'000), 0, gen_);
    job->queue = std::string(kQueue);
    job->state = state;
    job->seq = table_.NextSeq();
    return job;
  }
  // Adopts a job as an enqueue does, and stamps its put with `commit`.
  uint64_t Put(std::unique_ptr<Job> job, uint64_t commit) {
    const uint64_t seq = job->seq;
    Transition t;
    t.put_jobs.push_back(*job);
    table_.Adopt(std::move(job), JobTable::kNotWritten);
    table_.StampPuts(JobTable::PutsOf(t), commit);
    return seq;
  }

  absl::BitGen gen_;
  JobTable table_;
};

TEST_F(JobTableTest, AJobGoesColdOnlyOnceItsPutIsWritten) {
  const uint64_t seq = Put(NewJob(), /*commit=*/5);
  table_.Freeze(/*written=*/4, /*max_hot=*/0);
  EXPECT_NE(table_.FindHotBySeq(seq), nullptr) << "commit 5 is not in the store yet";
  EXPECT_FALSE(table_.ColdId(seq).has_value());

  table_.Freeze(/*written=*/5, /*max_hot=*/0);
  EXPECT_EQ(table_.FindHotBySeq(seq), nullptr);
  ASSERT_TRUE(table_.ColdId(seq).has_value());
  EXPECT_EQ(table_.hot_count(), 0);
  EXPECT_EQ(table_.cold_count(), 1);
}

TEST_F(JobTableTest, AJobChangedSinceItsLastPutStaysHot) {
  const uint64_t seq = Put(NewJob(), 1);
  table_.Hot(seq).state = JobState::kActive;  // leased, its new put not written yet
  table_.Freeze(/*written=*/1, /*max_hot=*/0);
  EXPECT_NE(table_.FindHotBySeq(seq), nullptr);
}

TEST_F(JobTableTest, ActiveAndEndedJobsNeverGoCold) {
  const uint64_t active = Put(NewJob(JobState::kActive), 1);
  const uint64_t done = Put(NewJob(JobState::kCompleted), 2);
  table_.Freeze(/*written=*/2, /*max_hot=*/0);
  EXPECT_NE(table_.FindHotBySeq(active), nullptr);
  EXPECT_NE(table_.FindHotBySeq(done), nullptr);
}

TEST_F(JobTableTest, FreezeKeepsMaxHotJobsAndTakesTheOldestPutsFirst) {
  const uint64_t first = Put(NewJob(), 1);
  const uint64_t second = Put(NewJob(), 2);
  const uint64_t third = Put(NewJob(), 3);
  table_.Freeze(/*written=*/3, /*max_hot=*/1);
  EXPECT_TRUE(table_.ColdId(first).has_value());
  EXPECT_TRUE(table_.ColdId(second).has_value());
  EXPECT_NE(table_.FindHotBySeq(third), nullptr);
  EXPECT_EQ(table_.hot_count(), 1);
}

TEST_F(JobTableTest, AColdJobReadBackIsHotAgainAndMayGoColdAgain) {
  const uint64_t seq = Put(NewJob(), 1);
  table_.Freeze(1, 0);
  const PackedJobId id = *table_.ColdId(seq);
  auto back = std::make_unique<Job>();
  back->id = UnpackJobId(id);
  back->seq = seq;
  back->state = JobState::kReady;
  table_.ForgetCold(seq);
  table_.Adopt(std::move(back), /*put_at=*/0);  // the store holds exactly it
  EXPECT_EQ(table_.FindHot(UnpackJobId(id))->seq, seq);
  table_.Freeze(1, 0);
  EXPECT_TRUE(table_.ColdId(seq).has_value());
}

TEST_F(JobTableTest, IdsAndSeqsAreFoundInEitherForm) {
  auto job = NewJob();
  const std::string id = job->id;
  const uint64_t seq = Put(std::move(job), 1);
  EXPECT_TRUE(table_.HasId(id));
  EXPECT_EQ(table_.IdOfSeq(seq), id);
  table_.Freeze(1, 0);
  EXPECT_EQ(table_.IdOfSeq(seq), id) << "a cold job's id comes from its packed form";
  EXPECT_EQ(table_.IdOfSeq(seq + 100), "");
}

TEST_F(JobTableTest, SequenceNumbersGoOnAfterAClearAndPastEverySeqSeen) {
  table_.SeenSeq(41);
  EXPECT_EQ(table_.NextSeq(), 42u);
  table_.Clear();
  table_.SeenSeq(7);
  EXPECT_EQ(table_.NextSeq(), 43u) << "never reused, not even after a rebuild";
}

TEST_F(JobTableTest, CorruptJobRecordsAreRememberedUntilForgotten) {
  table_.MarkCorrupt(RecordKind::kJob, "j1", absl::DataLossError("bad bytes"));
  table_.MarkCorrupt(RecordKind::kDedup, "q/k", absl::DataLossError("bad dedup"));
  EXPECT_EQ(table_.corrupt_records(), 2);
  ASSERT_NE(table_.CorruptReason("j1"), nullptr);
  EXPECT_EQ(table_.CorruptReason("j1")->message(), "bad bytes");
  EXPECT_EQ(table_.CorruptReason("q/k"), nullptr) << "only job records are looked up by id";
  EXPECT_TRUE(table_.ForgetCorrupt("j1"));
  EXPECT_FALSE(table_.ForgetCorrupt("j1"));
  EXPECT_EQ(table_.corrupt_records(), 1);
}

}  // namespace
}  // namespace jobbroker::core
