// QueueState: the per-queue indexes (groups taking turns, counts by state, retention order) and
// the rate limit's token bucket.
#include "core/queue_state.h"

#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

constexpr char kQueue[] = "q";

Job ReadyJob(uint64_t seq, std::string key = "", int32_t priority = 0) {
  Job job;
  job.queue = std::string(kQueue);
  job.seq = seq;
  job.state = JobState::kReady;
  job.concurrency_key = std::move(key);
  job.priority = priority;
  return job;
}

TEST(QueueStateTest, IndexCountsEachStateAndUnindexUndoesIt) {
  QueueState q("q", QueuePolicy{});
  Job ready = ReadyJob(1);
  Job done = ReadyJob(2);
  done.state = JobState::kCompleted;
  done.completed_at = absl::FromUnixSeconds(10);
  q.Index(ready);
  q.Index(done);
  EXPECT_EQ(q.count(JobState::kReady), 1);
  EXPECT_EQ(q.count(JobState::kCompleted), 1);
  EXPECT_EQ(q.live(), 1);
  EXPECT_EQ(*q.ready_by_seq.begin(), 1u);
  EXPECT_EQ(q.completed.size(), 1u);
  q.Unindex(ready);
  q.Unindex(done);
  EXPECT_EQ(q.count(JobState::kReady), 0);
  EXPECT_TRUE(q.completed.empty());
  // The key stays in the ring until the broker walks past it (stale entries are dropped
  // lazily, CanLeaseLocked), so its group is kept until then, empty.
  EXPECT_TRUE(q.groups.at("").ready.empty());
  q.ring.pop_front();
  q.groups.at("").in_ring = false;
  q.MaybeForget("");
  EXPECT_TRUE(q.groups.empty()) << "an empty group out of the ring is forgotten";
}

TEST(QueueStateTest, EachKeyWithReadyJobsIsOfferedOnceInTurn) {
  QueueState q("q", QueuePolicy{});
  q.Index(ReadyJob(1, "a"));
  q.Index(ReadyJob(2, "a"));
  q.Index(ReadyJob(3, "b"));
  ASSERT_EQ(q.ring.size(), 2u);
  EXPECT_EQ(q.ring[0], "a");
  EXPECT_EQ(q.ring[1], "b");
}

TEST(QueueStateTest, HigherPriorityComesFirstInsideAGroup) {
  QueueState q("q", QueuePolicy{});
  q.Index(ReadyJob(1, "", /*priority=*/0));
  q.Index(ReadyJob(2, "", /*priority=*/5));
  EXPECT_EQ(q.groups.at("").ready.begin()->second, 2u);
}

TEST(QueueStateTest, AKeyAtItsPerKeyLimitIsNotOfferedUntilOneOfItsJobsEnds) {
  QueuePolicy policy;
  policy.max_concurrency_per_key = 1;
  QueueState q("q", policy);
  Job running = ReadyJob(1, "tenant");
  running.state = JobState::kActive;
  q.Index(running);
  q.Index(ReadyJob(2, "tenant"));
  EXPECT_TRUE(q.ring.empty()) << "the key is full";
  q.Unindex(running);
  ASSERT_EQ(q.ring.size(), 1u);
  EXPECT_EQ(q.ring.front(), "tenant");
}

TEST(QueueStateTest, DropWaitingForgetsAReadyOrScheduledJobFoundByScan) {
  QueueState q("q", QueuePolicy{});
  Job ready = ReadyJob(1, "k");
  Job later = ReadyJob(2);
  later.state = JobState::kScheduled;
  for (const Job* j : {&ready, &later}) {
    q.all.insert(j->seq);
    q.Index(*j);
  }
  EXPECT_EQ(q.DropWaiting(1), JobState::kReady);
  EXPECT_EQ(q.DropWaiting(2), JobState::kScheduled);
  EXPECT_EQ(q.count(JobState::kReady), 0);
  EXPECT_EQ(q.count(JobState::kScheduled), 0);
  EXPECT_TRUE(q.all.empty());
}

TEST(QueueStateTest, TheTokenBucketStartsFullAndRefillsAtTheRate) {
  QueuePolicy policy;
  policy.rate_limit.per_second = 2;
  policy.rate_limit.burst = 2;
  QueueState q("q", policy);
  const absl::Time t0 = absl::FromUnixSeconds(100);
  q.Refill(t0);
  EXPECT_TRUE(q.has_token());
  q.TakeToken();
  q.TakeToken();
  EXPECT_FALSE(q.has_token());
  q.Refill(t0 + absl::Milliseconds(500));  // one token at 2 per second
  EXPECT_TRUE(q.has_token());
  q.TakeToken();
  q.Refill(t0 + absl::Seconds(60));
  q.TakeToken();
  q.TakeToken();
  EXPECT_FALSE(q.has_token()) << "the bucket holds at most `burst`";
}

TEST(QueueStateTest, RefillTimeIsWhenAWaitingConsumerGetsTheNextToken) {
  QueuePolicy policy;
  policy.rate_limit.per_second = 4;
  QueueState q("q", policy);
  const absl::Time t0 = absl::FromUnixSeconds(100);
  q.Index(ReadyJob(1));
  q.consumers.push_back(7);
  q.Refill(t0);
  for (int i = 0; i < 4; ++i) q.TakeToken();
  EXPECT_EQ(q.RefillTime(), t0 + absl::Milliseconds(250));
  q.consumers.clear();
  EXPECT_EQ(q.RefillTime(), absl::InfiniteFuture()) << "nobody waits";
}

TEST(QueueStateTest, RetentionSaysWhenTheOldestEndedJobIsTooOldAndWhenItIsOverCount) {
  QueuePolicy policy;
  policy.completed_retention.max_age = absl::Hours(1);
  policy.failed_retention.max_count = 1;
  QueueState q("q", policy);
  EXPECT_EQ(q.NextRetentionAge(), absl::InfiniteFuture());
  Job done = ReadyJob(1);
  done.state = JobState::kCompleted;
  done.completed_at = absl::FromUnixSeconds(1000);
  q.Index(done);
  EXPECT_EQ(q.NextRetentionAge(), absl::FromUnixSeconds(1000) + absl::Hours(1));
  Job dead = ReadyJob(2);
  dead.state = JobState::kFailed;
  Job dead2 = ReadyJob(3);
  dead2.state = JobState::kCancelled;
  q.Index(dead);
  EXPECT_FALSE(q.OverRetentionCount());
  q.Index(dead2);
  EXPECT_TRUE(q.OverRetentionCount()) << "FAILED and CANCELLED share failed_retention";
}

}  // namespace
}  // namespace jobbroker::core
