#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace jobbroker::core {

// Partitions a job id can name: 15 bits, three characters of the id.
inline constexpr uint32_t kMaxPartitions = uint32_t{1} << 15;

// A job id: 26 characters of Crockford base32 (the ULID alphabet and length): 10 characters of
// millisecond timestamp (48 bits), 3 of the partition the job lives in (15 bits), then 13 of
// randomness (65 bits). Unique across restarts and wiped data directories, which matters
// because the job id is the idempotency key that workers hand to side effects' providers. The
// partition makes Ack, Heartbeat and GetJob routable without a lookup; jobs of one partition
// share characters 11-13, which helps when reading logs. `partition` < kMaxPartitions.
std::string NewJobId(absl::Time now, uint32_t partition, absl::BitGen& gen);

// A job id of NewJobId's form in 16 bytes, for indexes that hold millions of ids: the 26
// characters carry 130 bits, the top 2 always zero.
struct PackedJobId {
  uint64_t hi = 0;  // 48 bits of time, 15 of partition, then the top random bit
  uint64_t lo = 0;  // the other 64 random bits
  bool operator==(const PackedJobId&) const = default;
};
// nullopt unless `id` is exactly what NewJobId writes (26 characters of its alphabet, the first
// at most '7'), so that UnpackJobId gives `id` back.
std::optional<PackedJobId> PackJobId(const std::string& id);
std::string UnpackJobId(PackedJobId packed);
// When the job was created, to the millisecond: NewJobId's first 48 bits.
absl::Time JobIdTime(PackedJobId packed);
// The partition field of the id (what NewJobId was given). Ids written before partitions existed
// (store format 1) hold random bits there; such ids only live in stores of one partition, which
// is why routing takes this field modulo the partition count (PartitionOfJobId).
uint32_t JobIdPartition(PackedJobId packed);

// The partition of `queue` among `count`: FNV-1a (64 bits) of its name modulo `count`. Stable
// across builds and languages (clients may route by it; docs/architecture.md, "Partitions"),
// and fixed for a store once created, so every policy, dedup key and limit of a queue lives in
// one partition.
uint32_t PartitionOfQueue(std::string_view queue, uint32_t count);
// The partition the job `id` lives in among `count`; nullopt unless `id` is of NewJobId's form.
std::optional<uint32_t> PartitionOfJobId(const std::string& id, uint32_t count);

// A lease id: "<attempt>-<16 hex digits>". Random, so a lease of a restarted broker never
// matches one handed out before.
std::string NewLeaseId(int attempt, absl::BitGen& gen);

}  // namespace jobbroker::core
