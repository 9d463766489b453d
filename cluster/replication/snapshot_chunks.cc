#include "cluster/replication/snapshot_chunks.h"

#include <string>
#include <utility>

namespace jobbroker::cluster {
namespace {

class ChunkingVisitor final : public core::RecoveryVisitor {
 public:
  ChunkingVisitor(uint32_t partition, size_t per_chunk)
      : partition_(partition), per_chunk_(per_chunk) {}
  void OnJob(core::Job job) override { Next().put_jobs.push_back(std::move(job)); }
  void OnDedup(core::DedupEntry entry) override { Next().put_dedup.push_back(std::move(entry)); }
  void OnPolicy(std::string queue, core::PolicyOverride policy) override {
    Next().put_policies.emplace_back(std::move(queue), std::move(policy));
  }
  void OnSchedule(core::Schedule schedule) override {
    Next().put_schedules.push_back(std::move(schedule));
  }
  void OnCorrupt(core::CorruptRecord) override {}
  std::vector<core::Transition> Take() { return std::move(chunks_); }

 private:
  core::Transition& Next() {
    if (chunks_.empty() || in_last_ == per_chunk_) {
      chunks_.emplace_back();
      chunks_.back().partition = partition_;
      in_last_ = 0;
    }
    ++in_last_;
    return chunks_.back();
  }
  const uint32_t partition_;
  const size_t per_chunk_;
  size_t in_last_ = 0;
  std::vector<core::Transition> chunks_;
};

}  // namespace

absl::StatusOr<std::vector<core::Transition>> CutSnapshotChunks(core::Store& state,
                                                                uint32_t partition,
                                                                size_t records_per_chunk) {
  ChunkingVisitor visitor(partition, records_per_chunk == 0 ? 1 : records_per_chunk);
  if (absl::Status status = state.Recover(partition, visitor); !status.ok()) return status;
  return visitor.Take();
}

}  // namespace jobbroker::cluster
