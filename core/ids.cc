#include "core/ids.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace jobbroker {

std::string NewJobId(absl::Time now, absl::BitGen& gen) {
  static constexpr char kAlphabet[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  uint64_t ms = static_cast<uint64_t>(absl::ToUnixMillis(now)) & ((uint64_t{1} << 48) - 1);
  uint64_t hi = absl::Uniform<uint64_t>(gen) & ((uint64_t{1} << 40) - 1);
  uint64_t lo = absl::Uniform<uint64_t>(gen) & ((uint64_t{1} << 40) - 1);
  std::string id(26, '0');
  // 10 characters of time (50 bits, top 2 zero), then 8 + 8 characters of randomness.
  for (int i = 9; i >= 0; --i, ms >>= 5) id[i] = kAlphabet[ms & 31];
  for (int i = 17; i >= 10; --i, hi >>= 5) id[i] = kAlphabet[hi & 31];
  for (int i = 25; i >= 18; --i, lo >>= 5) id[i] = kAlphabet[lo & 31];
  return id;
}

std::string NewLeaseId(int attempt, absl::BitGen& gen) {
  return absl::StrFormat("%d-%016x", attempt, absl::Uniform<uint64_t>(gen));
}

}  // namespace jobbroker
