#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cluster/replication/replica_storage.h"
#include "storage/memory_store.h"

namespace jobbroker::testing {

// A ReplicaStorage in process memory, for the cluster simulator: each call is "durable" at once
// (the object outlives the simulated node's crash and restart), and the state is a MemoryStore,
// so what a replica applied is read back with the store's own inspection methods.
class MemoryReplicaStorage final : public cluster::ReplicaStorage {
 public:
  explicit MemoryReplicaStorage(uint32_t partition);

  int64_t epoch_floor() const override { return floor_; }
  absl::Status RaiseEpochFloor(int64_t epoch) override;
  cluster::LogPosition log_base() const override { return base_; }
  uint64_t log_end() const override { return base_.seq + log_.size(); }
  absl::StatusOr<int64_t> EpochAt(uint64_t seq) const override;
  absl::StatusOr<std::vector<cluster::LogEntry>> Read(uint64_t from,
                                                      size_t max_entries) const override;
  absl::Status Append(const std::vector<cluster::LogEntry>& entries) override;
  // Durable at once, like every call here.
  absl::Status AppendUnsynced(const std::vector<cluster::LogEntry>& entries) override {
    return Append(entries);
  }
  absl::Status SyncLog() override {
    ++sync_calls_;
    return absl::OkStatus();
  }
  absl::Status TruncateAfter(uint64_t seq) override;
  absl::Status TrimThrough(uint64_t seq) override;
  uint64_t applied_seq() const override { return applied_; }
  absl::Status ApplyThrough(uint64_t seq) override;
  absl::Status AppendCommitted(std::vector<cluster::LogEntry> entries, bool keep_in_log,
                               bool sync) override;
  absl::StatusOr<std::vector<core::Transition>> SnapshotChunks(
      size_t records_per_chunk) const override;
  absl::Status InstallSnapshot(cluster::LogPosition at,
                               const std::vector<core::Transition>& chunks) override;

  // The applied state.
  const storage::MemoryStore& state() const { return *state_; }
  storage::MemoryStore& state() { return *state_; }
  // How many calls dropped entries that were not applied (truncations, snapshot installs): the
  // simulator's checker looks again at what this replica holds after each.
  uint64_t removals() const { return removals_; }
  // How many snapshots were installed.
  uint64_t snapshots_installed() const { return snapshots_installed_; }
  // How many times SyncLog was called (each would be an fsync of a real log).
  uint64_t sync_calls() const { return sync_calls_; }
  // Every entry applied since the last call, in order, with the id of the first job it puts (""
  // for none): the simulator's checker compares them across replicas.
  struct Applied {
    cluster::LogPosition position;
    std::string op;
  };
  std::vector<Applied> TakeApplied() { return std::exchange(applied_journal_, {}); }

 private:
  const uint32_t partition_;
  int64_t floor_ = 0;
  cluster::LogPosition base_;
  std::deque<cluster::LogEntry> log_;  // base_.seq + 1, + 2, ...
  uint64_t applied_ = 0;
  std::unique_ptr<storage::MemoryStore> state_;
  uint64_t removals_ = 0;
  uint64_t snapshots_installed_ = 0;
  uint64_t sync_calls_ = 0;
  std::vector<Applied> applied_journal_;
};

}  // namespace jobbroker::testing
