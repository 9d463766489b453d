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
    for (const core::Job& job : t.put_jobs) jobs_.insert_or_assign(job.id, job);
    for (const std::string& id : t.delete_jobs) jobs_.erase(id);
    for (const core::DedupEntry& d : t.put_dedup) dedup_.insert_or_assign({d.queue, d.key}, d);
    for (const auto& queue_key : t.delete_dedup) dedup_.erase(queue_key);
    for (const auto& [queue, policy] : t.put_policies) policies_.insert_or_assign(queue, policy);
    for (const std::string& queue : t.delete_policies) policies_.erase(queue);
  }
  return absl::OkStatus();
}

absl::Status MemoryStore::Recover(core::RecoveryVisitor& visitor) {
  // Copy under the lock and visit outside it, so that a visitor may call back into the store.
  std::vector<std::pair<std::string, core::PolicyOverride>> policies;
  std::vector<core::DedupEntry> dedup;
  std::vector<core::Job> jobs;
  {
    absl::MutexLock lock(&mu_);
    policies.assign(policies_.begin(), policies_.end());
    dedup.reserve(dedup_.size());
    for (const auto& [queue_key, entry] : dedup_) dedup.push_back(entry);
    jobs.reserve(jobs_.size());
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
  }
  for (auto& [queue, policy] : policies) visitor.OnPolicy(std::move(queue), std::move(policy));
  for (core::DedupEntry& entry : dedup) visitor.OnDedup(std::move(entry));
  for (core::Job& job : jobs) visitor.OnJob(std::move(job));
  return absl::OkStatus();
}

absl::StatusOr<core::Job> MemoryStore::ReadJob(const std::string& id) {
  std::optional<core::Job> job = FindJob(id);
  if (!job.has_value()) return absl::NotFoundError(absl::StrCat("no stored job ", id));
  return *std::move(job);
}

std::optional<core::Job> MemoryStore::FindJob(absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second;
}

size_t MemoryStore::job_count() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

size_t MemoryStore::dedup_count() const {
  absl::MutexLock lock(&mu_);
  return dedup_.size();
}

size_t MemoryStore::policy_count() const {
  absl::MutexLock lock(&mu_);
  return policies_.size();
}

}  // namespace jobbroker::storage
