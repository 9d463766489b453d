#pragma once

#include <functional>
#include <string>
#include <vector>

#include "node/partitions.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/observability/queue_labels.h"

namespace jobbroker::server {

// A gauge family a collector fills at scrape time, and one sample of it.
prometheus::MetricFamily GaugeFamily(const char* name, const char* help);
void AddGauge(prometheus::MetricFamily& family, std::vector<prometheus::ClientMetric::Label> labels,
              double value);

// Gauges computed at scrape time by the given functions (e.g. storage estimates); also counters
// kept outside the registry (a count that must outlive it), typed as counters.
class FunctionGauges final : public prometheus::Collectable {
 public:
  struct Gauge {
    std::string name;
    std::string help;
    std::function<double()> value;
    prometheus::MetricType type = prometheus::MetricType::Gauge;  // or Counter
  };
  explicit FunctionGauges(std::vector<Gauge> gauges) : gauges_(std::move(gauges)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::vector<Gauge> gauges_;
};

// Gauges read from the broker at scrape time (jobs by queue and state, oldest ready age), so
// they can never drift from the truth. Queues past `labels`' limit are summed into one series
// labelled QueueLabels::kOtherQueues (their oldest ready age: the oldest of them). `broker` and
// `labels` are borrowed and must outlive the collector.
class BrokerCollector final : public prometheus::Collectable {
 public:
  BrokerCollector(node::Partitions& broker, QueueLabels& labels)
      : broker_(broker), labels_(labels) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  node::Partitions& broker_;
  QueueLabels& labels_;
};

}  // namespace jobbroker::server
