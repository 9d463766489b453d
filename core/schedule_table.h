#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/schedules.h"
#include "schedule/plan.h"

namespace jobbroker::core {

// The recurring schedules a broker runs (those of its partition's queues), by id, and the order
// in which they come due. Each keeps its Timing, made once when it is put or recovered; a
// schedule whose timing no longer loads (a zone this build's tz database lacks) is kept, listed
// and stored, with `broken` saying why, and never runs.
//
// Not thread-safe (the broker's mutex guards it).
class ScheduleTable {
 public:
  struct Entry {
    Schedule schedule;
    std::optional<schedule::Timing> timing;  // unset: broken
    absl::Status broken;
    // Why its latest run was not enqueued (ScheduleInfo::error); empty if it was.
    std::string run_error;
  };

  // The timing of `s` (kInvalidArgument naming the field, "schedule.cron: ...").
  static absl::StatusOr<schedule::Timing> TimingOf(const Schedule& s);

  const Entry* Find(const std::string& id) const;
  // Adds or replaces the schedule (its timing made here; run_error cleared).
  Entry& Put(Schedule s);
  // False if there was none.
  bool Erase(const std::string& id);
  // Every schedule, by id.
  const absl::btree_map<std::string, Entry>& all() const { return entries_; }

  // The id of a runnable schedule (not paused, not broken) whose next run is at or before
  // `now`, the earliest first; none if nothing is due.
  std::optional<std::string> Due(absl::Time now) const;
  // When the earliest runnable schedule is due; InfiniteFuture if none is.
  absl::Time NextDue() const;

  size_t size() const { return entries_.size(); }
  void Clear();

 private:
  void Unqueue(const Entry& e);

  absl::btree_map<std::string, Entry> entries_;
  absl::btree_set<std::tuple<absl::Time, std::string>> due_;  // runnable ones only
};

}  // namespace jobbroker::core
