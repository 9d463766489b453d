#pragma once

#include <string>

#include "absl/time/time.h"
#include "core/requests.h"

namespace jobbroker::core {

// What a schedule does about runs it missed while nobody led its partition (schedule/plan.h).
enum class ScheduleCatchUp { kOne = 0, kNone = 1 };

// A recurring schedule (Admin.PutSchedule), as the broker keeps and stores it: when it runs
// (cron or every, in a zone, between start_at and end_at) and what each run enqueues. Its runs
// are enqueued by the broker that leads the partition of its template's queue, each with the
// dedup key "<id>@<run time>" (schedule::DedupKeyOf), so a run is one job whatever crashes.
struct Schedule {
  std::string id;
  std::string cron;                             // or
  absl::Duration every = absl::ZeroDuration();  // exactly one of the two
  std::string time_zone;                        // IANA; "" = UTC
  EnqueueSpec job;                              // what each run enqueues (no dedup key, no delay)
  bool paused = false;
  absl::Time start_at = absl::InfinitePast();
  absl::Time end_at = absl::InfiniteFuture();
  ScheduleCatchUp catch_up = ScheduleCatchUp::kOne;
  absl::Time created_at = absl::InfinitePast();
  // The next run's time (InfiniteFuture once it has ended), the last run's, and its job.
  absl::Time next_run_at = absl::InfiniteFuture();
  absl::Time last_run_at = absl::InfinitePast();
  std::string last_job_id;

  bool operator==(const Schedule&) const = default;
};

// A schedule as the broker shows it: what is stored, and what is wrong, if anything.
struct ScheduleInfo {
  Schedule schedule;
  // Why it cannot run (its time zone is not in this build's tz database), or why its last run
  // was not enqueued (the queue was full, say); empty when all is well. Not stored: a restart
  // forgets a failed run's reason.
  std::string error;
};

}  // namespace jobbroker::core
