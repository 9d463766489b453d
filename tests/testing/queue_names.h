#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "jobbroker/partition.h"

namespace jobbroker::testing {

// The first queue name "<prefix>-<n>" that lives in `partition` of `count` (the broker's
// placement, which the client computes the same way): for tests that need a queue in each
// partition.
inline std::string QueueInPartition(uint32_t partition, uint32_t count,
                                    const std::string& prefix = "q") {
  for (int i = 0;; ++i) {
    std::string queue = absl::StrCat(prefix, "-", i);
    if (client::PartitionOfQueue(queue, count) == partition) return queue;
  }
}

}  // namespace jobbroker::testing
