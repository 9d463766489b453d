#pragma once

#include <string>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace jobbroker {

// A job id: 26 characters of Crockford base32, a 48-bit millisecond timestamp then 80 random
// bits (the ULID layout). Unique across restarts and wiped data directories, which matters
// because the job id is the idempotency key that workers hand to side effects' providers.
std::string NewJobId(absl::Time now, absl::BitGen& gen);

// A lease id: "<attempt>-<16 hex digits>". Random, so a lease of a restarted broker never
// matches one handed out before.
std::string NewLeaseId(int attempt, absl::BitGen& gen);

}  // namespace jobbroker
