#include "server/observability/log_observer.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/observability/log.h"

namespace jobbroker::server {
namespace {

const char* OutcomeName(core::AttemptOutcome o) {
  switch (o) {
    case core::AttemptOutcome::kCompleted:
      return "completed";
    case core::AttemptOutcome::kError:
      return "error";
    case core::AttemptOutcome::kPermanentError:
      return "permanent_error";
    case core::AttemptOutcome::kLeaseExpired:
      return "lease_expired";
    case core::AttemptOutcome::kTimedOut:
      return "timed_out";
    case core::AttemptOutcome::kSnoozed:
      return "snoozed";
    case core::AttemptOutcome::kRunning:
      break;
  }
  return "running";
}

}  // namespace

void LogObserver::Enqueued(const std::string& queue, const std::string& job_id, bool dedup) {
  if (!Log::Enabled(LogLevel::kDebug)) return;
  Log::Write(LogLevel::kDebug, dedup ? "job_deduplicated" : "job_enqueued",
             {{"queue", queue}, {"job_id", job_id}});
}

void LogObserver::Leased(const core::Job& job, absl::Duration waited) {
  if (!Log::Enabled(LogLevel::kDebug)) return;
  Log::Write(LogLevel::kDebug, "job_leased",
             {{"queue", job.queue},
              {"job_id", job.id},
              {"attempt", absl::StrCat(job.attempt)},
              {"worker_id", job.worker_id},
              {"waited_ms", absl::StrCat(absl::ToInt64Milliseconds(waited))}});
}

void LogObserver::AttemptEnded(const core::Job& job, core::AttemptOutcome outcome,
                               absl::Duration ran) {
  // A lease running out means a worker died, hung or lost its connection, and a time-out a
  // handler that ran too long: both worth a warning.
  const bool warn =
      outcome == core::AttemptOutcome::kLeaseExpired || outcome == core::AttemptOutcome::kTimedOut;
  LogLevel level = warn ? LogLevel::kWarn : LogLevel::kDebug;
  if (!Log::Enabled(level)) return;
  Log::Write(level,
             outcome == core::AttemptOutcome::kLeaseExpired ? "lease_expired"
             : outcome == core::AttemptOutcome::kTimedOut   ? "attempt_timed_out"
                                                            : "attempt_ended",
             {{"queue", job.queue},
              {"job_id", job.id},
              {"attempt", absl::StrCat(job.attempt)},
              {"worker_id", job.worker_id},
              {"outcome", OutcomeName(outcome)},
              {"ran_ms", absl::StrCat(absl::ToInt64Milliseconds(ran))}});
}

void LogObserver::Retried(const core::Job& job) {
  if (!Log::Enabled(LogLevel::kInfo)) return;
  Log::Write(
      LogLevel::kInfo, "job_retried",
      {{"queue", job.queue},
       {"job_id", job.id},
       {"attempt", absl::StrCat(job.attempt)},
       {"worker_id", job.worker_id},
       {"reason", job.last_error},
       {"next_attempt_at", absl::FormatTime(absl::RFC3339_full, job.run_at, absl::UTCTimeZone())}});
}

void LogObserver::Dead(const core::Job& job) {
  Log::Write(LogLevel::kWarn, "job_dead",
             {{"queue", job.queue},
              {"job_id", job.id},
              {"attempt", absl::StrCat(job.attempt)},
              {"worker_id", job.worker_id},
              {"fail_reason", core::FailReasonLabel(job.fail_reason)},
              {"reason", job.last_error}});
}

void LogObserver::Cancelled(const core::Job& job) {
  Log::Write(LogLevel::kInfo, "job_cancelled",
             {{"queue", job.queue}, {"job_id", job.id}, {"attempt", absl::StrCat(job.attempt)}});
}

void LogObserver::Released(const core::Job& job) {
  if (!Log::Enabled(LogLevel::kDebug)) return;
  Log::Write(LogLevel::kDebug, "job_released", {{"queue", job.queue}, {"job_id", job.id}});
}

void LogObserver::Recovered(uint32_t partition, size_t jobs, size_t expired_leases,
                            absl::Duration took) {
  {
    absl::MutexLock lock(&mu_);
    recovery_logged_.erase(partition);
  }
  Log::Write(LogLevel::kInfo, "recovered",
             {{"partition", absl::StrCat(partition)},
              {"jobs", absl::StrCat(jobs)},
              {"expired_leases", absl::StrCat(expired_leases)},
              {"took_ms", absl::StrCat(absl::ToInt64Milliseconds(took))}});
}

void LogObserver::RecoveryStarted(uint32_t partition) {
  absl::MutexLock lock(&mu_);
  recovery_logged_[partition] = absl::ZeroDuration();
}

void LogObserver::Recovering(uint32_t partition, size_t jobs, absl::Duration elapsed) {
  {
    absl::MutexLock lock(&mu_);
    absl::Duration& logged = recovery_logged_[partition];
    if (elapsed - logged < kRecoveryLogEvery) return;
    logged = elapsed;
  }
  Log::Write(LogLevel::kInfo, "recovering",
             {{"partition", absl::StrCat(partition)},
              {"jobs_so_far", absl::StrCat(jobs)},
              {"elapsed_ms", absl::StrCat(absl::ToInt64Milliseconds(elapsed))}});
}

void LogObserver::RecoveryFailed(uint32_t partition, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    recovery_logged_.erase(partition);
  }
  Log::Write(LogLevel::kWarn, "recovery_failed",
             {{"partition", absl::StrCat(partition)},
              {"reason", status.ToString()},
              {"effect", "the partition answers nothing until a later try recovers it"}});
}

void LogObserver::StoreFailed(const absl::Status& status) {
  const bool full = status.code() == absl::StatusCode::kResourceExhausted;
  Log::Write(LogLevel::kError, "store_write_failed",
             {{"reason", status.ToString()},
              {"effect", full ? "every change is refused with RESOURCE_EXHAUSTED until space is "
                                "freed; reads still work; the store is retried in the background"
                              : "every change is refused with UNAVAILABLE until the store "
                                "recovers; reads still work; the store is retried in the "
                                "background"}});
}

void LogObserver::StoreResumed(const absl::Status& cause, absl::Duration outage) {
  Log::Write(LogLevel::kInfo, "store_resumed",
             {{"reason", cause.ToString()},
              {"outage_ms", absl::StrCat(absl::ToInt64Milliseconds(outage))},
              {"effect", "memory was rebuilt from the store; changes are accepted again"}});
}

void LogObserver::CorruptRecordSkipped(const core::CorruptRecord& record) {
  // The key and what is wrong, never the record's bytes: they may hold a payload.
  Log::Write(LogLevel::kError, "corrupt_record",
             {{"record", core::RecordKindName(record.kind)},
              {"key", absl::CHexEscape(record.key)},
              {"reason", std::string(record.reason.message())},
              {"effect", record.kind == core::RecordKind::kJob
                             ? "the job is skipped: GetJob answers DATA_LOSS, DeleteJob removes it"
                             : "the record is skipped"}});
}

}  // namespace jobbroker::server
