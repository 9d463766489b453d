// Broker: handing jobs out. Unary and long-poll Leases, Work streams, and the line of
// consumers each queue serves in turn.
#include "absl/strings/str_cat.h"
#include "core/broker_internal.h"
#include "core/ids.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker {

void Broker::Refill(QueueState& q, absl::Time now) {
  const RateLimit& r = q.policy.rate_limit;
  if (r.per_second <= 0) return;
  // Without a burst, up to one second's worth (at least one lease) may go at once.
  const double cap = r.burst > 0 ? r.burst : std::max(1.0, r.per_second);
  if (q.tokens_at == absl::InfinitePast()) {
    q.tokens = cap;
  } else if (now > q.tokens_at) {
    q.tokens = std::min(cap, q.tokens + absl::ToDoubleSeconds(now - q.tokens_at) * r.per_second);
  }
  q.tokens_at = now;
}

absl::Time Broker::RefillTime(const QueueState& q) const {
  const double rate = q.policy.rate_limit.per_second;
  if (rate <= 0 || q.tokens >= 1 || q.consumers.empty() || q.count(JobState::kReady) == 0)
    return absl::InfiniteFuture();
  return q.tokens_at + absl::Seconds((1 - q.tokens) / rate);
}

bool Broker::CanLease(QueueState& q, absl::Time now) {
  // No lease while the store refuses writes: it could not be made durable.
  if (q.policy.paused || shutting_down_ || !pipeline_.healthy()) return false;
  if (q.policy.max_concurrency > 0 && q.count(JobState::kActive) >= q.policy.max_concurrency)
    return false;
  if (q.policy.rate_limit.per_second > 0) {
    Refill(q, now);
    if (q.tokens < 1) return false;
  }
  // Drop ring entries that went stale (their jobs were taken or their key filled up).
  while (!q.ring.empty()) {
    const std::string& key = q.ring.front();
    auto g = q.groups.find(key);
    if (g != q.groups.end() && !g->second.ready.empty() && q.HasRoom(key, g->second)) {
      // LeaseNext takes this job: read it back now if it is cold. One that cannot be read is
      // dropped from the group, so look again.
      if (JobBySeq(g->second.ready.begin()->second) != nullptr) return true;
      continue;
    }
    std::string stale = key;
    q.ring.pop_front();
    if (g != q.groups.end()) g->second.in_ring = false;
    q.MaybeForget(stale);
  }
  return false;
}

std::pair<LeasedJob, uint64_t> Broker::LeaseNext(QueueState& q, const LeaseSpec& spec,
                                                 absl::Time now, Transition& t) {
  std::string key = std::move(q.ring.front());
  q.ring.pop_front();
  QueueState::Group& g = q.groups.at(key);
  g.in_ring = false;
  Job& job = *JobBySeq(g.ready.begin()->second);  // hot: CanLease read it back
  const uint64_t seq = job.seq;
  LeasedJob leased = LeaseOne(job, spec, now, t);
  if (q.policy.rate_limit.per_second > 0) {
    q.tokens -= 1;
    MaybeWake(RefillTime(q));  // consumers left waiting are served when a token is back
  }
  // One job per turn: the key goes to the back of the ring if it may run more.
  if (auto it = q.groups.find(key); it != q.groups.end()) q.Offer(key, it->second);
  return {std::move(leased), seq};
}

void Broker::PolicyChanged(QueueState& q) {
  q.tokens_at = absl::InfinitePast();               // a new rate starts with a full bucket
  for (auto& [key, g] : q.groups) q.Offer(key, g);  // a larger per-key limit frees keys
}

LeasedJob Broker::LeaseOne(Job& job, const LeaseSpec& spec, absl::Time now, Transition& t) {
  // Ready since run_at (its enqueue, delay or backoff end, or its release).
  const absl::Duration waited = std::max(now - job.run_at, absl::ZeroDuration());
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
  observer_.Leased(job, waited);

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
  const int n = std::max(spec.max_jobs, 1);
  std::vector<LeasedJob> out;
  while (static_cast<int>(out.size()) < n && CanLease(q, now))
    out.push_back(LeaseNext(q, spec, now, t).first);
  return out;
}

void Broker::ServeConsumers(QueueState& q, absl::Time now, Transition& t, Effects& fx) {
  while (!q.consumers.empty() && CanLease(q, now)) {
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
    auto [leased, seq] = LeaseNext(q, spec, now, t);
    fx.pushes.push_back({c.sink, std::move(leased)});
    holders_[seq] = id;
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
      FreezeLocked();
      absl::Time now = clock_.Now();
      Transition t;
      ProcessDue(now, t, fx);
      QueueState& q = Queue(spec.queue);
      fx.Touch(q.policy);
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
      seq = CommitLocked(std::move(t), fx);
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

}  // namespace jobbroker
