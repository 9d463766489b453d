// Deadlines: what comes due when, and waking a ticker that planned to sleep past a new one.
#include "core/deadlines.h"

#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

const absl::Time kT = absl::FromUnixSeconds(1000);

TEST(DeadlinesTest, TheEarliestDueEntryComesFirstAndNothingBeforeItsTime) {
  Deadlines d;
  d.AddLease(kT + absl::Seconds(2), 7);
  d.AddLease(kT + absl::Seconds(1), 8);
  EXPECT_FALSE(d.DueLease(kT).has_value());
  EXPECT_EQ(d.DueLease(kT + absl::Seconds(5)), 8u);
  d.RemoveLease(kT + absl::Seconds(1), 8);
  EXPECT_EQ(d.DueLease(kT + absl::Seconds(5)), 7u);
}

TEST(DeadlinesTest, EarliestLooksAtEverySetOrOnlyAtLongPolls) {
  Deadlines d;
  EXPECT_EQ(d.Earliest(), absl::InfiniteFuture());
  d.AddScheduled(kT + absl::Seconds(3), 1);
  d.AddWaiter(kT + absl::Seconds(9), 2);
  EXPECT_EQ(d.Earliest(), kT + absl::Seconds(3));
  EXPECT_EQ(d.Earliest(/*jobs=*/false), kT + absl::Seconds(9));
}

TEST(DeadlinesTest, ADeadlineBeforeTheTickersPlanAsksForAWakeUp) {
  Deadlines d;
  EXPECT_TRUE(d.wake_needed()) << "no plan yet";
  d.Planned(kT + absl::Seconds(10));
  EXPECT_FALSE(d.wake_needed());
  d.AddScheduled(kT + absl::Seconds(20), 1);
  EXPECT_FALSE(d.wake_needed()) << "after the plan: the ticker sees it anyway";
  d.AddLease(kT + absl::Seconds(5), 2);
  EXPECT_TRUE(d.wake_needed());
}

TEST(DeadlinesTest, DropScheduledFindsAJobWhateverItsTime) {
  Deadlines d;
  d.AddScheduled(kT, 1);
  d.AddScheduled(kT + absl::Seconds(1), 2);
  d.DropScheduled(2);
  EXPECT_FALSE(d.HasScheduled(kT + absl::Seconds(1), 2));
  EXPECT_TRUE(d.HasScheduled(kT, 1));
  d.ClearJobs();
  EXPECT_FALSE(d.DueScheduled(absl::InfiniteFuture()).has_value());
}

}  // namespace
}  // namespace jobbroker::core
