#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace jobbroker {

// Source of the current time. Injected everywhere so that lease expiry, backoff and TTLs are
// tested by advancing a FakeClock instead of sleeping. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The wall clock, cut to whole microseconds: the store keeps times in microseconds, so a time
// read back after a restart equals the one the broker held before it.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::FromUnixMicros(absl::ToUnixMicros(absl::Now())); }
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
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

}  // namespace jobbroker
