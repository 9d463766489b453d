#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "schedule/cron.h"

namespace jobbroker::schedule {

// What to do about runs a schedule missed (the broker was down, or its partition had no leader,
// when they came due).
enum class CatchUp {
  kOne,   // one run, at once, named by the latest missed time; the others are skipped
  kNone,  // none: the schedule goes on with its next run after now
};

// A missed run is still "on time" (run, not caught up) this long after its time: a tick a few
// seconds late, a failover that took seconds, is not downtime.
inline constexpr absl::Duration kOnTime = absl::Minutes(1);

// When a schedule runs: a cron expression on the wall clock of a zone, or a fixed `every` from
// an anchor; never before start_at nor after end_at. An immutable value.
class Timing {
 public:
  // Exactly one of `cron` (non-empty) and `every` (> 0, at least 1 s) must be given; `zone` is
  // an IANA name ("" = UTC). `anchor` is where an `every` series starts (its first run). The
  // kInvalidArgument messages name the field: cron, every, time_zone, end_at.
  static absl::StatusOr<Timing> Make(absl::string_view cron, absl::Duration every,
                                     absl::string_view zone, absl::Time anchor,
                                     absl::Time start_at = absl::InfinitePast(),
                                     absl::Time end_at = absl::InfiniteFuture(),
                                     CatchUp catch_up = CatchUp::kOne);

  // The first run strictly after `after`, not before start_at; InfiniteFuture if there is none
  // by end_at (the schedule has ended).
  absl::Time NextRun(absl::Time after) const;

  CatchUp catch_up() const { return catch_up_; }

 private:
  Timing() = default;

  std::optional<CronExpression> cron_;
  absl::Duration every_ = absl::ZeroDuration();
  absl::TimeZone zone_;
  absl::Time anchor_ = absl::InfinitePast();
  absl::Time start_at_ = absl::InfinitePast();
  absl::Time end_at_ = absl::InfiniteFuture();
  CatchUp catch_up_ = CatchUp::kOne;
};

// What a schedule whose next run is `next_run_at` does when the broker looks at `now`.
struct Due {
  // The run to enqueue now, as its scheduled time (which names it: DedupKeyOf); none if nothing
  // is due, or every missed run is skipped.
  std::optional<absl::Time> run;
  // Runs that came due and are not enqueued (caught up into `run`, or skipped). At most
  // kCountLimit: past it, counting stops.
  int64_t skipped = 0;
  // The run after: the schedule's new next_run_at (InfiniteFuture once it has ended).
  absl::Time next_run_at = absl::InfiniteFuture();
};

inline constexpr int64_t kCountLimit = 100'000;

// Due runs at `now`. One due run within kOnTime of its time is simply run. Several (or one
// later than that) were missed: kOne runs the latest of them, kNone runs none, unless the
// latest is itself on time. Pure: the same arguments give the same answer, so a broker that
// crashed after enqueueing a run and before storing the schedule enqueues the same run again,
// and the run's dedup key makes that one job.
Due Advance(const Timing& timing, absl::Time next_run_at, absl::Time now);

// The dedup key of a schedule's run: "<schedule_id>@<run time, RFC 3339 in UTC>", e.g.
// "nightly-report@2026-12-04T02:30:00Z".
std::string DedupKeyOf(absl::string_view schedule_id, absl::Time run);

}  // namespace jobbroker::schedule
