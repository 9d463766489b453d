#include "jobbroker/partition.h"

namespace jobbroker::client {
namespace {

constexpr size_t kJobIdChars = 26;
// Characters [10, 13) of a job id hold its partition, 5 bits each, most significant first.
constexpr size_t kPartitionFirstChar = 10;
constexpr size_t kPartitionChars = 3;

// The 5-bit value of a Crockford base32 digit as the broker writes it (upper case; no I, L, O,
// U), or -1.
int Base32Value(char c) {
  static constexpr std::string_view kDigits = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  const size_t at = kDigits.find(c);
  return at == std::string_view::npos ? -1 : static_cast<int>(at);
}

}  // namespace

uint32_t PartitionOfQueue(std::string_view queue, uint32_t count) {
  if (count <= 1) return 0;
  constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ull;
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t hash = kOffsetBasis;
  for (const char c : queue) {
    hash = (hash ^ static_cast<uint8_t>(c)) * kPrime;
  }
  return static_cast<uint32_t>(hash % count);
}

std::optional<uint32_t> PartitionOfJobId(std::string_view job_id, uint32_t count) {
  if (job_id.size() != kJobIdChars) return std::nullopt;
  uint32_t field = 0;
  for (size_t i = 0; i < job_id.size(); ++i) {
    const int value = Base32Value(job_id[i]);
    // 26 characters carry 130 bits of which the top 2 are zero: the first digit is below 8.
    if (value < 0 || (i == 0 && value >= 8)) return std::nullopt;
    if (i >= kPartitionFirstChar && i < kPartitionFirstChar + kPartitionChars) {
      field = (field << 5) | static_cast<uint32_t>(value);
    }
  }
  if (count <= 1) return 0;
  return field % count;
}

}  // namespace jobbroker::client
