#include "tests/testing/faulty_store.h"

#include <utility>

namespace jobbroker::testing {

absl::Status FaultyStore::Write(absl::Span<const core::Transition> transitions) {
  // Held across the inner write, so that the budget and the count follow the order of writes.
  absl::MutexLock lock(&mu_);
  if (writes_before_failure_ == 0) return injected_failure_;
  absl::Status written = memory_.Write(transitions);
  if (!written.ok()) return written;
  if (writes_before_failure_ > 0) --writes_before_failure_;
  ++successful_writes_;
  return absl::OkStatus();
}

absl::Status FaultyStore::Resume() {
  absl::MutexLock lock(&mu_);
  ++resume_calls_;
  if (writes_before_failure_ == 0) return injected_failure_;
  return memory_.Resume();
}

absl::Status FaultyStore::Recover(uint32_t partition, core::RecoveryVisitor& visitor) {
  {
    absl::MutexLock lock(&mu_);
    if (!recover_failure_.ok()) return recover_failure_;
  }
  return memory_.Recover(partition, visitor);  // without mu_: the visitor may take its time
}

void FaultyStore::FailRecoveries(absl::Status error) {
  absl::MutexLock lock(&mu_);
  recover_failure_ = std::move(error);
}

void FaultyStore::FailWritesAfter(int n, absl::Status error) {
  absl::MutexLock lock(&mu_);
  writes_before_failure_ = n < 0 ? -1 : n;
  injected_failure_ = std::move(error);
}

int64_t FaultyStore::successful_writes() const {
  absl::MutexLock lock(&mu_);
  return successful_writes_;
}

int64_t FaultyStore::resume_calls() const {
  absl::MutexLock lock(&mu_);
  return resume_calls_;
}

}  // namespace jobbroker::testing
