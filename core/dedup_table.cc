#include "core/dedup_table.h"

namespace jobbroker::core {

const DedupEntry* DedupTable::Find(const std::string& queue, const std::string& key) const {
  auto it = entries_.find(Key(queue, key));
  return it == entries_.end() ? nullptr : &it->second;
}

void DedupTable::Put(DedupEntry entry) {
  Key key(entry.queue, entry.key);
  if (auto old = entries_.find(key); old != entries_.end())
    expiry_.erase({old->second.expires_at, entry.queue, entry.key});
  expiry_.emplace(entry.expires_at, entry.queue, entry.key);
  entries_.insert_or_assign(std::move(key), std::move(entry));
}

std::vector<DedupTable::Key> DedupTable::Expire(
    absl::Time now, int& budget, absl::FunctionRef<bool(const std::string& job_id)> job_running) {
  std::vector<Key> freed;
  while (!expiry_.empty() && std::get<0>(*expiry_.begin()) <= now && budget > 0) {
    --budget;
    auto [when, queue, key] = *expiry_.begin();
    expiry_.erase(expiry_.begin());
    auto it = entries_.find(Key(queue, key));
    // Gone, or claimed again since with a later expiry: nothing to do for this entry.
    if (it == entries_.end() || it->second.expires_at > now) continue;
    if (job_running(it->second.job_id)) {
      expiry_.emplace(now + absl::Minutes(1), queue, key);
      continue;
    }
    entries_.erase(it);
    freed.emplace_back(std::move(queue), std::move(key));
  }
  return freed;
}

absl::Time DedupTable::NextExpiry() const {
  return expiry_.empty() ? absl::InfiniteFuture() : std::get<0>(*expiry_.begin());
}

void DedupTable::Clear() {
  entries_.clear();
  expiry_.clear();
}

}  // namespace jobbroker::core
