#pragma once

#include <cstddef>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace jobbroker::server {

// Which queues get a `queue` label of their own in /metrics. A queue costs about 60 series
// (counters, two histograms, gauges by state); with 10,000 queues (one per tenant, say) a scrape
// was 54 MB and took 0.9 s, and the series held 200 MB (docs/performance.md). So the first
// `max_queues` queues seen keep their name, and any later one is counted under kOtherQueues, a
// value no queue name can take. 0 means no limit. Thread-safe; the set only grows, so a queue's
// label never changes while the process runs.
class QueueLabels {
 public:
  static constexpr char kOtherQueues[] = "(other)";  // parentheses: never a valid queue name

  explicit QueueLabels(size_t max_queues) : max_queues_(max_queues) {}

  // `queue`, or kOtherQueues once max_queues other queues have their own label.
  std::string For(const std::string& queue);

 private:
  const size_t max_queues_;
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> labelled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::server
