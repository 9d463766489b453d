#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/job.h"
#include "core/policy.h"
#include "core/store.h"

namespace jobbroker::storage {

// A Store that keeps everything in process memory: for tests and benchmarks, never for data that
// must survive the process. Its contents outlive any Broker built over it, so a test can destroy
// a broker, build a new one over the same MemoryStore and Recover() what the first one wrote —
// the in-process stand-in for a restart.
//
// Semantics match RocksDbStore (tests/storage/store_conformance_test.cc holds both to them):
// transitions apply in order; inside one Transition, its fields apply in declaration order (all
// puts of jobs, then job deletes, then dedup puts, dedup deletes, policy puts, policy deletes),
// so a later put of the same key wins and a delete after a put of the same key removes it.
// Each partition's records are apart; Recover visits one partition's applied seq, policies,
// dedup entries, then jobs, each in key order.
//
// Thread-safe (a stricter promise than Store's).
class MemoryStore final : public core::Store {
 public:
  MemoryStore() = default;
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  // OK, or kInvalidArgument (nothing applied) if a dedup put or delete names a queue containing
  // '\0' (RocksDbStore cannot key it).
  absl::Status Write(absl::Span<const core::Transition> transitions) override;
  absl::StatusOr<core::Job> ReadJob(uint32_t partition, const std::string& id) override;
  // Always OK: nothing in memory can be corrupt. The visitor runs without the lock held.
  absl::Status Recover(uint32_t partition, core::RecoveryVisitor& visitor) override;
  // Always OK: nothing in memory can break. (tests/testing/faulty_store.h makes writes fail.)
  absl::Status Resume() override { return absl::OkStatus(); }

  // Inspection for tests: the stored job (of any partition), if any; counts of stored records
  // over every partition; a partition's applied seq.
  std::optional<core::Job> FindJob(absl::string_view id) const;
  size_t job_count() const;
  size_t dedup_count() const;
  size_t policy_count() const;
  uint64_t applied_seq(uint32_t partition) const;

 private:
  struct Partition {
    uint64_t applied_seq = 0;
    std::map<std::string, core::Job, std::less<>> jobs;
    std::map<std::pair<std::string, std::string>, core::DedupEntry> dedup;
    std::map<std::string, core::PolicyOverride> policies;
    std::map<std::string, core::Schedule> schedules;
  };
  mutable absl::Mutex mu_;
  std::map<uint32_t, Partition> partitions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::storage
