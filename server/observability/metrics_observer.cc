#include "server/observability/metrics_observer.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace jobbroker::server {
namespace {

// Seconds, from a millisecond to five minutes: jobs range from instant to long batch work.
const prometheus::Histogram::BucketBoundaries kJobSeconds = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
// An fsync here takes 0.1 to a few ms; tens of ms is trouble.
const prometheus::Histogram::BucketBoundaries kSyncSeconds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1};
const prometheus::Histogram::BucketBoundaries kBatch = {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024};
// A partition's recovery: milliseconds when it is small, about 8 s for 10 million ready jobs on
// 2 cores (docs/performance.md, "Restart and memory"); minutes mean a backlog past what it sized.
const prometheus::Histogram::BucketBoundaries kRecoverySeconds = {0.01, 0.05, 0.1, 0.5, 1,  2.5,
                                                                  5,    10,   20,  30,  60, 300};

prometheus::Family<prometheus::Counter>& Counter(prometheus::Registry& r, const char* name,
                                                 const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r, const char* name,
                                             const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

// The labels of a partition's series.
std::map<std::string, std::string> PartitionLabel(uint32_t partition) {
  return {{"partition", absl::StrCat(partition)}};
}

prometheus::Family<prometheus::Histogram>& Histogram(prometheus::Registry& r, const char* name,
                                                     const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r);
}

}  // namespace

struct MetricsObserver::QueueMetrics {
  prometheus::Counter* enqueued;
  prometheus::Counter* deduplicated;
  prometheus::Counter* leased;
  prometheus::Counter* completed;
  prometheus::Counter* error;
  prometheus::Counter* permanent_error;
  prometheus::Counter* lease_expired;
  prometheus::Counter* timed_out;
  prometheus::Counter* snoozed;
  prometheus::Counter* retried;
  prometheus::Counter* dead_permanent;
  prometheus::Counter* dead_exhausted;
  prometheus::Counter* dead_snooze_limit;
  prometheus::Counter* dead_expired;
  prometheus::Counter* dead_dependency_failed;
  prometheus::Counter* cancelled;
  prometheus::Counter* released;
  prometheus::Histogram* schedule_to_start;
  prometheus::Histogram* run;
};

MetricsObserver::MetricsObserver(prometheus::Registry& r, QueueLabels& labels)
    : enqueued_(Counter(r, "jobbroker_enqueued_total", "Jobs created by Enqueue.")),
      deduplicated_(Counter(r, "jobbroker_deduplicated_total",
                            "Enqueues answered with an existing job of the same dedup key.")),
      leased_(Counter(r, "jobbroker_leased_total", "Attempts started (jobs leased).")),
      attempts_(Counter(r, "jobbroker_attempts_total", "Attempts ended, by outcome.")),
      retried_(Counter(r, "jobbroker_retried_total",
                       "Failed attempts (errors and lease expiries) given another attempt.")),
      dead_(Counter(r, "jobbroker_dead_total", "Jobs that died (FAILED), by reason.")),
      cancelled_(Counter(r, "jobbroker_cancelled_total", "Jobs cancelled.")),
      released_(Counter(r, "jobbroker_released_total", "Jobs given back unstarted by workers.")),
      schedule_to_start_(Histogram(r, "jobbroker_schedule_to_start_seconds",
                                   "Time from a job being ready to its lease.")),
      run_(Histogram(r, "jobbroker_run_seconds", "Time from a lease to its ack or fail.")),
      wal_sync_(Histogram(r, "jobbroker_wal_sync_seconds",
                          "Time of one synced store write (one group commit).")
                    .Add({}, kSyncSeconds)),
      wal_batch_(Histogram(r, "jobbroker_wal_batch_transitions",
                           "State transitions made durable by one synced store write.")
                     .Add({}, kBatch)),
      storage_errors_(Counter(r, "jobbroker_storage_errors_total",
                              "Failed store writes, by kind (no_space, io_error); after one the "
                              "broker refuses every change until the store takes writes again.")),
      no_space_(storage_errors_.Add({{"kind", "no_space"}})),
      io_error_(storage_errors_.Add({{"kind", "io_error"}})),
      recovery_(Histogram(r, "jobbroker_recovery_seconds",
                          "Time a partition took to rebuild its state from the store: at the "
                          "start, after a store outage, and in cluster mode each time this node "
                          "takes the lead.")
                    .Add({}, kRecoverySeconds)),
      recovered_jobs_(Counter(r, "jobbroker_recovered_jobs_total",
                              "Jobs read back from the store by recoveries.")
                          .Add({})),
      recovered_expired_leases_(
          Counter(r, "jobbroker_recovery_expired_leases_total",
                  "Leases found run out at a recovery (their worker's time passed while the "
                  "partition was down or led elsewhere): each became a failed attempt.")
              .Add({})),
      recovering_(Gauge(r, "jobbroker_recovering",
                        "1 while the partition rebuilds its state from the store (it answers "
                        "no call meanwhile), 0 once it is done or failed.")),
      recovery_loaded_jobs_(Gauge(r, "jobbroker_recovery_loaded_jobs",
                                  "Jobs the partition's recovery under way has loaded so far "
                                  "(updated every 5 s), or all its last recovery loaded.")),
      labels_(labels) {}

MetricsObserver::~MetricsObserver() = default;

MetricsObserver::QueueMetrics& MetricsObserver::For(const std::string& queue) {
  auto it = queues_.find(queue);
  if (it != queues_.end()) return *it->second;
  const std::string label = labels_.For(queue);
  if (auto shared = by_label_.find(label); shared != by_label_.end()) {
    queues_.emplace(queue, shared->second.get());
    return *shared->second;
  }
  auto m = std::make_unique<QueueMetrics>();
  const prometheus::Labels q = {{"queue", label}};
  auto with = [&](const char* key, const char* value) {
    prometheus::Labels l = q;
    l[key] = value;
    return l;
  };
  m->enqueued = &enqueued_.Add(q);
  m->deduplicated = &deduplicated_.Add(q);
  m->leased = &leased_.Add(q);
  m->completed = &attempts_.Add(with("outcome", "completed"));
  m->error = &attempts_.Add(with("outcome", "error"));
  m->permanent_error = &attempts_.Add(with("outcome", "permanent_error"));
  m->lease_expired = &attempts_.Add(with("outcome", "lease_expired"));
  m->timed_out = &attempts_.Add(with("outcome", "timed_out"));
  m->snoozed = &attempts_.Add(with("outcome", "snoozed"));
  m->retried = &retried_.Add(q);
  m->dead_permanent = &dead_.Add(with("reason", "permanent"));
  m->dead_exhausted = &dead_.Add(with("reason", "attempts_exhausted"));
  m->dead_snooze_limit = &dead_.Add(with("reason", "snooze_limit"));
  m->dead_expired = &dead_.Add(with("reason", "expired"));
  m->dead_dependency_failed = &dead_.Add(with("reason", "dependency_failed"));
  m->cancelled = &cancelled_.Add(q);
  m->released = &released_.Add(q);
  m->schedule_to_start = &schedule_to_start_.Add(q, kJobSeconds);
  m->run = &run_.Add(q, kJobSeconds);
  QueueMetrics* handle = by_label_.emplace(label, std::move(m)).first->second.get();
  queues_.emplace(queue, handle);
  return *handle;
}

void MetricsObserver::Enqueued(const std::string& queue, const std::string&, bool dedup) {
  QueueMetrics& m = For(queue);
  (dedup ? m.deduplicated : m.enqueued)->Increment();
}

void MetricsObserver::Leased(const core::Job& job, absl::Duration waited) {
  QueueMetrics& m = For(job.queue);
  m.leased->Increment();
  m.schedule_to_start->Observe(absl::ToDoubleSeconds(waited));
}

void MetricsObserver::AttemptEnded(const core::Job& job, core::AttemptOutcome outcome,
                                   absl::Duration ran) {
  QueueMetrics& m = For(job.queue);
  switch (outcome) {
    case core::AttemptOutcome::kCompleted:
      m.completed->Increment();
      break;
    case core::AttemptOutcome::kError:
      m.error->Increment();
      break;
    case core::AttemptOutcome::kPermanentError:
      m.permanent_error->Increment();
      break;
    case core::AttemptOutcome::kLeaseExpired:
      m.lease_expired->Increment();
      break;
    case core::AttemptOutcome::kTimedOut:
      m.timed_out->Increment();
      break;
    case core::AttemptOutcome::kSnoozed:
      m.snoozed->Increment();
      break;
    case core::AttemptOutcome::kRunning:
      return;
  }
  m.run->Observe(absl::ToDoubleSeconds(ran));
}

void MetricsObserver::Retried(const core::Job& job) { For(job.queue).retried->Increment(); }

void MetricsObserver::Dead(const core::Job& job) {
  QueueMetrics& m = For(job.queue);
  switch (job.fail_reason) {
    case core::FailReason::kPermanent:
      m.dead_permanent->Increment();
      break;
    case core::FailReason::kSnoozeLimit:
      m.dead_snooze_limit->Increment();
      break;
    case core::FailReason::kExpired:
      m.dead_expired->Increment();
      break;
    case core::FailReason::kDependencyFailed:
      m.dead_dependency_failed->Increment();
      break;
    case core::FailReason::kAttemptsExhausted:
    case core::FailReason::kNone:
      m.dead_exhausted->Increment();
      break;
  }
}

void MetricsObserver::Cancelled(const core::Job& job) { For(job.queue).cancelled->Increment(); }

void MetricsObserver::Released(const core::Job& job) { For(job.queue).released->Increment(); }

void MetricsObserver::Committed(size_t transitions, absl::Duration took) {
  wal_sync_.Observe(absl::ToDoubleSeconds(took));
  wal_batch_.Observe(static_cast<double>(transitions));
}

void MetricsObserver::StoreFailed(const absl::Status& status) {
  (status.code() == absl::StatusCode::kResourceExhausted ? no_space_ : io_error_).Increment();
}

// The recovery events come from the thread that opens or rebuilds a partition (Recovering from
// its index builder), several partitions at once when they open side by side: they touch only
// queue-less metrics, which prometheus-cpp updates thread-safely (Family::Add too, which returns
// the partition's existing gauge after the first time). The gauges are set, not added to, so
// that a partition's last event says its state.
void MetricsObserver::RecoveryStarted(uint32_t partition) {
  recovering_.Add(PartitionLabel(partition)).Set(1);
  recovery_loaded_jobs_.Add(PartitionLabel(partition)).Set(0);
}

void MetricsObserver::Recovering(uint32_t partition, size_t jobs, absl::Duration /*elapsed*/) {
  recovery_loaded_jobs_.Add(PartitionLabel(partition)).Set(static_cast<double>(jobs));
}

void MetricsObserver::RecoveryFailed(uint32_t partition, const absl::Status& /*status*/) {
  recovering_.Add(PartitionLabel(partition)).Set(0);
}

void MetricsObserver::Recovered(uint32_t partition, size_t jobs, size_t expired_leases,
                                absl::Duration took) {
  recovering_.Add(PartitionLabel(partition)).Set(0);
  recovery_loaded_jobs_.Add(PartitionLabel(partition)).Set(static_cast<double>(jobs));
  recovery_.Observe(absl::ToDoubleSeconds(took));
  recovered_jobs_.Increment(static_cast<double>(jobs));
  recovered_expired_leases_.Increment(static_cast<double>(expired_leases));
}

}  // namespace jobbroker::server
