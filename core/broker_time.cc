// Broker: the work that comes due with time. Leases running out and attempts reaching their
// run-time limit, waiting jobs expiring, delayed and backoff jobs coming due, long polls timing
// out, retention and dedup keys expiring, schedules' runs (broker_schedules.cc); and Tick, which
// does it all and says when it next needs to run.
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/broker.h"

namespace jobbroker::core {

void Broker::ProcessDueLocked(absl::Time now, Transition& t, Effects& fx) {
  int budget = options_.tick_batch;
  absl::flat_hash_set<QueueState*> touched;
  while (budget > 0) {
    std::optional<uint64_t> seq = deadlines_.DueLease(now);
    if (!seq.has_value()) break;
    --budget;
    Job& job = jobs_.Hot(*seq);
    ExpireLeaseLocked(job, now, t, fx);
    touched.insert(&queues_.Get(job.queue));
  }
  // Before promotions: a job whose expire_at passed must not become leasable.
  while (budget > 0) {
    std::optional<uint64_t> seq = deadlines_.DueExpiry(now);
    if (!seq.has_value()) break;
    --budget;
    Job* job = JobBySeqLocked(*seq);
    if (job == nullptr) continue;  // unreadable: dropped from the deadlines
    ExpireWaitingLocked(*job, now, t, fx);
  }
  // A job coming due is not persisted: recovery promotes a SCHEDULED job whose run_at passed.
  while (budget > 0) {
    std::optional<uint64_t> seq = deadlines_.DueScheduled(now);
    if (!seq.has_value()) break;
    --budget;
    Job* job = JobBySeqLocked(*seq);
    if (job == nullptr) continue;  // unreadable: dropped from the deadlines
    UnindexLocked(*job);
    job->state = JobState::kReady;
    IndexLocked(*job);
    touched.insert(&queues_.Get(job->queue));
  }
  for (QueueState* q : touched) ServeConsumersLocked(*q, now, t, fx);
}

void Broker::ExpireLeaseLocked(Job& job, absl::Time now, Transition& t, Effects& fx) {
  UnindexLocked(job);
  // The run-time limit wins when it comes first: heartbeats extend a lease, never the limit.
  const bool timed_out = job.timeout_at <= job.lease_deadline;
  const AttemptOutcome outcome =
      timed_out ? AttemptOutcome::kTimedOut : AttemptOutcome::kLeaseExpired;
  const absl::Time ended = job.active_deadline();
  std::string error =
      timed_out
          ? absl::StrCat("timed out: attempt ", job.attempt, " on worker ", job.worker_id,
                         " was still running at its run-time limit ",
                         absl::FormatTime(absl::RFC3339_full, job.timeout_at, absl::UTCTimeZone()))
          : absl::StrCat("lease expired: worker ", job.worker_id,
                         " did not ack, fail or heartbeat in time");
  // The attempt ended at its deadline, even if the broker only notices later (after a restart).
  FinishAttemptRecordLocked(job, ended, outcome, error);
  EndAttemptFailedLocked(job, now, outcome, std::move(error), std::nullopt);
  IndexLocked(job);
  t.put_jobs.push_back(job);
  fx.Touch(queues_.Get(job.queue).policy);
  // After the state change, so the freed slot can take this very job if it is due again.
  EndHoldLocked(job, /*lost=*/true, now, t, fx);
}

void Broker::ExpireWaitingLocked(Job& job, absl::Time now, Transition& t, Effects& fx) {
  UnindexLocked(job);
  job.state = JobState::kFailed;
  job.fail_reason = FailReason::kExpired;
  job.last_error =
      absl::StrCat("expired: not started before its expire_at ",
                   absl::FormatTime(absl::RFC3339_full, job.expire_at, absl::UTCTimeZone()));
  job.completed_at = now;
  observer_.Dead(job);
  IndexLocked(job);
  t.put_jobs.push_back(job);
  fx.Touch(queues_.Get(job.queue).policy);
}

void Broker::TimeOutWaitersLocked(absl::Time now, int& budget, Effects& fx) {
  while (budget > 0) {
    std::optional<uint64_t> id = deadlines_.DueWaiter(now);
    if (!id.has_value()) break;
    --budget;
    Consumer& waiter = *consumers_.Find(*id);
    DelistLocked(waiter);
    fx.deliveries.push_back({std::move(waiter.done), {}});
    consumers_.Erase(*id);
  }
}

void Broker::RetentionLocked(absl::Time now, Transition& t, Effects& fx, int& budget) {
  auto sweep = [&](QueueState& q, absl::btree_set<TimeKey>& ended,
                   const Retention& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!ended.empty() && budget > 0) {
      bool over_count = r.max_count > 0 && static_cast<int64_t>(ended.size()) > r.max_count;
      bool too_old = r.max_age > absl::ZeroDuration() && ended.begin()->first + r.max_age <= now;
      if (!over_count && !too_old) break;
      --budget;
      Job& oldest = jobs_.Hot(ended.begin()->second);
      if (&ended == &q.completed && NeededByWaitingLocked(oldest.id)) {
        // A fan-in still gathering: it gets this result when it is released, so the job stays
        // (out of the count) until then (ReleaseHeldDependenciesLocked).
        q.held_for_dependents.insert(*ended.begin());
        ended.erase(ended.begin());
        continue;
      }
      fx.Touch(q.policy);
      RemoveJobLocked(oldest, t);
    }
  };
  for (auto& [name, q] : queues_) {
    sweep(*q, q->completed, q->policy.completed_retention);
    sweep(*q, q->dead, q->policy.failed_retention);
  }
}

void Broker::ExpireDedupLocked(absl::Time now, Transition& t, int& budget) {
  auto job_running = [this](const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Job* job = FindJobLocked(job_id);
    return job != nullptr && !IsTerminal(job->state);
  };
  for (DedupTable::Key& key : dedup_.Expire(now, budget, job_running))
    t.delete_dedup.push_back(std::move(key));
}

absl::Time Broker::NextDeadlineLocked() {
  absl::Time next = std::min({deadlines_.Earliest(), dedup_.NextExpiry(), schedules_.NextDue()});
  for (auto& [name, q] : queues_) {
    next = std::min(next, q->NextRetentionAge());
    if (q->OverRetentionCount()) next = absl::InfinitePast();
    next = std::min(next, q->RefillTime());
  }
  return next;
}

absl::Time Broker::Tick() {
  MaybeResume();
  Effects fx;
  uint64_t commit;
  absl::Time next;
  {
    absl::MutexLock lock(&mu_);
    Transition t;
    // While the store refuses writes, nothing that needs one happens (expiries, leases,
    // removals): memory will be rebuilt from the store before writes resume anyway. Only long
    // polls time out meanwhile. So this is the one change that does not start with
    // StartChangeLocked when the store fails.
    const bool writable = WritableLocked();
    const absl::Time now = writable ? StartChangeLocked(t, fx) : clock_.Now();
    if (writable) {
      // Rate-limited queues whose bucket refilled serve whoever waits for them.
      for (auto& [name, q] : queues_) {
        if (q->policy.rate_limit.per_second > 0 && !q->consumers.empty())
          ServeConsumersLocked(*q, now, t, fx);
      }
    }
    int budget = options_.tick_batch;
    TimeOutWaitersLocked(now, budget, fx);
    if (!shutting_down_ && writable) {
      RunSchedulesLocked(now, t, fx, budget);
      RetentionLocked(now, t, fx, budget);
      ExpireDedupLocked(now, t, budget);
    }
    commit = CommitChangeLocked(std::move(t), fx);
    if (writable) {
      next = NextDeadlineLocked();
      bool more = deadlines_.DueLease(now).has_value() ||
                  deadlines_.DueScheduled(now).has_value() ||
                  deadlines_.DueExpiry(now).has_value() || schedules_.Due(now).has_value();
      if (budget <= 0 || more) next = now;
    } else {
      next = deadlines_.Earliest(/*jobs=*/false);
      if (!shutting_down_)
        next = std::min(next, resume_at_ == absl::InfinitePast() ? now : resume_at_);
    }
    deadlines_.Planned(next);
    fx.wake = false;  // this tick has just planned the next one itself
  }
  Finish(commit, std::move(fx), nullptr);
  return next;
}

}  // namespace jobbroker::core
