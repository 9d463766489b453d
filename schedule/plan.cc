#include "schedule/plan.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace jobbroker::schedule {

absl::StatusOr<Timing> Timing::Make(absl::string_view cron, absl::Duration every,
                                    absl::string_view zone, absl::Time anchor, absl::Time start_at,
                                    absl::Time end_at, CatchUp catch_up) {
  Timing t;
  if (cron.empty() == (every == absl::ZeroDuration()))
    return absl::InvalidArgumentError("cron: give exactly one of cron and every");
  if (!cron.empty()) {
    absl::StatusOr<CronExpression> parsed = CronExpression::Parse(cron);
    if (!parsed.ok()) return parsed.status();
    t.cron_ = *std::move(parsed);
  } else if (every < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("every: ", absl::FormatDuration(every), " is under the 1s minimum"));
  }
  absl::StatusOr<absl::TimeZone> loaded = LoadZone(zone);
  if (!loaded.ok()) return loaded.status();
  if (end_at <= start_at) return absl::InvalidArgumentError("end_at: must be after start_at");
  t.zone_ = *loaded;
  t.every_ = every;
  t.anchor_ = start_at == absl::InfinitePast() ? anchor : std::max(anchor, start_at);
  t.start_at_ = start_at;
  t.end_at_ = end_at;
  t.catch_up_ = catch_up;
  return t;
}

absl::Time Timing::NextRun(absl::Time after) const {
  // Nothing before start_at: the first run is the first at or after it.
  if (start_at_ != absl::InfinitePast() && after < start_at_) after = start_at_ - absl::Seconds(1);
  const absl::Time next =
      cron_.has_value() ? cron_->Next(after, zone_) : NextEvery(anchor_, every_, after);
  return next > end_at_ ? absl::InfiniteFuture() : next;
}

Due Advance(const Timing& timing, absl::Time next_run_at, absl::Time now) {
  Due due;
  if (next_run_at > now) {
    due.next_run_at = next_run_at;
    return due;
  }
  // The latest due run, counting the others. A schedule that runs every second and was down for
  // days would count for long: past kCountLimit the count stops and the search jumps to a minute
  // before now (every run in between was missed anyway).
  absl::Time latest = next_run_at;
  int64_t missed = 0;
  bool jumped = false;
  for (absl::Time next = timing.NextRun(latest); next <= now; next = timing.NextRun(latest)) {
    if (missed < kCountLimit) {
      ++missed;
      latest = next;
    } else if (jumped) {
      latest = next;  // the last minute's runs, one by one
    } else {
      jumped = true;
      const absl::Time near_now = timing.NextRun(now - kOnTime);
      if (near_now > now) break;
      latest = near_now;
    }
  }
  due.next_run_at = timing.NextRun(latest);
  const bool on_time = now - latest <= kOnTime;
  if (on_time || timing.catch_up() == CatchUp::kOne) {
    due.run = latest;
    due.skipped = missed;
  } else {
    due.skipped = missed + 1;
  }
  return due;
}

std::string DedupKeyOf(absl::string_view schedule_id, absl::Time run) {
  return absl::StrCat(schedule_id, "@",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", run, absl::UTCTimeZone()));
}

}  // namespace jobbroker::schedule
