#include "core/ids.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace jobbroker::core {

namespace {

constexpr char kAlphabet[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
constexpr int kJobIdLength = 26;

// The value of one character of kAlphabet; -1 for any other.
int DigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  for (int v = 10; v < 32; ++v)
    if (kAlphabet[v] == c) return v;
  return -1;
}

}  // namespace

std::string NewJobId(absl::Time now, absl::BitGen& gen) {
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

std::optional<PackedJobId> PackJobId(const std::string& id) {
  if (id.size() != kJobIdLength) return std::nullopt;
  // 130 bits, most significant first, shifted through a 128-bit accumulator: the first
  // character's top 2 bits must be zero or they would be lost.
  unsigned __int128 bits = 0;
  for (int i = 0; i < kJobIdLength; ++i) {
    const int v = DigitValue(id[i]);
    if (v < 0 || (i == 0 && v > 7)) return std::nullopt;
    bits = (bits << 5) | static_cast<unsigned>(v);
  }
  return PackedJobId{static_cast<uint64_t>(bits >> 64), static_cast<uint64_t>(bits)};
}

std::string UnpackJobId(PackedJobId packed) {
  unsigned __int128 bits = (static_cast<unsigned __int128>(packed.hi) << 64) | packed.lo;
  std::string id(kJobIdLength, '0');
  for (int i = kJobIdLength - 1; i >= 0; --i, bits >>= 5) id[i] = kAlphabet[bits & 31];
  return id;
}

absl::Time JobIdTime(PackedJobId packed) {
  return absl::FromUnixMillis(static_cast<int64_t>(packed.hi >> 16));
}

std::string NewLeaseId(int attempt, absl::BitGen& gen) {
  return absl::StrFormat("%d-%016x", attempt, absl::Uniform<uint64_t>(gen));
}

}  // namespace jobbroker::core
