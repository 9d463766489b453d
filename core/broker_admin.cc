// Broker: an operator's calls on single jobs and queues (cancel, retry, delete, policies,
// pause) and the reads of jobs and queues. Bulk redrive and purge are in broker_bulk.cc.
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/broker_mutation.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker::core {
namespace {

absl::Status NoSuchJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
}

absl::Status NoSuchQueue(const std::string& queue) {
  return absl::NotFoundError(absl::StrCat("queue ", queue, " not found"));
}

}  // namespace

void Broker::RunOnJob(std::string job_id, JobChangeLocked change, Done<absl::StatusOr<Job>> done) {
  if (absl::Status s = ValidateJobId(job_id); !s.ok()) return done(s);
  Run<Job>(std::move(done),
           [this, change, job_id = std::move(job_id)](absl::Time now, Transition& t, Effects& fx)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<Job> {
                 fx.Require(Durability::kSync);  // an operator's change (Effects)
                 Job* job = FindJobLocked(job_id);
                 if (job == nullptr) return NoSuchJob(job_id);
                 return (this->*change)(*job, now, t, fx);
               });
}

void Broker::CancelJob(std::string job_id, Done<absl::StatusOr<Job>> done) {
  RunOnJob(std::move(job_id), &Broker::CancelLocked, std::move(done));
}

absl::StatusOr<Job> Broker::CancelLocked(Job& job, absl::Time now, Transition& t, Effects& fx) {
  if (IsTerminal(job.state))
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.id, " has already ended (", JobStateName(job.state), ")"));
  UnindexLocked(job);
  if (job.state == JobState::kActive) {
    // The worker learns it from its next heartbeat, or at once on its stream.
    job.cancel_requested = true;
    if (Consumer* holder = consumers_.HolderOf(job.seq))
      fx.cancelled.push_back({holder->sink, job.id});
  } else {
    job.state = JobState::kCancelled;
    job.completed_at = now;
    observer_.Cancelled(job);
  }
  IndexLocked(job);
  t.put_jobs.push_back(job);
  return job;
}

void Broker::UpdateQueuePolicy(std::string queue, PolicyOverride policy, bool reset,
                               Done<absl::StatusOr<QueueInfo>> done) {
  if (absl::Status s = ValidateQueueName(queue); !s.ok()) return done(s);
  Run<QueueInfo>(std::move(done), [this, queue = std::move(queue), policy = std::move(policy),
                                   reset](absl::Time now, Transition& t, Effects& fx)
                                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                        return ChangePolicyLocked(queue, policy, reset, now, t, fx);
                                      });
}

absl::StatusOr<QueueInfo> Broker::ChangePolicyLocked(const std::string& queue,
                                                     const PolicyOverride& policy, bool reset,
                                                     absl::Time now, Transition& t, Effects& fx) {
  fx.Require(Durability::kSync);  // an operator's change (Effects)
  QueueState* existing = queues_.Find(queue);
  PolicyOverride runtime = reset || existing == nullptr ? PolicyOverride{} : existing->runtime;
  runtime.MergeFrom(policy);
  BROKER_RETURN_IF_ERROR(ValidatePolicy(queues_.EffectivePolicy(queue, runtime), "policy"));
  QueueState& q = queues_.Get(queue);
  if (runtime.empty()) {
    t.delete_policies.push_back(queue);
  } else {
    t.put_policies.emplace_back(queue, runtime);
  }
  queues_.SetRuntime(q, std::move(runtime));
  // A resumed queue or a larger max_concurrency may lease now.
  ServeConsumersLocked(q, now, t, fx);
  return InfoLocked(q, now);
}

void Broker::SetQueuePaused(std::string queue, bool paused, Done<absl::StatusOr<QueueInfo>> done) {
  if (absl::Status s = ValidateQueueName(queue); !s.ok()) return done(s);
  Run<QueueInfo>(
      std::move(done),
      [this, queue = std::move(queue), paused](absl::Time now, Transition& t, Effects& fx)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<QueueInfo> {
            // Unlike UpdateQueuePolicy: a typo must not create a paused queue nobody uses.
            if (queues_.Find(queue) == nullptr) return NoSuchQueue(queue);
            PolicyOverride change;
            change.paused = paused;
            return ChangePolicyLocked(queue, change, /*reset=*/false, now, t, fx);
          });
}

void Broker::RetryLocked(Job& job, absl::Time now, Transition& t) {
  UnindexLocked(job);
  job.state = JobState::kReady;
  job.run_at = now;
  job.attempt = 0;
  job.fail_reason = FailReason::kNone;
  job.completed_at = absl::InfinitePast();
  // No lease id fences anything until the next lease: a late Ack of an old attempt is refused.
  job.lease_id.clear();
  job.worker_id.clear();
  job.lease_deadline = absl::InfinitePast();
  job.lease_length = absl::ZeroDuration();
  job.timeout_at = absl::InfiniteFuture();
  job.cancel_requested = false;
  // An operator who retries a job means it to run: its expiry and its snoozes no longer hold it.
  job.expire_at = absl::InfiniteFuture();
  job.snoozes = 0;
  IndexLocked(job);
  // A live job holds its dedup key. If the key's TTL passed while the job was dead, the key was
  // freed: take it again, expiring at once, so that it holds exactly while the job runs. A key
  // that another job has taken since stays with that job.
  if (!job.dedup_key.empty() && !dedup_.Contains(job.queue, job.dedup_key)) {
    DedupEntry e{job.queue, job.dedup_key, job.id, now, PayloadHash(job.payload)};
    deadlines_.Note(e.expires_at);
    t.put_dedup.push_back(e);
    dedup_.Put(std::move(e));
  }
  t.put_jobs.push_back(job);
}

void Broker::RetryJob(std::string job_id, Done<absl::StatusOr<Job>> done) {
  RunOnJob(std::move(job_id), &Broker::RetryOneLocked, std::move(done));
}

absl::StatusOr<Job> Broker::RetryOneLocked(Job& job, absl::Time now, Transition& t, Effects& fx) {
  if (job.state != JobState::kFailed && job.state != JobState::kCancelled)
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " is ",
                                                      JobStateName(job.state),
                                                      ": only FAILED or CANCELLED jobs can be "
                                                      "retried"));
  RetryLocked(job, now, t);
  ServeConsumersLocked(queues_.Get(job.queue), now, t, fx);
  return job;
}

void Broker::DeleteJob(std::string job_id, Done<absl::Status> done) {
  if (absl::Status s = ValidateJobId(job_id); !s.ok()) return done(s);
  Run<bool>([done = std::move(done)](absl::StatusOr<bool> r) mutable { done(r.status()); },
            [this, job_id = std::move(job_id)](absl::Time, Transition& t, Effects& fx)
                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
                  BROKER_RETURN_IF_ERROR(DeleteLocked(job_id, t, fx));
                  return true;
                });
}

absl::Status Broker::DeleteLocked(const std::string& job_id, Transition& t, Effects& fx) {
  fx.Require(Durability::kSync);  // an operator's change (Effects)
  Job* job = FindJobLocked(job_id);
  if (job == nullptr) {
    // A record recovery could not read: deleting it is how an operator clears it.
    if (jobs_.ForgetCorrupt(job_id)) {
      t.delete_jobs.push_back(job_id);
      return absl::OkStatus();
    }
    return NoSuchJob(job_id);
  }
  // Its worker holds a lease and would ack a job that no longer exists.
  if (job->state == JobState::kActive)
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is JOB_STATE_ACTIVE: cancel it first, then delete it once it has ended"));
  RemoveJobLocked(*job, t);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Reads
void ReadFence::Await(absl::AnyInvocable<void(absl::Status)> done) const {
  if (pending_.empty()) return done(absl::OkStatus());
  // One answer for every partition the read saw: OK once all passed, else the first refusal.
  struct Countdown {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu);
    absl::Status refusal ABSL_GUARDED_BY(mu);
    absl::AnyInvocable<void(absl::Status)> done;
  };
  auto countdown = std::make_shared<Countdown>();
  {
    absl::MutexLock lock(&countdown->mu);
    countdown->left = pending_.size();
  }
  countdown->done = std::move(done);
  for (const Pending& p : pending_) {
    // kGroup: in the store's log, what a worker's push waits for. At RF > 1, ReplicatedPartition
    // answers even an unsynced write only once it is committed.
    p.pipeline->WhenDurable(
        p.seq,
        [countdown](absl::Status written) {
          absl::Status refusal;
          {
            absl::MutexLock lock(&countdown->mu);
            if (IsNotStorageFailure(written) && countdown->refusal.ok()) {
              countdown->refusal = absl::UnavailableError(absl::StrCat(
                  "the read saw a change that was not committed, so it is not answered (read "
                  "again, at the partition's leader): ",
                  written.message()));
            }
            if (--countdown->left > 0) return;
            refusal = countdown->refusal;
          }
          // The last one: no other callback touches the countdown any more.
          countdown->done(std::move(refusal));
        },
        Durability::kGroup);
  }
}

void Broker::FenceLocked(ReadFence* fence) {
  if (fence == nullptr) return;
  const uint64_t seq = pipeline_.last_appended();
  // What was appended before the last rebuild is stored or, dropped, no longer in memory.
  if (seq <= rebuilt_through_) return;
  // Partitions of one process share a pipeline (BrokerOptions::pipeline): its last sequence
  // number covers every earlier one, so a read over them waits on one entry, not one each.
  for (ReadFence::Pending& p : fence->pending_) {
    if (p.pipeline == &pipeline_) {
      p.seq = std::max(p.seq, seq);
      return;
    }
  }
  fence->pending_.push_back({&pipeline_, seq});
}

absl::StatusOr<Job> Broker::GetJob(const std::string& job_id, ReadFence* fence) {
  BROKER_RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock lock(&mu_);
  FenceLocked(fence);
  Job* job = FindJobLocked(job_id);
  if (job == nullptr) {
    if (const absl::Status* why = jobs_.CorruptReason(job_id))
      return absl::DataLossError(absl::StrCat(
          "job ", job_id, " is corrupt in the store or could not be read, and was set aside (",
          why->message(), "); DeleteJob removes its record"));
    return NoSuchJob(job_id);
  }
  Job copy = *job;
  if (auto it = needed_by_.find(job_id); it != needed_by_.end()) {
    copy.dependents = it->second;
    std::sort(copy.dependents.begin(), copy.dependents.end());
  }
  return copy;
}

absl::StatusOr<uint64_t> Broker::WatchJob(const std::string& job_id,
                                          std::shared_ptr<JobWatcher> watcher) {
  BROKER_RETURN_IF_ERROR(ValidateJobId(job_id));
  std::optional<Job> ended;
  uint64_t handle = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("the broker is shutting down");
    // Checked under mu_, as EndWatches detaches under it: a watch added after the halt is
    // refused here, one added before is ended there.
    if (absl::Status halted = pipeline_.status(); IsNotStorageFailure(halted)) return halted;
    Job* job = FindJobLocked(job_id);
    if (job == nullptr) return NoSuchJob(job_id);
    if (IsTerminal(job->state)) {
      ended = *job;
    } else {
      // Registered and shown under one lock: a change committed before this is in the first
      // message, one committed after it reaches the watcher once durable.
      handle = watchers_.Add(*job, watcher);
      watcher->Changed(*job);
    }
  }
  if (ended.has_value()) {
    watcher->Changed(*std::move(ended));
    watcher->End(absl::OkStatus());
  }
  return handle;
}

void Broker::Unwatch(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  watchers_.Remove(handle);
}

void Broker::EndWatches(const absl::Status& why) {
  std::vector<WatchNotice> watches;
  {
    absl::MutexLock lock(&mu_);
    watchers_.DetachAll(why, watches);
  }
  Notify(watches);
}

std::vector<WorkerInfo> Broker::ListWorkers(const std::string& queue) {
  std::vector<WorkerInfo> workers;
  absl::flat_hash_map<std::string, size_t> index;
  absl::flat_hash_set<std::string> of_queue;  // workers that touch `queue`
  auto worker = [&](const std::string& id) -> WorkerInfo& {
    auto [it, added] = index.emplace(id, workers.size());
    if (added) workers.push_back(WorkerInfo{.worker_id = id});
    return workers[it->second];
  };
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  consumers_.ForEach([&](const Consumer& c) {
    WorkerInfo& w = worker(c.spec.worker_id);
    // The newest connection says where the worker is.
    if (w.origin.peer.empty() || c.since >= w.connected_at) w.origin = c.spec.origin;
    if (c.stream) {
      ++w.streams;
      w.max_in_flight += c.max_in_flight;
      w.queues.insert(w.queues.end(), c.queues.begin(), c.queues.end());
      if (std::find(c.queues.begin(), c.queues.end(), queue) != c.queues.end())
        of_queue.insert(w.worker_id);
    } else {
      ++w.lease_waits;
      w.queues.push_back(c.spec.queue);
      if (c.spec.queue == queue) of_queue.insert(w.worker_id);
    }
    w.connected_at = std::min(w.connected_at, c.since);
  });
  for (const auto& [deadline, seq] : deadlines_.leases()) {
    const Job& job = jobs_.Hot(seq);
    if (job.attempts.empty()) continue;
    WorkerInfo& w = worker(job.attempts.back().worker_id);
    w.running.push_back(RunningJobOf(job));
    if (job.queue == queue) of_queue.insert(w.worker_id);
  }
  // Workers that lease with unary calls hold no connection between them: listed for a while.
  recent_workers_.ForEachListed(now, [&](const std::string& id, const RecentWorkers::Seen& seen) {
    WorkerInfo& w = worker(id);
    w.queues.push_back(seen.lease_queue);
    if (seen.lease_queue == queue) of_queue.insert(id);
  });
  for (WorkerInfo& w : workers) {
    if (const RecentWorkers::Seen* seen = recent_workers_.Find(w.worker_id)) {
      w.last_seen = seen->last_seen;
      if (w.origin.peer.empty()) w.origin = seen->origin;
    }
  }
  if (!queue.empty()) {
    std::erase_if(workers, [&](const WorkerInfo& w) { return !of_queue.contains(w.worker_id); });
  }
  MergeWorkers(workers, {});  // sorts
  return workers;
}

absl::StatusOr<std::string> Broker::JobQueue(const std::string& job_id) {
  BROKER_RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock lock(&mu_);
  const Job* job = FindJobLocked(job_id);
  if (job == nullptr) return NoSuchJob(job_id);
  return job->queue;
}

absl::StatusOr<ListJobsResult> Broker::ListJobs(const ListJobsSpec& spec, ReadFence* fence) {
  BROKER_RETURN_IF_ERROR(ValidateListJobsSpec(spec));
  BROKER_ASSIGN_OR_RETURN(const uint64_t after, ParsePageToken(spec.page_token));
  const int page_size = spec.page_size == 0 ? 100 : spec.page_size;

  absl::MutexLock lock(&mu_);
  FenceLocked(fence);
  QueueState* q = queues_.Find(spec.queue);
  if (q == nullptr) return NoSuchQueue(spec.queue);
  ListJobsResult out;
  if (!spec.dedup_key.empty()) {
    // One job at most holds a key: no scan, no page.
    const DedupEntry* held = dedup_.Find(spec.queue, spec.dedup_key);
    if (held == nullptr) return out;
    const Job* job = FindJobLocked(held->job_id);
    if (job != nullptr && (!spec.state.has_value() || job->state == *spec.state))
      out.jobs.push_back(*job);
    return out;
  }
  // false once the page is full and one more match exists.
  auto visit = [&](uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The state decides first, so a filtered scan reads back only the cold jobs it lists.
    if (spec.state.has_value() && StateOfLocked(*q, seq) != *spec.state) return true;
    if (static_cast<int>(out.jobs.size()) == page_size) {
      out.next_page_token = absl::StrCat(out.jobs.back().seq);
      return false;
    }
    if (const Job* job = JobBySeqLocked(seq)) out.jobs.push_back(*job);
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
  info.partition = options_.partition;
  info.policy = q.policy;
  for (JobState s :
       {JobState::kReady, JobState::kScheduled, JobState::kActive, JobState::kCompleted,
        JobState::kFailed, JobState::kCancelled, JobState::kWaiting}) {
    info.counts[s] = q.count(s);
  }
  info.waiting_leases = static_cast<int64_t>(q.consumers.size());
  info.active = q.count(JobState::kActive);
  info.dead = q.count(JobState::kFailed);
  info.enqueued_total = q.enqueued_total;
  info.completed_total = q.completed_total;
  if (!q.ready_by_seq.empty()) {
    const uint64_t oldest = *q.ready_by_seq.begin();
    // A cold job's id says when it was created (to the ms): a gauge need not read it back.
    if (std::optional<PackedJobId> cold = jobs_.ColdId(oldest)) {
      info.oldest_ready_age = now - JobIdTime(*cold);
    } else {
      info.oldest_ready_age = now - jobs_.Hot(oldest).created_at;
    }
  }
  return info;
}

absl::StatusOr<QueueInfo> Broker::GetQueue(const std::string& queue, ReadFence* fence) {
  BROKER_RETURN_IF_ERROR(ValidateQueueName(queue));
  absl::MutexLock lock(&mu_);
  FenceLocked(fence);
  QueueState* q = queues_.Find(queue);
  if (q == nullptr) return NoSuchQueue(queue);
  return InfoLocked(*q, clock_.Now());
}

std::vector<QueueInfo> Broker::ListQueues(ReadFence* fence) {
  absl::MutexLock lock(&mu_);
  FenceLocked(fence);
  std::vector<QueueInfo> out;
  const absl::Time now = clock_.Now();
  for (auto& [name, q] : queues_) out.push_back(InfoLocked(*q, now));
  return out;
}

}  // namespace jobbroker::core
