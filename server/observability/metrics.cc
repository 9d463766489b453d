#include "server/observability/metrics.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"

namespace jobbroker::server {

prometheus::MetricFamily GaugeFamily(const char* name, const char* help) {
  return prometheus::MetricFamily{name, help, prometheus::MetricType::Gauge, {}};
}

void AddGauge(prometheus::MetricFamily& family, std::vector<prometheus::ClientMetric::Label> labels,
              double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  family.metric.push_back(std::move(m));
}

std::vector<prometheus::MetricFamily> FunctionGauges::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  for (const Gauge& g : gauges_) {
    prometheus::MetricFamily f{g.name, g.help, g.type, {}};
    prometheus::ClientMetric m;
    if (g.type == prometheus::MetricType::Counter) {
      m.counter.value = g.value();
    } else {
      m.gauge.value = g.value();
    }
    f.metric.push_back(std::move(m));
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<prometheus::MetricFamily> BrokerCollector::Collect() const {
  const auto family = GaugeFamily;
  prometheus::MetricFamily jobs = family("jobbroker_jobs", "Jobs by queue and state.");
  prometheus::MetricFamily age =
      family("jobbroker_oldest_ready_age_seconds",
             "Age of the oldest READY job of each queue (0 when none): workers missing or too few "
             "when it grows.");
  prometheus::MetricFamily waiting =
      family("jobbroker_waiting_leases",
             "Idle capacity waiting for jobs: long-poll Leases and Work streams with a free slot.");
  prometheus::MetricFamily active = family("jobbroker_active_leases", "Jobs leased right now.");
  prometheus::MetricFamily dead = family("jobbroker_dead_jobs", "Jobs in the dead (FAILED) set.");
  const auto gauge = AddGauge;
  // By label, in the broker's queue order (the queue's own name, or the shared "(other)").
  struct Sums {
    std::map<core::JobState, int64_t> counts;
    absl::Duration oldest_ready_age = absl::ZeroDuration();
    int64_t waiting_leases = 0;
  };
  std::vector<std::pair<std::string, Sums>> queues;
  absl::flat_hash_map<std::string, size_t> index;
  for (const core::QueueInfo& q : broker_.ListQueues()) {
    std::string label = labels_.For(q.name);
    auto [it, added] = index.emplace(label, queues.size());
    if (added) queues.emplace_back(std::move(label), Sums{});
    Sums& sums = queues[it->second].second;
    for (const auto& [state, n] : q.counts) sums.counts[state] += n;
    sums.oldest_ready_age = std::max(sums.oldest_ready_age, q.oldest_ready_age);
    sums.waiting_leases += q.waiting_leases;
  }
  for (const auto& [label, q] : queues) {
    for (const auto& [state, n] : q.counts) {
      // "JOB_STATE_READY" -> "ready"
      std::string name = absl::AsciiStrToLower(std::string(core::JobStateName(state)).substr(10));
      gauge(jobs, {{"queue", label}, {"state", name}}, static_cast<double>(n));
    }
    gauge(age, {{"queue", label}}, absl::ToDoubleSeconds(q.oldest_ready_age));
    gauge(waiting, {{"queue", label}}, static_cast<double>(q.waiting_leases));
    gauge(active, {{"queue", label}}, static_cast<double>(q.counts.at(core::JobState::kActive)));
    gauge(dead, {{"queue", label}}, static_cast<double>(q.counts.at(core::JobState::kFailed)));
  }
  prometheus::MetricFamily writes{"jobbroker_store_writes_total",
                                  "Synced store writes (one per group commit).",
                                  prometheus::MetricType::Counter,
                                  {}};
  prometheus::ClientMetric w;
  w.counter.value = static_cast<double>(broker_.store_writes());
  writes.metric.push_back(std::move(w));
  prometheus::MetricFamily writable =
      family("jobbroker_storage_writable",
             "1 while the store takes writes; 0 while a store failure (disk full, I/O error) makes "
             "the broker refuse every change.");
  gauge(writable, {}, broker_.storage_status().ok() ? 1 : 0);
  prometheus::MetricFamily corrupt =
      family("jobbroker_corrupt_records",
             "Stored records the last recovery skipped because they do not decode.");
  gauge(corrupt, {}, static_cast<double>(broker_.corrupt_records()));
  prometheus::MetricFamily memory =
      family("jobbroker_jobs_in_memory",
             "Jobs held in memory, by form: whole, or (waiting jobs past --max-hot-jobs) as index "
             "entries only, read back from the store when leased.");
  const core::Broker::MemoryCounts held = broker_.memory_counts();
  gauge(memory, {{"form", "whole"}}, static_cast<double>(held.hot_jobs));
  gauge(memory, {{"form", "index_only"}}, static_cast<double>(held.cold_jobs));
  std::vector<prometheus::MetricFamily> out;
  for (auto* f : {&jobs, &age, &waiting, &active, &dead, &writes, &writable, &corrupt, &memory})
    out.push_back(std::move(*f));
  return out;
}

}  // namespace jobbroker::server
