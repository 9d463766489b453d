// What a starting broker's dashboard API says of its recovery (RecoveryStatus::Describe), driven
// by the observer calls a recovery makes.
#include "server/observability/recovery_status.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace jobbroker::server {
namespace {

TEST(RecoveryStatusTest, BeforeAnyPartitionBeginsItSaysSo) {
  RecoveryStatus status;
  EXPECT_EQ(status.Describe(), "no partition has begun its recovery yet");
}

TEST(RecoveryStatusTest, OnePartitionShowsTheJobsLoadedSoFarAndHowLongItTook) {
  RecoveryStatus status;
  status.RecoveryStarted(0);
  EXPECT_EQ(status.Describe(), "partition 0: 0 jobs loaded");
  status.Recovering(0, 4'259'840, absl::Milliseconds(5165));
  EXPECT_EQ(status.Describe(), "partition 0: 4,259,840 jobs loaded in 5.2 s");
  status.Recovering(0, 1, absl::Seconds(1));
  EXPECT_EQ(status.Describe(), "partition 0: 1 job loaded in 1.0 s");
}

// Partitions recover side by side: those done are counted, the others listed in partition order,
// at most kListed of them.
TEST(RecoveryStatusTest, ManyPartitionsAreCountedWhenDoneAndListedWhileRecovering) {
  RecoveryStatus status;
  for (uint32_t p = 0; p < 8; ++p) status.RecoveryStarted(p);
  status.Recovered(2, 100, 0, absl::Seconds(1));
  status.Recovered(5, 100, 0, absl::Seconds(1));
  status.Recovering(7, 999, absl::Seconds(2));
  status.Recovering(0, 1'000'000, absl::Seconds(2));
  EXPECT_EQ(status.Describe(),
            "2 partitions recovered; partition 0: 1,000,000 jobs loaded in 2.0 s; partition 1: 0 "
            "jobs loaded; partition 3: 0 jobs loaded; partition 4: 0 jobs loaded; 2 more "
            "recovering");
  for (uint32_t p : {0, 1, 3, 4, 6}) status.Recovered(p, 5, 0, absl::Seconds(3));
  EXPECT_EQ(status.Describe(), "7 partitions recovered; partition 7: 999 jobs loaded in 2.0 s");
}

// A partition rebuilt again (after a store outage) is recovering again, from nothing.
TEST(RecoveryStatusTest, ARecoveryStartedAgainStartsOver) {
  RecoveryStatus status;
  status.RecoveryStarted(0);
  status.Recovered(0, 10, 0, absl::Seconds(1));
  EXPECT_EQ(status.Describe(), "1 partition recovered");
  status.RecoveryStarted(0);
  EXPECT_EQ(status.Describe(), "partition 0: 0 jobs loaded");
}

}  // namespace
}  // namespace jobbroker::server
