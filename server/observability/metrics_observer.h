#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "core/observer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/observability/queue_labels.h"

namespace jobbroker::server {

// Counts and times the broker's work in a prometheus-cpp registry: jobs enqueued,
// deduplicated, leased, attempts by outcome, retries, deaths by reason, cancels, releases;
// schedule-to-start and run-time histograms per queue; WAL sync time and batch size; failed
// store writes by kind; recoveries (their time, the jobs read back, the leases found run out) and,
// per partition, whether one is under way and how far it got.
//
// The broker calls it under its own lock, which also guards the per-queue cache of metric
// handles (so a hot-path event is a hash lookup and an atomic add); Committed() comes from the
// writer thread and touches only queue-less metrics. Queues past `labels`' limit share the
// series of QueueLabels::kOtherQueues. The registry and `labels` are borrowed.
class MetricsObserver final : public core::BrokerObserver {
 public:
  MetricsObserver(prometheus::Registry& registry, QueueLabels& labels);
  ~MetricsObserver() override;

  void Enqueued(const std::string& queue, const std::string& job_id, bool dedup) override;
  void Leased(const core::Job& job, absl::Duration waited) override;
  void AttemptEnded(const core::Job& job, core::AttemptOutcome outcome,
                    absl::Duration ran) override;
  void Retried(const core::Job& job) override;
  void Dead(const core::Job& job) override;
  void Cancelled(const core::Job& job) override;
  void Released(const core::Job& job) override;
  void Committed(size_t transitions, absl::Duration took) override;
  void StoreFailed(const absl::Status& status) override;
  void RecoveryStarted(uint32_t partition) override;
  void Recovering(uint32_t partition, size_t jobs, absl::Duration elapsed) override;
  void RecoveryFailed(uint32_t partition, const absl::Status& status) override;
  void Recovered(uint32_t partition, size_t jobs, size_t expired_leases,
                 absl::Duration took) override;

 private:
  struct QueueMetrics;
  QueueMetrics& For(const std::string& queue);

  prometheus::Family<prometheus::Counter>& enqueued_;
  prometheus::Family<prometheus::Counter>& deduplicated_;
  prometheus::Family<prometheus::Counter>& leased_;
  prometheus::Family<prometheus::Counter>& attempts_;
  prometheus::Family<prometheus::Counter>& retried_;
  prometheus::Family<prometheus::Counter>& dead_;
  prometheus::Family<prometheus::Counter>& cancelled_;
  prometheus::Family<prometheus::Counter>& released_;
  prometheus::Family<prometheus::Histogram>& schedule_to_start_;
  prometheus::Family<prometheus::Histogram>& run_;
  prometheus::Histogram& wal_sync_;
  prometheus::Histogram& wal_batch_;
  prometheus::Family<prometheus::Counter>& storage_errors_;
  prometheus::Counter& no_space_;
  prometheus::Counter& io_error_;
  prometheus::Histogram& recovery_;
  prometheus::Counter& recovered_jobs_;
  prometheus::Counter& recovered_expired_leases_;
  prometheus::Family<prometheus::Gauge>& recovering_;            // by partition
  prometheus::Family<prometheus::Gauge>& recovery_loaded_jobs_;  // by partition
  QueueLabels& labels_;
  // By label: the queue's own name, or QueueLabels::kOtherQueues.
  absl::flat_hash_map<std::string, std::unique_ptr<QueueMetrics>> by_label_;
  // By queue name: a handle into by_label_, so that an event costs one lookup.
  absl::flat_hash_map<std::string, QueueMetrics*> queues_;
};

}  // namespace jobbroker::server
