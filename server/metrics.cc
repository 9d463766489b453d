#include "server/metrics.h"

#include <string>

#include "absl/strings/ascii.h"

namespace jobbroker {

std::vector<prometheus::MetricFamily> BrokerCollector::Collect() const {
  prometheus::MetricFamily jobs{
      "jobbroker_jobs", "Jobs by queue and state.", prometheus::MetricType::Gauge, {}};
  prometheus::MetricFamily age{"jobbroker_oldest_ready_age_seconds",
                               "Age of the oldest READY job of each queue (0 when none).",
                               prometheus::MetricType::Gauge,
                               {}};
  prometheus::MetricFamily waiting{"jobbroker_waiting_leases",
                                   "Long-poll Leases waiting for a job (idle workers).",
                                   prometheus::MetricType::Gauge,
                                   {}};
  for (const QueueInfo& q : broker_.ListQueues()) {
    for (const auto& [state, n] : q.counts) {
      prometheus::ClientMetric m;
      // "JOB_STATE_READY" -> "ready"
      std::string name = absl::AsciiStrToLower(std::string(JobStateName(state)).substr(10));
      m.label = {{"queue", q.name}, {"state", name}};
      m.gauge.value = static_cast<double>(n);
      jobs.metric.push_back(std::move(m));
    }
    prometheus::ClientMetric m;
    m.label = {{"queue", q.name}};
    m.gauge.value = absl::ToDoubleSeconds(q.oldest_ready_age);
    age.metric.push_back(std::move(m));
    m.gauge.value = static_cast<double>(q.waiting_leases);
    waiting.metric.push_back(std::move(m));
  }
  prometheus::MetricFamily writes{"jobbroker_store_writes_total",
                                  "Synced store writes (one per group commit).",
                                  prometheus::MetricType::Counter,
                                  {}};
  prometheus::ClientMetric w;
  w.counter.value = static_cast<double>(broker_.store_writes());
  writes.metric.push_back(std::move(w));
  return {std::move(jobs), std::move(age), std::move(waiting), std::move(writes)};
}

}  // namespace jobbroker
