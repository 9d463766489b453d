#include "core/broker.h"

#include <algorithm>
#include <array>
#include <deque>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/ids.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker {

using LeaseDone = Done<absl::StatusOr<std::vector<LeasedJob>>>;

// A long-poll Lease (waits once, for up to spec.max_jobs jobs of spec.queue) or a Work stream
// (stays, holds up to max_in_flight jobs from any of its queues).
struct Broker::Consumer {
  uint64_t id = 0;
  bool stream = false;
  LeaseSpec spec;  // worker_id and lease_duration for both; queue and max_jobs for a long poll
  // Long poll.
  absl::Time deadline;
  LeaseDone done;
  // Stream.
  std::vector<std::string> queues;
  int max_in_flight = 1;
  int in_flight = 0;
  std::shared_ptr<StreamSink> sink;
  absl::flat_hash_set<std::string> enlisted;  // queues whose line it stands in

  bool has_slot() const { return in_flight < max_in_flight; }
};

struct Broker::QueueState {
  std::string name;
  PolicyOverride runtime;  // persisted run-time changes
  QueuePolicy policy;      // effective: built-ins <- config <- runtime
  // READY jobs: higher priority first, then FIFO (priority negated so begin() is next).
  absl::btree_set<std::pair<int64_t, uint64_t>> ready;
  absl::btree_set<uint64_t> ready_by_seq;  // oldest READY job, for its age
  absl::btree_set<uint64_t> all;           // every job of the queue, for listing
  absl::btree_set<TimeKey> completed;      // (completed_at, seq), for retention
  absl::btree_set<TimeKey> dead;           // FAILED and CANCELLED, for retention
  std::array<int64_t, 7> counts{};         // indexed by JobState
  std::deque<uint64_t> consumers;          // long polls and streams with a free slot, in turn

  int64_t count(JobState s) const { return counts[static_cast<int>(s)]; }
  int64_t live() const {
    return count(JobState::kReady) + count(JobState::kScheduled) + count(JobState::kActive);
  }
};

// What an operation must do after its transition is durable.
struct Broker::Effects {
  struct Delivery {
    LeaseDone done;
    std::vector<LeasedJob> jobs;
  };
  std::vector<Delivery> deliveries;  // answers to waiting Leases
  struct Push {
    std::shared_ptr<StreamSink> sink;
    LeasedJob job;
  };
  std::vector<Push> pushes;  // jobs for streams
  struct Notice {
    std::shared_ptr<StreamSink> sink;
    std::string job_id;
  };
  std::vector<Notice> lost;       // leases that ran out under a stream
  std::vector<Notice> cancelled;  // cancel requests for jobs a stream holds
  bool wake = false;              // an earlier deadline appeared: wake the ticker
};

namespace {

constexpr absl::Duration kMaxLeaseWait = absl::Seconds(60);

// Runs an asynchronous operation and blocks for its answer.
template <typename T, typename Start>
T Await(Start start) {
  absl::Notification ready;
  std::optional<T> out;
  start([&](T value) {
    out.emplace(std::move(value));
    ready.Notify();
  });
  ready.WaitForNotification();
  return std::move(*out);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction and recovery

Broker::Broker(Store& store, const Clock& clock, BrokerOptions options)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      pipeline_(store, options_.commit_mode) {}

Broker::~Broker() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Broker>> Broker::Open(Store& store, const Clock& clock,
                                                     BrokerOptions options) {
  BROKER_RETURN_IF_ERROR(ValidatePolicy(options.default_policy.ApplyTo({}), "default_policy"));
  for (const auto& [name, policy] : options.queue_policies) {
    BROKER_RETURN_IF_ERROR(ValidateQueueName(name, absl::StrCat("queues[\"", name, "\"]")));
    QueuePolicy effective = policy.ApplyTo(options.default_policy.ApplyTo({}));
    std::string prefix = absl::StrCat("queues[\"", name, "\"]");
    BROKER_RETURN_IF_ERROR(ValidatePolicy(effective, prefix.c_str()));
  }
  std::unique_ptr<Broker> broker(new Broker(store, clock, std::move(options)));
  BROKER_RETURN_IF_ERROR(broker->Recover());
  return broker;
}

absl::Status Broker::Recover() {
  struct Collector : RecoveryVisitor {
    std::vector<Job> jobs;
    std::vector<DedupEntry> dedup;
    std::vector<std::pair<std::string, PolicyOverride>> policies;
    void OnJob(Job job) override { jobs.push_back(std::move(job)); }
    void OnDedup(DedupEntry entry) override { dedup.push_back(std::move(entry)); }
    void OnPolicy(std::string queue, PolicyOverride policy) override {
      policies.emplace_back(std::move(queue), std::move(policy));
    }
  } found;
  BROKER_RETURN_IF_ERROR(store_.Recover(found));

  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, unused] : options_.queue_policies) Queue(name);
    for (auto& [name, policy] : found.policies) {
      QueueState& q = Queue(name);
      q.runtime = std::move(policy);
      q.policy = EffectivePolicy(name, q.runtime);
    }
    for (Job& job : found.jobs) {
      next_seq_ = std::max(next_seq_, job.seq + 1);
      auto owned = std::make_unique<Job>(std::move(job));
      Job& j = *owned;
      if (!jobs_.emplace(j.id, std::move(owned)).second)
        return absl::DataLossError(absl::StrCat("job ", j.id, " is stored twice"));
      if (!jobs_by_seq_.emplace(j.seq, &j).second)
        return absl::DataLossError(absl::StrCat("job ", j.id, " repeats sequence ", j.seq));
      Queue(j.queue).all.insert(j.seq);
      Index(j);
    }
    for (DedupEntry& e : found.dedup) {
      dedup_expiry_.emplace(e.expires_at, e.queue, e.key);
      auto key = std::make_pair(e.queue, e.key);
      dedup_.insert_or_assign(std::move(key), std::move(e));
    }
    // Leases that ran out while the broker was down become failed attempts now.
    Transition t;
    Effects fx;
    absl::Time now = clock_.Now();
    int budget = std::numeric_limits<int>::max();
    while (!leases_.empty() && leases_.begin()->first <= now && budget-- > 0) {
      ExpireLease(*jobs_by_seq_.at(leases_.begin()->second), now, t, fx);
    }
    seq = CommitLocked(std::move(t));
  }
  return pipeline_.WaitDurable(seq);
}

// ---------------------------------------------------------------------------------------------
// Plumbing

uint64_t Broker::CommitLocked(Transition t) { return pipeline_.Append(std::move(t)); }

void Broker::Finish(uint64_t seq, Effects fx, absl::AnyInvocable<void(absl::Status)> done) {
  if (fx.wake && options_.wake) options_.wake();
  pipeline_.WhenDurable(seq,
                        [fx = std::move(fx), done = std::move(done)](absl::Status written) mutable {
                          Deliver(fx, written);
                          if (done) done(std::move(written));
                        });
}

void Broker::Deliver(Effects& fx, const absl::Status& written) {
  for (Effects::Delivery& d : fx.deliveries) {
    if (written.ok()) {
      d.done(std::move(d.jobs));
    } else {
      d.done(written);
    }
  }
  if (!written.ok()) return;  // nothing was leased, lost or cancelled after all
  for (Effects::Push& p : fx.pushes) p.sink->PushJob(std::move(p.job));
  for (Effects::Notice& n : fx.lost) n.sink->LeaseLost(std::move(n.job_id));
  for (Effects::Notice& n : fx.cancelled) n.sink->CancelRequested(std::move(n.job_id));
}

absl::Status Broker::RefusalLocked() {
  if (shutting_down_) return absl::UnavailableError("the broker is shutting down");
  absl::Status storage = pipeline_.status();
  if (!storage.ok())
    return absl::UnavailableError(
        absl::StrCat("the broker stopped writing after a storage error: ", storage.message()));
  return absl::OkStatus();
}

template <typename T>
void Broker::Reply(uint64_t seq, Effects fx, Done<absl::StatusOr<T>> done,
                   absl::StatusOr<T> result) {
  Finish(seq, std::move(fx),
         [done = std::move(done), result = std::move(result)](absl::Status written) mutable {
           if (written.ok()) {
             done(std::move(result));
           } else {
             done(absl::UnavailableError(
                 absl::StrCat("the change could not be made durable: ", written.message())));
           }
         });
}

template <typename T, typename Op>
void Broker::Run(Done<absl::StatusOr<T>> done, Op op) {
  Effects fx;
  absl::StatusOr<T> result;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status refused = RefusalLocked(); !refused.ok()) {
      result = refused;
    } else {
      absl::Time now = clock_.Now();
      Transition t;
      ProcessDue(now, t, fx);
      result = op(now, t, fx);
      seq = CommitLocked(std::move(t));
    }
    if (next_wake_ == absl::InfinitePast()) fx.wake = true;
  }
  Reply<T>(seq, std::move(fx), std::move(done), std::move(result));
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
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
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
    case JobState::kReady:
      q.ready.emplace(-static_cast<int64_t>(job.priority), job.seq);
      q.ready_by_seq.insert(job.seq);
      break;
    case JobState::kScheduled:
      scheduled_.emplace(job.run_at, job.seq);
      MaybeWake(job.run_at);
      break;
    case JobState::kActive:
      leases_.emplace(job.lease_deadline, job.seq);
      MaybeWake(job.lease_deadline);
      break;
    case JobState::kCompleted:
      q.completed.emplace(job.completed_at, job.seq);
      break;
    case JobState::kFailed:
    case JobState::kCancelled:
      q.dead.emplace(job.completed_at, job.seq);
      break;
  }
}

void Broker::Unindex(Job& job) {
  QueueState& q = Queue(job.queue);
  --q.counts[static_cast<int>(job.state)];
  switch (job.state) {
    case JobState::kReady:
      q.ready.erase({-static_cast<int64_t>(job.priority), job.seq});
      q.ready_by_seq.erase(job.seq);
      break;
    case JobState::kScheduled:
      scheduled_.erase({job.run_at, job.seq});
      break;
    case JobState::kActive:
      leases_.erase({job.lease_deadline, job.seq});
      break;
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
    Job& job = *jobs_by_seq_.at(leases_.begin()->second);
    ExpireLease(job, now, t, fx);
    touched.insert(&Queue(job.queue));
  }
  // A job coming due is not persisted: recovery promotes a SCHEDULED job whose run_at passed.
  while (!scheduled_.empty() && scheduled_.begin()->first <= now && budget-- > 0) {
    Job& job = *jobs_by_seq_.at(scheduled_.begin()->second);
    Unindex(job);
    job.state = JobState::kReady;
    Index(job);
    touched.insert(&Queue(job.queue));
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
}

void Broker::Retention(absl::Time now, Transition& t, int& budget) {
  auto sweep = [&](QueueState& q, absl::btree_set<TimeKey>& set, const ::jobbroker::Retention& r) {
    while (!set.empty() && budget > 0) {
      bool over_count = r.max_count > 0 && static_cast<int64_t>(set.size()) > r.max_count;
      bool too_old = r.max_age > absl::ZeroDuration() && set.begin()->first + r.max_age <= now;
      if (!over_count && !too_old) break;
      --budget;
      RemoveJob(*jobs_by_seq_.at(set.begin()->second), t);
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
    if (it == dedup_.end() || it->second.expires_at != when) continue;  // replaced since
    const Job* job = FindJob(it->second.job_id);
    if (job != nullptr && !IsTerminal(job->state)) {
      // The key holds at least until its job ends; look again later.
      dedup_expiry_.emplace(now + absl::Minutes(1), queue, key);
      it->second.expires_at = now + absl::Minutes(1);
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
  }
  return next;
}

absl::Time Broker::Tick() {
  Effects fx;
  uint64_t seq;
  absl::Time next;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = clock_.Now();
    Transition t;
    ProcessDue(now, t, fx);
    int budget = options_.tick_batch;
    while (!waiter_deadlines_.empty() && waiter_deadlines_.begin()->first <= now && budget-- > 0) {
      uint64_t id = waiter_deadlines_.begin()->second;
      auto it = consumers_.find(id);
      Delist(*it->second);
      fx.deliveries.push_back({std::move(it->second->done), {}});
      consumers_.erase(it);
    }
    if (!shutting_down_ && pipeline_.status().ok()) {
      Retention(now, t, budget);
      ExpireDedup(now, t, budget);
    }
    seq = CommitLocked(std::move(t));
    next = NextDeadlineLocked();
    bool more = !leases_.empty() && leases_.begin()->first <= now;
    more = more || (!scheduled_.empty() && scheduled_.begin()->first <= now);
    if (budget <= 0 || more) next = now;
    next_wake_ = next;
  }
  Finish(seq, std::move(fx), nullptr);
  return next;
}

// ---------------------------------------------------------------------------------------------
// Enqueue

void Broker::EnqueueBatch(std::vector<EnqueueSpec> specs,
                          Done<absl::StatusOr<std::vector<EnqueueResult>>> done) {
  if (specs.empty()) {
    done(absl::InvalidArgumentError("jobs must hold at least one job"));
    return;
  }
  if (specs.size() > static_cast<size_t>(kMaxLeaseBatch)) {
    done(absl::InvalidArgumentError(
        absl::StrCat("jobs holds ", specs.size(), " jobs; the limit is ", kMaxLeaseBatch)));
    return;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::Status s = ValidateEnqueueSpec(specs[i]);
    if (!s.ok()) {
      if (specs.size() > 1) s = absl::Status(s.code(), absl::StrCat("jobs[", i, "].", s.message()));
      done(s);
      return;
    }
  }
  Run<std::vector<EnqueueResult>>(
      std::move(done),
      [this, specs = std::move(specs)](absl::Time now, Transition& t,
                                       Effects& fx) mutable ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return EnqueueLocked(specs, now, t, fx);
      });
}

absl::StatusOr<std::vector<EnqueueResult>> Broker::EnqueueLocked(std::vector<EnqueueSpec>& specs,
                                                                 absl::Time now, Transition& t,
                                                                 Effects& fx) {
  // First decide everything without changing anything, so a refusal changes nothing.
  struct Plan {
    int duplicate_of = -1;        // index of an earlier job of this batch with the same key
    std::string existing_job_id;  // a stored job holding the key
  };
  std::vector<Plan> plan(specs.size());
  std::map<std::pair<std::string, std::string>, size_t> batch_keys;
  std::map<std::string, int64_t> new_live;
  for (size_t i = 0; i < specs.size(); ++i) {
    const EnqueueSpec& s = specs[i];
    std::string where = specs.size() > 1 ? absl::StrCat("jobs[", i, "].") : "";
    if (!s.dedup_key.empty()) {
      auto key = std::make_pair(s.queue, s.dedup_key);
      uint64_t hash = PayloadHash(s.payload);
      if (auto it = batch_keys.find(key); it != batch_keys.end()) {
        if (PayloadHash(specs[it->second].payload) != hash)
          return absl::AlreadyExistsError(
              absl::StrCat(where, "dedup_key \"", s.dedup_key, "\" is used by jobs[", it->second,
                           "] of the same batch with a different payload"));
        plan[i].duplicate_of = static_cast<int>(it->second);
        continue;
      }
      if (auto it = dedup_.find(key); it != dedup_.end()) {
        const DedupEntry& e = it->second;
        const Job* holder = FindJob(e.job_id);
        bool held = now < e.expires_at || (holder != nullptr && !IsTerminal(holder->state));
        if (held) {
          if (e.payload_hash != hash)
            return absl::AlreadyExistsError(absl::StrCat(where, "dedup_key \"", s.dedup_key,
                                                         "\" is held by job ", e.job_id,
                                                         " with a different payload"));
          plan[i].existing_job_id = e.job_id;
          continue;
        }
      }
      batch_keys.emplace(std::move(key), i);
    }
    ++new_live[s.queue];
  }
  for (const auto& [name, added] : new_live) {
    // FindQueue, not Queue: a refused batch must not even create a queue.
    QueueState* q = FindQueue(name);
    int64_t live = q == nullptr ? 0 : q->live();
    int64_t max_length = q == nullptr ? EffectivePolicy(name, {}).max_length : q->policy.max_length;
    if (max_length > 0 && live + added > max_length)
      return absl::ResourceExhaustedError(absl::StrCat("queue ", name, " is full: ", live,
                                                       " jobs are not finished and max_length is ",
                                                       max_length));
  }

  std::vector<EnqueueResult> results(specs.size());
  absl::flat_hash_set<QueueState*> touched;
  for (size_t i = 0; i < specs.size(); ++i) {
    EnqueueSpec& s = specs[i];
    if (plan[i].duplicate_of >= 0) {
      results[i] = {results[plan[i].duplicate_of].job_id, true};
      continue;
    }
    if (!plan[i].existing_job_id.empty()) {
      results[i] = {plan[i].existing_job_id, true};
      continue;
    }
    QueueState& q = Queue(s.queue);
    auto owned = std::make_unique<Job>();
    Job& job = *owned;
    job.id = NewJobId(now, gen_);
    job.queue = s.queue;
    job.payload = std::move(s.payload);
    job.headers = std::move(s.headers);
    job.priority = s.priority;
    job.seq = next_seq_++;
    job.max_attempts = s.max_attempts > 0 ? s.max_attempts : q.policy.retry.max_attempts;
    job.dedup_key = std::move(s.dedup_key);
    job.concurrency_key = std::move(s.concurrency_key);
    job.created_at = now;
    job.lease_duration = s.lease_duration;
    job.run_at = now;
    if (s.delay.has_value()) job.run_at = now + *s.delay;
    if (s.run_at.has_value()) job.run_at = std::max(now, *s.run_at);
    job.state = job.run_at > now ? JobState::kScheduled : JobState::kReady;

    if (!job.dedup_key.empty()) {
      DedupEntry e{job.queue, job.dedup_key, job.id, now + s.dedup_ttl.value_or(q.policy.dedup_ttl),
                   PayloadHash(job.payload)};
      auto key = std::make_pair(job.queue, job.dedup_key);
      if (auto old = dedup_.find(key); old != dedup_.end())
        dedup_expiry_.erase({old->second.expires_at, job.queue, job.dedup_key});
      dedup_expiry_.emplace(e.expires_at, job.queue, job.dedup_key);
      t.put_dedup.push_back(e);
      dedup_.insert_or_assign(std::move(key), std::move(e));
    }
    results[i] = {job.id, false};
    jobs_by_seq_.emplace(job.seq, &job);
    q.all.insert(job.seq);
    Index(job);
    t.put_jobs.push_back(job);
    touched.insert(&q);
    jobs_.emplace(job.id, std::move(owned));
  }
  for (QueueState* q : touched) ServeConsumers(*q, now, t, fx);
  return results;
}

// ---------------------------------------------------------------------------------------------
// Leasing

int Broker::Leasable(QueueState& q) {
  if (q.policy.paused || shutting_down_) return 0;
  int64_t n = static_cast<int64_t>(q.ready.size());
  if (q.policy.max_concurrency > 0)
    n = std::min<int64_t>(
        n, std::max<int64_t>(0, q.policy.max_concurrency - q.count(JobState::kActive)));
  return static_cast<int>(std::min<int64_t>(n, std::numeric_limits<int>::max()));
}

LeasedJob Broker::LeaseOne(Job& job, const LeaseSpec& spec, absl::Time now, Transition& t) {
  Unindex(job);
  job.state = JobState::kActive;
  ++job.attempt;
  job.lease_id = NewLeaseId(job.attempt, gen_);
  job.worker_id = spec.worker_id;
  if (spec.lease_duration > absl::ZeroDuration()) {
    job.lease_length = spec.lease_duration;
  } else if (job.lease_duration > absl::ZeroDuration()) {
    job.lease_length = job.lease_duration;
  } else {
    job.lease_length = Queue(job.queue).policy.lease_duration;
  }
  job.lease_deadline = now + job.lease_length;
  job.attempts.push_back(AttemptRecord{job.attempt, spec.worker_id, now, absl::InfinitePast(),
                                       AttemptOutcome::kRunning, ""});
  if (job.attempts.size() > static_cast<size_t>(kMaxAttemptHistory))
    job.attempts.erase(job.attempts.begin());
  Index(job);
  t.put_jobs.push_back(job);

  LeasedJob leased;
  leased.job_id = job.id;
  leased.lease_id = job.lease_id;
  leased.queue = job.queue;
  leased.payload = job.payload;
  leased.headers = job.headers;
  leased.attempt = job.attempt;
  leased.max_attempts = job.max_attempts;
  leased.lease_deadline = job.lease_deadline;
  leased.idempotency_key = job.idempotency_key();
  leased.checkpoint = job.checkpoint;
  leased.enqueued_at = job.created_at;
  return leased;
}

std::vector<LeasedJob> Broker::LeaseMany(QueueState& q, const LeaseSpec& spec, absl::Time now,
                                         Transition& t) {
  int n = std::min(std::max(spec.max_jobs, 1), Leasable(q));
  std::vector<LeasedJob> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    Job& job = *jobs_by_seq_.at(q.ready.begin()->second);
    out.push_back(LeaseOne(job, spec, now, t));
  }
  return out;
}

void Broker::ServeConsumers(QueueState& q, absl::Time now, Transition& t, Effects& fx) {
  while (!q.consumers.empty() && Leasable(q) > 0) {
    uint64_t id = q.consumers.front();
    q.consumers.pop_front();
    auto it = consumers_.find(id);
    Consumer& c = *it->second;
    if (!c.stream) {
      waiter_deadlines_.erase({c.deadline, id});
      fx.deliveries.push_back({std::move(c.done), LeaseMany(q, c.spec, now, t)});
      consumers_.erase(it);
      continue;
    }
    c.enlisted.erase(q.name);
    if (!c.has_slot()) continue;
    LeaseSpec spec{q.name, c.spec.worker_id, 1, c.spec.lease_duration};
    Job& job = *jobs_by_seq_.at(q.ready.begin()->second);
    fx.pushes.push_back({c.sink, LeaseOne(job, spec, now, t)});
    holders_[job.seq] = id;
    ++c.in_flight;
    if (c.has_slot()) {  // one job per turn: back of the line
      q.consumers.push_back(id);
      c.enlisted.insert(q.name);
    }
  }
}

void Broker::Enlist(Consumer& stream, absl::Time now, Transition& t, Effects& fx) {
  for (const std::string& name : stream.queues) {
    if (!stream.has_slot()) return;
    if (!stream.enlisted.insert(name).second) continue;
    QueueState& q = Queue(name);
    q.consumers.push_back(stream.id);
    ServeConsumers(q, now, t, fx);
  }
}

void Broker::EndHold(const Job& job, bool lost, absl::Time now, Transition& t, Effects& fx) {
  auto held = holders_.find(job.seq);
  if (held == holders_.end()) return;
  uint64_t id = held->second;
  holders_.erase(held);
  auto it = consumers_.find(id);
  if (it == consumers_.end()) return;  // the stream has ended since
  Consumer& stream = *it->second;
  --stream.in_flight;
  if (lost) fx.lost.push_back({stream.sink, job.id});
  Enlist(stream, now, t, fx);
}

void Broker::Delist(Consumer& c) {
  auto leave = [&](const std::string& name) {
    QueueState& q = Queue(name);
    q.consumers.erase(std::find(q.consumers.begin(), q.consumers.end(), c.id));
  };
  if (c.stream) {
    for (const std::string& name : c.enlisted) leave(name);
    c.enlisted.clear();
  } else {
    leave(c.spec.queue);
    waiter_deadlines_.erase({c.deadline, c.id});
  }
}

uint64_t Broker::Lease(LeaseSpec spec, absl::Duration wait, LeaseDone done) {
  absl::Status valid = ValidateLeaseSpec(spec);
  if (valid.ok() && (wait < absl::ZeroDuration() || wait > kMaxLeaseWait))
    valid = absl::InvalidArgumentError("wait must be between 0 and 60s");
  if (!valid.ok()) {
    done(valid);
    return 0;
  }
  Effects fx;
  uint64_t seq = 0;
  uint64_t waiter_id = 0;
  absl::StatusOr<std::vector<LeasedJob>> result;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status refused = RefusalLocked(); !refused.ok()) {
      result = refused;
    } else {
      absl::Time now = clock_.Now();
      Transition t;
      ProcessDue(now, t, fx);
      QueueState& q = Queue(spec.queue);
      // Jobs still leasable here found no consumer with room in line (ServeConsumers runs
      // whenever jobs become leasable), so taking them directly is fair.
      std::vector<LeasedJob> jobs = LeaseMany(q, spec, now, t);
      if (jobs.empty() && wait > absl::ZeroDuration()) {
        waiter_id = next_consumer_id_++;
        auto w = std::make_unique<Consumer>();
        w->id = waiter_id;
        w->spec = std::move(spec);
        w->deadline = now + wait;
        w->done = std::move(done);
        waiter_deadlines_.emplace(w->deadline, waiter_id);
        MaybeWake(w->deadline);
        q.consumers.push_back(waiter_id);
        consumers_.emplace(waiter_id, std::move(w));
      } else {
        result = std::move(jobs);
      }
      seq = CommitLocked(std::move(t));
    }
    if (next_wake_ == absl::InfinitePast()) fx.wake = true;
  }
  if (waiter_id != 0) {
    Finish(seq, std::move(fx), nullptr);  // the waiter's own answer comes later
    return waiter_id;
  }
  Reply<std::vector<LeasedJob>>(seq, std::move(fx), std::move(done), std::move(result));
  return 0;
}

bool Broker::CancelWait(uint64_t waiter) {
  LeaseDone done;
  {
    absl::MutexLock lock(&mu_);
    auto it = consumers_.find(waiter);
    if (it == consumers_.end() || it->second->stream) return false;
    Delist(*it->second);
    done = std::move(it->second->done);
    consumers_.erase(it);
  }
  done(absl::CancelledError("the lease request was cancelled"));
  return true;
}

absl::StatusOr<uint64_t> Broker::Subscribe(SubscribeSpec spec, std::shared_ptr<StreamSink> sink) {
  if (spec.queues.empty()) return absl::InvalidArgumentError("queues must name at least one queue");
  if (spec.queues.size() > static_cast<size_t>(kMaxSubscribedQueues))
    return absl::InvalidArgumentError(
        absl::StrCat("queues names ", spec.queues.size(), "; the limit is ", kMaxSubscribedQueues));
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < spec.queues.size(); ++i) {
    BROKER_RETURN_IF_ERROR(ValidateQueueName(spec.queues[i], absl::StrCat("queues[", i, "]")));
    if (!seen.insert(spec.queues[i]).second)
      return absl::InvalidArgumentError(absl::StrCat("queues[", i, "] repeats ", spec.queues[i]));
  }
  if (spec.max_in_flight < 0 || spec.max_in_flight > kMaxInFlight)
    return absl::InvalidArgumentError(
        absl::StrCat("max_in_flight must be between 0 and ", kMaxInFlight));
  BROKER_RETURN_IF_ERROR(
      ValidateLeaseSpec(LeaseSpec{spec.queues[0], spec.worker_id, 1, spec.lease_duration}));

  Effects fx;
  uint64_t seq = 0;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    BROKER_RETURN_IF_ERROR(RefusalLocked());
    absl::Time now = clock_.Now();
    Transition t;
    ProcessDue(now, t, fx);
    id = next_consumer_id_++;
    auto c = std::make_unique<Consumer>();
    c->id = id;
    c->stream = true;
    c->spec.worker_id = std::move(spec.worker_id);
    c->spec.lease_duration = spec.lease_duration;
    c->queues = std::move(spec.queues);
    c->max_in_flight = std::max(spec.max_in_flight, 1);
    c->sink = std::move(sink);
    Consumer& stream = *c;
    consumers_.emplace(id, std::move(c));
    Enlist(stream, now, t, fx);
    seq = CommitLocked(std::move(t));
    if (next_wake_ == absl::InfinitePast()) fx.wake = true;
  }
  Finish(seq, std::move(fx), nullptr);
  return id;
}

absl::Status Broker::SetFlow(uint64_t stream, int max_in_flight) {
  if (max_in_flight < 0 || max_in_flight > kMaxInFlight)
    return absl::InvalidArgumentError(
        absl::StrCat("max_in_flight must be between 0 and ", kMaxInFlight));
  Effects fx;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = consumers_.find(stream);
    if (it == consumers_.end() || !it->second->stream)
      return absl::NotFoundError("the stream has not subscribed");
    BROKER_RETURN_IF_ERROR(RefusalLocked());
    absl::Time now = clock_.Now();
    Transition t;
    ProcessDue(now, t, fx);
    Consumer& c = *it->second;
    c.max_in_flight = max_in_flight;
    if (!c.has_slot()) {
      Delist(c);  // drained or full: out of every line until a slot frees
    } else {
      Enlist(c, now, t, fx);
    }
    seq = CommitLocked(std::move(t));
  }
  Finish(seq, std::move(fx), nullptr);
  return absl::OkStatus();
}

void Broker::Unsubscribe(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  auto it = consumers_.find(stream);
  if (it == consumers_.end() || !it->second->stream) return;
  Delist(*it->second);
  consumers_.erase(it);
}

// ---------------------------------------------------------------------------------------------
// Heartbeat, Ack, Fail, Release

absl::StatusOr<Job*> Broker::LeasedJobFor(const std::string& job_id, const std::string& lease_id) {
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  if (job->lease_id != lease_id) {
    if (job->lease_id.empty())
      return absl::FailedPreconditionError(absl::StrCat("lease ", lease_id, " of job ", job_id,
                                                        " is not held: the job was released"));
    return absl::FailedPreconditionError(absl::StrCat("lease ", lease_id, " of job ", job_id,
                                                      " is stale: attempt ", job->attempt,
                                                      " (lease ", job->lease_id, ") replaced it"));
  }
  return job;
}

void Broker::Heartbeat(HeartbeatSpec spec, Done<absl::StatusOr<HeartbeatResult>> done) {
  if (absl::Status s = ValidateHeartbeatSpec(spec); !s.ok()) return done(s);
  Run<HeartbeatResult>(
      std::move(done),
      [this, spec = std::move(spec)](
          absl::Time now, Transition& t,
          Effects&) mutable ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<HeartbeatResult> {
        absl::StatusOr<Job*> found = LeasedJobFor(spec.job_id, spec.lease_id);
        if (!found.ok()) return found.status();
        Job& job = **found;
        if (job.state != JobState::kActive)
          return absl::FailedPreconditionError(
              absl::StrCat("lease ", spec.lease_id, " of job ", job.id, " has ended (the job is ",
                           JobStateName(job.state), "); stop working on it"));
        Unindex(job);
        absl::Duration extend =
            spec.extend_by > absl::ZeroDuration() ? spec.extend_by : job.lease_length;
        job.lease_deadline = now + extend;
        if (spec.checkpoint.has_value()) job.checkpoint = std::move(*spec.checkpoint);
        Index(job);
        t.put_jobs.push_back(job);
        return HeartbeatResult{job.lease_deadline, job.cancel_requested};
      });
}

void Broker::Ack(AckSpec spec, Done<absl::Status> done) {
  if (absl::Status s = ValidateAckSpec(spec); !s.ok()) return done(s);
  Run<bool>([done = std::move(done)](absl::StatusOr<bool> r) mutable { done(r.status()); },
            [this, spec = std::move(spec)](
                absl::Time now, Transition& t,
                Effects& fx) mutable ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
              absl::StatusOr<Job*> found = LeasedJobFor(spec.job_id, spec.lease_id);
              if (!found.ok()) return found.status();
              Job& job = **found;
              if (job.state == JobState::kCompleted) return true;  // a retried Ack of this lease
              if (job.state != JobState::kActive) {
                // Late-ack salvage: the lease ran out but no newer attempt started, so the work the
                // worker finished still counts and saves a needless rerun.
                bool expired = !job.attempts.empty() &&
                               job.attempts.back().attempt == job.attempt &&
                               job.attempts.back().outcome == AttemptOutcome::kLeaseExpired;
                if (!expired)
                  return absl::FailedPreconditionError(
                      absl::StrCat("attempt ", job.attempt, " of job ", job.id,
                                   " already failed (the job is ", JobStateName(job.state), ")"));
              }
              Unindex(job);
              FinishAttemptRecord(job, now, AttemptOutcome::kCompleted, "");
              job.state = JobState::kCompleted;
              job.fail_reason = FailReason::kNone;
              job.result = std::move(spec.result);
              job.completed_at = now;
              Index(job);
              t.put_jobs.push_back(job);
              EndHold(job, /*lost=*/false, now, t, fx);
              ServeConsumers(Queue(job.queue), now, t, fx);  // a concurrency slot may have freed
              return true;
            });
}

void Broker::Fail(FailSpec spec, Done<absl::StatusOr<FailResult>> done) {
  if (absl::Status s = ValidateFailSpec(spec); !s.ok()) return done(s);
  Run<FailResult>(
      std::move(done),
      [this, spec = std::move(spec)](
          absl::Time now, Transition& t,
          Effects& fx) mutable ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<FailResult> {
        absl::StatusOr<Job*> found = LeasedJobFor(spec.job_id, spec.lease_id);
        if (!found.ok()) return found.status();
        Job& job = **found;
        std::string error = TruncateUtf8(std::move(spec.error), kMaxErrorBytes);
        AttemptOutcome outcome =
            spec.permanent ? AttemptOutcome::kPermanentError : AttemptOutcome::kError;
        auto answer = [&job] {
          FailResult r{job.state, absl::InfinitePast()};
          if (job.state == JobState::kScheduled || job.state == JobState::kReady)
            r.next_attempt_at = job.run_at;
          return r;
        };
        if (job.state == JobState::kActive) {
          Unindex(job);
          FinishAttemptRecord(job, now, outcome, error);
          EndAttemptFailed(job, now, outcome, std::move(error), spec.retry_after);
          Index(job);
          t.put_jobs.push_back(job);
          EndHold(job, /*lost=*/false, now, t, fx);
          ServeConsumers(Queue(job.queue), now, t, fx);
          return answer();
        }
        const AttemptRecord* last =
            job.attempts.empty() || job.attempts.back().attempt != job.attempt
                ? nullptr
                : &job.attempts.back();
        if (last != nullptr && (last->outcome == AttemptOutcome::kError ||
                                last->outcome == AttemptOutcome::kPermanentError)) {
          return answer();  // a retried Fail of this lease
        }
        if (last == nullptr || last->outcome != AttemptOutcome::kLeaseExpired)
          return absl::FailedPreconditionError(absl::StrCat("attempt ", job.attempt, " of job ",
                                                            job.id, " already ended (the job is ",
                                                            JobStateName(job.state), ")"));
        // A late Fail of an expired attempt: keep the worker's error, and honour `permanent`.
        Unindex(job);
        job.attempts.back().outcome = outcome;
        job.attempts.back().error = error;
        job.last_error = std::move(error);
        if (spec.permanent && !IsTerminal(job.state)) {
          job.state = JobState::kFailed;
          job.fail_reason = FailReason::kPermanent;
          job.completed_at = now;
        }
        Index(job);
        t.put_jobs.push_back(job);
        return answer();
      });
}

void Broker::Release(ReleaseSpec spec, Done<absl::Status> done) {
  if (absl::Status s = ValidateLeaseRef(spec.job_id, spec.lease_id); !s.ok()) return done(s);
  Run<bool>([done = std::move(done)](absl::StatusOr<bool> r) mutable { done(r.status()); },
            [this, spec = std::move(spec)](
                absl::Time now, Transition& t,
                Effects& fx) mutable ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
              absl::StatusOr<Job*> found = LeasedJobFor(spec.job_id, spec.lease_id);
              if (!found.ok()) return found.status();
              Job& job = **found;
              if (job.state != JobState::kActive)
                return absl::FailedPreconditionError(
                    absl::StrCat("lease ", spec.lease_id, " of job ", job.id,
                                 " has ended (the job is ", JobStateName(job.state), ")"));
              Unindex(job);
              // Given back unstarted: the attempt does not count.
              if (!job.attempts.empty() && job.attempts.back().attempt == job.attempt)
                job.attempts.pop_back();
              --job.attempt;
              job.lease_id.clear();
              job.worker_id.clear();
              job.lease_deadline = absl::InfinitePast();
              job.lease_length = absl::ZeroDuration();
              job.state = job.cancel_requested ? JobState::kCancelled : JobState::kReady;
              if (job.state == JobState::kCancelled) job.completed_at = now;
              job.run_at = now;
              Index(job);
              t.put_jobs.push_back(job);
              EndHold(job, /*lost=*/false, now, t, fx);
              ServeConsumers(Queue(job.queue), now, t, fx);
              return true;
            });
}

// ---------------------------------------------------------------------------------------------
// Admin

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
