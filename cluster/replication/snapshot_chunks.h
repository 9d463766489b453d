#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/store.h"

namespace jobbroker::cluster {

// The records of `partition` in `state` (policies, dedup entries, jobs, in the store's order), cut
// into Transitions of puts of at most `records_per_chunk` records each (at least 1): what a
// ReplicaStorage's SnapshotChunks returns. Records that do not decode are left out; the store's
// own Recover has already reported them. Errors as Store::Recover.
absl::StatusOr<std::vector<core::Transition>> CutSnapshotChunks(core::Store& state,
                                                                uint32_t partition,
                                                                size_t records_per_chunk);

}  // namespace jobbroker::cluster
