#include "core/ids.h"

#include <array>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace jobbroker::core {

namespace {

constexpr char kAlphabet[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
constexpr int kJobIdLength = 26;

// The value of each byte as a character of kAlphabet; -1 for any other. A table, because
// recovery packs every cold job's id (a scan of the alphabet per character was 9% of a restart).
constexpr std::array<int8_t, 256> kDigitValues = [] {
  std::array<int8_t, 256> values{};
  values.fill(-1);
  for (int v = 0; v < 32; ++v)
    values[static_cast<unsigned char>(kAlphabet[v])] = static_cast<int8_t>(v);
  return values;
}();

int DigitValue(char c) { return kDigitValues[static_cast<unsigned char>(c)]; }

}  // namespace

std::string NewJobId(absl::Time now, uint32_t partition, absl::BitGen& gen) {
  uint64_t ms = static_cast<uint64_t>(absl::ToUnixMillis(now)) & ((uint64_t{1} << 48) - 1);
  uint64_t part = partition & (kMaxPartitions - 1);
  uint64_t hi = absl::Uniform<uint64_t>(gen) & ((uint64_t{1} << 25) - 1);
  uint64_t lo = absl::Uniform<uint64_t>(gen) & ((uint64_t{1} << 40) - 1);
  std::string id(26, '0');
  // 10 characters of time (50 bits, top 2 zero), 3 of partition, then 5 + 8 of randomness.
  for (int i = 9; i >= 0; --i, ms >>= 5) id[i] = kAlphabet[ms & 31];
  for (int i = 12; i >= 10; --i, part >>= 5) id[i] = kAlphabet[part & 31];
  for (int i = 17; i >= 13; --i, hi >>= 5) id[i] = kAlphabet[hi & 31];
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

uint32_t JobIdPartition(PackedJobId packed) {
  // Bits 79..65 of the 130 (hi holds bits 127..64).
  return static_cast<uint32_t>(packed.hi >> 1) & (kMaxPartitions - 1);
}

uint32_t PartitionOfQueue(std::string_view queue, uint32_t count) {
  if (count <= 1) return 0;
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits
  for (unsigned char c : queue) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return static_cast<uint32_t>(hash % count);
}

std::optional<uint32_t> PartitionOfJobId(const std::string& id, uint32_t count) {
  std::optional<PackedJobId> packed = PackJobId(id);
  if (!packed.has_value()) return std::nullopt;
  if (count <= 1) return 0;
  return JobIdPartition(*packed) % count;
}

std::string NewLeaseId(int attempt, absl::BitGen& gen) {
  return absl::StrFormat("%d-%016x", attempt, absl::Uniform<uint64_t>(gen));
}

}  // namespace jobbroker::core
