#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace jobbroker::core {

// A job id: 26 characters of Crockford base32, a 48-bit millisecond timestamp then 80 random
// bits (the ULID layout). Unique across restarts and wiped data directories, which matters
// because the job id is the idempotency key that workers hand to side effects' providers.
std::string NewJobId(absl::Time now, absl::BitGen& gen);

// A job id of NewJobId's form in 16 bytes, for indexes that hold millions of ids: the 26
// characters carry 130 bits, the top 2 always zero.
struct PackedJobId {
  uint64_t hi = 0;  // 48 bits of time, then the top 16 random bits
  uint64_t lo = 0;  // the other 64 random bits
  bool operator==(const PackedJobId&) const = default;
};
// nullopt unless `id` is exactly what NewJobId writes (26 characters of its alphabet, the first
// at most '7'), so that UnpackJobId gives `id` back.
std::optional<PackedJobId> PackJobId(const std::string& id);
std::string UnpackJobId(PackedJobId packed);
// When the job was created, to the millisecond: NewJobId's first 48 bits.
absl::Time JobIdTime(PackedJobId packed);

// A lease id: "<attempt>-<16 hex digits>". Random, so a lease of a restarted broker never
// matches one handed out before.
std::string NewLeaseId(int attempt, absl::BitGen& gen);

}  // namespace jobbroker::core
