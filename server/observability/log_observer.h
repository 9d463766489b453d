#pragma once

#include "core/observer.h"

namespace jobbroker::server {

// Logs the job events an operator should see (dead, lease expired, retried, cancelled) at
// info/warn, the rest of a job's life at debug, and recovery at info (server/observability/log.h).
// Cheap when a level is off: one comparison.
class LogObserver final : public core::BrokerObserver {
 public:
  void Enqueued(const std::string& queue, const std::string& job_id, bool dedup) override;
  void Leased(const core::Job& job, absl::Duration waited) override;
  void AttemptEnded(const core::Job& job, core::AttemptOutcome outcome,
                    absl::Duration ran) override;
  void Retried(const core::Job& job) override;
  void Dead(const core::Job& job) override;
  void Cancelled(const core::Job& job) override;
  void Released(const core::Job& job) override;
  void Recovered(uint32_t partition, size_t jobs, size_t expired_leases,
                 absl::Duration took) override;
  void Recovering(uint32_t partition, size_t jobs, absl::Duration elapsed) override;
  void RecoveryFailed(uint32_t partition, const absl::Status& status) override;
  void StoreFailed(const absl::Status& status) override;
  void StoreResumed(const absl::Status& cause, absl::Duration outage) override;
  void CorruptRecordSkipped(const core::CorruptRecord& record) override;
};

}  // namespace jobbroker::server
