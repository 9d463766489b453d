#include "tests/testing/memory_replica_storage.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/replication/snapshot_chunks.h"

namespace jobbroker::testing {
namespace {

absl::Status Misuse(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat("replica storage misused: ", what));
}

}  // namespace

MemoryReplicaStorage::MemoryReplicaStorage(uint32_t partition)
    : partition_(partition), state_(std::make_unique<storage::MemoryStore>()) {}

absl::Status MemoryReplicaStorage::RaiseEpochFloor(int64_t epoch) {
  if (epoch > floor_) floor_ = epoch;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MemoryReplicaStorage::EpochAt(uint64_t seq) const {
  if (seq == base_.seq) return base_.epoch;
  if (seq < base_.seq || seq > log_end()) {
    return absl::NotFoundError(absl::StrCat("no log entry ", seq));
  }
  return log_[seq - base_.seq - 1].epoch;
}

absl::StatusOr<std::vector<cluster::LogEntry>> MemoryReplicaStorage::Read(
    uint64_t from, size_t max_entries) const {
  if (from <= base_.seq) return Misuse(absl::StrCat("read from ", from, " at or below the base"));
  std::vector<cluster::LogEntry> entries;
  for (uint64_t seq = from; seq <= log_end() && entries.size() < max_entries; ++seq) {
    entries.push_back(log_[seq - base_.seq - 1]);
  }
  return entries;
}

absl::Status MemoryReplicaStorage::Append(const std::vector<cluster::LogEntry>& entries) {
  uint64_t expected = log_end() + 1;
  for (const auto& entry : entries) {
    if (entry.seq != expected++) return Misuse(absl::StrCat("append of entry ", entry.seq));
  }
  for (const auto& entry : entries) log_.push_back(entry);
  return absl::OkStatus();
}

absl::Status MemoryReplicaStorage::TruncateAfter(uint64_t seq) {
  if (seq < applied_) return Misuse(absl::StrCat("truncation below the applied ", applied_));
  if (seq >= log_end()) return absl::OkStatus();
  log_.resize(seq - base_.seq);
  ++removals_;
  return absl::OkStatus();
}

absl::Status MemoryReplicaStorage::TrimThrough(uint64_t seq) {
  if (seq > applied_) return Misuse(absl::StrCat("trim above the applied ", applied_));
  if (seq <= base_.seq) return absl::OkStatus();
  int64_t epoch = log_[seq - base_.seq - 1].epoch;
  log_.erase(log_.begin(), log_.begin() + static_cast<std::ptrdiff_t>(seq - base_.seq));
  base_ = {seq, epoch};
  return absl::OkStatus();
}

absl::Status MemoryReplicaStorage::ApplyThrough(uint64_t seq) {
  if (seq > log_end()) return Misuse(absl::StrCat("apply through ", seq, " beyond the log"));
  for (uint64_t next = applied_ + 1; next <= seq; ++next) {
    const cluster::LogEntry& entry = log_[next - base_.seq - 1];
    core::Transition transition = entry.transition;
    transition.partition = partition_;
    transition.seq = entry.seq;
    if (auto status = state_->Write({transition}); !status.ok()) return status;
    applied_ = next;
    applied_journal_.push_back({{entry.seq, entry.epoch},
                                transition.put_jobs.empty() ? "" : transition.put_jobs.front().id});
  }
  return absl::OkStatus();
}

absl::Status MemoryReplicaStorage::AppendCommitted(std::vector<cluster::LogEntry> entries,
                                                   bool keep_in_log, bool /*sync*/) {
  if (entries.empty()) return absl::OkStatus();
  if (applied_ != log_end()) {
    return Misuse(absl::StrCat("committed append with entries ", applied_ + 1, "..", log_end(),
                               " not applied"));
  }
  const uint64_t last = entries.back().seq;
  if (auto status = Append(entries); !status.ok()) return status;
  if (auto status = ApplyThrough(last); !status.ok()) return status;
  return keep_in_log ? absl::OkStatus() : TrimThrough(last);
}

absl::StatusOr<std::vector<core::Transition>> MemoryReplicaStorage::SnapshotChunks(
    size_t records_per_chunk) const {
  return cluster::CutSnapshotChunks(*state_, partition_, records_per_chunk);
}

absl::Status MemoryReplicaStorage::InstallSnapshot(cluster::LogPosition at,
                                                   const std::vector<core::Transition>& chunks) {
  auto state = std::make_unique<storage::MemoryStore>();
  for (core::Transition chunk : chunks) {
    chunk.partition = partition_;
    chunk.seq = 0;
    if (auto status = state->Write({chunk}); !status.ok()) return status;
  }
  core::Transition mark;
  mark.partition = partition_;
  mark.seq = at.seq;
  if (auto status = state->Write({mark}); !status.ok()) return status;
  state_ = std::move(state);
  log_.clear();
  base_ = at;
  applied_ = at.seq;
  ++removals_;
  ++snapshots_installed_;
  return absl::OkStatus();
}

}  // namespace jobbroker::testing
