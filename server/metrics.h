#pragma once

#include <vector>

#include "core/broker.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace jobbroker {

// Gauges read from the broker at scrape time (jobs by queue and state, oldest ready age), so
// they can never drift from the truth. `broker` is borrowed and must outlive the collector.
class BrokerCollector final : public prometheus::Collectable {
 public:
  explicit BrokerCollector(Broker& broker) : broker_(broker) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  Broker& broker_;
};

}  // namespace jobbroker
