#pragma once

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace jobbroker::server {

// The standard process_* metrics (CPU seconds, resident memory, open file descriptors, start
// time), read from /proc/self at scrape time. prometheus-cpp 1.0 has no such collector.
class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace jobbroker::server
