#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/ids.h"
#include "core/job.h"
#include "core/store.h"

namespace jobbroker::core {

// Everything a store's Recover reported, collected so that the broker can build its memory
// under its lock in one go. Past `hot_limit` whole jobs, a READY or SCHEDULED job is kept as the
// few fields its indexes need (BrokerOptions::max_hot_jobs): at millions of jobs, whole ones
// would not fit in memory. Not thread-safe; used by one recovery at a time.
class RecoveredState final : public RecoveryVisitor {
 public:
  // What the indexes need of a job left cold.
  struct ColdJob {
    PackedJobId id;
    uint64_t seq = 0;
    absl::Time run_at;
    int32_t priority = 0;
    uint32_t queue = 0;  // index into queue_names
    JobState state = JobState::kReady;
    std::string concurrency_key;
    absl::Time expire_at = absl::InfiniteFuture();
  };

  explicit RecoveredState(int64_t hot_limit) : hot_limit_(hot_limit) {}

  void OnAppliedSeq(uint64_t seq) override { applied_seq = seq; }
  void OnJob(Job job) override;
  void OnDedup(DedupEntry entry) override { dedup.push_back(std::move(entry)); }
  void OnPolicy(std::string queue, PolicyOverride policy) override {
    policies.emplace_back(std::move(queue), std::move(policy));
  }
  void OnSchedule(Schedule schedule) override { schedules.push_back(std::move(schedule)); }
  void OnCorrupt(CorruptRecord record) override { corrupt.push_back(std::move(record)); }

  size_t job_count() const { return jobs.size() + cold.size(); }

  uint64_t applied_seq = 0;
  std::vector<Job> jobs;  // whole
  std::vector<ColdJob> cold;
  std::vector<std::string> queue_names;  // of cold jobs, each once
  // The depends_on of the cold jobs that have one (for Job::dependents): (job id, depends_on).
  std::vector<std::pair<std::string, std::vector<std::string>>> cold_depends_on;
  std::vector<DedupEntry> dedup;
  std::vector<Schedule> schedules;
  std::vector<std::pair<std::string, PolicyOverride>> policies;
  std::vector<CorruptRecord> corrupt;

 private:
  const int64_t hot_limit_;
  absl::flat_hash_map<std::string, uint32_t> queue_index_;
};

}  // namespace jobbroker::core
