// schedule/plan.h: which run a schedule enqueues when the broker looks at it, on given instants
// (no clock): on time, after downtime (catch-up ONE and NONE), bounded by start_at and end_at,
// across daylight-saving changes in two zones, and the run's dedup key.
#include "schedule/plan.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::schedule {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::Time Utc(int y, int mo, int d, int h, int mi, int s = 0) {
  return absl::FromCivil(absl::CivilSecond(y, mo, d, h, mi, s), absl::UTCTimeZone());
}

Timing Cron(const char* cron, const char* zone = "UTC", CatchUp catch_up = CatchUp::kOne,
            absl::Time start_at = absl::InfinitePast(),
            absl::Time end_at = absl::InfiniteFuture()) {
  absl::StatusOr<Timing> t = Timing::Make(cron, absl::ZeroDuration(), zone, absl::InfinitePast(),
                                          start_at, end_at, catch_up);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

// The runs of `timing` from its first after `from`, as a broker ticking at each run time sees
// them, `count` of them.
std::vector<absl::Time> Runs(const Timing& timing, absl::Time from, int count) {
  std::vector<absl::Time> runs;
  absl::Time next = timing.NextRun(from);
  while (static_cast<int>(runs.size()) < count && next != absl::InfiniteFuture()) {
    Due due = Advance(timing, next, next);
    EXPECT_TRUE(due.run.has_value());
    if (!due.run.has_value()) break;
    runs.push_back(*due.run);
    next = due.next_run_at;
  }
  return runs;
}

TEST(AdvanceTest, NothingIsDueBeforeTheNextRun) {
  Due due = Advance(Cron("0 * * * *"), Utc(2026, 12, 4, 10, 0), Utc(2026, 12, 4, 9, 59, 59));
  EXPECT_FALSE(due.run.has_value());
  EXPECT_EQ(due.skipped, 0);
  EXPECT_EQ(due.next_run_at, Utc(2026, 12, 4, 10, 0));
}

TEST(AdvanceTest, ARunThatCameDueIsRunAndTheNextOneFollows) {
  Due due = Advance(Cron("0 * * * *"), Utc(2026, 12, 4, 10, 0),
                    Utc(2026, 12, 4, 10, 0) + absl::Milliseconds(400));
  EXPECT_EQ(due.run, Utc(2026, 12, 4, 10, 0));
  EXPECT_EQ(due.skipped, 0);
  EXPECT_EQ(due.next_run_at, Utc(2026, 12, 4, 11, 0));
}

TEST(AdvanceTest, CatchUpOneRunsTheLatestMissedRunOnceAfterDowntime) {
  const Timing hourly = Cron("0 * * * *");
  // Down from 09:59 to 13:30: 10:00, 11:00, 12:00 and 13:00 came due meanwhile.
  Due due = Advance(hourly, Utc(2026, 12, 4, 10, 0), Utc(2026, 12, 4, 13, 30));
  EXPECT_EQ(due.run, Utc(2026, 12, 4, 13, 0));
  EXPECT_EQ(due.skipped, 3);
  EXPECT_EQ(due.next_run_at, Utc(2026, 12, 4, 14, 0));
  // Looked at again before 14:00, it does nothing more.
  EXPECT_FALSE(Advance(hourly, due.next_run_at, Utc(2026, 12, 4, 13, 31)).run.has_value());
}

TEST(AdvanceTest, CatchUpNoneSkipsMissedRunsButNotALateTick) {
  const Timing hourly = Cron("0 * * * *", "UTC", CatchUp::kNone);
  Due down = Advance(hourly, Utc(2026, 12, 4, 10, 0), Utc(2026, 12, 4, 13, 30));
  EXPECT_FALSE(down.run.has_value());
  EXPECT_EQ(down.skipped, 4);
  EXPECT_EQ(down.next_run_at, Utc(2026, 12, 4, 14, 0));
  // 30 s late (a slow failover) is not downtime: the run happens.
  Due late = Advance(hourly, Utc(2026, 12, 4, 14, 0), Utc(2026, 12, 4, 14, 0, 30));
  EXPECT_EQ(late.run, Utc(2026, 12, 4, 14, 0));
}

TEST(AdvanceTest, TheSameMomentGivesTheSameRunSoARetriedEnqueueIsDeduplicated) {
  // A broker that enqueued the run and crashed before storing the schedule asks again.
  const Timing hourly = Cron("0 * * * *");
  Due first = Advance(hourly, Utc(2026, 12, 4, 10, 0), Utc(2026, 12, 4, 13, 30));
  Due again = Advance(hourly, Utc(2026, 12, 4, 10, 0), Utc(2026, 12, 4, 13, 45));
  ASSERT_TRUE(first.run.has_value());
  EXPECT_EQ(DedupKeyOf("nightly", *first.run), DedupKeyOf("nightly", *again.run));
}

TEST(AdvanceTest, AnEverySeriesCountsFromItsAnchor) {
  const absl::Time anchor = Utc(2026, 12, 4, 10, 0);
  absl::StatusOr<Timing> every = Timing::Make("", absl::Seconds(90), "", anchor);
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_EQ(every->NextRun(anchor - absl::Hours(1)), anchor);
  Due due = Advance(*every, anchor, anchor + absl::Seconds(200));
  EXPECT_EQ(due.run, anchor + absl::Seconds(180));
  EXPECT_EQ(due.skipped, 2);
  EXPECT_EQ(due.next_run_at, anchor + absl::Seconds(270));
}

TEST(AdvanceTest, AWeekDownWithAnEverySecondScheduleRunsOnceNearNow) {
  const absl::Time anchor = Utc(2026, 12, 1, 0, 0);
  absl::StatusOr<Timing> every = Timing::Make("", absl::Seconds(1), "", anchor);
  ASSERT_TRUE(every.ok());
  const absl::Time now = anchor + absl::Hours(24 * 7) + absl::Milliseconds(500);
  Due due = Advance(*every, anchor, now);
  ASSERT_TRUE(due.run.has_value());
  EXPECT_EQ(*due.run, now - absl::Milliseconds(500));
  EXPECT_EQ(due.skipped, kCountLimit);
  EXPECT_EQ(due.next_run_at, *due.run + absl::Seconds(1));
}

TEST(TimingTest, StartAtAndEndAtBoundTheRuns) {
  const Timing bounded =
      Cron("0 12 * * *", "UTC", CatchUp::kOne, Utc(2026, 12, 10, 0, 0), Utc(2026, 12, 11, 12, 0));
  EXPECT_THAT(Runs(bounded, Utc(2026, 12, 1, 0, 0), 5),
              ElementsAre(Utc(2026, 12, 10, 12, 0), Utc(2026, 12, 11, 12, 0)));
  EXPECT_EQ(bounded.NextRun(Utc(2026, 12, 11, 12, 0)), absl::InfiniteFuture()) << "ended";
}

TEST(TimingTest, ADailyRunAcrossNewYorksDaylightSavingChanges) {
  // 2024-03-10 02:00 EST jumps to 03:00 EDT; 2024-11-03 02:00 EDT falls back to 01:00 EST.
  const Timing at_2_30 = Cron("30 2 * * *", "America/New_York");
  EXPECT_THAT(Runs(at_2_30, Utc(2024, 3, 9, 0, 0), 3),
              ElementsAre(Utc(2024, 3, 9, 7, 30),     // 02:30 EST
                          Utc(2024, 3, 10, 7, 0),     // skipped: at the end of the gap, 03:00 EDT
                          Utc(2024, 3, 11, 6, 30)));  // 02:30 EDT
  const Timing at_1_30 = Cron("30 1 * * *", "America/New_York");
  EXPECT_THAT(Runs(at_1_30, Utc(2024, 11, 2, 12, 0), 2),
              ElementsAre(Utc(2024, 11, 3, 5, 30),    // 01:30 EDT, once: not again at 01:30 EST
                          Utc(2024, 11, 4, 6, 30)));  // 01:30 EST
}

TEST(TimingTest, ADailyRunAcrossBerlinsDaylightSavingChanges) {
  // 2024-03-31 02:00 CET jumps to 03:00 CEST; 2024-10-27 03:00 CEST falls back to 02:00 CET.
  const Timing at_2_30 = Cron("30 2 * * *", "Europe/Berlin");
  EXPECT_THAT(Runs(at_2_30, Utc(2024, 3, 30, 0, 0), 3),
              ElementsAre(Utc(2024, 3, 30, 1, 30),   // 02:30 CET
                          Utc(2024, 3, 31, 1, 0),    // skipped: 03:00 CEST
                          Utc(2024, 4, 1, 0, 30)));  // 02:30 CEST
  EXPECT_THAT(Runs(at_2_30, Utc(2024, 10, 26, 12, 0), 2),
              ElementsAre(Utc(2024, 10, 27, 0, 30),    // 02:30 CEST, the first pass only
                          Utc(2024, 10, 28, 1, 30)));  // 02:30 CET
  // An hourly schedule keeps every real hour: 02:30 CEST and 02:30 CET both run.
  EXPECT_THAT(
      Runs(Cron("30 * * * *", "Europe/Berlin"), Utc(2024, 10, 26, 23, 0), 3),
      ElementsAre(Utc(2024, 10, 26, 23, 30), Utc(2024, 10, 27, 0, 30), Utc(2024, 10, 27, 1, 30)));
}

TEST(TimingTest, BadTimingsAreRefusedNamingTheField) {
  auto refused = [](absl::string_view cron, absl::Duration every, absl::string_view zone) {
    absl::StatusOr<Timing> t = Timing::Make(cron, every, zone, absl::InfinitePast());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << cron << " " << zone;
    return std::string(t.status().message());
  };
  EXPECT_THAT(refused("", absl::ZeroDuration(), ""), HasSubstr("exactly one of cron and every"));
  EXPECT_THAT(refused("* * * * *", absl::Minutes(1), ""), HasSubstr("exactly one"));
  EXPECT_THAT(refused("", absl::Milliseconds(500), ""), HasSubstr("every"));
  EXPECT_THAT(refused("61 * * * *", absl::ZeroDuration(), ""), HasSubstr("minute"));
  EXPECT_THAT(refused("* * * * *", absl::ZeroDuration(), "Mars/Olympus"),
              HasSubstr("Mars/Olympus"));
  absl::StatusOr<Timing> backwards =
      Timing::Make("* * * * *", absl::ZeroDuration(), "", absl::InfinitePast(),
                   Utc(2026, 1, 2, 0, 0), Utc(2026, 1, 1, 0, 0));
  EXPECT_THAT(std::string(backwards.status().message()), HasSubstr("end_at"));
}

TEST(DedupKeyOfTest, NamesTheScheduleAndTheRunTimeInUtc) {
  EXPECT_EQ(DedupKeyOf("nightly-report", Utc(2026, 12, 4, 2, 30)),
            "nightly-report@2026-12-04T02:30:00Z");
}

}  // namespace
}  // namespace jobbroker::schedule
