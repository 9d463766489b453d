// Broker: handing jobs out. Unary and long-poll Leases, Work streams, and the line of consumers
// each queue serves in turn.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/broker_mutation.h"
#include "core/ids.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker::core {

bool Broker::CanLeaseLocked(QueueState& q, absl::Time now) {
  // No lease while the store refuses writes: it could not be made durable.
  if (q.policy.paused || shutting_down_ || !WritableLocked()) return false;
  if (q.policy.max_concurrency > 0 && q.count(JobState::kActive) >= q.policy.max_concurrency)
    return false;
  if (q.policy.rate_limit.per_second > 0) {
    q.Refill(now);
    if (!q.has_token()) return false;
  }
  // Drop ring entries that went stale (their jobs were taken or their key filled up).
  while (!q.ring.empty()) {
    const std::string& key = q.ring.front();
    auto g = q.groups.find(key);
    if (g != q.groups.end() && !g->second.ready.empty() && q.HasRoom(key, g->second)) {
      // LeaseNextLocked takes this job: read it back now if it is cold. One that cannot be read
      // is dropped from the group, so look again.
      if (JobBySeqLocked(g->second.ready.begin()->second) != nullptr) return true;
      continue;
    }
    std::string stale = key;
    q.ring.pop_front();
    if (g != q.groups.end()) g->second.in_ring = false;
    q.MaybeForget(stale);
  }
  return false;
}

std::pair<LeasedJob, uint64_t> Broker::LeaseNextLocked(QueueState& q, const LeaseSpec& spec,
                                                       absl::Time now, Transition& t) {
  std::string key = std::move(q.ring.front());
  q.ring.pop_front();
  QueueState::Group& g = q.groups.at(key);
  g.in_ring = false;
  Job& job = *JobBySeqLocked(g.ready.begin()->second);  // hot: CanLeaseLocked read it back
  const uint64_t seq = job.seq;
  LeasedJob leased = LeaseOneLocked(q, job, spec, now, t);
  if (q.policy.rate_limit.per_second > 0) {
    q.TakeToken();
    deadlines_.Note(q.RefillTime());  // consumers left waiting are served when a token is back
  }
  // One job per turn: the key goes to the back of the ring if it may run more.
  if (auto it = q.groups.find(key); it != q.groups.end()) q.Offer(key, it->second);
  return {std::move(leased), seq};
}

LeasedJob Broker::LeaseOneLocked(QueueState& q, Job& job, const LeaseSpec& spec, absl::Time now,
                                 Transition& t) {
  // Ready since run_at (its enqueue, delay or backoff end, or its release).
  const absl::Duration waited = std::max(now - job.run_at, absl::ZeroDuration());
  UnindexLocked(job);
  job.state = JobState::kActive;
  ++job.attempt;
  job.lease_id = NewLeaseId(job.attempt, gen_);
  job.worker_id = spec.worker_id;
  if (spec.lease_duration > absl::ZeroDuration()) {
    job.lease_length = spec.lease_duration;
  } else if (job.lease_duration > absl::ZeroDuration()) {
    job.lease_length = job.lease_duration;
  } else {
    job.lease_length = q.policy.lease_duration;
  }
  job.lease_deadline = now + job.lease_length;
  const absl::Duration timeout =
      job.timeout > absl::ZeroDuration() ? job.timeout : q.policy.timeout;
  job.timeout_at = timeout > absl::ZeroDuration() ? now + timeout : absl::InfiniteFuture();
  job.attempts.push_back(AttemptRecord{job.attempt, spec.worker_id, now, absl::InfinitePast(),
                                       AttemptOutcome::kRunning, ""});
  if (job.attempts.size() > static_cast<size_t>(kMaxAttemptHistory))
    job.attempts.erase(job.attempts.begin());
  IndexLocked(job);
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
  leased.timeout_at = job.timeout_at;
  leased.dependency_results = job.dependency_results;
  return leased;
}

std::vector<LeasedJob> Broker::LeaseManyLocked(QueueState& q, const LeaseSpec& spec, absl::Time now,
                                               Transition& t) {
  const int n = std::max(spec.max_jobs, 1);
  std::vector<LeasedJob> out;
  while (static_cast<int>(out.size()) < n && CanLeaseLocked(q, now))
    out.push_back(LeaseNextLocked(q, spec, now, t).first);
  return out;
}

void Broker::ServeConsumersLocked(QueueState& q, absl::Time now, Transition& t, Effects& fx) {
  bool leased = false;
  while (!q.consumers.empty() && CanLeaseLocked(q, now)) {
    const uint64_t id = q.consumers.front();
    q.consumers.pop_front();
    Consumer& c = *consumers_.Find(id);
    if (!c.stream) {
      deadlines_.RemoveWaiter(c.deadline, id);
      fx.deliveries.push_back({std::move(c.done), LeaseManyLocked(q, c.spec, now, t)});
      consumers_.Erase(id);
      leased = true;
      continue;
    }
    c.enlisted.erase(q.name);
    if (!c.has_slot()) continue;
    // Out of line until the shared budget has room again (StreamCredit refills it).
    if (c.credit != nullptr && !c.credit->TryTake(c.credit_member)) continue;
    LeaseSpec spec{q.name, c.spec.worker_id, 1, c.spec.lease_duration};
    auto [job, seq] = LeaseNextLocked(q, spec, now, t);
    fx.pushes.push_back({c.sink, std::move(job)});
    consumers_.Hold(seq, id);
    ++c.in_flight;
    leased = true;
    if (c.has_slot()) {  // one job per turn: back of the line
      q.consumers.push_back(id);
      c.enlisted.insert(q.name);
    }
  }
  if (leased) fx.Touch(q.policy);  // a lease is as durable as its queue asks
}

void Broker::EnlistLocked(Consumer& stream, absl::Time now, Transition& t, Effects& fx) {
  for (const std::string& name : stream.queues) {
    if (!stream.has_slot()) return;
    if (!stream.enlisted.insert(name).second) continue;
    QueueState& q = queues_.Get(name);
    q.consumers.push_back(stream.id);
    ServeConsumersLocked(q, now, t, fx);
  }
}

void Broker::EndHoldLocked(const Job& job, bool lost, absl::Time now, Transition& t, Effects& fx) {
  Consumer* stream = consumers_.EndHold(job.seq);
  if (stream == nullptr) return;  // no stream held it, or the stream has ended since
  --stream->in_flight;
  if (stream->credit != nullptr && stream->credit->Give()) fx.refills.push_back(stream->credit);
  if (lost) {
    AttemptOutcome why =
        job.attempts.empty() ? AttemptOutcome::kLeaseExpired : job.attempts.back().outcome;
    fx.lost.push_back({stream->sink, job.id, why});
  }
  EnlistLocked(*stream, now, t, fx);
}

void Broker::DelistLocked(Consumer& c) {
  auto leave = [&](const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    QueueState& q = queues_.Get(name);
    q.consumers.erase(std::find(q.consumers.begin(), q.consumers.end(), c.id));
  };
  if (c.stream) {
    for (const std::string& name : c.enlisted) leave(name);
    c.enlisted.clear();
  } else {
    leave(c.spec.queue);
    deadlines_.RemoveWaiter(c.deadline, c.id);
  }
}

uint64_t Broker::Lease(LeaseSpec spec, absl::Duration wait, LeaseDone done) {
  if (absl::Status valid = ValidateLease(spec, wait); !valid.ok()) {
    done(valid);
    return 0;
  }
  Effects fx;
  uint64_t commit = 0;
  uint64_t waiter_id = 0;
  std::vector<LeasedJob> jobs;
  absl::Status refused = Mutate(
      fx, commit,
      [&](absl::Time now, Transition& t, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        QueueState& q = queues_.Get(spec.queue);
        effects.Touch(q.policy);
        // Jobs still leasable here found no consumer with room in
        // line (ServeConsumersLocked runs whenever jobs become
        // leasable), so taking them directly is fair.
        recent_workers_.Leased(spec.worker_id, spec.queue, spec.origin, now);
        jobs = LeaseManyLocked(q, spec, now, t);
        if (jobs.empty() && wait > absl::ZeroDuration()) {
          Consumer& w = consumers_.Add(/*stream=*/false);
          waiter_id = w.id;
          w.spec = std::move(spec);
          w.deadline = now + wait;
          w.since = now;
          w.done = std::move(done);
          deadlines_.AddWaiter(w.deadline, w.id);
          q.consumers.push_back(w.id);
        }
        return absl::OkStatus();
      });
  if (waiter_id != 0) {
    Finish(commit, std::move(fx), nullptr);  // the waiter's own answer comes later
    return waiter_id;
  }
  absl::StatusOr<std::vector<LeasedJob>> result = std::move(jobs);
  if (!refused.ok()) result = refused;
  Reply<std::vector<LeasedJob>>(commit, std::move(fx), std::move(done), std::move(result));
  return 0;
}

bool Broker::CancelWait(uint64_t waiter) {
  LeaseDone done;
  {
    absl::MutexLock lock(&mu_);
    Consumer* c = consumers_.Find(waiter);
    if (c == nullptr || c->stream) return false;
    DelistLocked(*c);
    done = std::move(c->done);
    consumers_.Erase(waiter);
  }
  done(absl::CancelledError("the lease request was cancelled"));
  return true;
}

absl::StatusOr<uint64_t> Broker::Subscribe(SubscribeSpec spec, std::shared_ptr<StreamSink> sink) {
  BROKER_RETURN_IF_ERROR(ValidateSubscribeSpec(spec));
  Effects fx;
  uint64_t commit = 0;
  uint64_t id = 0;
  BROKER_RETURN_IF_ERROR(Mutate(fx, commit,
                                [&](absl::Time now, Transition& t, Effects& effects)
                                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                      Consumer& stream = consumers_.Add(/*stream=*/true);
                                      id = stream.id;
                                      recent_workers_.Leased(spec.worker_id, "", spec.origin, now);
                                      stream.spec.origin = std::move(spec.origin);
                                      stream.spec.worker_id = std::move(spec.worker_id);
                                      stream.spec.lease_duration = spec.lease_duration;
                                      stream.queues = std::move(spec.queues);
                                      stream.max_in_flight = std::max(spec.max_in_flight, 1);
                                      stream.sink = std::move(sink);
                                      stream.credit = std::move(spec.credit);
                                      stream.credit_member = spec.credit_member;
                                      stream.since = now;
                                      EnlistLocked(stream, now, t, effects);
                                      return absl::OkStatus();
                                    }));
  Finish(commit, std::move(fx), nullptr);
  return id;
}

absl::Status Broker::SetFlow(uint64_t stream, int max_in_flight) {
  BROKER_RETURN_IF_ERROR(ValidateMaxInFlight(max_in_flight));
  Effects fx;
  uint64_t commit = 0;
  absl::Status status = Mutate(
      fx, commit,
      [&](absl::Time now, Transition& t, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        Consumer* c = consumers_.Find(stream);
        if (c == nullptr || !c->stream) return absl::NotFoundError("the stream has not subscribed");
        c->max_in_flight = max_in_flight;
        if (!c->has_slot()) {
          DelistLocked(*c);  // drained or full: out of every line until a slot frees
        } else {
          EnlistLocked(*c, now, t, effects);
        }
        return absl::OkStatus();
      });
  Finish(commit, std::move(fx), nullptr);
  return status;
}

void Broker::RefillStream(uint64_t stream) {
  Effects fx;
  uint64_t commit = 0;
  absl::Status status = Mutate(fx, commit,
                               [&](absl::Time now, Transition& t, Effects& effects)
                                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                     Consumer* c = consumers_.Find(stream);
                                     if (c == nullptr || !c->stream)
                                       return absl::NotFoundError("the stream has not subscribed");
                                     EnlistLocked(*c, now, t, effects);
                                     return absl::OkStatus();
                                   });
  Finish(commit, std::move(fx), nullptr);
  status.IgnoreError();  // a stream that ended meanwhile needs nothing
}

void Broker::Unsubscribe(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  Consumer* c = consumers_.Find(stream);
  if (c == nullptr || !c->stream) return;
  DelistLocked(*c);
  consumers_.Erase(stream);
}

}  // namespace jobbroker::core
