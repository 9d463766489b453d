// Broker: jobs that wait for other jobs (EnqueueSpec::depends_on, depends_on_index). A job with
// unfinished dependencies is WAITING; when the last one completes it becomes READY (or SCHEDULED)
// with their results, and when one ends FAILED or CANCELLED (or is removed) it ends FAILED with
// kDependencyFailed, and so on down the graph. Both happen in the transition that ended the
// dependency (ResolveDependentsLocked, called by CommitChangeLocked), so a crash keeps both or
// neither. A job can depend only on jobs that exist before it (or earlier in its batch), so the
// graph has no cycle by construction.
//
// A dependency of another partition is awaited the same way, but its end is not seen here: the
// node's DependencyRelay watches it where it lives and delivers its outcome (SettleRemoteJobs),
// which then releases or fails the dependents in a transition of this partition. The WAITING
// job's stored depends_on is what makes that durable (a restart or a new leader awaits the same
// ids again), and a result delivered before the last dependency ends is stored with the job, so
// nothing is asked twice of a partition that may since have removed the job.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/broker.h"
#include "core/broker_mutation.h"
#include "core/ids.h"

namespace jobbroker::core {

std::vector<std::string> Broker::ResolveDependenciesLocked(
    const EnqueueSpec& spec, const std::vector<EnqueueResult>& earlier) {
  std::vector<std::string> ids = spec.depends_on;
  for (int index : spec.depends_on_index) ids.push_back(earlier[index].job_id);
  // Named twice is waited for once.
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

bool Broker::IsRemoteJobLocked(const std::string& id) const {
  if (options_.partition_count <= 1) return false;
  std::optional<uint32_t> partition = PartitionOfJobId(id, options_.partition_count);
  return partition.has_value() && *partition != options_.partition;
}

void Broker::NoteNeededByLocked(const Job& job) {
  for (const std::string& id : job.depends_on)
    if (!IsRemoteJobLocked(id)) needed_by_[id].push_back(job.id);
}

void Broker::ForgetNeededByLocked(const Job& job) {
  needed_by_.erase(job.id);
  for (const std::string& id : job.depends_on) {
    auto it = needed_by_.find(id);
    if (it == needed_by_.end()) continue;
    std::erase(it->second, job.id);
    if (it->second.empty()) needed_by_.erase(it);
  }
}

void Broker::KeepResultForDependentsLocked(const Job& ended, Transition& t) {
  auto it = needed_by_.find(ended.id);
  if (it == needed_by_.end()) return;
  for (const std::string& id : it->second) {
    const Job* job = jobs_.FindHot(id);
    if (job != nullptr && job->state == JobState::kWaiting &&
        job->dependency_results.contains(ended.id))
      t.put_jobs.push_back(*job);
  }
}

bool Broker::NeededByWaitingLocked(const std::string& id) {
  auto it = needed_by_.find(id);
  if (it == needed_by_.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(),
                     [&](const std::string& dependent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       const Job* job = jobs_.FindHot(dependent);
                       return job != nullptr && job->state == JobState::kWaiting;
                     });
}

void Broker::ReleaseHeldDependenciesLocked(const Job& job, absl::Time now) {
  for (const std::string& id : job.depends_on) {
    if (IsRemoteJobLocked(id)) continue;
    const Job* dep = jobs_.FindHot(id);
    if (dep == nullptr || dep->state != JobState::kCompleted) continue;
    QueueState& q = queues_.Get(dep->queue);
    const TimeKey key(dep->completed_at, dep->seq);
    if (!q.held_for_dependents.contains(key) || NeededByWaitingLocked(id)) continue;
    q.held_for_dependents.erase(key);
    q.completed.insert(key);
    deadlines_.Note(now);  // retention may remove it now
  }
}

void Broker::SetDependencyStateLocked(Job& job, absl::Time now) {
  NoteNeededByLocked(job);
  int pending = 0;
  for (const std::string& id : job.depends_on) {
    if (IsRemoteJobLocked(id)) {
      ++pending;  // its outcome arrives through SettleRemoteJobs
      continue;
    }
    const Job* dep = FindJobLocked(id);
    if (dep == nullptr || dep->state == JobState::kCompleted) {
      if (dep != nullptr) job.dependency_results[id] = dep->result;
      continue;
    }
    if (dep->state == JobState::kFailed || dep->state == JobState::kCancelled) {
      job.state = JobState::kFailed;
      job.fail_reason = FailReason::kDependencyFailed;
      job.last_error = absl::StrCat("dependency ", id, " ended ", JobStateName(dep->state));
      job.completed_at = now;
      job.dependency_results.clear();
      observer_.Dead(job);
      return;
    }
    ++pending;
  }
  if (pending == 0) return;
  job.state = JobState::kWaiting;
  job.dependency_results.clear();  // gathered when the last one completes
  waiting_on_[job.id] = pending;
  for (const std::string& id : job.depends_on) {
    if (IsRemoteJobLocked(id)) {
      dependents_[id].push_back(job.id);
      remote_awaited_.insert(id);
      continue;
    }
    const Job* dep = FindJobLocked(id);
    if (dep != nullptr && !IsTerminal(dep->state)) dependents_[id].push_back(job.id);
  }
}

void Broker::ReleaseDependentLocked(Job& job, absl::Time now, Transition& t, Effects& fx) {
  UnindexLocked(job);
  for (const std::string& id : job.depends_on) {
    if (IsRemoteJobLocked(id)) continue;  // its result came with its outcome
    // A dependency that retention has removed since it completed has no result to give.
    if (const Job* dep = FindJobLocked(id); dep != nullptr && dep->state == JobState::kCompleted)
      job.dependency_results[id] = dep->result;
  }
  job.state = job.run_at > now ? JobState::kScheduled : JobState::kReady;
  IndexLocked(job);
  ReleaseHeldDependenciesLocked(job, now);
  t.put_jobs.push_back(job);
  QueueState& q = queues_.Get(job.queue);
  fx.Touch(q.policy);
  ServeConsumersLocked(q, now, t, fx);
}

void Broker::FailDependentLocked(Job& job, const std::string& dep, const std::string& why,
                                 absl::Time now, Transition& t, Effects& fx) {
  UnindexLocked(job);
  waiting_on_.erase(job.id);
  job.state = JobState::kFailed;
  job.fail_reason = FailReason::kDependencyFailed;
  job.last_error = absl::StrCat("dependency ", dep, " ", why);
  job.completed_at = now;
  observer_.Dead(job);
  IndexLocked(job);
  ReleaseHeldDependenciesLocked(job, now);
  t.put_jobs.push_back(job);
  fx.Touch(queues_.Get(job.queue).policy);
}

void Broker::SettleDependentsLocked(const std::string& dep, const std::string& failed_why,
                                    const std::string* remote_result, absl::Time now, Transition& t,
                                    Effects& fx) {
  auto it = dependents_.find(dep);
  if (it == dependents_.end()) return;
  std::vector<std::string> waiting = std::move(it->second);
  dependents_.erase(it);
  remote_awaited_.erase(dep);
  for (const std::string& id : waiting) {
    Job* job = FindJobLocked(id);
    if (job == nullptr || job->state != JobState::kWaiting) continue;
    if (!failed_why.empty()) {
      FailDependentLocked(*job, dep, failed_why, now, t, fx);
      continue;
    }
    // The result is taken now, not when the last dependency completes: by then retention may
    // have removed this one (a fan-in over more jobs than the queue keeps completed).
    if (remote_result != nullptr) {
      job->dependency_results[dep] = *remote_result;
    } else if (const Job* ended = FindJobLocked(dep); ended != nullptr) {
      job->dependency_results[dep] = ended->result;
    }
    auto left = waiting_on_.find(id);
    if (left != waiting_on_.end() && --left->second > 0) {
      // Still waiting: a remote result is stored now, since its partition may remove the job
      // before the last dependency here ends.
      if (remote_result != nullptr) t.put_jobs.push_back(*job);
      continue;
    }
    if (left != waiting_on_.end()) waiting_on_.erase(left);
    ReleaseDependentLocked(*job, now, t, fx);
  }
}

void Broker::ResolveDependentsLocked(Transition& t, Effects& fx) {
  if (dependents_.empty()) return;
  const absl::Time now = change_now_;
  // What ended or went settles its dependents, which are appended to `t` as they end in turn, so
  // the loops walk down the graph.
  for (size_t i = 0; i < t.put_jobs.size() && !dependents_.empty(); ++i) {
    const JobState state = t.put_jobs[i].state;
    if (!IsTerminal(state)) continue;
    const std::string id = t.put_jobs[i].id;  // a copy: settling appends to t.put_jobs
    SettleDependentsLocked(
        id, state == JobState::kCompleted ? "" : absl::StrCat("ended ", JobStateName(state)),
        nullptr, now, t, fx);
  }
  for (size_t i = 0; i < t.delete_jobs.size() && !dependents_.empty(); ++i) {
    const std::string id = t.delete_jobs[i];
    waiting_on_.erase(id);
    SettleDependentsLocked(id, "was removed before it completed", nullptr, now, t, fx);
  }
}

std::vector<std::string> Broker::AwaitedRemoteJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (auto it = remote_awaited_.begin(); it != remote_awaited_.end();) {
    auto dependents = dependents_.find(*it);
    const bool awaited = dependents != dependents_.end() &&
                         std::any_of(dependents->second.begin(), dependents->second.end(),
                                     [&](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                       const Job* job = FindJobLocked(id);
                                       return job != nullptr && job->state == JobState::kWaiting;
                                     });
    if (!awaited) {
      // Its dependents were cancelled or removed meanwhile: nobody needs its outcome.
      if (dependents != dependents_.end()) dependents_.erase(dependents);
      remote_awaited_.erase(it++);
      continue;
    }
    ids.push_back(*it);
    ++it;
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

void Broker::SettleRemoteJobs(std::vector<RemoteOutcome> outcomes, Done<absl::Status> done) {
  Run<bool>([done = std::move(done)](absl::StatusOr<bool> r) mutable { done(r.status()); },
            [this, outcomes = std::move(outcomes)](absl::Time now, Transition& t, Effects& fx)
                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
                  for (const RemoteOutcome& o : outcomes) {
                    if (!remote_awaited_.contains(o.job_id)) continue;  // settled already
                    if (o.gone) {
                      std::optional<uint32_t> where =
                          PartitionOfJobId(o.job_id, options_.partition_count);
                      SettleDependentsLocked(
                          o.job_id,
                          absl::StrCat("is not in partition ", where.value_or(0),
                                       " (removed before it ended, or never enqueued)"),
                          nullptr, now, t, fx);
                    } else if (o.state == JobState::kCompleted) {
                      SettleDependentsLocked(o.job_id, "", &o.result, now, t, fx);
                    } else if (IsTerminal(o.state)) {
                      SettleDependentsLocked(o.job_id,
                                             absl::StrCat("ended ", JobStateName(o.state)), nullptr,
                                             now, t, fx);
                    }
                  }
                  return true;
                });
}

void Broker::RewaitLocked(const std::vector<std::string>& ids, absl::Time now, Transition& t,
                          Effects& fx) {
  for (const std::string& id : ids) {
    Job* job = FindJobLocked(id);
    if (job == nullptr || job->state != JobState::kWaiting) continue;
    int pending = 0;
    std::string failed;
    JobState failed_state = JobState::kFailed;
    for (const std::string& dep_id : job->depends_on) {
      if (IsRemoteJobLocked(dep_id)) {
        // Its outcome was delivered and stored (completed), or is still awaited.
        if (!job->dependency_results.contains(dep_id)) ++pending;
        continue;
      }
      const Job* dep = FindJobLocked(dep_id);
      // Gone: it ended and retention removed it. Had it failed, this job would have failed in
      // the same transition; so it completed.
      if (dep == nullptr || dep->state == JobState::kCompleted) continue;
      if (dep->state == JobState::kFailed || dep->state == JobState::kCancelled) {
        failed = dep_id;
        failed_state = dep->state;
        break;
      }
      ++pending;
    }
    if (!failed.empty()) {
      FailDependentLocked(*job, failed, absl::StrCat("ended ", JobStateName(failed_state)), now, t,
                          fx);
    } else if (pending == 0) {
      ReleaseDependentLocked(*job, now, t, fx);
    } else {
      waiting_on_[id] = pending;
      for (const std::string& dep_id : job->depends_on) {
        if (IsRemoteJobLocked(dep_id)) {
          if (!job->dependency_results.contains(dep_id)) {
            dependents_[dep_id].push_back(id);
            remote_awaited_.insert(dep_id);
          }
          continue;
        }
        const Job* dep = FindJobLocked(dep_id);
        if (dep != nullptr && !IsTerminal(dep->state)) dependents_[dep_id].push_back(id);
      }
    }
  }
}

}  // namespace jobbroker::core
