#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"

namespace jobbroker::schedule {

// When a recurring schedule runs next. Pure functions of their arguments: no clock is read, so a
// caller passes `now` (or the last run) and gets the next run time back.

// The IANA time zone `name` ("Europe/Berlin"), read from the system's tzdata
// (/usr/share/zoneinfo); "" and "UTC" are UTC. kInvalidArgument naming the zone if it is unknown,
// and for "localtime" or a file path (a leading "/", or ".."): those would make a schedule depend
// on the host that evaluates it.
absl::StatusOr<absl::TimeZone> LoadZone(absl::string_view name);

// A cron expression: when each field matches the wall clock of a time zone, the schedule runs.
//
// Syntax. Five fields, `minute hour day-of-month month day-of-week`, or six with a leading
// `second` field, separated by spaces or tabs:
//   second 0-59, minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or JAN-DEC,
//   day-of-week 0-7 or SUN-SAT (0 and 7 are both Sunday). Names are case-insensitive.
// Each field is a comma-separated list of items; an item is
//   `*` (every value), `a` (one value), `a-b` (a to b, a <= b: ranges do not wrap around),
//   `*/n`, `a-b/n` (every n-th value from the start of the range), or `a/n` (from a to the end of
//   the field: `5/20` in minutes is 5,25,45; in day-of-week the end is Saturday, so `1/2` is
//   MON,WED,FRI). n is 1 up to the number of values in the field (60 for minutes).
// Macros: @yearly and @annually (0 0 1 1 *), @monthly (0 0 1 * *), @weekly (0 0 * * 0),
// @daily and @midnight (0 0 * * *), @hourly (0 * * * *).
// Not supported, and refused with a message saying so: `L`, `W`, `#`, `?`, @reboot, a seventh
// (year) field. Every refusal is kInvalidArgument whose message names the field and the text:
//   cron: day-of-week field 'FRX': unknown name 'FRX' (expected 0-7 or SUN-SAT)
//
// Day-of-month and day-of-week. If both are restricted, that is neither is written `*`, a day
// matches when EITHER matches (Vixie cron's rule, and croniter's default day_or=True): "0 9 1 *
// MON" runs at 09:00 on the 1st of each month and on every Monday. If one of them is `*`, only
// the other decides. "Restricted" is read from the text, as the crontab(5) man page words it
// ("aren't *"): `*/1` or `1-31` is restricted although it names every day, so "0 0 */1 * MON"
// runs every day.
//
// Time zones and daylight saving time. The fields are matched against the wall clock of the zone
// passed to Next. A wall time that the zone skips (spring forward) or shows twice (fall back) is
// handled by one rule that depends only on the hour field:
//   - Skipped wall time. If the hour field names every hour (`*`, `*/1`, `0-23`), the schedule
//     runs "every hour or more often" and a wall time that never shows is simply not a run: the
//     runs around the gap stay the usual elapsed time apart. Otherwise (fixed hours of the day)
//     a run whose wall time is skipped happens at the end of the gap, the instant the clocks
//     jump: it is not lost. Several skipped runs of one gap are one run there, and a run due
//     exactly at the end of the gap is that same run.
//   - Repeated wall time. If the hour field names every hour, a repeated wall time runs at both
//     of its instants: they are a real hour apart, and an hourly schedule keeps running every
//     real hour. Otherwise it runs once, at the first instant (still on summer time), and the
//     second pass of the repeated hour has no runs: a daily job is never doubled. The price: a
//     schedule for some hours that runs often within them ("*/5 0-5 * * *") also has no runs in
//     that second pass, an hour longer than usual without one.
// Worked example, America/New_York, where 2024-03-10 02:00 EST jumps to 03:00 EDT and 2024-11-03
// 02:00 EDT falls back to 01:00 EST:
//   "30 2 * * *"  runs 2024-03-10 03:00 EDT (07:00Z, the end of the gap); on 11-03 at 02:30 EST.
//   "30 1 * * *"  runs 2024-11-03 01:30 EDT (05:30Z) only; not again at 01:30 EST (06:30Z).
//   "30 * * * *"  runs 2024-03-10 01:30 EST, then 03:30 EDT (one hour later); on 11-03 it runs
//                 00:30 EDT, 01:30 EDT, 01:30 EST, 02:30 EST: every real hour.
//   "*/20 2 * * *" runs 2024-03-10 03:00 EDT once (02:00, 02:20 and 02:40 were all skipped).
// This is Vixie cron's rule (its cron(8): jobs that would have run in a skipped interval run
// immediately, and care is taken not to run jobs twice when time moves back; jobs that run more
// often are scheduled normally), with "fixed time" decided by the hour field alone rather than by
// how the minute and hour fields are spelt.
//
// croniter 7.0.0, the reference of the differential test (tests/schedule/differential.sh), agrees
// everywhere else and differs here, each difference checked case by case by that test:
//   - it runs every schedule at both instants of a repeated wall time ("30 1 * * *" twice on
//     2024-11-03);
//   - it moves a skipped wall time forward in whole minutes, so with a seconds field a skipped
//     run lands at the end of the gap plus its seconds ("5 30 2 * * *": 03:00:05, ours 03:00:00);
//   - where a fall back repeats only 30 minutes (Australia/Lord_Howe) it misses some second-pass
//     runs of every-hour schedules that it lists itself when asked from just before them;
//   - it reads a day field that names every day but is not `*` as `*` when the other day field
//     has a `*` in its text ("0 0 */1 * */2" runs on SUN,TUE,THU,SAT there; every day here).
//   It also reads a one-value range `a-a` as the whole field; here it is a.
//
// An immutable value: copy it freely and call Next from any number of threads.
class CronExpression {
 public:
  // Parses `text`. kInvalidArgument with a message naming the bad field and value (see above).
  static absl::StatusOr<CronExpression> Parse(absl::string_view text);

  // The first run strictly after `after`, per the rules above, as a whole second. InfiniteFuture
  // if the schedule never runs ("0 0 30 2 *": February has no 30th) or `after` is infinite.
  // Cost: a few steps per field, never a scan over minutes: 65-110 ns for common schedules in UTC
  // and in DST zones alike (Release build, GCC 12, this project's 2-core machine).
  absl::Time Next(absl::Time after, const absl::TimeZone& zone) const;

  // The text it was parsed from, as given.
  const std::string& text() const { return text_; }

 private:
  CronExpression() = default;

  // The first wall time at or after `from` whose fields all match, searching at most 400 years
  // (a whole Gregorian cycle) ahead; absl::CivilSecond::max() if none.
  absl::CivilSecond NextMatch(absl::CivilSecond from) const;
  // The days of `month` that match the day-of-month and day-of-week fields, as bits 1 to 31.
  uint32_t DaysOf(absl::CivilMonth month) const;

  std::string text_;
  // Bit v set when value v matches. Day-of-week uses 0-6 (7 is folded into 0).
  uint64_t seconds_ = 0;
  uint64_t minutes_ = 0;
  uint32_t hours_ = 0;
  uint32_t days_of_month_ = 0;
  uint32_t months_ = 0;
  uint32_t days_of_week_ = 0;
  // The day-of-month and day-of-week fields were written `*`.
  bool any_day_of_month_ = true;
  bool any_day_of_week_ = true;
  // The hour field names every hour: the daylight-saving rule above.
  bool every_hour_ = false;
  // No day of any year matches (a day of month that none of the months has).
  bool never_ = false;
  // For each weekday of the 1st of a month (0 = Sunday), the days 1-31 that match the
  // day-of-week field.
  std::array<uint32_t, 7> weekday_days_ = {};
};

// For `every` schedules: the first run strictly after `after` of the series anchor + k * every,
// k >= 0 (so `anchor` itself when `after` is before it). Elapsed time, not wall time: a daylight
// saving change does not move the series. InfiniteFuture if `every` is not positive or `after` is
// InfiniteFuture.
absl::Time NextEvery(absl::Time anchor, absl::Duration every, absl::Time after);

}  // namespace jobbroker::schedule
