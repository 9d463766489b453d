#include "core/schedule_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace jobbroker::core {

absl::StatusOr<schedule::Timing> ScheduleTable::TimingOf(const Schedule& s) {
  absl::StatusOr<schedule::Timing> timing = schedule::Timing::Make(
      s.cron, s.every, s.time_zone, s.created_at, s.start_at, s.end_at,
      s.catch_up == ScheduleCatchUp::kNone ? schedule::CatchUp::kNone : schedule::CatchUp::kOne);
  if (timing.ok()) return timing;
  return absl::Status(timing.status().code(), absl::StrCat("schedule.", timing.status().message()));
}

const ScheduleTable::Entry* ScheduleTable::Find(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

void ScheduleTable::Unqueue(const Entry& e) { due_.erase({e.schedule.next_run_at, e.schedule.id}); }

ScheduleTable::Entry& ScheduleTable::Put(Schedule s) {
  if (auto it = entries_.find(s.id); it != entries_.end()) Unqueue(it->second);
  Entry e;
  absl::StatusOr<schedule::Timing> timing = TimingOf(s);
  if (timing.ok()) {
    e.timing = *std::move(timing);
  } else {
    e.broken = timing.status();
  }
  e.schedule = std::move(s);
  if (!e.schedule.paused && e.timing.has_value() &&
      e.schedule.next_run_at != absl::InfiniteFuture())
    due_.insert({e.schedule.next_run_at, e.schedule.id});
  std::string id = e.schedule.id;
  return entries_.insert_or_assign(std::move(id), std::move(e)).first->second;
}

bool ScheduleTable::Erase(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  Unqueue(it->second);
  entries_.erase(it);
  return true;
}

std::optional<std::string> ScheduleTable::Due(absl::Time now) const {
  if (due_.empty() || std::get<0>(*due_.begin()) > now) return std::nullopt;
  return std::get<1>(*due_.begin());
}

absl::Time ScheduleTable::NextDue() const {
  return due_.empty() ? absl::InfiniteFuture() : std::get<0>(*due_.begin());
}

void ScheduleTable::Clear() {
  entries_.clear();
  due_.clear();
}

}  // namespace jobbroker::core
