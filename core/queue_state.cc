#include "core/queue_state.h"

#include <algorithm>

namespace jobbroker::core {

void QueueState::Index(const Job& job) {
  ++counts_[static_cast<int>(job.state)];
  switch (job.state) {
    case JobState::kReady: {
      Group& g = groups[job.concurrency_key];
      g.ready.emplace(-static_cast<int64_t>(job.priority), job.seq);
      Offer(job.concurrency_key, g);
      ready_by_seq.insert(job.seq);
      break;
    }
    case JobState::kScheduled:
    case JobState::kWaiting:
      break;
    case JobState::kActive:
      ++groups[job.concurrency_key].active;
      break;
    case JobState::kCompleted:
      completed.emplace(job.completed_at, job.seq);
      break;
    case JobState::kFailed:
    case JobState::kCancelled:
      dead.emplace(job.completed_at, job.seq);
      break;
  }
}

void QueueState::Unindex(const Job& job) {
  --counts_[static_cast<int>(job.state)];
  switch (job.state) {
    case JobState::kReady:
      groups[job.concurrency_key].ready.erase({-static_cast<int64_t>(job.priority), job.seq});
      MaybeForget(job.concurrency_key);
      ready_by_seq.erase(job.seq);
      break;
    case JobState::kScheduled:
    case JobState::kWaiting:
      break;
    case JobState::kActive: {
      Group& g = groups[job.concurrency_key];
      --g.active;
      Offer(job.concurrency_key, g);  // its key may start another job now
      MaybeForget(job.concurrency_key);
      break;
    }
    case JobState::kCompleted:
      if (completed.erase({job.completed_at, job.seq}) == 0)
        held_for_dependents.erase({job.completed_at, job.seq});
      break;
    case JobState::kFailed:
    case JobState::kCancelled:
      dead.erase({job.completed_at, job.seq});
      break;
  }
}

JobState QueueState::DropWaiting(uint64_t seq) {
  all.erase(seq);
  if (ready_by_seq.erase(seq) == 0) {
    --counts_[static_cast<int>(JobState::kScheduled)];
    return JobState::kScheduled;
  }
  --counts_[static_cast<int>(JobState::kReady)];
  for (auto& [key, g] : groups) {
    auto it = std::find_if(g.ready.begin(), g.ready.end(),
                           [seq](const auto& entry) { return entry.second == seq; });
    if (it == g.ready.end()) continue;
    g.ready.erase(it);
    MaybeForget(std::string(key));
    break;
  }
  return JobState::kReady;
}

void QueueState::Offer(const std::string& key, Group& g) {
  if (g.in_ring || g.ready.empty() || !HasRoom(key, g)) return;
  g.in_ring = true;
  ring.push_back(key);
}

void QueueState::MaybeForget(const std::string& key) {
  auto it = groups.find(key);
  if (it != groups.end() && it->second.ready.empty() && it->second.active == 0 &&
      !it->second.in_ring)
    groups.erase(it);
}

void QueueState::Refill(absl::Time now) {
  const RateLimit& r = policy.rate_limit;
  if (r.per_second <= 0) return;
  // Without a burst, up to one second's worth (at least one lease) may go at once.
  const double cap = r.burst > 0 ? r.burst : std::max(1.0, r.per_second);
  if (tokens_at_ == absl::InfinitePast()) {
    tokens_ = cap;
  } else if (now > tokens_at_) {
    tokens_ = std::min(cap, tokens_ + absl::ToDoubleSeconds(now - tokens_at_) * r.per_second);
  }
  tokens_at_ = now;
}

absl::Time QueueState::RefillTime() const {
  const double rate = policy.rate_limit.per_second;
  if (rate <= 0 || tokens_ >= 1 || consumers.empty() || count(JobState::kReady) == 0)
    return absl::InfiniteFuture();
  return tokens_at_ + absl::Seconds((1 - tokens_) / rate);
}

void QueueState::PolicyChanged() {
  tokens_at_ = absl::InfinitePast();            // a new rate starts with a full bucket
  for (auto& [key, g] : groups) Offer(key, g);  // a larger per-key limit frees keys
}

bool QueueState::OverRetentionCount() const {
  const Retention& c = policy.completed_retention;
  const Retention& f = policy.failed_retention;
  return (c.max_count > 0 && static_cast<int64_t>(completed.size()) > c.max_count) ||
         (f.max_count > 0 && static_cast<int64_t>(dead.size()) > f.max_count);
}

absl::Time QueueState::NextRetentionAge() const {
  absl::Time next = absl::InfiniteFuture();
  const absl::Duration completed_age = policy.completed_retention.max_age;
  const absl::Duration failed_age = policy.failed_retention.max_age;
  if (!completed.empty() && completed_age > absl::ZeroDuration())
    next = std::min(next, completed.begin()->first + completed_age);
  if (!dead.empty() && failed_age > absl::ZeroDuration())
    next = std::min(next, dead.begin()->first + failed_age);
  return next;
}

}  // namespace jobbroker::core
