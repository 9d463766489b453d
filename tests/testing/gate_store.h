#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/job.h"
#include "core/store.h"
#include "storage/memory_store.h"

namespace jobbroker::testing {

// A MemoryStore whose writes wait while it is closed, so a test can look at the broker while a
// transition is appended but not yet in the store. Thread-safe.
class GateStore final : public core::Store {
 public:
  absl::Status Write(absl::Span<const core::Transition> t) override {
    absl::MutexLock lock(&mu_);
    ++entered_;
    mu_.Await(absl::Condition(&open_));
    return inner_.Write(t);
  }
  absl::StatusOr<core::Job> ReadJob(uint32_t partition, const std::string& id) override {
    return inner_.ReadJob(partition, id);
  }
  absl::Status Recover(uint32_t partition, core::RecoveryVisitor& v) override {
    return inner_.Recover(partition, v);
  }
  absl::Status Resume() override { return inner_.Resume(); }

  void SetOpen(bool open) {
    absl::MutexLock lock(&mu_);
    open_ = open;
  }
  // Waits until the writer has entered `n` writes in all.
  void AwaitEntered(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entered_ >= n; };
    mu_.Await(absl::Condition(&reached));
  }
  int entered() {
    absl::MutexLock lock(&mu_);
    return entered_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  storage::MemoryStore inner_;
};

}  // namespace jobbroker::testing
