#include "core/workers.h"

#include <algorithm>
#include <iterator>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace jobbroker::core {

RunningJob RunningJobOf(const Job& job) {
  RunningJob r;
  r.job_id = job.id;
  r.queue = job.queue;
  r.attempt = job.attempt;
  if (!job.attempts.empty()) r.started_at = job.attempts.back().started_at;
  r.lease_deadline = job.lease_deadline;
  r.timeout_at = job.timeout_at;
  r.progress = job.progress;
  return r;
}

void MergeWorkers(std::vector<WorkerInfo>& into, std::vector<WorkerInfo> more) {
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i < into.size(); ++i) index.emplace(into[i].worker_id, i);
  for (WorkerInfo& w : more) {
    auto [it, added] = index.emplace(w.worker_id, into.size());
    if (added) {
      into.push_back(std::move(w));
      continue;
    }
    WorkerInfo& to = into[it->second];
    to.queues.insert(to.queues.end(), std::make_move_iterator(w.queues.begin()),
                     std::make_move_iterator(w.queues.end()));
    to.streams += w.streams;
    to.lease_waits += w.lease_waits;
    to.max_in_flight += w.max_in_flight;
    to.connected_at = std::min(to.connected_at, w.connected_at);
    to.running.insert(to.running.end(), std::make_move_iterator(w.running.begin()),
                      std::make_move_iterator(w.running.end()));
  }
  for (WorkerInfo& w : into) {
    std::sort(w.queues.begin(), w.queues.end());
    w.queues.erase(std::unique(w.queues.begin(), w.queues.end()), w.queues.end());
    std::sort(w.running.begin(), w.running.end(), [](const RunningJob& a, const RunningJob& b) {
      return std::tie(a.started_at, a.job_id) < std::tie(b.started_at, b.job_id);
    });
  }
  std::sort(into.begin(), into.end(),
            [](const WorkerInfo& a, const WorkerInfo& b) { return a.worker_id < b.worker_id; });
}

}  // namespace jobbroker::core
