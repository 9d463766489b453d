// CronExpression, LoadZone and NextEvery: the syntax and its refusals, Next on calendar edge
// cases, the daylight-saving rule of schedule/cron.h in three zones, and `every` series. Every
// instant is constructed; no clock is read.
#include "schedule/cron.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::schedule {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

CronExpression Cron(absl::string_view text) { return CronExpression::Parse(text).value(); }

// The message of a refusal, which must be kInvalidArgument.
std::string Refusal(absl::string_view text) {
  absl::StatusOr<CronExpression> cron = CronExpression::Parse(text);
  EXPECT_EQ(cron.status().code(), absl::StatusCode::kInvalidArgument)
      << "'" << text << "' gave " << cron.status();
  return std::string(cron.status().message());
}

absl::TimeZone Zone(absl::string_view name) { return LoadZone(name).value(); }

// A wall time in `zone`; for a repeated one, its first instant.
absl::Time Wall(const absl::TimeZone& zone, int y, int mo, int d, int h, int mi, int s = 0) {
  return absl::FromCivil(absl::CivilSecond(y, mo, d, h, mi, s), zone);
}

absl::Time Utc(int y, int mo, int d, int h, int mi, int s = 0) {
  return Wall(absl::UTCTimeZone(), y, mo, d, h, mi, s);
}

// "2024-11-03 01:30:00-04:00": the wall time and the offset, so a repeated hour's two passes
// read differently.
std::string Show(absl::Time t, const absl::TimeZone& zone) {
  if (t == absl::InfiniteFuture()) return "never";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S%Ez", t, zone);
}

// The first `n` runs strictly after `after`.
std::vector<std::string> Runs(absl::string_view text, const absl::TimeZone& zone, absl::Time after,
                              int n) {
  const CronExpression cron = Cron(text);
  std::vector<std::string> runs;
  for (int i = 0; i < n; ++i) {
    after = cron.Next(after, zone);
    runs.push_back(Show(after, zone));
    if (after == absl::InfiniteFuture()) break;
  }
  return runs;
}

const absl::TimeZone kUtc = absl::UTCTimeZone();

// ---- Syntax ----

TEST(CronSyntaxTest, FiveFieldsAreMinuteHourDayOfMonthMonthDayOfWeek) {
  // 2024-01-01 is a Monday.
  EXPECT_THAT(Runs("30 9 15 6 *", kUtc, Utc(2024, 1, 1, 0, 0), 2),
              ElementsAre("2024-06-15 09:30:00+00:00", "2025-06-15 09:30:00+00:00"));
  EXPECT_THAT(Runs("0 12 * * 3", kUtc, Utc(2024, 1, 1, 0, 0), 2),
              ElementsAre("2024-01-03 12:00:00+00:00", "2024-01-10 12:00:00+00:00"));
}

TEST(CronSyntaxTest, ASixthFieldIsALeadingSecondsField) {
  EXPECT_THAT(Runs("15,45 * * * * *", kUtc, Utc(2024, 1, 1, 0, 0), 3),
              ElementsAre("2024-01-01 00:00:15+00:00", "2024-01-01 00:00:45+00:00",
                          "2024-01-01 00:01:15+00:00"));
  EXPECT_THAT(Runs("30 0 9 * * *", kUtc, Utc(2024, 1, 1, 0, 0), 1),
              ElementsAre("2024-01-01 09:00:30+00:00"));
  // Five fields run at second 0.
  EXPECT_THAT(Runs("* * * * *", kUtc, Utc(2024, 1, 1, 0, 0, 1), 1),
              ElementsAre("2024-01-01 00:01:00+00:00"));
}

TEST(CronSyntaxTest, ListsRangesAndStepsCombineInOneField) {
  EXPECT_THAT(Runs("0 8-12/2,17 * * *", kUtc, Utc(2024, 1, 1, 0, 0), 5),
              ElementsAre("2024-01-01 08:00:00+00:00", "2024-01-01 10:00:00+00:00",
                          "2024-01-01 12:00:00+00:00", "2024-01-01 17:00:00+00:00",
                          "2024-01-02 08:00:00+00:00"));
}

TEST(CronSyntaxTest, AStarStepCountsFromTheFieldsFirstValue) {
  EXPECT_THAT(Runs("*/20 * * * *", kUtc, Utc(2024, 1, 1, 0, 0), 3),
              ElementsAre("2024-01-01 00:20:00+00:00", "2024-01-01 00:40:00+00:00",
                          "2024-01-01 01:00:00+00:00"));
  // Days of the month count from 1.
  EXPECT_THAT(Runs("0 0 */10 * *", kUtc, Utc(2024, 1, 1, 0, 0), 4),
              ElementsAre("2024-01-11 00:00:00+00:00", "2024-01-21 00:00:00+00:00",
                          "2024-01-31 00:00:00+00:00", "2024-02-01 00:00:00+00:00"));
}

TEST(CronSyntaxTest, AStartWithAStepRunsToTheEndOfTheFieldAndTheWeekEndsOnSaturday) {
  EXPECT_THAT(Runs("5/20 * * * *", kUtc, Utc(2024, 1, 1, 0, 0), 4),
              ElementsAre("2024-01-01 00:05:00+00:00", "2024-01-01 00:25:00+00:00",
                          "2024-01-01 00:45:00+00:00", "2024-01-01 01:05:00+00:00"));
  // MON, WED, FRI; not Sunday (7) although 7 is a day-of-week value.
  EXPECT_THAT(Runs("0 0 * * 1/2", kUtc, Utc(2024, 1, 1, 0, 0), 4),
              ElementsAre("2024-01-03 00:00:00+00:00", "2024-01-05 00:00:00+00:00",
                          "2024-01-08 00:00:00+00:00", "2024-01-10 00:00:00+00:00"));
}

TEST(CronSyntaxTest, MonthAndDayNamesAreCaseInsensitiveAndWorkInRanges) {
  const absl::Time from = Utc(2024, 3, 28, 0, 0);
  EXPECT_EQ(Runs("0 0 * jan-Mar mon-FRI", kUtc, from, 6), Runs("0 0 * 1-3 1-5", kUtc, from, 6));
  EXPECT_THAT(Runs("0 0 1 Jun,DEC *", kUtc, from, 2),
              ElementsAre("2024-06-01 00:00:00+00:00", "2024-12-01 00:00:00+00:00"));
}

TEST(CronSyntaxTest, SundayIsBothZeroAndSeven) {
  const absl::Time from = Utc(2024, 1, 1, 0, 0);  // a Monday
  EXPECT_THAT(Runs("0 0 * * 7", kUtc, from, 1), ElementsAre("2024-01-07 00:00:00+00:00"));
  EXPECT_EQ(Runs("0 0 * * 7", kUtc, from, 5), Runs("0 0 * * 0", kUtc, from, 5));
  EXPECT_EQ(Runs("0 0 * * SUN", kUtc, from, 5), Runs("0 0 * * 0", kUtc, from, 5));
  // Friday, Saturday, Sunday.
  EXPECT_THAT(Runs("0 0 * * 5-7", kUtc, from, 4),
              ElementsAre("2024-01-05 00:00:00+00:00", "2024-01-06 00:00:00+00:00",
                          "2024-01-07 00:00:00+00:00", "2024-01-12 00:00:00+00:00"));
  // A one-value range is that value.
  EXPECT_EQ(Runs("0 0 * * 7-7", kUtc, from, 3), Runs("0 0 * * 0", kUtc, from, 3));
}

TEST(CronSyntaxTest, MacrosAreTheirFiveFieldForms) {
  const absl::Time from = Utc(2024, 5, 17, 13, 45);  // a Friday
  EXPECT_EQ(Runs("@yearly", kUtc, from, 3), Runs("0 0 1 1 *", kUtc, from, 3));
  EXPECT_EQ(Runs("@annually", kUtc, from, 3), Runs("0 0 1 1 *", kUtc, from, 3));
  EXPECT_EQ(Runs("@monthly", kUtc, from, 3), Runs("0 0 1 * *", kUtc, from, 3));
  EXPECT_EQ(Runs("@weekly", kUtc, from, 3), Runs("0 0 * * 0", kUtc, from, 3));
  EXPECT_EQ(Runs("@daily", kUtc, from, 3), Runs("0 0 * * *", kUtc, from, 3));
  EXPECT_EQ(Runs("@midnight", kUtc, from, 3), Runs("0 0 * * *", kUtc, from, 3));
  EXPECT_EQ(Runs("@HOURLY", kUtc, from, 3), Runs("0 * * * *", kUtc, from, 3));
  EXPECT_THAT(Runs("@weekly", kUtc, from, 1), ElementsAre("2024-05-19 00:00:00+00:00"));
  EXPECT_EQ(Cron("@weekly").text(), "@weekly");
}

TEST(CronSyntaxTest, SpacesAndTabsSeparateFieldsAndTheTextIsKeptAsGiven) {
  const absl::Time from = Utc(2024, 1, 1, 0, 0);
  EXPECT_EQ(Runs("  30\t9  * * *  ", kUtc, from, 2), Runs("30 9 * * *", kUtc, from, 2));
  EXPECT_EQ(Cron(" 30\t9 * * * ").text(), " 30\t9 * * * ");
}

TEST(CronSyntaxTest, EachRefusalNamesTheFieldAndTheValue) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"", "cron: the expression is empty"},
      {"   ", "cron: the expression is empty"},
      {"* * * *",
       "expected 5 fields (minute hour day-of-month month day-of-week) or 6 (second "
       "first), got 4 in '* * * *'"},
      {"0 0 0 1 1 * 2025", "got 7"},
      {"60 * * * *", "cron: minute field '60': value 60 is out of range 0-59"},
      {"* 24 * * *", "cron: hour field '24': value 24 is out of range 0-23"},
      {"* * 0 * *", "cron: day-of-month field '0': value 0 is out of range 1-31"},
      {"* * 32 * *", "cron: day-of-month field '32': value 32 is out of range 1-31"},
      {"* * * 13 *", "cron: month field '13': value 13 is out of range 1-12"},
      {"* * * * 8", "cron: day-of-week field '8': value 8 is out of range 0-7"},
      {"60 * * * * *", "cron: second field '60': value 60 is out of range 0-59"},
      {"* * * * 99999999999", "cron: day-of-week field '99999999999': value 99999999999 is out"},
      {"* * * * FRX",
       "cron: day-of-week field 'FRX': unknown name 'FRX' (expected 0-7 or SUN-SAT)"},
      {"* * * January *", "cron: month field 'January': unknown name 'January' (expected 1-12 or"},
      {"* * * * MON-FRX", "cron: day-of-week field 'MON-FRX': unknown name 'FRX'"},
      {"MON * * * *", "cron: minute field 'MON': 'MON' is not a number (expected 0-59)"},
      {"* * * * 1,,2", "cron: day-of-week field '1,,2': an empty list item"},
      {"0, * * * *", "cron: minute field '0,': an empty list item"},
      {"*/0 * * * *", "cron: minute field '*/0': step 0 is out of range 1-60"},
      {"* */25 * * *", "cron: hour field '*/25': step 25 is out of range 1-24"},
      {"* * * * */8", "cron: day-of-week field '*/8': step 8 is out of range 1-7"},
      {"*/ * * * *", "cron: minute field '*/': step '' is not a number"},
      {"*/x * * * *", "cron: minute field '*/x': step 'x' is not a number"},
      {"1/2/3 * * * *", "cron: minute field '1/2/3': '1/2/3' has more than one '/'"},
      {"30-10 * * * *", "cron: minute field '30-10': the range '30-10' is reversed"},
      {"* * * * FRI-MON", "cron: day-of-week field 'FRI-MON': the range 'FRI-MON' is reversed"},
      {"* * * NOV-FEB *", "cron: month field 'NOV-FEB': the range 'NOV-FEB' is reversed"},
      {"-5 * * * *", "cron: minute field '-5': '-5' is missing a value"},
      {"* * * * 1-", "cron: day-of-week field '1-': '1-' is missing a value"},
      {"/5 * * * *", "cron: minute field '/5': '/5' is missing a value"},
      {"* * 1-5-9 * *", "cron: day-of-month field '1-5-9': '5-9' is not a number"},
      {"* * L * *", "cron: day-of-month field 'L': 'L' (last) is not supported"},
      {"* * 15W * *", "cron: day-of-month field '15W': 'W' (nearest weekday) is not supported"},
      {"* * * * 5L", "cron: day-of-week field '5L': 'L' (last) is not supported"},
      {"* * * * FRI#3", "cron: day-of-week field 'FRI#3': '#' (n-th weekday of the month) is not"},
      {"* * ? * MON", "cron: day-of-month field '?': '?' is not supported (write '*')"},
      {"@reboot", "cron: unknown macro '@reboot' (expected @yearly, @annually, @monthly, "},
      {"@every 5m", "cron: unknown macro '@every 5m'"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Refusal(c.text), HasSubstr(c.message)) << "for '" << c.text << "'";
  }
}

// ---- Next on the calendar ----

TEST(CronNextTest, TheNextRunIsStrictlyAfterTheGivenInstant) {
  const CronExpression cron = Cron("0 9 * * *");
  EXPECT_EQ(cron.Next(Utc(2024, 1, 1, 9, 0), kUtc), Utc(2024, 1, 2, 9, 0));
  EXPECT_EQ(cron.Next(Utc(2024, 1, 1, 9, 0) - absl::Nanoseconds(1), kUtc), Utc(2024, 1, 1, 9, 0));
  EXPECT_EQ(cron.Next(Utc(2024, 1, 1, 9, 0) + absl::Milliseconds(500), kUtc),
            Utc(2024, 1, 2, 9, 0));
}

TEST(CronNextTest, FebruaryTheTwentyNinthRunsInLeapYearsOnlyAndNotIn2100) {
  EXPECT_THAT(Runs("0 0 29 2 *", kUtc, Utc(2023, 3, 1, 0, 0), 2),
              ElementsAre("2024-02-29 00:00:00+00:00", "2028-02-29 00:00:00+00:00"));
  // 2100 is not a leap year (divisible by 100, not by 400); 2000 was.
  EXPECT_THAT(Runs("0 0 29 2 *", kUtc, Utc(2096, 3, 1, 0, 0), 1),
              ElementsAre("2104-02-29 00:00:00+00:00"));
  EXPECT_THAT(Runs("0 0 29 2 *", kUtc, Utc(1997, 1, 1, 0, 0), 1),
              ElementsAre("2000-02-29 00:00:00+00:00"));
}

TEST(CronNextTest, ADayOfMonthSkipsTheMonthsThatDoNotHaveIt) {
  EXPECT_THAT(Runs("0 0 31 * *", kUtc, Utc(2024, 1, 31, 0, 0), 4),
              ElementsAre("2024-03-31 00:00:00+00:00", "2024-05-31 00:00:00+00:00",
                          "2024-07-31 00:00:00+00:00", "2024-08-31 00:00:00+00:00"));
  EXPECT_THAT(Runs("0 0 30 * *", kUtc, Utc(2023, 1, 30, 0, 0), 2),
              ElementsAre("2023-03-30 00:00:00+00:00", "2023-04-30 00:00:00+00:00"));
}

TEST(CronNextTest, ADayNoMonthHasNeverRuns) {
  EXPECT_EQ(Cron("0 0 30 2 *").Next(Utc(2024, 1, 1, 0, 0), kUtc), absl::InfiniteFuture());
  EXPECT_EQ(Cron("0 0 31 4,6,9,11 *").Next(Utc(2024, 1, 1, 0, 0), kUtc), absl::InfiniteFuture());
  // With a day of the week as well, the weekdays still run (either field matches).
  EXPECT_THAT(Runs("0 0 30 2 MON", kUtc, Utc(2024, 1, 1, 0, 0), 2),
              ElementsAre("2024-02-05 00:00:00+00:00", "2024-02-12 00:00:00+00:00"));
}

TEST(CronNextTest, ADayOfMonthAndADayOfWeekBothRestrictedMatchEitherOne) {
  // The 13th, and every Friday: 2024-09-06 and 09-13 are Fridays, 10-13 a Sunday.
  EXPECT_THAT(Runs("0 9 13 * FRI", kUtc, Utc(2024, 9, 1, 0, 0), 7),
              ElementsAre("2024-09-06 09:00:00+00:00", "2024-09-13 09:00:00+00:00",
                          "2024-09-20 09:00:00+00:00", "2024-09-27 09:00:00+00:00",
                          "2024-10-04 09:00:00+00:00", "2024-10-11 09:00:00+00:00",
                          "2024-10-13 09:00:00+00:00"));
}

TEST(CronNextTest, WhenOneDayFieldIsAStarOnlyTheOtherDecides) {
  EXPECT_THAT(Runs("0 9 * * FRI", kUtc, Utc(2024, 9, 1, 0, 0), 2),
              ElementsAre("2024-09-06 09:00:00+00:00", "2024-09-13 09:00:00+00:00"));
  EXPECT_THAT(Runs("0 9 13 * *", kUtc, Utc(2024, 9, 1, 0, 0), 2),
              ElementsAre("2024-09-13 09:00:00+00:00", "2024-10-13 09:00:00+00:00"));
}

TEST(CronNextTest, ADayFieldWrittenOtherThanStarIsRestrictedEvenIfItNamesEveryDay) {
  const absl::Time from = Utc(2024, 1, 1, 0, 0);  // a Monday
  EXPECT_THAT(Runs("0 0 */1 * MON", kUtc, from, 2),
              ElementsAre("2024-01-02 00:00:00+00:00", "2024-01-03 00:00:00+00:00"));
  EXPECT_THAT(Runs("0 0 1 * 0-6", kUtc, from, 2),
              ElementsAre("2024-01-02 00:00:00+00:00", "2024-01-03 00:00:00+00:00"));
  EXPECT_THAT(Runs("0 0 */2 * MON", kUtc, from, 4),
              ElementsAre("2024-01-03 00:00:00+00:00", "2024-01-05 00:00:00+00:00",
                          "2024-01-07 00:00:00+00:00", "2024-01-08 00:00:00+00:00"));
}

TEST(CronNextTest, TheSearchCarriesIntoTheNextYear) {
  EXPECT_THAT(Runs("0 0 1 1 *", kUtc, Utc(2024, 12, 31, 23, 59, 59), 1),
              ElementsAre("2025-01-01 00:00:00+00:00"));
  EXPECT_THAT(Runs("59 23 31 12 *", kUtc, Utc(2024, 12, 31, 23, 59), 1),
              ElementsAre("2025-12-31 23:59:00+00:00"));
}

TEST(CronNextTest, InstantsFrom1970To2100AndBeforeWork) {
  EXPECT_THAT(Runs("*/15 * * * * *", kUtc, absl::UnixEpoch(), 1),
              ElementsAre("1970-01-01 00:00:15+00:00"));
  EXPECT_THAT(Runs("0 0 1 1 *", kUtc, Utc(1969, 6, 1, 0, 0), 1),
              ElementsAre("1970-01-01 00:00:00+00:00"));
  EXPECT_THAT(Runs("@monthly", kUtc, Utc(2100, 12, 15, 0, 0), 1),
              ElementsAre("2101-01-01 00:00:00+00:00"));
}

TEST(CronNextTest, AnInfiniteInstantHasNoNextRun) {
  EXPECT_EQ(Cron("* * * * *").Next(absl::InfiniteFuture(), kUtc), absl::InfiniteFuture());
  EXPECT_EQ(Cron("* * * * *").Next(absl::InfinitePast(), kUtc), absl::InfiniteFuture());
}

TEST(CronNextTest, FieldsAreMatchedOnTheZonesWallClock) {
  const absl::TimeZone tokyo = Zone("Asia/Tokyo");  // UTC+9, no daylight saving time
  EXPECT_EQ(Cron("0 9 * * *").Next(Utc(2024, 1, 1, 0, 0), tokyo), Utc(2024, 1, 2, 0, 0));
  const absl::TimeZone kolkata = Zone("Asia/Kolkata");  // UTC+5:30
  EXPECT_EQ(Cron("0 0 * * *").Next(Utc(2024, 1, 1, 0, 0), kolkata), Utc(2024, 1, 1, 18, 30));
}

// ---- Daylight saving time (the rule in schedule/cron.h) ----
// America/New_York: 2024-03-10 02:00 EST -> 03:00 EDT; 2024-11-03 02:00 EDT -> 01:00 EST.
// Europe/Berlin: 2024-03-31 02:00 CET -> 03:00 CEST; 2024-10-27 03:00 CEST -> 02:00 CET.
// Australia/Lord_Howe (a 30-minute shift): 2024-10-06 02:00 +10:30 -> 02:30 +11:00;
// 2024-04-07 02:00 +11:00 -> 01:30 +10:30.

class CronDstTest : public ::testing::Test {
 protected:
  const absl::TimeZone new_york_ = Zone("America/New_York");
  const absl::TimeZone berlin_ = Zone("Europe/Berlin");
  const absl::TimeZone lord_howe_ = Zone("Australia/Lord_Howe");
};

TEST_F(CronDstTest, ASkippedFixedTimeRunsOnceAtTheEndOfTheGap) {
  EXPECT_THAT(Runs("30 2 * * *", new_york_, Wall(new_york_, 2024, 3, 9, 12, 0), 2),
              ElementsAre("2024-03-10 03:00:00-04:00", "2024-03-11 02:30:00-04:00"));
  EXPECT_THAT(Runs("30 2 * * *", berlin_, Wall(berlin_, 2024, 3, 30, 12, 0), 2),
              ElementsAre("2024-03-31 03:00:00+02:00", "2024-04-01 02:30:00+02:00"));
  EXPECT_THAT(Runs("15 2 * * *", lord_howe_, Wall(lord_howe_, 2024, 10, 5, 12, 0), 2),
              ElementsAre("2024-10-06 02:30:00+11:00", "2024-10-07 02:15:00+11:00"));
  // With a seconds field too: the end of the gap, not 03:00:05.
  EXPECT_THAT(Runs("5 30 2 * * *", new_york_, Wall(new_york_, 2024, 3, 9, 12, 0), 1),
              ElementsAre("2024-03-10 03:00:00-04:00"));
  // From just before the jump, the run is the jump itself.
  EXPECT_EQ(Cron("30 2 * * *").Next(Utc(2024, 3, 10, 6, 59, 59), new_york_),
            Utc(2024, 3, 10, 7, 0));
  EXPECT_EQ(Cron("30 2 * * *").Next(Utc(2024, 3, 10, 7, 0), new_york_), Utc(2024, 3, 11, 6, 30));
}

TEST_F(CronDstTest, SeveralSkippedRunsOfOneGapAndARunAtItsEndAreOneRun) {
  EXPECT_THAT(Runs("*/20 2 * * *", new_york_, Wall(new_york_, 2024, 3, 10, 0, 0), 2),
              ElementsAre("2024-03-10 03:00:00-04:00", "2024-03-11 02:00:00-04:00"));
  EXPECT_THAT(Runs("0 2,3 * * *", berlin_, Wall(berlin_, 2024, 3, 31, 0, 0), 3),
              ElementsAre("2024-03-31 03:00:00+02:00", "2024-04-01 02:00:00+02:00",
                          "2024-04-01 03:00:00+02:00"));
  // A run after the end of the gap is its own run.
  EXPECT_THAT(Runs("30 2,3 * * *", new_york_, Wall(new_york_, 2024, 3, 10, 0, 0), 2),
              ElementsAre("2024-03-10 03:00:00-04:00", "2024-03-10 03:30:00-04:00"));
}

TEST_F(CronDstTest, AScheduleForEveryHourHasNoRunInTheSkippedHour) {
  EXPECT_THAT(Runs("30 * * * *", new_york_, Wall(new_york_, 2024, 3, 10, 1, 0), 2),
              ElementsAre("2024-03-10 01:30:00-05:00", "2024-03-10 03:30:00-04:00"));
  EXPECT_THAT(Runs("30 * * * *", berlin_, Wall(berlin_, 2024, 3, 31, 1, 0), 2),
              ElementsAre("2024-03-31 01:30:00+01:00", "2024-03-31 03:30:00+02:00"));
  EXPECT_THAT(Runs("0 * * * *", lord_howe_, Wall(lord_howe_, 2024, 10, 6, 0, 30), 2),
              ElementsAre("2024-10-06 01:00:00+10:30", "2024-10-06 03:00:00+11:00"));
  // Every minute: 01:59 EST, then 03:00 EDT, one minute later.
  EXPECT_THAT(Runs("* * * * *", new_york_, Wall(new_york_, 2024, 3, 10, 1, 58, 30), 2),
              ElementsAre("2024-03-10 01:59:00-05:00", "2024-03-10 03:00:00-04:00"));
}

TEST_F(CronDstTest, ARepeatedFixedTimeRunsOnceAtItsFirstInstant) {
  EXPECT_THAT(Runs("30 1 * * *", new_york_, Wall(new_york_, 2024, 11, 2, 12, 0), 2),
              ElementsAre("2024-11-03 01:30:00-04:00", "2024-11-04 01:30:00-05:00"));
  EXPECT_THAT(Runs("30 2 * * *", berlin_, Wall(berlin_, 2024, 10, 26, 12, 0), 2),
              ElementsAre("2024-10-27 02:30:00+02:00", "2024-10-28 02:30:00+01:00"));
  EXPECT_THAT(Runs("45 1 * * *", lord_howe_, Wall(lord_howe_, 2024, 4, 6, 12, 0), 2),
              ElementsAre("2024-04-07 01:45:00+11:00", "2024-04-08 01:45:00+10:30"));
  // From anywhere in the repeated hour, either pass, the next run is the next day's.
  const CronExpression cron = Cron("30 1 * * *");
  for (absl::Time after :
       {Utc(2024, 11, 3, 5, 40), Utc(2024, 11, 3, 6, 10), Utc(2024, 11, 3, 6, 40)}) {
    EXPECT_EQ(Show(cron.Next(after, new_york_), new_york_), "2024-11-04 01:30:00-05:00")
        << Show(after, new_york_);
  }
}

TEST_F(CronDstTest, AScheduleForEveryHourRunsAtBothInstantsOfARepeatedWallTime) {
  EXPECT_THAT(Runs("30 * * * *", new_york_, Wall(new_york_, 2024, 11, 3, 0, 0), 4),
              ElementsAre("2024-11-03 00:30:00-04:00", "2024-11-03 01:30:00-04:00",
                          "2024-11-03 01:30:00-05:00", "2024-11-03 02:30:00-05:00"));
  EXPECT_THAT(Runs("30 * * * *", berlin_, Wall(berlin_, 2024, 10, 27, 1, 0), 4),
              ElementsAre("2024-10-27 01:30:00+02:00", "2024-10-27 02:30:00+02:00",
                          "2024-10-27 02:30:00+01:00", "2024-10-27 03:30:00+01:00"));
  EXPECT_THAT(Runs("45 * * * *", lord_howe_, Wall(lord_howe_, 2024, 4, 7, 1, 0), 3),
              ElementsAre("2024-04-07 01:45:00+11:00", "2024-04-07 01:45:00+10:30",
                          "2024-04-07 02:45:00+10:30"));
}

TEST_F(CronDstTest, FromInsideARepeatedHourTheNextRunIsTheNextRealOne) {
  const CronExpression cron = Cron("30 * * * *");
  // 01:45 EDT, the first pass after its 01:30: the next run is 01:30 EST, 45 minutes later,
  // although its wall time is earlier.
  EXPECT_EQ(Show(cron.Next(Utc(2024, 11, 3, 5, 45), new_york_), new_york_),
            "2024-11-03 01:30:00-05:00");
  // 01:10 EST and 01:40 EST, the second pass.
  EXPECT_EQ(Show(cron.Next(Utc(2024, 11, 3, 6, 10), new_york_), new_york_),
            "2024-11-03 01:30:00-05:00");
  EXPECT_EQ(Show(cron.Next(Utc(2024, 11, 3, 6, 40), new_york_), new_york_),
            "2024-11-03 02:30:00-05:00");
  // Every second: 01:59:59 EDT is followed by 01:00:00 EST, one second later.
  const CronExpression every_second = Cron("* * * * * *");
  EXPECT_EQ(every_second.Next(Utc(2024, 11, 3, 5, 59, 59), new_york_), Utc(2024, 11, 3, 6, 0));
  EXPECT_EQ(every_second.Next(Utc(2024, 11, 3, 6, 59, 59), new_york_), Utc(2024, 11, 3, 7, 0));
  // A fixed minute in the repeated hour, seen from its first pass: only the first pass runs.
  const CronExpression fixed = Cron("*/10 1 * * *");
  EXPECT_EQ(Show(fixed.Next(Utc(2024, 11, 3, 5, 45), new_york_), new_york_),
            "2024-11-03 01:50:00-04:00");
  EXPECT_EQ(Show(fixed.Next(Utc(2024, 11, 3, 5, 55), new_york_), new_york_),
            "2024-11-04 01:00:00-05:00");
}

TEST_F(CronDstTest, AGapAtMidnightStillRunsTheSkippedDay) {
  // America/Sao_Paulo, 2018-11-04: 00:00 -03 jumped to 01:00 -02, so that day had no midnight.
  const absl::TimeZone sao_paulo = Zone("America/Sao_Paulo");
  EXPECT_THAT(Runs("@daily", sao_paulo, Wall(sao_paulo, 2018, 11, 3, 12, 0), 2),
              ElementsAre("2018-11-04 01:00:00-02:00", "2018-11-05 00:00:00-02:00"));
  // 2018-02-18: 00:00 -02 fell back to 23:00 -03 on the 17th; the 17th's 23:30 repeats.
  EXPECT_THAT(Runs("30 23 * * *", sao_paulo, Wall(sao_paulo, 2018, 2, 17, 12, 0), 2),
              ElementsAre("2018-02-17 23:30:00-02:00", "2018-02-18 23:30:00-03:00"));
}

TEST_F(CronDstTest, AFixedTimeRunsOnceOnEveryDayOfAYearWithTwoChanges) {
  for (const absl::TimeZone& zone : {new_york_, berlin_, lord_howe_}) {
    const CronExpression cron = Cron("30 2 * * *");
    absl::Time t = Wall(zone, 2024, 1, 1, 0, 0);
    absl::CivilDay day(2024, 1, 1);
    while (day.year() == 2024) {
      const absl::Time next = cron.Next(t, zone);
      ASSERT_GT(next, t);
      ASSERT_EQ(absl::CivilDay(absl::ToCivilSecond(next, zone)), day) << zone.name();
      t = next;
      ++day;
    }
  }
}

TEST_F(CronDstTest, AnHourlyScheduleRunsOnceInEveryRealHourAllYear) {
  for (const absl::TimeZone& zone : {new_york_, berlin_}) {
    const CronExpression cron = Cron("30 * * * *");
    absl::Time t = Utc(2024, 1, 1, 0, 0);
    for (int hour = 0; hour < 366 * 24; ++hour) {
      t = cron.Next(t, zone);
      ASSERT_EQ(t, Utc(2024, 1, 1, 0, 30) + absl::Hours(hour)) << zone.name();
    }
  }
}

TEST_F(CronDstTest, AZoneWithoutDaylightSavingIsUnaffected) {
  EXPECT_THAT(Runs("30 2 * * *", kUtc, Utc(2024, 3, 10, 0, 0), 2),
              ElementsAre("2024-03-10 02:30:00+00:00", "2024-03-11 02:30:00+00:00"));
}

// ---- LoadZone ----

TEST(LoadZoneTest, EmptyAndUtcAreUtcAndAnIanaNameIsItsZone) {
  EXPECT_EQ(LoadZone("").value(), absl::UTCTimeZone());
  EXPECT_EQ(LoadZone("UTC").value().name(), "UTC");
  EXPECT_EQ(LoadZone("Europe/Berlin").value().name(), "Europe/Berlin");
}

TEST(LoadZoneTest, AnUnknownZoneOrAHostDependentOneIsRefusedByName) {
  for (const char* name : {"Mars/Olympus_Mons", "../../etc/passwd", "/etc/localtime", "localtime",
                           "Europe/../Europe/Berlin"}) {
    const absl::StatusOr<absl::TimeZone> zone = LoadZone(name);
    EXPECT_EQ(zone.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(zone.status().message()),
                HasSubstr(std::string("unknown time zone '") + name + "'"));
  }
}

// ---- NextEvery ----

TEST(NextEveryTest, BeforeTheAnchorTheFirstRunIsTheAnchor) {
  const absl::Time anchor = Utc(2024, 1, 1, 0, 0);
  EXPECT_EQ(NextEvery(anchor, absl::Minutes(5), anchor - absl::Hours(3)), anchor);
  EXPECT_EQ(NextEvery(anchor, absl::Minutes(5), anchor - absl::Nanoseconds(1)), anchor);
}

TEST(NextEveryTest, TheNextRunIsTheFirstMultipleStrictlyAfter) {
  const absl::Time anchor = Utc(2024, 1, 1, 0, 0);
  EXPECT_EQ(NextEvery(anchor, absl::Minutes(5), anchor), anchor + absl::Minutes(5));
  EXPECT_EQ(NextEvery(anchor, absl::Minutes(5), anchor + absl::Minutes(7)),
            anchor + absl::Minutes(10));
  EXPECT_EQ(NextEvery(anchor, absl::Minutes(5), anchor + absl::Minutes(10)),
            anchor + absl::Minutes(15));
  EXPECT_EQ(NextEvery(anchor, absl::Milliseconds(1500), anchor + absl::Seconds(3)),
            anchor + absl::Milliseconds(4500));
}

TEST(NextEveryTest, TheSeriesIsElapsedTimeAcrossADaylightSavingChange) {
  // Anchored at 00:00 EST on the day New York springs forward: 24 hours later is 01:00 EDT.
  const absl::TimeZone new_york = Zone("America/New_York");
  const absl::Time anchor = Wall(new_york, 2024, 3, 10, 0, 0);
  EXPECT_EQ(Show(NextEvery(anchor, absl::Hours(24), anchor), new_york),
            "2024-03-11 01:00:00-04:00");
}

TEST(NextEveryTest, FarFromTheAnchorNothingOverflows) {
  const absl::Time anchor = absl::UnixEpoch();
  EXPECT_EQ(NextEvery(anchor, absl::Seconds(1), Utc(2100, 1, 1, 0, 0)), Utc(2100, 1, 1, 0, 0, 1));
  EXPECT_EQ(NextEvery(anchor, absl::Nanoseconds(1), Utc(2100, 1, 1, 0, 0)),
            Utc(2100, 1, 1, 0, 0) + absl::Nanoseconds(1));
  EXPECT_EQ(NextEvery(anchor, absl::Hours(1), absl::InfiniteFuture()), absl::InfiniteFuture());
}

TEST(NextEveryTest, ANonPositiveIntervalHasNoRuns) {
  const absl::Time anchor = Utc(2024, 1, 1, 0, 0);
  EXPECT_EQ(NextEvery(anchor, absl::ZeroDuration(), anchor), absl::InfiniteFuture());
  EXPECT_EQ(NextEvery(anchor, -absl::Seconds(1), anchor), absl::InfiniteFuture());
}

}  // namespace
}  // namespace jobbroker::schedule
