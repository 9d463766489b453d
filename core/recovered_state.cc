#include "core/recovered_state.h"

namespace jobbroker::core {

void RecoveredState::OnJob(Job job) {
  std::optional<PackedJobId> id;
  if (static_cast<int64_t>(jobs.size()) >= hot_limit_ &&
      (job.state == JobState::kReady || job.state == JobState::kScheduled))
    id = PackJobId(job.id);
  if (!id.has_value()) {  // hot: under the limit, ACTIVE or ended, or an id that cannot pack
    jobs.push_back(std::move(job));
    return;
  }
  auto [it, added] = queue_index_.try_emplace(job.queue, queue_names.size());
  if (added) queue_names.push_back(job.queue);
  if (!job.depends_on.empty()) cold_depends_on.emplace_back(job.id, std::move(job.depends_on));
  cold.push_back(ColdJob{*id, job.seq, job.run_at, job.priority, it->second, job.state,
                         std::move(job.concurrency_key), job.expire_at});
}

}  // namespace jobbroker::core
