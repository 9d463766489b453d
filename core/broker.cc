// Broker: construction and recovery, the commit plumbing, indexes, time-driven work, and the
// blocking forms of the operations. The operations themselves live in broker_*.cc.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/broker_internal.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker {

// ---------------------------------------------------------------------------------------------
// Construction and recovery
Broker::Broker(Store& store, const Clock& clock, BrokerOptions options)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      observer_(options_.observer != nullptr ? *options_.observer : NoObserver()),
      pipeline_(store, options_.commit_mode, &clock, options_.observer,
                // The ticker may sleep until some far deadline: wake it to schedule the retries.
                [this](const absl::Status&) {
                  if (options_.wake) options_.wake();
                }) {}

BrokerObserver& Broker::NoObserver() {
  static BrokerObserver* const none = new BrokerObserver();
  return *none;
}

Broker::~Broker() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Broker>> Broker::Open(Store& store, const Clock& clock,
                                                     BrokerOptions options) {
  BROKER_RETURN_IF_ERROR(ValidateStartPolicies(options.default_policy, options.queue_policies));
  std::unique_ptr<Broker> broker(new Broker(store, clock, std::move(options)));
  BROKER_RETURN_IF_ERROR(broker->Recover());
  return broker;
}

absl::Status Broker::Recover() {
  const absl::Time started = clock_.Now();
  Recovered found(options_.max_hot_jobs);
  BROKER_RETURN_IF_ERROR(store_.Recover(found));
  uint64_t seq;
  size_t expired;
  {
    absl::MutexLock lock(&mu_);
    Transition t;
    Effects fx;  // nobody is subscribed yet: nothing to deliver
    expired = LoadLocked(found, clock_.Now(), t, fx);
    seq = CommitLocked(std::move(t));
  }
  // A failed write does not stop the start: the broker serves reads and refuses changes until
  // the store takes writes again (Tick retries it), instead of exiting into a restart loop.
  pipeline_.WaitDurable(seq).IgnoreError();
  observer_.Recovered(found.job_count(), expired, clock_.Now() - started);
  return absl::OkStatus();
}

size_t Broker::LoadLocked(Recovered& found, absl::Time now, Transition& t, Effects& fx) {
  auto quarantine = [&](CorruptRecord record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    observer_.CorruptRecordSkipped(record);
    ++corrupt_records_;
    if (record.kind == RecordKind::kJob)
      corrupt_jobs_.insert_or_assign(std::move(record.key), std::move(record.reason));
  };
  for (CorruptRecord& record : found.corrupt) quarantine(std::move(record));
  for (const auto& [name, unused] : options_.queue_policies) Queue(name);
  for (auto& [name, policy] : found.policies) {
    QueueState& q = Queue(name);
    q.runtime = std::move(policy);
    q.policy = EffectivePolicy(name, q.runtime);
  }
  // Both are keys of the store or fixed at enqueue; a repeat means a damaged record.
  auto clash = [&](const std::string& id, uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (jobs_.contains(id))
      return absl::DataLossError(absl::StrCat("job ", id, " is stored twice"));
    std::string other;
    if (auto h = jobs_by_seq_.find(seq); h != jobs_by_seq_.end()) other = h->second.job->id;
    if (auto c = cold_.find(seq); c != cold_.end()) other = UnpackJobId(c->second);
    if (other.empty()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("sequence number ", seq, " is also job ", other, "'s"));
  };
  for (Job& job : found.jobs) {
    if (absl::Status s = clash(job.id, job.seq); !s.ok()) {
      quarantine(CorruptRecord{RecordKind::kJob, job.id, std::move(s)});
      continue;
    }
    next_seq_ = std::max(next_seq_, job.seq + 1);
    auto owned = std::make_unique<Job>(std::move(job));
    Queue(owned->queue).all.insert(owned->seq);
    Index(*owned);
    AdoptLocked(std::move(owned), 0);
  }
  for (Recovered::ColdJob& c : found.cold) {
    if (absl::Status s = clash(UnpackJobId(c.id), c.seq); !s.ok()) {
      quarantine(CorruptRecord{RecordKind::kJob, UnpackJobId(c.id), std::move(s)});
      continue;
    }
    next_seq_ = std::max(next_seq_, c.seq + 1);
    // Index() reads only these fields of a READY or SCHEDULED job.
    Job fields;
    fields.queue = found.queue_names[c.queue];
    fields.state = c.state;
    fields.seq = c.seq;
    fields.priority = c.priority;
    fields.run_at = c.run_at;
    fields.concurrency_key = std::move(c.concurrency_key);
    Queue(fields.queue).all.insert(c.seq);
    Index(fields);
    cold_.emplace(c.seq, c.id);
  }
  found.cold = {};  // can be large: give it back before the rest of the start
  for (DedupEntry& e : found.dedup) {
    dedup_expiry_.emplace(e.expires_at, e.queue, e.key);
    auto key = std::make_pair(e.queue, e.key);
    dedup_.insert_or_assign(std::move(key), std::move(e));
  }
  // Leases that ran out while the broker was down become failed attempts now.
  size_t expired = 0;
  int budget = std::numeric_limits<int>::max();
  while (!leases_.empty() && leases_.begin()->first <= now && budget-- > 0) {
    ExpireLease(HotJob(leases_.begin()->second), now, t, fx);
    ++expired;
  }
  return expired;
}

// ---------------------------------------------------------------------------------------------
// Plumbing
uint64_t Broker::CommitLocked(Transition t) {
  // Noted before Append moves `t`; the commit number is known right after, still under mu_.
  PutList puts = PutsOf(t);
  const uint64_t commit = pipeline_.Append(std::move(t));
  StampPutsLocked(puts, commit);
  return commit;
}

uint64_t Broker::CommitLocked(Transition t, const Effects& fx) {
  PutList puts = PutsOf(t);
  const uint64_t commit = pipeline_.Append(std::move(t), fx.level(), fx.group_delay,
                                           fx.level() == Durability::kSync && fx.reaches_workers());
  StampPutsLocked(puts, commit);
  return commit;
}

void Broker::Finish(uint64_t seq, Effects fx, absl::AnyInvocable<void(absl::Status)> done) {
  if (fx.wake && options_.wake) options_.wake();
  const Durability level = fx.level();
  if (level == Durability::kSync && fx.reaches_workers()) {
    // Workers get what the transition handed them once it is in the store's log, while its fsync
    // runs; the caller's answer still waits for the fsync (docs/decisions.md, "early pushes").
    pipeline_.WhenDurable(
        seq, [fx = std::move(fx)](absl::Status written) mutable { Deliver(fx, written); },
        Durability::kGroup);
    if (done) pipeline_.WhenDurable(seq, std::move(done), Durability::kSync);
    return;
  }
  pipeline_.WhenDurable(
      seq,
      [fx = std::move(fx), done = std::move(done)](absl::Status written) mutable {
        Deliver(fx, written);
        if (done) done(std::move(written));
      },
      level);
}

void Broker::Deliver(Effects& fx, const absl::Status& written) {
  for (Effects::Delivery& d : fx.deliveries) {
    if (written.ok()) {
      d.done(std::move(d.jobs));
    } else {
      d.done(NotDurable(written));
    }
  }
  if (!written.ok()) return;  // nothing was leased, lost or cancelled after all
  // Grouped by stream, each in order, so a stream gets what one transition leased to it at once.
  // Streams take turns one job at a time, so the pushes of one stream are rarely adjacent.
  std::vector<std::pair<StreamSink*, std::vector<LeasedJob>>> by_sink;
  for (Effects::Push& p : fx.pushes) {
    auto it = std::find_if(by_sink.begin(), by_sink.end(),
                           [&](const auto& entry) { return entry.first == p.sink.get(); });
    if (it == by_sink.end())
      it = by_sink.emplace(by_sink.end(), p.sink.get(), std::vector<LeasedJob>{});
    it->second.push_back(std::move(p.job));
  }
  for (auto& [sink, jobs] : by_sink) {
    if (jobs.size() == 1) {
      sink->PushJob(std::move(jobs.front()));
    } else {
      sink->PushJobs(std::move(jobs));
    }
  }
  for (Effects::Notice& n : fx.lost) n.sink->LeaseLost(std::move(n.job_id));
  for (Effects::Notice& n : fx.cancelled) n.sink->CancelRequested(std::move(n.job_id));
}

absl::Status Broker::RefusalLocked() {
  if (shutting_down_) return absl::UnavailableError("the broker is shutting down");
  return storage_status();
}

Broker::QueueState& Broker::Queue(const std::string& name) {
  auto it = queues_.find(name);
  if (it != queues_.end()) return *it->second;
  auto q = std::make_unique<QueueState>();
  q->name = name;
  q->policy = EffectivePolicy(name, q->runtime);
  return *queues_.emplace(name, std::move(q)).first->second;
}

Broker::QueueState* Broker::FindQueue(const std::string& name) {
  auto it = queues_.find(name);
  return it == queues_.end() ? nullptr : it->second.get();
}

QueuePolicy Broker::EffectivePolicy(const std::string& queue, const PolicyOverride& runtime) const {
  QueuePolicy p = options_.default_policy.ApplyTo(QueuePolicy{});
  if (auto it = options_.queue_policies.find(queue); it != options_.queue_policies.end())
    p = it->second.ApplyTo(p);
  return runtime.ApplyTo(p);
}

Job* Broker::FindJob(const std::string& id) {
  if (auto it = jobs_.find(id); it != jobs_.end()) return it->second.get();
  if (cold_.empty()) return nullptr;
  // A cold job is found through its stored record's seq. A record of a job memory no longer
  // has (its delete not written yet) names a seq that is not cold, so it is not taken.
  std::optional<PackedJobId> packed = PackJobId(id);
  if (!packed.has_value()) return nullptr;
  absl::StatusOr<Job> stored = store_.ReadJob(id);
  if (!stored.ok()) return nullptr;
  auto c = cold_.find(stored->seq);
  if (c == cold_.end() || !(c->second == *packed)) return nullptr;
  return ThawLocked(stored->seq, *packed);
}

double Broker::Uniform() {
  return options_.uniform ? options_.uniform() : absl::Uniform<double>(gen_, 0.0, 1.0);
}

void Broker::MaybeWake(absl::Time when) {
  // next_wake_ is when the ticker plans to run next; an earlier deadline must wake it.
  if (when < next_wake_) next_wake_ = absl::InfinitePast();
}

// ---------------------------------------------------------------------------------------------
// Indexes
void Broker::Index(Job& job) {
  QueueState& q = Queue(job.queue);
  ++q.counts[static_cast<int>(job.state)];
  switch (job.state) {
    case JobState::kReady: {
      QueueState::Group& g = q.groups[job.concurrency_key];
      g.ready.emplace(-static_cast<int64_t>(job.priority), job.seq);
      q.Offer(job.concurrency_key, g);
      q.ready_by_seq.insert(job.seq);
      break;
    }
    case JobState::kScheduled:
      scheduled_.emplace(job.run_at, job.seq);
      MaybeWake(job.run_at);
      break;
    case JobState::kActive:
      ++q.groups[job.concurrency_key].active;
      leases_.emplace(job.lease_deadline, job.seq);
      MaybeWake(job.lease_deadline);
      break;
    case JobState::kCompleted:
      q.completed.emplace(job.completed_at, job.seq);
      WakeForRetention(q.completed, q.policy.completed_retention, job.completed_at);
      break;
    case JobState::kFailed:
    case JobState::kCancelled:
      q.dead.emplace(job.completed_at, job.seq);
      WakeForRetention(q.dead, q.policy.failed_retention, job.completed_at);
      break;
  }
}

void Broker::WakeForRetention(const absl::btree_set<TimeKey>& finished,
                              const ::jobbroker::Retention& r, absl::Time ended) {
  // Over the count: the sweep is due now. Under an age limit: when this job gets too old.
  if (r.max_count > 0 && static_cast<int64_t>(finished.size()) > r.max_count) MaybeWake(ended);
  if (r.max_age > absl::ZeroDuration()) MaybeWake(ended + r.max_age);
}

void Broker::Unindex(Job& job) {
  QueueState& q = Queue(job.queue);
  --q.counts[static_cast<int>(job.state)];
  switch (job.state) {
    case JobState::kReady:
      q.groups[job.concurrency_key].ready.erase({-static_cast<int64_t>(job.priority), job.seq});
      q.MaybeForget(job.concurrency_key);
      q.ready_by_seq.erase(job.seq);
      break;
    case JobState::kScheduled:
      scheduled_.erase({job.run_at, job.seq});
      break;
    case JobState::kActive: {
      QueueState::Group& g = q.groups[job.concurrency_key];
      --g.active;
      q.Offer(job.concurrency_key, g);  // its key may start another job now
      q.MaybeForget(job.concurrency_key);
      leases_.erase({job.lease_deadline, job.seq});
      break;
    }
    case JobState::kCompleted:
      q.completed.erase({job.completed_at, job.seq});
      break;
    case JobState::kFailed:
    case JobState::kCancelled:
      q.dead.erase({job.completed_at, job.seq});
      break;
  }
}

void Broker::RemoveJob(Job& job, Transition& t) {
  Unindex(job);
  Queue(job.queue).all.erase(job.seq);
  t.delete_jobs.push_back(job.id);
  // The dedup entry outlives the job until its TTL has passed (ExpireDedup removes it then).
  jobs_by_seq_.erase(job.seq);
  jobs_.erase(job.id);  // destroys `job`
}

// ---------------------------------------------------------------------------------------------
// Time-driven work
void Broker::ProcessDue(absl::Time now, Transition& t, Effects& fx) {
  int budget = options_.tick_batch;
  absl::flat_hash_set<QueueState*> touched;
  while (!leases_.empty() && leases_.begin()->first <= now && budget-- > 0) {
    Job& job = HotJob(leases_.begin()->second);
    ExpireLease(job, now, t, fx);
    touched.insert(&Queue(job.queue));
  }
  // A job coming due is not persisted: recovery promotes a SCHEDULED job whose run_at passed.
  while (!scheduled_.empty() && scheduled_.begin()->first <= now && budget-- > 0) {
    Job* job = JobBySeq(scheduled_.begin()->second);
    if (job == nullptr) continue;  // unreadable: dropped from scheduled_
    Unindex(*job);
    job->state = JobState::kReady;
    Index(*job);
    touched.insert(&Queue(job->queue));
  }
  for (QueueState* q : touched) ServeConsumers(*q, now, t, fx);
}

void Broker::FinishAttemptRecord(Job& job, absl::Time now, AttemptOutcome outcome,
                                 std::string error) {
  if (job.attempts.empty() || job.attempts.back().attempt != job.attempt) return;
  AttemptRecord& rec = job.attempts.back();
  rec.ended_at = now;
  rec.outcome = outcome;
  rec.error = std::move(error);
  if (outcome == AttemptOutcome::kCompleted) ++Queue(job.queue).completed_total;
  observer_.AttemptEnded(job, outcome, std::max(now - rec.started_at, absl::ZeroDuration()));
}

void Broker::ExpireLease(Job& job, absl::Time now, Transition& t, Effects& fx) {
  Unindex(job);
  std::string error = absl::StrCat("lease expired: worker ", job.worker_id,
                                   " did not ack, fail or heartbeat in time");
  // The attempt ended when its lease did, even if the broker only notices later (after a restart).
  FinishAttemptRecord(job, job.lease_deadline, AttemptOutcome::kLeaseExpired, error);
  EndAttemptFailed(job, now, AttemptOutcome::kLeaseExpired, std::move(error), std::nullopt);
  Index(job);
  t.put_jobs.push_back(job);
  // After the state change, so the freed slot can take this very job if it is due again.
  EndHold(job, /*lost=*/true, now, t, fx);
}

void Broker::EndAttemptFailed(Job& job, absl::Time now, AttemptOutcome outcome, std::string error,
                              std::optional<absl::Duration> retry_after) {
  job.last_error = std::move(error);
  if (job.cancel_requested) {
    job.state = JobState::kCancelled;
    job.completed_at = now;
  } else if (outcome == AttemptOutcome::kPermanentError) {
    job.state = JobState::kFailed;
    job.fail_reason = FailReason::kPermanent;
    job.completed_at = now;
  } else if (job.attempt >= job.max_attempts) {
    job.state = JobState::kFailed;
    job.fail_reason = FailReason::kAttemptsExhausted;
    job.completed_at = now;
  } else {
    const RetryPolicy& retry = Queue(job.queue).policy.retry;
    absl::Duration wait = retry_after.value_or(retry.Backoff(job.attempt, Uniform()));
    job.run_at = now + wait;
    job.state = wait > absl::ZeroDuration() ? JobState::kScheduled : JobState::kReady;
  }
  switch (job.state) {
    case JobState::kScheduled:
    case JobState::kReady:
      observer_.Retried(job);
      break;
    case JobState::kFailed:
      observer_.Dead(job);
      break;
    case JobState::kCancelled:
      observer_.Cancelled(job);
      break;
    default:
      break;
  }
}

void Broker::Retention(absl::Time now, Transition& t, int& budget) {
  auto sweep = [&](QueueState& q, absl::btree_set<TimeKey>& set, const ::jobbroker::Retention& r) {
    while (!set.empty() && budget > 0) {
      bool over_count = r.max_count > 0 && static_cast<int64_t>(set.size()) > r.max_count;
      bool too_old = r.max_age > absl::ZeroDuration() && set.begin()->first + r.max_age <= now;
      if (!over_count && !too_old) break;
      --budget;
      RemoveJob(HotJob(set.begin()->second), t);
    }
    (void)q;
  };
  for (auto& [name, q] : queues_) {
    sweep(*q, q->completed, q->policy.completed_retention);
    sweep(*q, q->dead, q->policy.failed_retention);
  }
}

void Broker::ExpireDedup(absl::Time now, Transition& t, int& budget) {
  while (!dedup_expiry_.empty() && std::get<0>(*dedup_expiry_.begin()) <= now && budget > 0) {
    --budget;
    auto [when, queue, key] = *dedup_expiry_.begin();
    dedup_expiry_.erase(dedup_expiry_.begin());
    auto it = dedup_.find(std::make_pair(queue, key));
    // Gone, or claimed again since with a later expiry: nothing to do for this entry.
    if (it == dedup_.end() || it->second.expires_at > now) continue;
    const Job* job = FindJob(it->second.job_id);
    if (job != nullptr && !IsTerminal(job->state)) {
      // The key holds at least until its job ends (Enqueue checks that itself); this only
      // frees the memory, so looking again in a minute is soon enough.
      dedup_expiry_.emplace(now + absl::Minutes(1), queue, key);
      continue;
    }
    t.delete_dedup.emplace_back(queue, key);
    dedup_.erase(it);
  }
}

absl::Time Broker::NextDeadlineLocked() {
  absl::Time next = absl::InfiniteFuture();
  if (!leases_.empty()) next = std::min(next, leases_.begin()->first);
  if (!scheduled_.empty()) next = std::min(next, scheduled_.begin()->first);
  if (!waiter_deadlines_.empty()) next = std::min(next, waiter_deadlines_.begin()->first);
  if (!dedup_expiry_.empty()) next = std::min(next, std::get<0>(*dedup_expiry_.begin()));
  for (auto& [name, q] : queues_) {
    const QueuePolicy& p = q->policy;
    if (!q->completed.empty() && p.completed_retention.max_age > absl::ZeroDuration())
      next = std::min(next, q->completed.begin()->first + p.completed_retention.max_age);
    if (!q->dead.empty() && p.failed_retention.max_age > absl::ZeroDuration())
      next = std::min(next, q->dead.begin()->first + p.failed_retention.max_age);
    bool over = (p.completed_retention.max_count > 0 &&
                 static_cast<int64_t>(q->completed.size()) > p.completed_retention.max_count) ||
                (p.failed_retention.max_count > 0 &&
                 static_cast<int64_t>(q->dead.size()) > p.failed_retention.max_count);
    if (over) next = absl::InfinitePast();
    if (absl::Time refill = RefillTime(*q); refill < next) next = refill;
  }
  return next;
}

absl::Time Broker::Tick() {
  MaybeResume();
  Effects fx;
  uint64_t seq;
  absl::Time next;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = clock_.Now();
    Transition t;
    // While the store refuses writes, nothing that needs one happens (expiries, leases,
    // removals): memory will be rebuilt from the store before writes resume anyway.
    const bool writable = pipeline_.healthy();
    if (writable) {
      FreezeLocked();
      ProcessDue(now, t, fx);
      // Rate-limited queues whose bucket refilled serve whoever waits for them.
      for (auto& [name, q] : queues_) {
        if (q->policy.rate_limit.per_second > 0 && !q->consumers.empty())
          ServeConsumers(*q, now, t, fx);
      }
    }
    int budget = options_.tick_batch;
    while (!waiter_deadlines_.empty() && waiter_deadlines_.begin()->first <= now && budget-- > 0) {
      uint64_t id = waiter_deadlines_.begin()->second;
      auto it = consumers_.find(id);
      Delist(*it->second);
      fx.deliveries.push_back({std::move(it->second->done), {}});
      consumers_.erase(it);
    }
    if (!shutting_down_ && writable) {
      Retention(now, t, budget);
      ExpireDedup(now, t, budget);
    }
    seq = CommitLocked(std::move(t));
    if (writable) {
      next = NextDeadlineLocked();
      bool more = !leases_.empty() && leases_.begin()->first <= now;
      more = more || (!scheduled_.empty() && scheduled_.begin()->first <= now);
      if (budget <= 0 || more) next = now;
    } else {
      // Only long polls time out meanwhile; and the store is tried again.
      next = waiter_deadlines_.empty() ? absl::InfiniteFuture() : waiter_deadlines_.begin()->first;
      if (!shutting_down_)
        next = std::min(next, resume_at_ == absl::InfinitePast() ? now : resume_at_);
    }
    next_wake_ = next;
  }
  Finish(seq, std::move(fx), nullptr);
  return next;
}

// ---------------------------------------------------------------------------------------------
// Blocking forms
absl::StatusOr<EnqueueResult> Broker::Enqueue(EnqueueSpec spec) {
  std::vector<EnqueueSpec> one;
  one.push_back(std::move(spec));
  absl::StatusOr<std::vector<EnqueueResult>> r = EnqueueBatch(std::move(one));
  if (!r.ok()) return r.status();
  return std::move(r->front());
}

absl::StatusOr<std::vector<EnqueueResult>> Broker::EnqueueBatch(std::vector<EnqueueSpec> specs) {
  using R = absl::StatusOr<std::vector<EnqueueResult>>;
  return Await<R>([&](Done<R> d) { EnqueueBatch(std::move(specs), std::move(d)); });
}

absl::StatusOr<std::vector<LeasedJob>> Broker::Lease(LeaseSpec spec) {
  using R = absl::StatusOr<std::vector<LeasedJob>>;
  return Await<R>([&](Done<R> d) { Lease(std::move(spec), absl::ZeroDuration(), std::move(d)); });
}

absl::StatusOr<HeartbeatResult> Broker::Heartbeat(HeartbeatSpec spec) {
  using R = absl::StatusOr<HeartbeatResult>;
  return Await<R>([&](Done<R> d) { Heartbeat(std::move(spec), std::move(d)); });
}

absl::Status Broker::Ack(AckSpec spec) {
  return Await<absl::Status>([&](Done<absl::Status> d) { Ack(std::move(spec), std::move(d)); });
}

absl::StatusOr<std::vector<absl::Status>> Broker::AckBatch(std::vector<AckSpec> specs) {
  using Result = absl::StatusOr<std::vector<absl::Status>>;
  return Await<Result>([&](Done<Result> d) { AckBatch(std::move(specs), std::move(d)); });
}

absl::StatusOr<FailResult> Broker::Fail(FailSpec spec) {
  using R = absl::StatusOr<FailResult>;
  return Await<R>([&](Done<R> d) { Fail(std::move(spec), std::move(d)); });
}

absl::Status Broker::Release(ReleaseSpec spec) {
  return Await<absl::Status>([&](Done<absl::Status> d) { Release(std::move(spec), std::move(d)); });
}

absl::StatusOr<Job> Broker::CancelJob(std::string job_id) {
  using R = absl::StatusOr<Job>;
  return Await<R>([&](Done<R> d) { CancelJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<QueueInfo> Broker::UpdateQueuePolicy(std::string queue, PolicyOverride policy,
                                                    bool reset) {
  using R = absl::StatusOr<QueueInfo>;
  return Await<R>([&](Done<R> d) {
    UpdateQueuePolicy(std::move(queue), std::move(policy), reset, std::move(d));
  });
}

}  // namespace jobbroker
