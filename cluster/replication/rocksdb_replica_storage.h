#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/replication/replica_storage.h"
#include "storage/rocksdb_store.h"

namespace jobbroker::cluster {

// The ReplicaStorage of a node: one partition's floor, replication log and state in the node's
// RocksDbStore (its replication_log column family and the partition's records; the layout is in
// storage/rocksdb_store.h). Every mutating call is one WriteBatch, so what a call changes
// survives kill -9 and power loss whole or not at all; each is synced except applying and
// trimming (see replica_storage.h: a power loss may undo them, the log redoes them), which saves
// two of every three fsyncs of a leader's batch. Applying entries goes into one write with the
// applied_seq it reaches.
//
// It keeps the log's bounds in memory (read once by Open), and its newest entries as they were
// appended: a leader sends each batch to its followers and applies it once they have it, and a
// follower applies what it appended a tick ago, all without reading the entries back from
// RocksDB and decoding them again. It keeps what is not applied yet and the last
// kRecentKeptApplied applied entries (whose epochs the next messages name), within
// kRecentMaxEntries and about kRecentMaxBytes; older ones (for a follower far behind) are read
// from the store. Not thread-safe, like every ReplicaStorage; the store may serve other
// partitions meanwhile.
class RocksDbReplicaStorage final : public ReplicaStorage {
 public:
  // Reads the partition's replica records from `store` (borrowed: it must outlive this object).
  // Errors as RocksDbStore::ReadReplica.
  static absl::StatusOr<std::unique_ptr<RocksDbReplicaStorage>> Open(storage::RocksDbStore* store,
                                                                     uint32_t partition);

  int64_t epoch_floor() const override { return floor_; }
  absl::Status RaiseEpochFloor(int64_t epoch) override;
  LogPosition log_base() const override { return base_; }
  uint64_t log_end() const override { return end_.seq; }
  absl::StatusOr<int64_t> EpochAt(uint64_t seq) const override;
  absl::StatusOr<std::vector<LogEntry>> Read(uint64_t from, size_t max_entries) const override;
  absl::Status Append(const std::vector<LogEntry>& entries) override;
  absl::Status AppendUnsynced(const std::vector<LogEntry>& entries) override;
  absl::Status SyncLog() override;
  absl::Status TruncateAfter(uint64_t seq) override;
  absl::Status TrimThrough(uint64_t seq) override;
  uint64_t applied_seq() const override { return applied_; }
  absl::Status ApplyThrough(uint64_t seq) override;
  absl::Status AppendCommitted(std::vector<LogEntry> entries, bool keep_in_log, bool sync) override;
  absl::StatusOr<std::vector<core::Transition>> SnapshotChunks(
      size_t records_per_chunk) const override;
  absl::Status InstallSnapshot(LogPosition at,
                               const std::vector<core::Transition>& chunks) override;

 private:
  RocksDbReplicaStorage(storage::RocksDbStore* store, uint32_t partition,
                        const storage::ReplicaRecords& records);
  absl::Status AppendWith(const std::vector<LogEntry>& entries, bool sync);

  // The bound on the entries kept in memory, per partition.
  static constexpr size_t kRecentKeptApplied = 1024;
  static constexpr size_t kRecentMaxEntries = 16384;
  static constexpr size_t kRecentMaxBytes = 16 << 20;

  // Keeps copies of `entries`, just appended, and drops the oldest kept ones past the bounds.
  void KeepRecent(const std::vector<LogEntry>& entries);
  // Drops the kept entries above `seq` (a truncation) or through it (a trim).
  void ForgetRecentAfter(uint64_t seq);
  void ForgetRecentThrough(uint64_t seq);
  // Drops every kept entry (the log was emptied or replaced).
  void ForgetRecent();
  // The first kept entry's seq; end_.seq + 1 when none is kept.
  uint64_t RecentFirst() const { return end_.seq + 1 - recent_.size(); }

  storage::RocksDbStore* const store_;
  const uint32_t partition_;
  int64_t floor_ = 0;
  LogPosition base_;
  LogPosition end_;  // the last stored entry; base_ when the log is empty
  uint64_t applied_ = 0;
  // The newest stored entries, (end_.seq - size, end_.seq], as appended; their approximate size.
  std::deque<LogEntry> recent_;
  std::deque<size_t> recent_sizes_;  // each one's approximate size, in the same order
  size_t recent_bytes_ = 0;
};

}  // namespace jobbroker::cluster
