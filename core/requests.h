#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/job.h"
#include "core/policy.h"
#include "core/workers.h"

namespace jobbroker::core {

class StreamCredit;

// Arguments and results of the Broker's operations, free of any wire format.

struct EnqueueSpec {
  std::string queue;
  std::string payload;
  std::map<std::string, std::string> headers;
  int32_t priority = 0;
  std::optional<absl::Duration> delay;
  std::optional<absl::Time> run_at;  // at most one of delay and run_at
  std::string dedup_key;
  std::optional<absl::Duration> dedup_ttl;               // unset = the queue's
  int max_attempts = 0;                                  // 0 = the queue's
  absl::Duration lease_duration = absl::ZeroDuration();  // zero = the queue's
  std::string concurrency_key;
  absl::Duration timeout = absl::ZeroDuration();  // run-time limit; zero = the queue's
  std::optional<absl::Time> expire_at;            // no attempt starts from then on
  // Jobs it waits for: ids of this partition's jobs, and (in a batch) indexes of earlier jobs
  // of the same batch. It is WAITING until they have all completed.
  std::vector<std::string> depends_on;
  std::vector<int> depends_on_index;

  bool operator==(const EnqueueSpec&) const = default;
};

// What became of a job of another partition that jobs here depend on (Broker::SettleRemoteJobs).
struct RemoteOutcome {
  std::string job_id;
  // COMPLETED, FAILED or CANCELLED; ignored when `gone`.
  JobState state = JobState::kCompleted;
  std::string result;  // COMPLETED: its result
  // Its partition has no such job: removed before its outcome reached here, or never existed
  // (an id a producer made up, when the enqueue could not check it).
  bool gone = false;
};

struct EnqueueResult {
  std::string job_id;
  bool deduplicated = false;
};

// The first message of a Work stream.
struct SubscribeSpec {
  std::vector<std::string> queues;  // at least one
  std::string worker_id;
  int max_in_flight = 1;  // unacknowledged pushed jobs at once; 0 means 1
  absl::Duration lease_duration = absl::ZeroDuration();  // zero = the job's, else the queue's
  // A stream whose queues live in several partitions: the budget its members share, and which
  // member this subscription is (core/stream_credit.h). Unset: max_in_flight alone bounds it.
  std::shared_ptr<StreamCredit> credit;
  int credit_member = 0;
  WorkerOrigin origin;  // for ListWorkers
};

struct LeaseSpec {
  std::string queue;
  std::string worker_id;
  int max_jobs = 1;
  absl::Duration lease_duration = absl::ZeroDuration();  // zero = the job's, else the queue's
  WorkerOrigin origin;                                   // for ListWorkers
};

// One attempt, as handed to a worker.
struct LeasedJob {
  std::string job_id;
  std::string lease_id;
  std::string queue;
  std::string payload;
  std::map<std::string, std::string> headers;
  int attempt = 0;
  int max_attempts = 0;
  absl::Time lease_deadline;
  std::string idempotency_key;
  std::string checkpoint;
  absl::Time enqueued_at;
  // When the attempt times out whatever its heartbeats; InfiniteFuture if it has no limit.
  absl::Time timeout_at = absl::InfiniteFuture();
  // The results of the jobs it depended on, by job id.
  std::map<std::string, std::string> dependency_results;
};

struct HeartbeatSpec {
  std::string job_id;
  std::string lease_id;
  absl::Duration extend_by = absl::ZeroDuration();  // zero = the lease's own length
  std::optional<std::string> checkpoint;
  std::optional<std::string> progress;  // set = replaces the job's progress
};

struct HeartbeatResult {
  absl::Time lease_deadline;
  bool cancel_requested = false;
};

struct AckSpec {
  std::string job_id;
  std::string lease_id;
  std::string result;
};

struct FailSpec {
  std::string job_id;
  std::string lease_id;
  std::string error;
  bool permanent = false;
  std::optional<absl::Duration> retry_after;  // replaces the computed backoff
};

struct FailResult {
  JobState state = JobState::kScheduled;
  absl::Time next_attempt_at = absl::InfinitePast();  // set when kScheduled
};

struct ReleaseSpec {
  std::string job_id;
  std::string lease_id;
  // Snooze: the job comes back this much later, SCHEDULED, and counts a snooze (not an
  // attempt). Unset or zero: READY again at once.
  std::optional<absl::Duration> delay;
};

struct ListJobsSpec {
  std::string queue;
  std::optional<JobState> state;  // unset = every state
  int page_size = 100;
  std::string page_token;
  bool newest_first = false;
  std::string dedup_key;  // set = only the job holding this dedup key
};

struct ListJobsResult {
  std::vector<Job> jobs;
  std::string next_page_token;  // empty on the last page
};

struct QueueInfo {
  std::string name;
  uint32_t partition = 0;  // the partition the queue lives in (PartitionOfQueue)
  QueuePolicy policy;
  std::map<JobState, int64_t> counts;  // every state present, zero included
  absl::Duration oldest_ready_age = absl::ZeroDuration();
  // Idle capacity waiting for the queue's next job: long-poll Leases and Work streams with a
  // free slot.
  int64_t waiting_leases = 0;
  int64_t active = 0;  // counts[kActive]
  int64_t dead = 0;    // counts[kFailed]
  // Since the broker started, not persisted: enough for a rate.
  int64_t enqueued_total = 0;   // jobs created (deduplicated enqueues not counted)
  int64_t completed_total = 0;  // attempts acked
};

// Bulk redrive: jobs of `queue` in `state` back to READY.
struct RetryJobsSpec {
  std::string queue;
  JobState state = JobState::kFailed;  // kFailed or kCancelled
  bool dry_run = false;                // only count
  int64_t limit = 0;                   // at most this many jobs; 0 = kDefaultRetryLimit
};

struct RetryJobsResult {
  int64_t matched = 0;  // jobs retried, or with dry_run those that would be
  int64_t retried = 0;  // 0 with dry_run
};

// Limits on what a request may carry.
inline constexpr size_t kMaxQueueNameBytes = 128;
inline constexpr size_t kMaxKeyBytes = 256;  // dedup_key, concurrency_key, worker_id, ids
// The bound checked before the queue is known; the broker then holds a payload to its queue's
// max_payload_bytes (1 MiB by default, at most this much).
inline constexpr size_t kMaxPayloadBytes = kMaxPayloadBytesCeiling;
inline constexpr size_t kMaxCheckpointBytes = 4 << 20;  // a checkpoint, and a result
inline constexpr size_t kMaxProgressBytes = 64 << 10;   // a heartbeat's progress

inline constexpr size_t kMaxHeaders = 64;
inline constexpr size_t kMaxHeaderBytes = 64 << 10;  // all names and values together
inline constexpr int kMaxLeaseBatch = 1000;          // max_jobs, batch size, page size
inline constexpr int kMaxAttemptsLimit = 1000;
inline constexpr int kMaxInFlight = 1000;            // per Work stream
inline constexpr int kMaxSubscribedQueues = 100;     // per Work stream
inline constexpr int64_t kDefaultRetryLimit = 1000;  // RetryJobsSpec::limit of 0
inline constexpr int64_t kMaxRetryLimit = 100000;

// Bulk admin work (redrive, purge) is cut into transitions of at most this many changed jobs,
// and looks at no more than kBulkVisitsPerBatch jobs per transition, so that it holds the
// broker's mutex briefly and other calls run between its batches.
inline constexpr int kRetryBatch = 500;
inline constexpr int kPurgeBatch = 1000;
inline constexpr int kBulkVisitsPerBatch = 10000;

}  // namespace jobbroker::core
