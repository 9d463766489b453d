#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/job.h"
#include "core/policy.h"

namespace jobbroker {

// The durable changes of one broker state transition. Applied all or nothing. Inside one
// Transition the fields apply in declaration order (job puts, job deletes, dedup puts, dedup
// deletes, policy puts, policy deletes), so a later put of the same key wins.
struct Transition {
  std::vector<Job> put_jobs;  // whole records; a later put of the same id wins
  std::vector<std::string> delete_jobs;
  std::vector<DedupEntry> put_dedup;
  std::vector<std::pair<std::string, std::string>> delete_dedup;     // (queue, key)
  std::vector<std::pair<std::string, PolicyOverride>> put_policies;  // run-time overrides by queue
  std::vector<std::string> delete_policies;

  bool empty() const {
    return put_jobs.empty() && delete_jobs.empty() && put_dedup.empty() && delete_dedup.empty() &&
           put_policies.empty() && delete_policies.empty();
  }
};

// What the broker reads back at start.
class RecoveryVisitor {
 public:
  virtual ~RecoveryVisitor() = default;
  virtual void OnJob(Job job) = 0;
  virtual void OnDedup(DedupEntry entry) = 0;
  virtual void OnPolicy(std::string queue, PolicyOverride policy) = 0;
};

// The durable store behind the broker. Implementations: MemoryStore (tests), RocksDbStore.
// Thread-compatible: the broker's CommitPipeline is the only writer, and Recover runs before it.
class Store {
 public:
  virtual ~Store() = default;

  // Applies `transitions` in order as one atomic, durable write: when it returns OK, all of them
  // survive a crash. On error the outcome is unknown (a failed fsync may leave the batch in the
  // log): the caller must stop writing and acknowledge nothing of it.
  virtual absl::Status Write(absl::Span<const Transition> transitions) = 0;

  // Visits every stored policy override, then dedup entry, then job, each in key order.
  // kDataLoss for a corrupt record.
  virtual absl::Status Recover(RecoveryVisitor& visitor) = 0;
};

}  // namespace jobbroker
