#include "core/watchers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace jobbroker::core {

uint64_t Watchers::Add(const Job& current, std::shared_ptr<JobWatcher> watcher) {
  const uint64_t handle = next_handle_++;
  by_job_[current.id].push_back(Entry{handle, std::move(watcher), SeenOf(current)});
  handles_.emplace(handle, current.id);
  return handle;
}

bool Watchers::Remove(uint64_t handle) {
  auto h = handles_.find(handle);
  if (h == handles_.end()) return false;
  auto it = by_job_.find(h->second);
  if (it != by_job_.end()) {
    std::vector<Entry>& entries = it->second;
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [handle](const Entry& e) { return e.handle == handle; }),
                  entries.end());
    if (entries.empty()) by_job_.erase(it);
  }
  handles_.erase(h);
  return true;
}

void Watchers::Collect(const Job& job, std::vector<WatchNotice>& out) {
  auto it = by_job_.find(job.id);
  if (it == by_job_.end()) return;
  const Seen now = SeenOf(job);
  const bool terminal = IsTerminal(job.state);
  for (Entry& e : it->second) {
    if (e.seen == now && !terminal) continue;
    WatchNotice n{e.watcher, std::nullopt, std::nullopt};
    if (!(e.seen == now)) n.job = job;
    if (terminal) n.end = absl::OkStatus();
    e.seen = now;
    out.push_back(std::move(n));
  }
  if (!terminal) return;
  for (const Entry& e : it->second) handles_.erase(e.handle);
  by_job_.erase(it);
}

void Watchers::CollectRemoved(const std::string& id, std::vector<WatchNotice>& out) {
  auto it = by_job_.find(id);
  if (it == by_job_.end()) return;
  for (const Entry& e : it->second) {
    out.push_back(WatchNotice{e.watcher, std::nullopt,
                              absl::NotFoundError(absl::StrCat("job ", id, " was removed"))});
    handles_.erase(e.handle);
  }
  by_job_.erase(it);
}

void Watchers::DetachAll(const absl::Status& why, std::vector<WatchNotice>& out) {
  for (auto& [id, entries] : by_job_) {
    for (const Entry& e : entries) out.push_back(WatchNotice{e.watcher, std::nullopt, why});
  }
  by_job_.clear();
  handles_.clear();
}

}  // namespace jobbroker::core
