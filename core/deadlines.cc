#include "core/deadlines.h"

#include <algorithm>

namespace jobbroker::core {

void Deadlines::AddScheduled(absl::Time run_at, uint64_t seq) {
  scheduled_.emplace(run_at, seq);
  Note(run_at);
}

void Deadlines::DropScheduled(uint64_t seq) {
  auto it = std::find_if(scheduled_.begin(), scheduled_.end(),
                         [seq](const TimeKey& entry) { return entry.second == seq; });
  if (it != scheduled_.end()) scheduled_.erase(it);
  auto expiry = std::find_if(expiries_.begin(), expiries_.end(),
                             [seq](const TimeKey& entry) { return entry.second == seq; });
  if (expiry != expiries_.end()) expiries_.erase(expiry);
}

void Deadlines::AddExpiry(absl::Time expire_at, uint64_t seq) {
  expiries_.emplace(expire_at, seq);
  Note(expire_at);
}

void Deadlines::AddLease(absl::Time deadline, uint64_t seq) {
  leases_.emplace(deadline, seq);
  Note(deadline);
}

void Deadlines::AddWaiter(absl::Time deadline, uint64_t consumer) {
  waiters_.emplace(deadline, consumer);
  Note(deadline);
}

absl::Time Deadlines::Earliest(bool jobs) const {
  absl::Time next = waiters_.empty() ? absl::InfiniteFuture() : waiters_.begin()->first;
  if (!jobs) return next;
  if (!leases_.empty()) next = std::min(next, leases_.begin()->first);
  if (!scheduled_.empty()) next = std::min(next, scheduled_.begin()->first);
  if (!expiries_.empty()) next = std::min(next, expiries_.begin()->first);
  return next;
}

void Deadlines::ClearJobs() {
  scheduled_.clear();
  leases_.clear();
  expiries_.clear();
}

}  // namespace jobbroker::core
