#include "storage/memory_store.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace jobbroker::storage {
namespace {

// RocksDbStore keys dedup entries as queue + '\0' + key; refusing a NUL here too keeps the two
// stores interchangeable.
absl::Status CheckDedupQueue(const std::string& queue) {
  if (queue.find('\0') == std::string::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("dedup entry queue \"", absl::CHexEscape(queue), "\" contains a NUL byte"));
}

}  // namespace

absl::Status MemoryStore::Write(absl::Span<const core::Transition> transitions) {
  // Validate everything before touching the maps, so that a refused write applies nothing.
  for (const core::Transition& t : transitions) {
    for (const core::DedupEntry& d : t.put_dedup) BROKER_RETURN_IF_ERROR(CheckDedupQueue(d.queue));
    for (const auto& [queue, key] : t.delete_dedup) BROKER_RETURN_IF_ERROR(CheckDedupQueue(queue));
  }

  absl::MutexLock lock(&mu_);
  for (const core::Transition& t : transitions) {
    Partition& p = partitions_[t.partition];
    for (const core::Job& job : t.put_jobs) p.jobs.insert_or_assign(job.id, job);
    for (const std::string& id : t.delete_jobs) p.jobs.erase(id);
    for (const core::DedupEntry& d : t.put_dedup) p.dedup.insert_or_assign({d.queue, d.key}, d);
    for (const auto& queue_key : t.delete_dedup) p.dedup.erase(queue_key);
    for (const auto& [queue, policy] : t.put_policies) p.policies.insert_or_assign(queue, policy);
    for (const std::string& queue : t.delete_policies) p.policies.erase(queue);
    for (const core::Schedule& s : t.put_schedules) p.schedules.insert_or_assign(s.id, s);
    for (const std::string& id : t.delete_schedules) p.schedules.erase(id);
    if (t.seq != 0) p.applied_seq = t.seq;
  }
  return absl::OkStatus();
}

absl::Status MemoryStore::Recover(uint32_t partition, core::RecoveryVisitor& visitor) {
  // Copy under the lock and visit outside it, so that a visitor may call back into the store.
  uint64_t applied_seq = 0;
  std::vector<std::pair<std::string, core::PolicyOverride>> policies;
  std::vector<core::DedupEntry> dedup;
  std::vector<core::Job> jobs;
  std::vector<core::Schedule> schedules;
  {
    absl::MutexLock lock(&mu_);
    auto found = partitions_.find(partition);
    if (found != partitions_.end()) {
      const Partition& p = found->second;
      applied_seq = p.applied_seq;
      policies.assign(p.policies.begin(), p.policies.end());
      dedup.reserve(p.dedup.size());
      for (const auto& [queue_key, entry] : p.dedup) dedup.push_back(entry);
      jobs.reserve(p.jobs.size());
      for (const auto& [id, job] : p.jobs) jobs.push_back(job);
      for (const auto& [id, s] : p.schedules) schedules.push_back(s);
    }
  }
  visitor.OnAppliedSeq(applied_seq);
  for (auto& [queue, policy] : policies) visitor.OnPolicy(std::move(queue), std::move(policy));
  for (core::DedupEntry& entry : dedup) visitor.OnDedup(std::move(entry));
  for (core::Job& job : jobs) visitor.OnJob(std::move(job));
  for (core::Schedule& s : schedules) visitor.OnSchedule(std::move(s));
  return absl::OkStatus();
}

absl::StatusOr<core::Job> MemoryStore::ReadJob(uint32_t partition, const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto p = partitions_.find(partition);
  if (p != partitions_.end()) {
    auto it = p->second.jobs.find(id);
    if (it != p->second.jobs.end()) return it->second;
  }
  return absl::NotFoundError(absl::StrCat("no stored job ", id, " in partition ", partition));
}

std::optional<core::Job> MemoryStore::FindJob(absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [number, p] : partitions_) {
    auto it = p.jobs.find(id);
    if (it != p.jobs.end()) return it->second;
  }
  return std::nullopt;
}

size_t MemoryStore::job_count() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [number, p] : partitions_) n += p.jobs.size();
  return n;
}

size_t MemoryStore::dedup_count() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [number, p] : partitions_) n += p.dedup.size();
  return n;
}

size_t MemoryStore::policy_count() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [number, p] : partitions_) n += p.policies.size();
  return n;
}

uint64_t MemoryStore::applied_seq(uint32_t partition) const {
  absl::MutexLock lock(&mu_);
  auto p = partitions_.find(partition);
  return p == partitions_.end() ? 0 : p->second.applied_seq;
}

}  // namespace jobbroker::storage
