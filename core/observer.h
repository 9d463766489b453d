#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/job.h"
#include "core/store.h"

namespace jobbroker::core {

// How often a recovery under way reports its progress (BrokerObserver::Recovering): each second,
// so that /metrics' loaded-jobs gauge moves through a ten-second restart rather than once or
// twice. The log says it less often (server/observability/log_observer.h).
inline constexpr absl::Duration kRecoveryProgressEvery = absl::Seconds(1);

// What the broker tells the outside about its work; metrics and logs hang on it (the
// prometheus-cpp exporter and the logger live in server/, so core stays free of both).
//
// The broker calls these with its lock held, right after the change they describe was
// decided, so implementations must be quick (an atomic increment, a short write) and must not
// call back into the broker. Committed() is called from the commit pipeline's writer thread.
// Every method has an empty default.
class BrokerObserver {
 public:
  virtual ~BrokerObserver() = default;

  // A job was created, or an Enqueue was answered with an existing job (`deduplicated`).
  virtual void Enqueued(const std::string& /*queue*/, const std::string& /*job_id*/,
                        bool /*deduplicated*/) {}
  // An attempt started; `waited` is how long the job had been ready (schedule-to-start).
  virtual void Leased(const Job& /*job*/, absl::Duration /*waited*/) {}
  // An attempt ended with `outcome` after running for `ran`.
  virtual void AttemptEnded(const Job& /*job*/, AttemptOutcome /*outcome*/,
                            absl::Duration /*ran*/) {}
  // A failed attempt was given another one at job.run_at.
  virtual void Retried(const Job& /*job*/) {}
  // The job died (FAILED); job.fail_reason and job.last_error say why.
  virtual void Dead(const Job& /*job*/) {}
  virtual void Cancelled(const Job& /*job*/) {}
  // A worker gave the job back unstarted.
  virtual void Released(const Job& /*job*/) {}
  // The broker of `partition` starts rebuilding its state from the store (at its start, and
  // once the store takes writes again after an outage or, in cluster mode, this node takes the
  // lead). Then Recovered, or RecoveryFailed; Recovering between them on a long one.
  virtual void RecoveryStarted(uint32_t /*partition*/) {}
  // The recovery of `partition` that RecoveryStarted announced ended without its state: the
  // store's read failed with `status`. The broker tries again later (at the start: it exits).
  virtual void RecoveryFailed(uint32_t /*partition*/, const absl::Status& /*status*/) {}
  // The broker of `partition` finished recovering `jobs` jobs from the store in `took`, turning
  // `expired_leases` leases that ran out while it was down into failed attempts.
  virtual void Recovered(uint32_t /*partition*/, size_t /*jobs*/, size_t /*expired_leases*/,
                         absl::Duration /*took*/) {}
  // A recovery of `partition` under way has loaded `jobs` jobs in `elapsed`: called at most every
  // kRecoveryProgressEvery, so that a restart over millions of jobs shows it is moving.
  virtual void Recovering(uint32_t /*partition*/, size_t /*jobs*/, absl::Duration /*elapsed*/) {}
  // One synced store write of `transitions` transitions took `took`.
  virtual void Committed(size_t /*transitions*/, absl::Duration /*took*/) {}
  // A store write failed: the broker refuses every change (kResourceExhausted when the disk is
  // full, kUnavailable otherwise) until the store recovers. Called once per failure, from the
  // thread that wrote.
  virtual void StoreFailed(const absl::Status& /*status*/) {}
  // The store took writes again after the failure `cause`, `outage` ago (by the broker's
  // clock), and the broker rebuilt its memory from it: changes are accepted again.
  virtual void StoreResumed(const absl::Status& /*cause*/, absl::Duration /*outage*/) {}
  // Recovery skipped a stored record that does not decode. Called once per record at each
  // recovery (start, and after a storage failure).
  virtual void CorruptRecordSkipped(const CorruptRecord& /*record*/) {}
};

// Passes every event on to each of `observers` (borrowed), in order.
class TeeObserver final : public BrokerObserver {
 public:
  explicit TeeObserver(std::vector<BrokerObserver*> observers) : observers_(std::move(observers)) {}
  void Enqueued(const std::string& queue, const std::string& job_id, bool dedup) override {
    for (BrokerObserver* o : observers_) o->Enqueued(queue, job_id, dedup);
  }
  void Leased(const Job& job, absl::Duration waited) override {
    for (BrokerObserver* o : observers_) o->Leased(job, waited);
  }
  void AttemptEnded(const Job& job, AttemptOutcome outcome, absl::Duration ran) override {
    for (BrokerObserver* o : observers_) o->AttemptEnded(job, outcome, ran);
  }
  void Retried(const Job& job) override {
    for (BrokerObserver* o : observers_) o->Retried(job);
  }
  void Dead(const Job& job) override {
    for (BrokerObserver* o : observers_) o->Dead(job);
  }
  void Cancelled(const Job& job) override {
    for (BrokerObserver* o : observers_) o->Cancelled(job);
  }
  void Released(const Job& job) override {
    for (BrokerObserver* o : observers_) o->Released(job);
  }
  void RecoveryStarted(uint32_t partition) override {
    for (BrokerObserver* o : observers_) o->RecoveryStarted(partition);
  }
  void RecoveryFailed(uint32_t partition, const absl::Status& status) override {
    for (BrokerObserver* o : observers_) o->RecoveryFailed(partition, status);
  }
  void Recovered(uint32_t partition, size_t jobs, size_t expired, absl::Duration took) override {
    for (BrokerObserver* o : observers_) o->Recovered(partition, jobs, expired, took);
  }
  void Recovering(uint32_t partition, size_t jobs, absl::Duration elapsed) override {
    for (BrokerObserver* o : observers_) o->Recovering(partition, jobs, elapsed);
  }
  void Committed(size_t transitions, absl::Duration took) override {
    for (BrokerObserver* o : observers_) o->Committed(transitions, took);
  }
  void StoreFailed(const absl::Status& status) override {
    for (BrokerObserver* o : observers_) o->StoreFailed(status);
  }
  void StoreResumed(const absl::Status& cause, absl::Duration outage) override {
    for (BrokerObserver* o : observers_) o->StoreResumed(cause, outage);
  }
  void CorruptRecordSkipped(const CorruptRecord& record) override {
    for (BrokerObserver* o : observers_) o->CorruptRecordSkipped(record);
  }

 private:
  const std::vector<BrokerObserver*> observers_;
};

}  // namespace jobbroker::core
