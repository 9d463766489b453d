#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace jobbroker::testing {

// A clock that moves only when told to, so tests of leases, backoff and TTLs advance time
// instead of sleeping. Thread-safe.
class FakeClock final : public core::Clock {
 public:
  explicit FakeClock(absl::Time start) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

// A clock that moves `step` each time it is read: a recovery, which reads it between chunks of
// jobs, sees time pass as a long restart would (and reports its progress). Thread-safe.
class TickingClock final : public core::Clock {
 public:
  explicit TickingClock(absl::Time start, absl::Duration step = absl::Seconds(2))
      : now_(start), step_(step) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    now_ += step_;
    return now_;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
  const absl::Duration step_;
};

}  // namespace jobbroker::testing
