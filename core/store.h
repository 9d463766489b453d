#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/types/span.h"
#include "core/job.h"
#include "core/policy.h"
#include "core/schedules.h"

namespace jobbroker::core {

// The durable changes of one broker state transition, in one partition. Applied all or nothing.
// Inside one Transition the fields apply in declaration order (job puts, job deletes, dedup puts,
// dedup deletes, policy puts, policy deletes), so a later put of the same key wins.
struct Transition {
  // The partition whose records it changes: each partition's keys are its own (a job id, a
  // queue's dedup keys and policy are looked up within their partition).
  uint32_t partition = 0;
  // The partition's sequence number of this transition, one more than the last one the
  // partition's broker committed: stored as the partition's applied_seq with it, so a replica
  // knows how far its state goes. 0: not numbered (tools and tests writing by hand).
  uint64_t seq = 0;
  std::vector<Job> put_jobs;  // whole records; a later put of the same id wins
  std::vector<std::string> delete_jobs;
  std::vector<DedupEntry> put_dedup;
  std::vector<std::pair<std::string, std::string>> delete_dedup;     // (queue, key)
  std::vector<std::pair<std::string, PolicyOverride>> put_policies;  // run-time overrides by queue
  std::vector<std::string> delete_policies;
  std::vector<Schedule> put_schedules;  // whole records, by id; a later put of the same id wins
  std::vector<std::string> delete_schedules;

  bool empty() const {
    return put_jobs.empty() && delete_jobs.empty() && put_dedup.empty() && delete_dedup.empty() &&
           put_policies.empty() && delete_policies.empty() && put_schedules.empty() &&
           delete_schedules.empty();
  }
};

// Which kind of record a corrupt one was.
enum class RecordKind { kJob, kDedup, kPolicy, kSchedule };
inline const char* RecordKindName(RecordKind kind) {
  switch (kind) {
    case RecordKind::kJob:
      return "job";
    case RecordKind::kDedup:
      return "dedup";
    case RecordKind::kPolicy:
      return "policy";
    case RecordKind::kSchedule:
      return "schedule";
  }
  return "unknown";
}

// A stored record that recovery could not decode. `key` is the record's key as stored (the job
// id for a job; queue + '\0' + dedup key for a dedup entry; the queue for a policy); `reason`
// says what is wrong with it and never holds the record's bytes (they may hold a payload).
struct CorruptRecord {
  RecordKind kind = RecordKind::kJob;
  std::string key;
  absl::Status reason;
};

// The fields of a READY or SCHEDULED job that its index entries need: all recovery keeps of a
// job it leaves cold (BrokerOptions::max_hot_jobs). A store may decode only these from a record.
struct ColdJobFields {
  std::string id;
  std::string queue;
  JobState state = JobState::kReady;
  uint64_t seq = 0;
  int32_t priority = 0;
  absl::Time run_at = absl::InfinitePast();
  std::string concurrency_key;
  absl::Time expire_at = absl::InfiniteFuture();
  std::vector<std::string> depends_on;
};

// What the broker reads back at start (and after a storage failure, to rebuild memory).
class RecoveryVisitor {
 public:
  virtual ~RecoveryVisitor() = default;
  // First, once: the seq of the partition's last numbered transition in the store (0: none).
  virtual void OnAppliedSeq(uint64_t seq) { (void)seq; }
  virtual void OnJob(Job job) = 0;
  // True when the next job, if it is READY or SCHEDULED, will be kept cold: the store may then
  // hand its ColdJobFields to OnColdJob instead of the whole record to OnJob. At millions of
  // jobs, decoding payloads and headers that are dropped at once is most of a restart.
  virtual bool NextJobMayBeCold() const { return false; }
  // Only after NextJobMayBeCold() said true, and only for a READY or SCHEDULED job. False: the
  // visitor keeps this one hot after all (its id is not in the broker's form), and the store
  // hands the whole record to OnJob instead. `job` is the store's again after the call (it
  // decodes the next record into it): move out what is kept.
  virtual bool OnColdJob(ColdJobFields& job) {
    (void)job;
    return false;
  }
  virtual void OnDedup(DedupEntry entry) = 0;
  virtual void OnPolicy(std::string queue, PolicyOverride policy) = 0;
  virtual void OnSchedule(Schedule schedule) = 0;
  // A record that does not decode: skipped, so the rest can still be served.
  virtual void OnCorrupt(CorruptRecord record) = 0;
};

// A refusal of writes whose reason is not the store failing (cluster mode: this node does not
// lead the partition, and who does): the broker answers changes with it as it is, instead of as
// "storage is failing: …". Marked by a payload, so it survives being passed on.
inline constexpr char kNotStorageFailurePayload[] = "type.jobbroker.dev/not-storage-failure";
inline absl::Status NotStorageFailure(absl::Status status) {
  status.SetPayload(kNotStorageFailurePayload, absl::Cord());
  return status;
}
inline bool IsNotStorageFailure(const absl::Status& status) {
  return status.GetPayload(kNotStorageFailurePayload).has_value();
}

// The durable store behind the brokers of one process: the records of every partition, each
// partition's keys apart. Implementations: MemoryStore (tests), RocksDbStore.
// Thread-compatible: the CommitPipeline is the only writer, and a partition's Recover runs while
// nothing of that partition is being written.
class Store {
 public:
  virtual ~Store() = default;

  // Applies `transitions` in order as one atomic, durable write: when it returns OK, all of them
  // survive a crash. On error the outcome is unknown (a failed fsync may leave the batch in the
  // log): the caller must stop writing, acknowledge nothing of it, and call Resume() before it
  // writes again. kResourceExhausted when the disk is full; kUnavailable for other I/O errors.
  virtual absl::Status Write(absl::Span<const Transition> transitions) = 0;

  // Like Write, but returns once the transitions are in the store's log, before they are on
  // disk: a crash of the process keeps them, power loss may not. The next Write or Sync makes
  // them durable (in order: a durable write implies every earlier one is durable). Errors as for
  // Write. A store without such a log writes them durably.
  virtual absl::Status WriteUnsynced(absl::Span<const Transition> transitions) {
    return Write(transitions);
  }
  // Makes every earlier WriteUnsynced durable. Errors as for Write.
  virtual absl::Status Sync() { return absl::OkStatus(); }

  // The stored job `id`, as the last write put it (written unsynced counts). kNotFound if there is
  // none; kDataLoss if its record does not decode (or holds another id); kUnavailable for I/O
  // errors. Safe to call while the CommitPipeline writes (the broker reads cold jobs back this
  // way, see Broker's memory model in docs/architecture.md).
  virtual absl::StatusOr<Job> ReadJob(uint32_t partition, const std::string& id) = 0;

  // Visits the partition's applied seq, then every stored policy override, then dedup entry, then
  // job of `partition`, each in key order. A record
  // that does not decode goes to OnCorrupt and the scan goes on. kDataLoss only if the store
  // cannot be read past some point (the visitor may have seen earlier records by then);
  // kUnavailable for I/O errors.
  virtual absl::Status Recover(uint32_t partition, RecoveryVisitor& visitor) = 0;

  // After a failed Write: makes the store accept writes again if it can. OK means a synced write
  // just succeeded (a later one may still fail); then Recover() reads what is durable, which may
  // or may not include the failed write. The cause otherwise (kResourceExhausted while the disk
  // is still full, kUnavailable otherwise); the caller tries again later. OK at once when nothing
  // failed.
  virtual absl::Status Resume() = 0;
};

}  // namespace jobbroker::core
