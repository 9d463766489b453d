// Broker: operator calls (cancel, policies, reads of jobs and queues) and shutdown.
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/broker_internal.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker {

void Broker::CancelJob(std::string job_id, Done<absl::StatusOr<Job>> done) {
  if (job_id.empty()) return done(absl::InvalidArgumentError("job_id is required"));
  Run<Job>(std::move(done),
           [this, job_id = std::move(job_id)](absl::Time now, Transition& t, Effects& fx)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<Job> {
                 Job* job = FindJob(job_id);
                 if (job == nullptr)
                   return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
                 if (IsTerminal(job->state))
                   return absl::FailedPreconditionError(absl::StrCat(
                       "job ", job_id, " has already ended (", JobStateName(job->state), ")"));
                 Unindex(*job);
                 if (job->state == JobState::kActive) {
                   // The worker learns it from its next heartbeat, or at once on its stream.
                   job->cancel_requested = true;
                   if (auto held = holders_.find(job->seq); held != holders_.end()) {
                     auto c = consumers_.find(held->second);
                     if (c != consumers_.end()) fx.cancelled.push_back({c->second->sink, job->id});
                   }
                 } else {
                   job->state = JobState::kCancelled;
                   job->completed_at = now;
                 }
                 Index(*job);
                 t.put_jobs.push_back(*job);
                 return *job;
               });
}

void Broker::UpdateQueuePolicy(std::string queue, PolicyOverride policy, bool reset,
                               Done<absl::StatusOr<QueueInfo>> done) {
  if (absl::Status s = ValidateQueueName(queue); !s.ok()) return done(s);
  Run<QueueInfo>(std::move(done),
                 [this, queue = std::move(queue), policy = std::move(policy), reset](
                     absl::Time now, Transition& t, Effects& fx)
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<QueueInfo> {
                       QueueState* existing = FindQueue(queue);
                       PolicyOverride runtime =
                           reset || existing == nullptr ? PolicyOverride{} : existing->runtime;
                       runtime.MergeFrom(policy);
                       QueuePolicy effective = EffectivePolicy(queue, runtime);
                       BROKER_RETURN_IF_ERROR(ValidatePolicy(effective, "policy"));
                       QueueState& q = Queue(queue);
                       q.runtime = runtime;
                       q.policy = effective;
                       PolicyChanged(q);
                       if (runtime.empty()) {
                         t.delete_policies.push_back(queue);
                       } else {
                         t.put_policies.emplace_back(queue, runtime);
                       }
                       // A resumed queue or a larger max_concurrency may lease now.
                       ServeConsumers(q, now, t, fx);
                       return InfoLocked(q, now);
                     });
}

absl::StatusOr<Job> Broker::GetJob(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is required");
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return *job;
}

absl::StatusOr<ListJobsResult> Broker::ListJobs(const ListJobsSpec& spec) {
  BROKER_RETURN_IF_ERROR(ValidateQueueName(spec.queue));
  if (spec.page_size < 0 || spec.page_size > kMaxLeaseBatch)
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be between 0 and ", kMaxLeaseBatch));
  uint64_t after = 0;
  if (!spec.page_token.empty() && !absl::SimpleAtoi(spec.page_token, &after))
    return absl::InvalidArgumentError("page_token is not one this server handed out");
  int page_size = spec.page_size == 0 ? 100 : spec.page_size;

  absl::MutexLock lock(&mu_);
  QueueState* q = FindQueue(spec.queue);
  if (q == nullptr) return absl::NotFoundError(absl::StrCat("queue ", spec.queue, " not found"));
  ListJobsResult out;
  auto visit = [&](uint64_t seq) {  // false once the page is full and one more match exists
    const Job& job = *jobs_by_seq_.at(seq);
    if (spec.state.has_value() && job.state != *spec.state) return true;
    if (static_cast<int>(out.jobs.size()) == page_size) {
      out.next_page_token = absl::StrCat(out.jobs.back().seq);
      return false;
    }
    out.jobs.push_back(job);
    return true;
  };
  // Page tokens are sequence numbers, so a page stays stable while jobs come and go.
  if (spec.newest_first) {
    auto it = spec.page_token.empty() ? q->all.end() : q->all.lower_bound(after);
    while (it != q->all.begin()) {
      if (!visit(*--it)) break;
    }
  } else {
    for (auto it = q->all.upper_bound(after); it != q->all.end(); ++it) {
      if (!visit(*it)) break;
    }
  }
  return out;
}

QueueInfo Broker::InfoLocked(QueueState& q, absl::Time now) {
  QueueInfo info;
  info.name = q.name;
  info.policy = q.policy;
  for (JobState s : {JobState::kReady, JobState::kScheduled, JobState::kActive,
                     JobState::kCompleted, JobState::kFailed, JobState::kCancelled}) {
    info.counts[s] = q.count(s);
  }
  info.waiting_leases = static_cast<int64_t>(q.consumers.size());
  if (!q.ready_by_seq.empty())
    info.oldest_ready_age = now - jobs_by_seq_.at(*q.ready_by_seq.begin())->created_at;
  return info;
}

absl::StatusOr<QueueInfo> Broker::GetQueue(const std::string& queue) {
  BROKER_RETURN_IF_ERROR(ValidateQueueName(queue));
  absl::MutexLock lock(&mu_);
  QueueState* q = FindQueue(queue);
  if (q == nullptr) return absl::NotFoundError(absl::StrCat("queue ", queue, " not found"));
  return InfoLocked(*q, clock_.Now());
}

std::vector<QueueInfo> Broker::ListQueues() {
  absl::MutexLock lock(&mu_);
  std::vector<QueueInfo> out;
  absl::Time now = clock_.Now();
  for (auto& [name, q] : queues_) out.push_back(InfoLocked(*q, now));
  return out;
}

void Broker::Shutdown() {
  std::vector<LeaseDone> waiting;
  std::vector<std::shared_ptr<StreamSink>> streams;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& [id, c] : consumers_) {
      if (c->stream) {
        streams.push_back(std::move(c->sink));
      } else {
        waiting.push_back(std::move(c->done));
      }
    }
    consumers_.clear();
    holders_.clear();
    waiter_deadlines_.clear();
    for (auto& [name, q] : queues_) q->consumers.clear();
  }
  for (LeaseDone& done : waiting) done(std::vector<LeasedJob>{});
  for (auto& sink : streams) sink->End(absl::UnavailableError("the broker is shutting down"));
}

absl::Status Broker::Flush() {
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    seq = CommitLocked(Transition{});
  }
  return pipeline_.WaitDurable(seq);
}

}  // namespace jobbroker
