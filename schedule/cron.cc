#include "schedule/cron.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace jobbroker::schedule {
namespace {

// A whole Gregorian cycle: the calendar (leap years and weekdays) repeats after it, so a
// schedule that matches no wall time in 400 years never matches.
constexpr int kSearchYears = 400;

// One cron field's name, bounds and names.
struct FieldSpec {
  const char* name;
  int min;
  int max;                   // the largest value written (7 for day-of-week)
  int star_max;              // what `*` and `a/n` run up to (6 for day-of-week)
  const char* const* names;  // names[i] is the value min + i; null if the field has none
  const char* expected;      // what a value may be, for messages
};

constexpr const char* kMonthNames[] = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                                       "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"};
constexpr const char* kDayNames[] = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"};

constexpr FieldSpec kSecond = {"second", 0, 59, 59, nullptr, "0-59"};
constexpr FieldSpec kMinute = {"minute", 0, 59, 59, nullptr, "0-59"};
constexpr FieldSpec kHour = {"hour", 0, 23, 23, nullptr, "0-23"};
constexpr FieldSpec kDayOfMonth = {"day-of-month", 1, 31, 31, nullptr, "1-31"};
constexpr FieldSpec kMonth = {"month", 1, 12, 12, kMonthNames, "1-12 or JAN-DEC"};
constexpr FieldSpec kDayOfWeek = {"day-of-week", 0, 7, 6, kDayNames, "0-7 or SUN-SAT"};

struct Macro {
  const char* name;
  const char* expansion;
};
constexpr Macro kMacros[] = {
    {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
    {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
    {"@hourly", "0 * * * *"},
};

bool IsNumber(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), absl::ascii_isdigit);
}

// Parses one field into a bit set; refusals name the field and its text.
class FieldParser {
 public:
  FieldParser(const FieldSpec& spec, absl::string_view text) : spec_(spec), text_(text) {}

  absl::StatusOr<uint64_t> Parse() {
    uint64_t bits = 0;
    for (absl::string_view item : absl::StrSplit(text_, ',')) {
      if (item.empty()) return Error("an empty list item");
      absl::StatusOr<uint64_t> item_bits = ParseItem(item);
      if (!item_bits.ok()) return item_bits.status();
      bits |= *item_bits;
    }
    return bits;
  }

 private:
  absl::Status Error(absl::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat("cron: ", spec_.name, " field '", text_, "': ", problem));
  }

  absl::StatusOr<uint64_t> ParseItem(absl::string_view item) const {
    for (char c : {'?', '#'}) {
      if (absl::StrContains(item, c)) {
        return Error(c == '?' ? "'?' is not supported (write '*')"
                              : "'#' (n-th weekday of the month) is not supported");
      }
    }
    std::vector<absl::string_view> parts = absl::StrSplit(item, '/');
    if (parts.size() > 2) return Error(absl::StrCat("'", item, "' has more than one '/'"));
    const absl::string_view base = parts[0];
    int low;
    int high;
    if (base == "*") {
      low = spec_.min;
      high = spec_.star_max;
    } else {
      const size_t dash = base.find('-');
      absl::StatusOr<int> first = Value(base.substr(0, dash), item);
      if (!first.ok()) return first.status();
      low = high = *first;
      if (dash != absl::string_view::npos) {
        absl::StatusOr<int> last = Value(base.substr(dash + 1), item);
        if (!last.ok()) return last.status();
        high = *last;
        if (low > high) {
          return Error(absl::StrCat("the range '", base, "' is reversed (ranges do not wrap)"));
        }
      } else if (parts.size() == 2) {
        high = std::max(low, spec_.star_max);  // `a/n`: from a to the end of the field
      }
    }
    int step = 1;
    if (parts.size() == 2) {
      const int values = spec_.star_max - spec_.min + 1;
      const absl::string_view text = parts[1];
      if (!IsNumber(text)) return Error(absl::StrCat("step '", text, "' is not a number"));
      if (!absl::SimpleAtoi(text, &step) || step < 1 || step > values) {
        return Error(absl::StrCat("step ", text, " is out of range 1-", values));
      }
    }
    uint64_t bits = 0;
    for (int v = low; v <= high; v += step) bits |= uint64_t{1} << v;
    return bits;
  }

  // One value of `item`: a number within the field's bounds, or a name of the field.
  absl::StatusOr<int> Value(absl::string_view text, absl::string_view item) const {
    if (text.empty()) return Error(absl::StrCat("'", item, "' is missing a value"));
    if (IsNumber(text)) {
      int v = 0;
      if (!absl::SimpleAtoi(text, &v) || v < spec_.min || v > spec_.max) {
        return Error(absl::StrCat("value ", text, " is out of range ", spec_.min, "-", spec_.max));
      }
      return v;
    }
    const std::string upper = absl::AsciiStrToUpper(text);
    if (spec_.names != nullptr) {
      const int count = spec_.star_max - spec_.min + 1;
      for (int i = 0; i < count; ++i) {
        if (upper == spec_.names[i]) return spec_.min + i;
      }
    }
    if (&spec_ == &kDayOfMonth || &spec_ == &kDayOfWeek) {
      // Quartz's day syntax: say what is not supported rather than "unknown name".
      if (absl::EndsWith(upper, "L")) {
        return Error("'L' (last) is not supported");
      }
      if (absl::EndsWith(upper, "W")) {
        return Error("'W' (nearest weekday) is not supported");
      }
    }
    if (spec_.names == nullptr) {
      return Error(absl::StrCat("'", text, "' is not a number (expected ", spec_.expected, ")"));
    }
    return Error(absl::StrCat("unknown name '", text, "' (expected ", spec_.expected, ")"));
  }

  const FieldSpec& spec_;
  const absl::string_view text_;
};

int DaysInMonth(absl::CivilMonth month) {
  return static_cast<int>(absl::CivilDay(month + 1) - absl::CivilDay(month));
}

// The weekday of `day`, 0 = Sunday.
int WeekdayNumber(absl::CivilDay day) {
  switch (absl::GetWeekday(day)) {
    case absl::Weekday::sunday:
      return 0;
    case absl::Weekday::monday:
      return 1;
    case absl::Weekday::tuesday:
      return 2;
    case absl::Weekday::wednesday:
      return 3;
    case absl::Weekday::thursday:
      return 4;
    case absl::Weekday::friday:
      return 5;
    case absl::Weekday::saturday:
      return 6;
  }
  return 0;
}

// The smallest value >= `from` whose bit is set in `bits`, or -1.
int NextBit(uint64_t bits, int from) {
  if (from >= 64) return -1;
  const uint64_t rest = bits & (~uint64_t{0} << from);
  return rest == 0 ? -1 : std::countr_zero(rest);
}

}  // namespace

absl::StatusOr<absl::TimeZone> LoadZone(absl::string_view name) {
  absl::TimeZone zone;
  if (name.empty()) return absl::UTCTimeZone();
  const bool path_like =
      absl::StartsWith(name, "/") || absl::StrContains(name, "..") || absl::StrContains(name, "\\");
  if (path_like || name == "localtime" || !absl::LoadTimeZone(std::string(name), &zone)) {
    return absl::InvalidArgumentError(absl::StrCat("time_zone: unknown time zone '", name,
                                                   "' (expected an IANA name such as ",
                                                   "Europe/Berlin, or UTC)"));
  }
  return zone;
}

absl::StatusOr<CronExpression> CronExpression::Parse(absl::string_view text) {
  absl::string_view fields_text = absl::StripAsciiWhitespace(text);
  if (fields_text.empty()) return absl::InvalidArgumentError("cron: the expression is empty");
  if (absl::StartsWith(fields_text, "@")) {
    const Macro* macro = nullptr;
    for (const Macro& m : kMacros) {
      if (absl::EqualsIgnoreCase(fields_text, m.name)) macro = &m;
    }
    if (macro == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cron: unknown macro '", fields_text,
          "' (expected @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"));
    }
    fields_text = macro->expansion;
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(fields_text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (fields.size() != 5 && fields.size() != 6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cron: expected 5 fields (minute hour day-of-month month day-of-week) or 6 (second "
        "first), got ",
        fields.size(), " in '", text, "'"));
  }
  if (fields.size() == 5) fields.insert(fields.begin(), "0");

  CronExpression cron;
  cron.text_ = std::string(text);
  const FieldSpec* const specs[] = {&kSecond, &kMinute, &kHour, &kDayOfMonth, &kMonth, &kDayOfWeek};
  uint64_t bits[6];
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<uint64_t> parsed = FieldParser(*specs[i], fields[i]).Parse();
    if (!parsed.ok()) return parsed.status();
    bits[i] = *parsed;
  }
  cron.seconds_ = bits[0];
  cron.minutes_ = bits[1];
  cron.hours_ = static_cast<uint32_t>(bits[2]);
  cron.days_of_month_ = static_cast<uint32_t>(bits[3]);
  cron.months_ = static_cast<uint32_t>(bits[4]);
  // Sunday is both 0 and 7.
  cron.days_of_week_ = static_cast<uint32_t>((bits[5] | (bits[5] >> 7)) & 0x7f);
  cron.any_day_of_month_ = fields[3] == "*";
  cron.any_day_of_week_ = fields[5] == "*";
  cron.every_hour_ = cron.hours_ == (uint32_t{1} << 24) - 1;

  for (int first = 0; first < 7; ++first) {
    for (int day = 1; day <= 31; ++day) {
      if (cron.days_of_week_ & (uint32_t{1} << ((first + day - 1) % 7))) {
        cron.weekday_days_[first] |= uint32_t{1} << day;
      }
    }
  }
  // Only a day-of-month list alone can name no day at all: every month has every weekday.
  if (cron.any_day_of_week_ && !cron.any_day_of_month_) {
    cron.never_ = true;
    for (int month = 1; month <= 12; ++month) {
      if (!(cron.months_ & (uint32_t{1} << month))) continue;
      const int longest = DaysInMonth(absl::CivilMonth(2000, month));  // 2000: a leap year
      if (NextBit(cron.days_of_month_, 1) <= longest) cron.never_ = false;
    }
  }
  return cron;
}

uint32_t CronExpression::DaysOf(absl::CivilMonth month) const {
  // Bits 1 to the month's last day.
  const uint32_t in_month = static_cast<uint32_t>((uint64_t{1} << (DaysInMonth(month) + 1)) - 2);
  const uint32_t by_week = weekday_days_[WeekdayNumber(absl::CivilDay(month))];
  uint32_t days;
  if (any_day_of_month_ && any_day_of_week_) {
    days = ~uint32_t{0};
  } else if (any_day_of_month_) {
    days = by_week;
  } else if (any_day_of_week_) {
    days = days_of_month_;
  } else {
    days = days_of_month_ | by_week;  // both restricted: either matches
  }
  return days & in_month;
}

absl::CivilSecond CronExpression::NextMatch(absl::CivilSecond from) const {
  const absl::civil_year_t last_year = from.year() + kSearchYears;
  absl::CivilSecond t = from;
  // Each pass either returns or moves `t` to the start of the next candidate month, day, hour or
  // minute; within a field it jumps straight to the next matching value.
  while (t.year() <= last_year) {
    const int month = NextBit(months_, t.month());
    if (month < 0) {
      t = absl::CivilSecond(t.year() + 1, 1, 1, 0, 0, 0);
      continue;
    }
    if (month != t.month()) t = absl::CivilSecond(t.year(), month, 1, 0, 0, 0);
    const int day = NextBit(DaysOf(absl::CivilMonth(t)), t.day());
    if (day < 0) {
      t = absl::CivilSecond(absl::CivilMonth(t) + 1);
      continue;
    }
    if (day != t.day()) t = absl::CivilSecond(t.year(), t.month(), day, 0, 0, 0);
    const int hour = NextBit(hours_, t.hour());
    if (hour < 0) {
      t = absl::CivilSecond(absl::CivilDay(t) + 1);
      continue;
    }
    if (hour != t.hour()) t = absl::CivilSecond(t.year(), t.month(), t.day(), hour, 0, 0);
    const int minute = NextBit(minutes_, t.minute());
    if (minute < 0) {
      t = absl::CivilSecond(absl::CivilHour(t) + 1);
      continue;
    }
    if (minute != t.minute()) {
      t = absl::CivilSecond(t.year(), t.month(), t.day(), t.hour(), minute, 0);
    }
    const int second = NextBit(seconds_, t.second());
    if (second < 0) {
      t = absl::CivilSecond(absl::CivilMinute(t) + 1);
      continue;
    }
    return absl::CivilSecond(t.year(), t.month(), t.day(), t.hour(), t.minute(), second);
  }
  return absl::CivilSecond::max();
}

// How the daylight-saving rule (cron.h) is carried out. Each matching wall time c has a first
// instant F(c): its only instant, the first of a repeated one, or the end of the gap for a skipped
// one (absl::FromCivil's choice). F never decreases as c grows. With every_hour_, a repeated wall
// time also has a second instant S(c), inside the repeated pass, and a skipped one has no instant.
// So the answer is the first F(c) after `after` over matching c after the wall time of `after`,
// unless an S(c) comes before it; an S(c) can be after `after` for a c at or before that wall time
// only when `after` is in the first pass of a repeated hour, which the search then starts from.
absl::Time CronExpression::Next(absl::Time after, const absl::TimeZone& zone) const {
  if (never_ || after == absl::InfiniteFuture() || after == absl::InfinitePast()) {
    return absl::InfiniteFuture();
  }
  const absl::CivilSecond wall = absl::ToCivilSecond(after, zone);
  absl::Time second_pass = absl::InfiniteFuture();  // the earliest S(c) after `after` so far
  if (every_hour_) {
    const absl::TimeZone::TimeInfo info = zone.At(wall);
    if (info.kind == absl::TimeZone::TimeInfo::REPEATED && after < info.trans) {
      // `after` is in the first pass: the repeated wall times from the start of the repeat up to
      // `wall` still have their second instants ahead.
      const absl::CivilSecond first = NextMatch(absl::ToCivilSecond(info.trans, zone));
      if (first <= wall) second_pass = zone.At(first).post;
    }
  }
  absl::CivilSecond cursor = wall;  // matches strictly after it
  while (true) {
    const absl::CivilSecond c = NextMatch(cursor + 1);
    if (c == absl::CivilSecond::max()) return second_pass;
    const absl::TimeZone::TimeInfo info = zone.At(c);
    switch (info.kind) {
      case absl::TimeZone::TimeInfo::UNIQUE:
        if (info.pre > after) return std::min(info.pre, second_pass);
        cursor = c;
        break;
      case absl::TimeZone::TimeInfo::SKIPPED:
        if (!every_hour_) {
          if (info.trans > after) return std::min(info.trans, second_pass);
          cursor = c;
        } else {
          // No run in the gap: go on from its end.
          cursor = absl::ToCivilSecond(info.trans, zone) - 1;
        }
        break;
      case absl::TimeZone::TimeInfo::REPEATED:
        if (info.pre > after) return std::min(info.pre, second_pass);
        // `after` is in the second pass.
        if (every_hour_ && info.post > after) return std::min(info.post, second_pass);
        // Nothing else in this repeat is after `after`: go on from its end.
        cursor = absl::ToCivilSecond(info.trans - absl::Seconds(1), zone);
        break;
    }
  }
}

absl::Time NextEvery(absl::Time anchor, absl::Duration every, absl::Time after) {
  if (every <= absl::ZeroDuration() || after == absl::InfiniteFuture()) {
    return absl::InfiniteFuture();
  }
  if (after < anchor) return anchor;
  absl::Duration remainder;
  const int64_t k = absl::IDivDuration(after - anchor, every, &remainder);
  return anchor + (k + 1) * every;
}

}  // namespace jobbroker::schedule
