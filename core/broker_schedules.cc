// Broker: recurring schedules. Put, get, list, delete and trigger them, and run those that are
// due (from Tick). A run is an enqueue of the schedule's template with the run's dedup key, in
// the same transition as the schedule's new next_run_at: stored together or not at all.
#include "absl/strings/str_cat.h"
#include "core/broker_mutation.h"
#include "core/status_macros.h"
#include "core/validation.h"
#include "schedule/plan.h"

namespace jobbroker::core {
namespace {

absl::Status NoSuchSchedule(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("schedule ", id, " not found"));
}

// Whether `a` and `b` run at the same times (the fields Timing is made of).
bool SameTiming(const Schedule& a, const Schedule& b) {
  return a.cron == b.cron && a.every == b.every && a.time_zone == b.time_zone &&
         a.start_at == b.start_at && a.end_at == b.end_at && a.catch_up == b.catch_up;
}

}  // namespace

ScheduleInfo Broker::InfoLocked(const ScheduleTable::Entry& e) const {
  ScheduleInfo info{e.schedule, e.run_error};
  if (!e.broken.ok()) info.error = absl::StrCat("cannot run: ", e.broken.message());
  return info;
}

void Broker::PutSchedule(Schedule s, Done<absl::StatusOr<ScheduleInfo>> done) {
  if (absl::Status v = ValidateSchedule(s); !v.ok()) return done(v);
  Run<ScheduleInfo>(
      std::move(done),
      [this, s = std::move(s)](absl::Time now, Transition& t, Effects& fx)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable -> absl::StatusOr<ScheduleInfo> {
            const ScheduleTable::Entry* old = schedules_.Find(s.id);
            s.created_at = old != nullptr ? old->schedule.created_at : now;
            s.last_run_at = old != nullptr ? old->schedule.last_run_at : absl::InfinitePast();
            s.last_job_id = old != nullptr ? old->schedule.last_job_id : "";
            BROKER_ASSIGN_OR_RETURN(schedule::Timing timing, ScheduleTable::TimingOf(s));
            const bool unchanged = old != nullptr && old->timing.has_value() &&
                                   SameTiming(old->schedule, s) && old->schedule.paused == s.paused;
            s.next_run_at = unchanged ? old->schedule.next_run_at : timing.NextRun(now);
            fx.Require(Durability::kSync);  // an operator's change (Effects)
            if (!s.paused) deadlines_.Note(s.next_run_at);
            t.put_schedules.push_back(s);
            return InfoLocked(schedules_.Put(std::move(s)));
          });
}

absl::StatusOr<ScheduleInfo> Broker::GetSchedule(const std::string& id, ReadFence* fence) {
  BROKER_RETURN_IF_ERROR(ValidateScheduleId(id));
  absl::MutexLock lock(&mu_);
  // Also for kNotFound: a delete the reader is told of must not come back after a failover.
  FenceLocked(fence);
  const ScheduleTable::Entry* e = schedules_.Find(id);
  if (e == nullptr) return NoSuchSchedule(id);
  return InfoLocked(*e);
}

std::vector<ScheduleInfo> Broker::ListSchedules(const std::string& queue, ReadFence* fence) {
  absl::MutexLock lock(&mu_);
  FenceLocked(fence);
  std::vector<ScheduleInfo> all;
  for (const auto& [id, e] : schedules_.all()) {
    if (queue.empty() || e.schedule.job.queue == queue) all.push_back(InfoLocked(e));
  }
  return all;
}

void Broker::DeleteSchedule(std::string id, Done<absl::Status> done) {
  if (absl::Status v = ValidateScheduleId(id); !v.ok()) return done(v);
  Run<bool>([done = std::move(done)](absl::StatusOr<bool> r) mutable { done(r.status()); },
            [this, id = std::move(id)](absl::Time, Transition& t, Effects& fx)
                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
                  if (!schedules_.Erase(id)) return NoSuchSchedule(id);
                  fx.Require(Durability::kSync);  // an operator's change (Effects)
                  t.delete_schedules.push_back(id);
                  return true;
                });
}

void Broker::TriggerSchedule(std::string id, Done<absl::StatusOr<EnqueueResult>> done) {
  if (absl::Status v = ValidateScheduleId(id); !v.ok()) return done(v);
  Run<EnqueueResult>(std::move(done),
                     [this, id = std::move(id)](absl::Time now, Transition& t, Effects& fx)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<EnqueueResult> {
                           const ScheduleTable::Entry* e = schedules_.Find(id);
                           if (e == nullptr) return NoSuchSchedule(id);
                           Schedule s = e->schedule;
                           // To the second: the run's name (its dedup key) has no finer grain.
                           const absl::Time run = absl::FromUnixSeconds(absl::ToUnixSeconds(now));
                           BROKER_ASSIGN_OR_RETURN(EnqueueResult result,
                                                   EnqueueRunLocked(s, run, now, t, fx));
                           fx.Require(Durability::kSync);  // an operator's change (Effects)
                           s.last_run_at = run;
                           s.last_job_id = result.job_id;
                           t.put_schedules.push_back(s);
                           schedules_.Put(std::move(s));
                           return result;
                         });
}

absl::StatusOr<EnqueueResult> Broker::EnqueueRunLocked(const Schedule& s, absl::Time run,
                                                       absl::Time now, Transition& t, Effects& fx) {
  std::vector<EnqueueSpec> specs{s.job};
  specs[0].dedup_key = schedule::DedupKeyOf(s.id, run);
  BROKER_ASSIGN_OR_RETURN(std::vector<EnqueueResult> results,
                          EnqueueLocked(specs, /*name_jobs=*/false, now, t, fx));
  return results[0];
}

void Broker::RunSchedulesLocked(absl::Time now, Transition& t, Effects& fx, int& budget) {
  while (budget > 0) {
    std::optional<std::string> id = schedules_.Due(now);
    if (!id.has_value()) break;
    --budget;
    const ScheduleTable::Entry& e = *schedules_.Find(*id);
    Schedule s = e.schedule;
    const schedule::Due due = schedule::Advance(*e.timing, s.next_run_at, now);
    std::string run_error;
    if (due.run.has_value()) {
      absl::StatusOr<EnqueueResult> result = EnqueueRunLocked(s, *due.run, now, t, fx);
      if (result.ok()) {
        s.last_run_at = *due.run;
        s.last_job_id = result->job_id;
      } else {
        // Not retried: the next run comes at its time. The reason is shown until then.
        run_error = absl::StrCat(
            "the run of ", absl::FormatTime(absl::RFC3339_full, *due.run, absl::UTCTimeZone()),
            " was not enqueued: ", result.status().message());
      }
    }
    s.next_run_at = due.next_run_at;
    fx.Require(Durability::kSync);  // rare, and a run must not be undone by a power cut
    t.put_schedules.push_back(s);
    schedules_.Put(std::move(s)).run_error = std::move(run_error);
  }
}

}  // namespace jobbroker::core
