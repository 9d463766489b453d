#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
  void RecoveryStarted(uint32_t partition) override;
  // A "recovering" line at most every kRecoveryLogEvery of a partition's recovery: the broker
  // reports each second for /metrics, and a line a second per partition would crowd the log.
  void Recovering(uint32_t partition, size_t jobs, absl::Duration elapsed) override;
  void RecoveryFailed(uint32_t partition, const absl::Status& status) override;
  void StoreFailed(const absl::Status& status) override;
  void StoreResumed(const absl::Status& cause, absl::Duration outage) override;
  void CorruptRecordSkipped(const core::CorruptRecord& record) override;

  static constexpr absl::Duration kRecoveryLogEvery = absl::Seconds(5);

 private:
  absl::Mutex mu_;
  // Per partition recovering: the elapsed time its last "recovering" line gave (zero: none yet).
  // Partitions recover on threads of their own.
  absl::flat_hash_map<uint32_t, absl::Duration> recovery_logged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::server
