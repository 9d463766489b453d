#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "core/ids.h"
#include "core/job.h"
#include "core/store.h"

namespace jobbroker::core {

// Everything a store's Recover reported, collected so that the broker can build its memory
// under its lock. Past `hot_limit` whole jobs, a READY or SCHEDULED job is kept as the few fields
// its indexes need (BrokerOptions::max_hot_jobs): at millions of jobs, whole ones would not fit
// in memory.
//
// The jobs come in chunks, in the store's order: with a sink, each chunk is handed to it as soon
// as it is full, on the scanning thread, so that the broker can build the indexes of one chunk
// while the store reads the next (Broker::Recover); without one, they stay in `chunks` for
// LoadLocked. Not thread-safe; used by one recovery at a time.
class RecoveredState final : public RecoveryVisitor {
 public:
  // What the indexes need of a job left cold.
  struct ColdJob {
    PackedJobId id;
    uint64_t seq = 0;
    absl::Time run_at;
    int32_t priority = 0;
    uint32_t queue = 0;  // index into the queue names of this chunk and the ones before it
    JobState state = JobState::kReady;
    std::string concurrency_key;
    absl::Time expire_at = absl::InfiniteFuture();
  };
  struct Chunk {
    // The run-time policy overrides, in the first chunk only: the store visits them before any
    // job, and the indexes of ended jobs need them (retention).
    std::vector<std::pair<std::string, PolicyOverride>> policies;
    std::vector<Job> jobs;  // whole
    std::vector<ColdJob> cold;
    // The queues first named by this chunk's cold jobs: ColdJob::queue counts on from the names
    // of the earlier chunks.
    std::vector<std::string> new_queue_names;
    // The depends_on of the cold jobs that have one (for Job::dependents): (job id, depends_on).
    std::vector<std::pair<std::string, std::vector<std::string>>> cold_depends_on;
    size_t size() const { return jobs.size() + cold.size(); }
  };
  using Sink = std::function<void(Chunk)>;

  // `chunk_jobs` jobs per chunk (at least 1); `sink` as above, or nullptr.
  explicit RecoveredState(int64_t hot_limit, size_t chunk_jobs = kDefaultChunkJobs,
                          Sink sink = nullptr)
      : hot_limit_(hot_limit),
        chunk_jobs_(chunk_jobs == 0 ? 1 : chunk_jobs),
        sink_(std::move(sink)) {}

  void OnAppliedSeq(uint64_t seq) override { applied_seq = seq; }
  void OnJob(Job job) override;
  bool NextJobMayBeCold() const override { return hot_jobs_ >= hot_limit_; }
  bool OnColdJob(ColdJobFields& job) override;
  void OnDedup(DedupEntry entry) override { dedup.push_back(std::move(entry)); }
  void OnPolicy(std::string queue, PolicyOverride policy) override {
    open_.policies.emplace_back(std::move(queue), std::move(policy));
  }
  void OnSchedule(Schedule schedule) override { schedules.push_back(std::move(schedule)); }
  void OnCorrupt(CorruptRecord record) override { corrupt.push_back(std::move(record)); }

  // Ends the scan: the last chunk (always at least one, which carries the policies) goes to the
  // sink or to `chunks`. Call it once, after the store's Recover, whatever that returned.
  void Finish();

  // Every job reported, hot and cold.
  size_t job_count() const { return job_count_; }

  static constexpr size_t kDefaultChunkJobs = 65536;

  uint64_t applied_seq = 0;
  std::vector<Chunk> chunks;  // without a sink
  std::vector<DedupEntry> dedup;
  std::vector<Schedule> schedules;
  std::vector<CorruptRecord> corrupt;

 private:
  void AddCold(PackedJobId id, const std::string& queue, JobState state, uint64_t seq,
               int32_t priority, absl::Time run_at, std::string concurrency_key,
               absl::Time expire_at, const std::string& job_id,
               std::vector<std::string> depends_on);
  // Hands the open chunk on once it holds chunk_jobs_ jobs (or always, with `last`).
  void MaybeHandOn(bool last);

  const int64_t hot_limit_;
  const size_t chunk_jobs_;
  const Sink sink_;
  Chunk open_;
  int64_t hot_jobs_ = 0;
  size_t job_count_ = 0;
  bool handed_any_ = false;
  absl::flat_hash_map<std::string, uint32_t> queue_index_;  // of cold jobs, over all chunks
};

// The hand-off of chunks from the thread that scans the store to the one that builds the
// indexes. Bounded: Push waits while `capacity` chunks are queued, so the scan never runs far
// ahead and memory stays bounded whatever the store holds. Thread-safe.
class ChunkQueue {
 public:
  explicit ChunkQueue(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // Queues `chunk`, waiting for room.
  void Push(RecoveredState::Chunk chunk) ABSL_LOCKS_EXCLUDED(mu_);
  // No more chunks will come.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  // The oldest chunk, waiting for one; nullopt once closed and empty.
  std::optional<RecoveredState::Chunk> Pop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t capacity_;
  absl::Mutex mu_;
  std::deque<RecoveredState::Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace jobbroker::core
