// Broker: jobs that wait for other jobs (EnqueueSpec::depends_on, depends_on_index). A job with
// unfinished dependencies is WAITING; when the last one completes it becomes READY (or SCHEDULED)
// with their results, and when one ends FAILED or CANCELLED (or is removed) it ends FAILED with
// kDependencyFailed, and so on down the graph. Both happen in the transition that ended the
// dependency (ResolveDependentsLocked, called by CommitChangeLocked), so a crash keeps both or
// neither. A job can depend only on jobs that exist before it (or earlier in its batch), so the
// graph has no cycle by construction.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/broker.h"

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

void Broker::SetDependencyStateLocked(Job& job, absl::Time now) {
  int pending = 0;
  for (const std::string& id : job.depends_on) {
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
    const Job* dep = FindJobLocked(id);
    if (dep != nullptr && !IsTerminal(dep->state)) dependents_[id].push_back(job.id);
  }
}

void Broker::ReleaseDependentLocked(Job& job, absl::Time now, Transition& t, Effects& fx) {
  UnindexLocked(job);
  for (const std::string& id : job.depends_on) {
    // A dependency that retention has removed since it completed has no result to give.
    if (const Job* dep = FindJobLocked(id); dep != nullptr && dep->state == JobState::kCompleted)
      job.dependency_results[id] = dep->result;
  }
  job.state = job.run_at > now ? JobState::kScheduled : JobState::kReady;
  IndexLocked(job);
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
  t.put_jobs.push_back(job);
  fx.Touch(queues_.Get(job.queue).policy);
}

void Broker::ResolveDependentsLocked(Transition& t, Effects& fx) {
  if (dependents_.empty()) return;
  const absl::Time now = change_now_;
  // What ended or went: (id, why a dependent fails; empty = it completed). Grows as dependents
  // end in turn, so the loop walks down the graph.
  auto settle = [&](const std::string& dep, const std::string& failed_why)
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                      auto it = dependents_.find(dep);
                      if (it == dependents_.end()) return;
                      std::vector<std::string> waiting = std::move(it->second);
                      dependents_.erase(it);
                      for (const std::string& id : waiting) {
                        Job* job = FindJobLocked(id);
                        if (job == nullptr || job->state != JobState::kWaiting) continue;
                        if (!failed_why.empty()) {
                          FailDependentLocked(*job, dep, failed_why, now, t, fx);
                          continue;
                        }
                        auto left = waiting_on_.find(id);
                        if (left != waiting_on_.end() && --left->second > 0) continue;
                        if (left != waiting_on_.end()) waiting_on_.erase(left);
                        ReleaseDependentLocked(*job, now, t, fx);
                      }
                    };
  for (size_t i = 0; i < t.put_jobs.size() && !dependents_.empty(); ++i) {
    const JobState state = t.put_jobs[i].state;
    if (!IsTerminal(state)) continue;
    const std::string id = t.put_jobs[i].id;  // a copy: settle appends to t.put_jobs
    settle(id, state == JobState::kCompleted ? "" : absl::StrCat("ended ", JobStateName(state)));
  }
  for (size_t i = 0; i < t.delete_jobs.size() && !dependents_.empty(); ++i) {
    const std::string id = t.delete_jobs[i];
    waiting_on_.erase(id);
    settle(id, "was removed before it completed");
  }
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
        const Job* dep = FindJobLocked(dep_id);
        if (dep != nullptr && !IsTerminal(dep->state)) dependents_[dep_id].push_back(id);
      }
    }
  }
}

}  // namespace jobbroker::core
