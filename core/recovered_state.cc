#include "core/recovered_state.h"

namespace jobbroker::core {

void RecoveredState::OnJob(Job job) {
  std::optional<PackedJobId> id;
  if (NextJobMayBeCold() && (job.state == JobState::kReady || job.state == JobState::kScheduled))
    id = PackJobId(job.id);
  if (!id.has_value()) {  // hot: under the limit, ACTIVE or ended, or an id that cannot pack
    ++hot_jobs_;
    ++job_count_;
    open_.jobs.push_back(std::move(job));
    MaybeHandOn(false);
    return;
  }
  AddCold(*id, job.queue, job.state, job.seq, job.priority, job.run_at,
          std::move(job.concurrency_key), job.expire_at, job.id, std::move(job.depends_on));
}

bool RecoveredState::OnColdJob(ColdJobFields& job) {
  std::optional<PackedJobId> id = PackJobId(job.id);
  if (!id.has_value()) return false;  // stays hot, as in OnJob: the store sends it whole
  AddCold(*id, job.queue, job.state, job.seq, job.priority, job.run_at,
          std::move(job.concurrency_key), job.expire_at, job.id, std::move(job.depends_on));
  return true;
}

void RecoveredState::AddCold(PackedJobId id, const std::string& queue, JobState state, uint64_t seq,
                             int32_t priority, absl::Time run_at, std::string concurrency_key,
                             absl::Time expire_at, const std::string& job_id,
                             std::vector<std::string> depends_on) {
  auto [it, added] = queue_index_.try_emplace(queue, queue_index_.size());
  if (added) open_.new_queue_names.push_back(queue);
  if (!depends_on.empty()) open_.cold_depends_on.emplace_back(job_id, std::move(depends_on));
  open_.cold.push_back(
      ColdJob{id, seq, run_at, priority, it->second, state, std::move(concurrency_key), expire_at});
  ++job_count_;
  MaybeHandOn(false);
}

void RecoveredState::Finish() { MaybeHandOn(true); }

void RecoveredState::MaybeHandOn(bool last) {
  if (last ? handed_any_ && open_.size() == 0 && open_.policies.empty()
           : open_.size() < chunk_jobs_)
    return;
  handed_any_ = true;
  Chunk full = std::move(open_);
  open_ = Chunk();
  if (sink_) {
    sink_(std::move(full));
  } else {
    chunks.push_back(std::move(full));
  }
}

void ChunkQueue::Push(RecoveredState::Chunk chunk) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ChunkQueue* q)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) { return q->chunks_.size() < q->capacity_; },
      this));
  chunks_.push_back(std::move(chunk));
}

void ChunkQueue::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

std::optional<RecoveredState::Chunk> ChunkQueue::Pop() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ChunkQueue* q)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) { return q->closed_ || !q->chunks_.empty(); },
      this));
  if (chunks_.empty()) return std::nullopt;
  RecoveredState::Chunk chunk = std::move(chunks_.front());
  chunks_.pop_front();
  return chunk;
}

}  // namespace jobbroker::core
