#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace jobbroker::core {

// Values match the wire enums of proto/jobbroker/v1/job.proto, so conversion is a cast.
enum class JobState : int {
  kReady = 1,
  kScheduled = 2,
  kActive = 3,
  kCompleted = 4,
  kFailed = 5,
  kCancelled = 6,
  kWaiting = 7,  // its dependencies have not all completed (depends_on)
};
enum class FailReason : int {
  kNone = 0,
  kPermanent = 1,
  kAttemptsExhausted = 2,
  kSnoozeLimit = 3,       // snoozed more often than its queue's max_snoozes
  kExpired = 4,           // not started before its expire_at
  kDependencyFailed = 5,  // a job it depends on ended FAILED or CANCELLED, or was deleted
};
enum class AttemptOutcome : int {
  kRunning = 0,
  kCompleted = 1,
  kError = 2,
  kPermanentError = 3,
  kLeaseExpired = 4,
  kTimedOut = 5,  // still running at its run-time limit (started + timeout)
  kSnoozed = 6,   // given back for later (a Release with a delay); not counted as an attempt
};

const char* JobStateName(JobState s);  // "JOB_STATE_READY", ...
// A dead job's reason as metrics and logs label it: "permanent", "attempts_exhausted",
// "snooze_limit", "expired" ("" for kNone).
const char* FailReasonLabel(FailReason r);
inline bool IsTerminal(JobState s) {
  return s == JobState::kCompleted || s == JobState::kFailed || s == JobState::kCancelled;
}

// History and error bounds, so that a poison job cannot grow without limit.
inline constexpr int kMaxAttemptHistory = 25;
inline constexpr size_t kMaxErrorBytes = 4096;

struct AttemptRecord {
  int attempt = 0;
  std::string worker_id;
  absl::Time started_at = absl::InfinitePast();
  absl::Time ended_at = absl::InfinitePast();  // InfinitePast while running
  AttemptOutcome outcome = AttemptOutcome::kRunning;
  std::string error;

  bool operator==(const AttemptRecord&) const = default;
};

// Everything the broker knows of one job; what the store persists.
struct Job {
  std::string id;
  std::string queue;
  JobState state = JobState::kReady;
  std::string payload;
  std::map<std::string, std::string> headers;
  int32_t priority = 0;
  // Enqueue order inside the broker; breaks priority ties (FIFO).
  uint64_t seq = 0;
  int attempt = 0;  // number of the latest attempt; 0 before the first lease
  int max_attempts = 0;
  std::string dedup_key;
  std::string concurrency_key;
  absl::Time created_at = absl::InfinitePast();
  absl::Time run_at = absl::InfinitePast();  // when READY/SCHEDULED may run
  // Lease length the producer asked for; ZeroDuration = the queue's.
  absl::Duration lease_duration = absl::ZeroDuration();
  // Run-time limit of each attempt the producer asked for; ZeroDuration = the queue's.
  absl::Duration timeout = absl::ZeroDuration();
  // No attempt starts at or after this time: the job then ends FAILED (kExpired).
  // InfiniteFuture = never.
  absl::Time expire_at = absl::InfiniteFuture();

  // The current (or, after it ended, the latest) lease. Kept after the lease ends so that a late
  // Ack of that attempt can still be matched while no newer attempt has started.
  std::string lease_id;
  std::string worker_id;
  absl::Time lease_deadline = absl::InfinitePast();
  absl::Duration lease_length = absl::ZeroDuration();  // what the current lease was granted for
  // When the current attempt times out whatever its heartbeats (started + its timeout);
  // InfiniteFuture when it has no limit. Kept after the attempt ends, like the lease.
  absl::Time timeout_at = absl::InfiniteFuture();
  bool cancel_requested = false;
  // Times a worker gave the job back for later (a Release with a delay); no attempt counted.
  int snoozes = 0;
  // What the latest Heartbeat said of the attempt's progress (JSON by convention); kept.
  std::string progress;

  std::string last_error;
  FailReason fail_reason = FailReason::kNone;
  std::vector<AttemptRecord> attempts;  // oldest first, at most kMaxAttemptHistory
  std::string result;
  std::string checkpoint;
  // The jobs it waits for (of any partition), and their results by id: all of them once they
  // all completed (those that retention had removed by then are missing); while it waits, those
  // of other partitions' jobs that completed already (they are delivered one by one).
  std::vector<std::string> depends_on;
  std::map<std::string, std::string> dependency_results;
  // Not stored: the jobs of its partition that depend on it, sorted; filled by Broker::GetJob.
  std::vector<std::string> dependents;
  absl::Time completed_at = absl::InfinitePast();  // when it became terminal

  // When the broker must end the current attempt if no ack comes: its lease deadline or, if
  // earlier, its run-time limit. Orders ACTIVE jobs in the deadlines.
  absl::Time active_deadline() const { return std::min(lease_deadline, timeout_at); }

  // The key a worker passes to side effects: the dedup key, else the job id.
  const std::string& idempotency_key() const { return dedup_key.empty() ? id : dedup_key; }

  bool operator==(const Job&) const = default;
};

// A dedup key's claim, kept apart from the job so that it outlives a job removed by retention
// until its TTL has passed.
struct DedupEntry {
  std::string queue;
  std::string key;
  std::string job_id;
  absl::Time expires_at = absl::InfinitePast();
  uint64_t payload_hash = 0;  // PayloadHash() of the first payload

  bool operator==(const DedupEntry&) const = default;
};

// Orders jobs by a time (a deadline, a due time, when they ended); the seq breaks ties and
// identifies the job.
using TimeKey = std::pair<absl::Time, uint64_t>;

// A stable 64-bit hash (FNV-1a) of a payload; persisted, so it must not change between builds.
uint64_t PayloadHash(const std::string& payload);

// Cuts `text` to at most `max_bytes` without splitting a UTF-8 sequence.
std::string TruncateUtf8(std::string text, size_t max_bytes);

}  // namespace jobbroker::core
