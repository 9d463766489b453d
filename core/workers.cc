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

RecentWorkers::Seen& RecentWorkers::Touch(const std::string& worker_id, absl::Time now) {
  // Sweep now and then, not on every call: one pass per kForgetAfter keeps the cost per call
  // constant.
  if (now - swept_at_ >= kForgetAfter) {
    absl::erase_if(by_id_,
                   [&](const auto& entry) { return now - entry.second.last_seen > kForgetAfter; });
    swept_at_ = now;
  }
  Seen& seen = by_id_[worker_id];
  seen.last_seen = std::max(seen.last_seen, now);
  return seen;
}

void RecentWorkers::Heard(const std::string& worker_id, absl::Time now) { Touch(worker_id, now); }

void RecentWorkers::Leased(const std::string& worker_id, const std::string& queue,
                           const WorkerOrigin& origin, absl::Time now) {
  Seen& seen = Touch(worker_id, now);
  seen.origin = origin;
  if (!queue.empty()) {
    seen.lease_queue = queue;
    seen.leased_at = now;
  }
}

const RecentWorkers::Seen* RecentWorkers::Find(const std::string& worker_id) const {
  auto it = by_id_.find(worker_id);
  return it == by_id_.end() ? nullptr : &it->second;
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
    if (w.last_seen > to.last_seen) {
      to.last_seen = w.last_seen;
      if (!w.origin.peer.empty()) to.origin = w.origin;  // the place it was heard from last
    }
    if (to.origin.peer.empty()) to.origin = std::move(w.origin);
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
