#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace jobbroker::core {

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

// tests/testing/fake_clock.h has a clock that moves only when told to.

}  // namespace jobbroker::core
