// Broker: operator calls (cancel, retry, delete, policies, pause, purge, reads of jobs and
// queues) and shutdown.
#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/broker_internal.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker {

// Bulk work cut into transitions: `step` does one batch under the mutex and says whether all is
// done; `done` gets the outcome once the last batch is durable, or the first error, with
// `lost` = true if that error is the failed write of the latest batch (whose changes then never
// reach the disk).
struct Broker::Batches {
  absl::AnyInvocable<absl::StatusOr<bool>(absl::Time now, Transition& t, Effects& fx)> step;
  absl::AnyInvocable<void(absl::Status status, bool lost)> done;
};

namespace {

absl::Status NoSuchQueue(const std::string& queue) {
  return absl::NotFoundError(absl::StrCat("queue ", queue, " not found"));
}

// An error that ended bulk work midway, with how far it got (the batches before it stay done).
absl::Status Midway(const absl::Status& s, absl::string_view what, int64_t n) {
  if (s.ok() || n == 0) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), " (", n, " jobs were ", what,
                                             " before it; the rest were not)"));
}

}  // namespace

void Broker::CancelJob(std::string job_id, Done<absl::StatusOr<Job>> done) {
  if (absl::Status s = ValidateJobId(job_id); !s.ok()) return done(s);
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
                   observer_.Cancelled(*job);
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
                       return ChangePolicyLocked(queue, policy, reset, now, t, fx);
                     });
}

absl::StatusOr<QueueInfo> Broker::ChangePolicyLocked(const std::string& queue,
                                                     const PolicyOverride& policy, bool reset,
                                                     absl::Time now, Transition& t, Effects& fx) {
  QueueState* existing = FindQueue(queue);
  PolicyOverride runtime = reset || existing == nullptr ? PolicyOverride{} : existing->runtime;
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
}

void Broker::SetQueuePaused(std::string queue, bool paused, Done<absl::StatusOr<QueueInfo>> done) {
  if (absl::Status s = ValidateQueueName(queue); !s.ok()) return done(s);
  Run<QueueInfo>(
      std::move(done),
      [this, queue = std::move(queue), paused](absl::Time now, Transition& t, Effects& fx)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<QueueInfo> {
            // Unlike UpdateQueuePolicy: a typo must not create a paused queue nobody uses.
            if (FindQueue(queue) == nullptr) return NoSuchQueue(queue);
            PolicyOverride change;
            change.paused = paused;
            return ChangePolicyLocked(queue, change, /*reset=*/false, now, t, fx);
          });
}

void Broker::RetryLocked(Job& job, absl::Time now, Transition& t) {
  Unindex(job);
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
  job.cancel_requested = false;
  Index(job);
  // A live job holds its dedup key. If the key's TTL passed while the job was dead, the key was
  // freed: take it again, expiring at once, so that it holds exactly while the job runs. A key
  // that another job has taken since stays with that job.
  if (!job.dedup_key.empty()) {
    auto key = std::make_pair(job.queue, job.dedup_key);
    if (!dedup_.contains(key)) {
      DedupEntry e{job.queue, job.dedup_key, job.id, now, PayloadHash(job.payload)};
      dedup_expiry_.emplace(e.expires_at, job.queue, job.dedup_key);
      MaybeWake(e.expires_at);
      t.put_dedup.push_back(e);
      dedup_.emplace(std::move(key), std::move(e));
    }
  }
  t.put_jobs.push_back(job);
}

void Broker::RetryJob(std::string job_id, Done<absl::StatusOr<Job>> done) {
  if (absl::Status s = ValidateJobId(job_id); !s.ok()) return done(s);
  Run<Job>(std::move(done),
           [this, job_id = std::move(job_id)](absl::Time now, Transition& t, Effects& fx)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<Job> {
                 Job* job = FindJob(job_id);
                 if (job == nullptr)
                   return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
                 if (job->state != JobState::kFailed && job->state != JobState::kCancelled)
                   return absl::FailedPreconditionError(
                       absl::StrCat("job ", job_id, " is ", JobStateName(job->state),
                                    ": only FAILED or CANCELLED jobs can be retried"));
                 RetryLocked(*job, now, t);
                 ServeConsumers(Queue(job->queue), now, t, fx);
                 return *job;
               });
}

void Broker::RetryJobs(RetryJobsSpec spec, Done<absl::StatusOr<RetryJobsResult>> done) {
  if (absl::Status s = ValidateQueueName(spec.queue); !s.ok()) return done(s);
  if (spec.state != JobState::kFailed && spec.state != JobState::kCancelled)
    return done(absl::InvalidArgumentError(absl::StrCat(
        "state must be JOB_STATE_FAILED or JOB_STATE_CANCELLED, not ", JobStateName(spec.state))));
  if (spec.limit < 0 || spec.limit > kMaxRetryLimit)
    return done(absl::InvalidArgumentError(absl::StrCat(
        "limit must be between 0 and ", kMaxRetryLimit, " (0 means ", kDefaultRetryLimit, ")")));
  if (spec.limit == 0) spec.limit = kDefaultRetryLimit;

  if (spec.dry_run) {
    // Every job now in `state` has ended before now, so the real run would take them all, up
    // to the limit. A read: nothing to make durable.
    absl::StatusOr<RetryJobsResult> result;
    {
      absl::MutexLock lock(&mu_);
      QueueState* q = FindQueue(spec.queue);
      if (q == nullptr) {
        result = NoSuchQueue(spec.queue);
      } else {
        result = RetryJobsResult{std::min(q->count(spec.state), spec.limit), 0};
      }
    }
    return done(std::move(result));
  }

  struct Redrive {
    RetryJobsSpec spec;
    RetryJobsResult result;
    bool started = false;
    absl::Time start;
    // Dead jobs in (completed_at, seq) order: the last one looked at. Only jobs that ended by
    // `start` are taken, so the walk ends even while jobs keep failing.
    std::pair<absl::Time, uint64_t> cursor{absl::InfinitePast(), 0};
    // A job retried here that fails again within the same clock tick sorts after the cursor
    // once more; this keeps it from being retried twice by one call.
    absl::flat_hash_set<uint64_t> retried;
    int64_t in_batch = 0;  // retried by the latest batch
  };
  auto r = std::make_shared<Redrive>();
  r->spec = std::move(spec);
  auto batches = std::make_shared<Batches>();
  batches->step = [this, r](absl::Time now, Transition& t, Effects& fx)
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
    QueueState* q = FindQueue(r->spec.queue);
    // Queues are never removed, so only the first batch can miss it (and has changed nothing).
    if (q == nullptr) return NoSuchQueue(r->spec.queue);
    if (!r->started) {
      r->started = true;
      r->start = now;
    }
    int changes = kRetryBatch;
    int visits = kBulkVisitsPerBatch;
    r->in_batch = 0;
    bool finished = false;
    bool any = false;
    auto it = q->dead.upper_bound(r->cursor);
    while (changes > 0 && visits-- > 0) {
      if (r->result.matched >= r->spec.limit || it == q->dead.end() || it->first > r->start) {
        finished = true;
        break;
      }
      r->cursor = *it;
      Job& job = HotJob(it->second);
      if (job.state != r->spec.state || r->retried.contains(job.seq)) {
        ++it;
        continue;
      }
      RetryLocked(job, now, t);  // leaves q->dead: find the next one afresh
      r->retried.insert(job.seq);
      ++r->result.matched;
      ++r->result.retried;
      ++r->in_batch;
      --changes;
      any = true;
      it = q->dead.upper_bound(r->cursor);
    }
    if (!finished && r->result.matched >= r->spec.limit) finished = true;
    if (any) ServeConsumers(*q, now, t, fx);
    return finished;
  };
  batches->done = [r, done = std::move(done)](absl::Status s, bool lost) mutable {
    if (!s.ok()) return done(Midway(s, "retried", r->result.retried - (lost ? r->in_batch : 0)));
    done(r->result);
  };
  RunBatches(std::move(batches));
}

void Broker::DeleteJob(std::string job_id, Done<absl::Status> done) {
  if (absl::Status s = ValidateJobId(job_id); !s.ok()) return done(s);
  Run<bool>([done = std::move(done)](absl::StatusOr<bool> r) mutable { done(r.status()); },
            [this, job_id = std::move(job_id)](absl::Time, Transition& t, Effects&)
                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
                  Job* job = FindJob(job_id);
                  if (job == nullptr) {
                    // A record recovery could not read: deleting it is how an operator clears
                    // it.
                    if (auto c = corrupt_jobs_.find(job_id); c != corrupt_jobs_.end()) {
                      t.delete_jobs.push_back(job_id);
                      corrupt_jobs_.erase(c);
                      --corrupt_records_;
                      return true;
                    }
                    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
                  }
                  // Its worker holds a lease and would ack a job that no longer exists.
                  if (job->state == JobState::kActive)
                    return absl::FailedPreconditionError(
                        absl::StrCat("job ", job_id,
                                     " is JOB_STATE_ACTIVE: cancel it first, then delete it "
                                     "once it has ended"));
                  RemoveJob(*job, t);
                  return true;
                });
}

void Broker::PurgeQueue(std::string queue, std::vector<JobState> states,
                        Done<absl::StatusOr<int64_t>> done) {
  if (absl::Status s = ValidateQueueName(queue); !s.ok()) return done(s);
  if (states.empty()) states = {JobState::kCompleted, JobState::kFailed, JobState::kCancelled};
  std::array<bool, 7> purge{};
  for (JobState s : states) {
    if (s == JobState::kActive)
      return done(absl::InvalidArgumentError(
          "states must not include JOB_STATE_ACTIVE: workers hold those jobs; cancel them first"));
    purge[static_cast<int>(s)] = true;
  }

  struct Purge {
    std::string queue;
    std::array<bool, 7> states{};
    bool started = false;
    // Jobs are walked in enqueue order up to the first one enqueued after the call started, so
    // the purge ends even while producers keep enqueueing.
    uint64_t end_seq = 0;
    uint64_t cursor = 0;  // the last seq looked at
    int64_t purged = 0;
    int64_t in_batch = 0;  // purged by the latest batch
  };
  auto p = std::make_shared<Purge>();
  p->queue = std::move(queue);
  p->states = purge;
  auto batches = std::make_shared<Batches>();
  batches->step = [this, p](absl::Time, Transition& t, Effects&)
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
    QueueState* q = FindQueue(p->queue);
    if (q == nullptr) return NoSuchQueue(p->queue);
    if (!p->started) {
      p->started = true;
      p->end_seq = next_seq_;
    }
    int changes = kPurgeBatch;
    int visits = kBulkVisitsPerBatch;
    p->in_batch = 0;
    auto it = q->all.upper_bound(p->cursor);
    while (changes > 0 && visits-- > 0) {
      if (it == q->all.end() || *it >= p->end_seq) return true;
      p->cursor = *it;
      // The state decides first: a cold job is read back only to be removed.
      Job* job = p->states[static_cast<int>(StateOf(*q, *it))] ? JobBySeq(*it) : nullptr;
      if (job == nullptr) {
        ++it;
        continue;
      }
      RemoveJob(*job, t);  // leaves q->all: find the next one afresh
      ++p->purged;
      ++p->in_batch;
      --changes;
      it = q->all.upper_bound(p->cursor);
    }
    return it == q->all.end() || *it >= p->end_seq;
  };
  batches->done = [p, done = std::move(done)](absl::Status s, bool lost) mutable {
    if (!s.ok()) return done(Midway(s, "purged", p->purged - (lost ? p->in_batch : 0)));
    done(p->purged);
  };
  RunBatches(std::move(batches));
}

void Broker::RunBatches(std::shared_ptr<Batches> batches) {
  while (true) {
    Effects fx;
    absl::StatusOr<bool> finished;
    uint64_t seq = 0;
    bool ran = false;
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status refused = RefusalLocked(); !refused.ok()) {
        finished = refused;
      } else {
        ran = true;
        absl::Time now = clock_.Now();
        Transition t;
        ProcessDue(now, t, fx);
        finished = batches->step(now, t, fx);
        seq = CommitLocked(std::move(t));
      }
      if (next_wake_ == absl::InfinitePast()) fx.wake = true;
    }
    // The next batch starts once this one is durable. When that is known at once (inline
    // commits, or a batch that wrote nothing) the callback runs inside Finish: then this loop
    // goes on instead of recursing. Otherwise the write's callback continues from the writer's
    // thread. Whichever of the two comes second carries on.
    auto turn = std::make_shared<std::atomic<int>>(0);  // 1: the loop let go; 2: callback ran
    Finish(
        seq, std::move(fx),
        [this, batches, turn, ran, finished = std::move(finished)](absl::Status written) mutable {
          // Refused (shutting down, or writes stopped after a failure): no batch was made.
          if (!ran) return batches->done(finished.status(), /*lost=*/false);
          if (!written.ok()) return batches->done(NotDurable(written), /*lost=*/true);
          if (!finished.ok()) return batches->done(finished.status(), /*lost=*/false);
          if (*finished) return batches->done(absl::OkStatus(), /*lost=*/false);
          if (turn->exchange(2) == 1) RunBatches(std::move(batches));
        });
    if (turn->exchange(1) != 2) return;
  }
}

absl::StatusOr<Job> Broker::GetJob(const std::string& job_id) {
  BROKER_RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) {
    if (auto c = corrupt_jobs_.find(job_id); c != corrupt_jobs_.end())
      return absl::DataLossError(absl::StrCat(
          "job ", job_id, " is corrupt in the store or could not be read, and was set aside (",
          c->second.message(), "); DeleteJob removes its record"));
    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  }
  return *job;
}

absl::StatusOr<std::string> Broker::JobQueue(const std::string& job_id) {
  BROKER_RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock lock(&mu_);
  const Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return job->queue;
}

absl::StatusOr<ListJobsResult> Broker::ListJobs(const ListJobsSpec& spec) {
  BROKER_RETURN_IF_ERROR(ValidateQueueName(spec.queue));
  BROKER_RETURN_IF_ERROR(ValidateDedupKey(spec.dedup_key));
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
  if (!spec.dedup_key.empty()) {
    // One job at most holds a key: no scan, no page.
    auto held = dedup_.find(std::make_pair(spec.queue, spec.dedup_key));
    if (held == dedup_.end()) return out;
    const Job* job = FindJob(held->second.job_id);
    if (job != nullptr && (!spec.state.has_value() || job->state == *spec.state))
      out.jobs.push_back(*job);
    return out;
  }
  auto visit = [&](uint64_t seq) {  // false once the page is full and one more match exists
    // The state decides first, so a filtered scan reads back only the cold jobs it lists.
    if (spec.state.has_value() && StateOf(*q, seq) != *spec.state) return true;
    if (static_cast<int>(out.jobs.size()) == page_size) {
      out.next_page_token = absl::StrCat(out.jobs.back().seq);
      return false;
    }
    if (const Job* job = JobBySeq(seq)) out.jobs.push_back(*job);
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
  info.active = q.count(JobState::kActive);
  info.dead = q.count(JobState::kFailed);
  info.enqueued_total = q.enqueued_total;
  info.completed_total = q.completed_total;
  if (!q.ready_by_seq.empty()) {
    const uint64_t oldest = *q.ready_by_seq.begin();
    // A cold job's id says when it was created (to the ms): a gauge need not read it back.
    if (auto c = cold_.find(oldest); c != cold_.end()) {
      info.oldest_ready_age = now - JobIdTime(c->second);
    } else {
      info.oldest_ready_age = now - HotJob(oldest).created_at;
    }
  }
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

absl::StatusOr<Job> Broker::RetryJob(std::string job_id) {
  using R = absl::StatusOr<Job>;
  return Await<R>([&](Done<R> d) { RetryJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<RetryJobsResult> Broker::RetryJobs(RetryJobsSpec spec) {
  using R = absl::StatusOr<RetryJobsResult>;
  return Await<R>([&](Done<R> d) { RetryJobs(std::move(spec), std::move(d)); });
}

absl::Status Broker::DeleteJob(std::string job_id) {
  return Await<absl::Status>(
      [&](Done<absl::Status> d) { DeleteJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<QueueInfo> Broker::SetQueuePaused(std::string queue, bool paused) {
  using R = absl::StatusOr<QueueInfo>;
  return Await<R>([&](Done<R> d) { SetQueuePaused(std::move(queue), paused, std::move(d)); });
}

absl::StatusOr<int64_t> Broker::PurgeQueue(std::string queue, std::vector<JobState> states) {
  using R = absl::StatusOr<int64_t>;
  return Await<R>(
      [&](Done<R> d) { PurgeQueue(std::move(queue), std::move(states), std::move(d)); });
}

void Broker::DetachConsumersLocked(std::vector<LeaseDone>& waiting,
                                   std::vector<std::shared_ptr<StreamSink>>& streams) {
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
}

void Broker::Shutdown() {
  std::vector<LeaseDone> waiting;
  std::vector<std::shared_ptr<StreamSink>> streams;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    DetachConsumersLocked(waiting, streams);
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
