#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/store.h"

namespace jobbroker::cluster {

// One batch of a partition's replication log: the broker transition numbered `seq` (the
// partition's Transition::seq), written by the leader of `epoch`. A (seq, epoch) pair names one
// entry across the whole cluster: one writer per epoch, and a writer numbers each seq once.
struct LogEntry {
  uint64_t seq = 0;
  int64_t epoch = 0;
  core::Transition transition;  // empty for an epoch-start entry (Raft's no-op)
};

// A place in a log: the entry `seq` of `epoch`. {0, 0} is before the first entry.
struct LogPosition {
  uint64_t seq = 0;
  int64_t epoch = 0;
  friend bool operator==(const LogPosition& a, const LogPosition& b) {
    return a.seq == b.seq && a.epoch == b.epoch;
  }
};

// The durable side of one partition's replica on one node: its epoch floor, its replication
// log, and the state that the committed prefix of the log has been applied to. The replica
// (replica.h) is its only user and owns all the protocol; this interface only stores.
//
// The log holds the entries (base, end]: `base` is the position of the last entry that is no
// longer stored because it was trimmed or came with a snapshot (its effects are in the state).
// The state holds every entry through applied_seq(), and base.seq <= applied_seq() <= end.
//
// Every mutating call is durable when it returns OK: a crash keeps it (the simulator's storage is
// durable at once; the RocksDB one syncs its write), except ApplyThrough and TrimThrough, which
// a power loss may undo along with every call after them until the next durable one (the
// RocksDB one writes them without an fsync of their own: its write-ahead log comes back as a
// prefix). Undoing them loses nothing: the log still holds what they applied or trimmed, and
// applied_seq() comes back with the state. On error nothing is known to have changed
// and the replica stops using the storage until it is rebuilt. Not thread-safe: one replica, one
// thread at a time.
class ReplicaStorage {
 public:
  virtual ~ReplicaStorage() = default;

  // The highest epoch this replica has seen (I4 of CLUSTER.md): batches of lower epochs are
  // refused. Only raised.
  virtual int64_t epoch_floor() const = 0;
  virtual absl::Status RaiseEpochFloor(int64_t epoch) = 0;

  virtual LogPosition log_base() const = 0;
  // The last stored entry's seq (base.seq when the log is empty).
  virtual uint64_t log_end() const = 0;
  // The epoch of the entry `seq`, for base.seq <= seq <= log_end(); kNotFound outside.
  virtual absl::StatusOr<int64_t> EpochAt(uint64_t seq) const = 0;
  // Entries from `from` (base.seq < from), at most `max_entries`, in order; fewer at the end.
  virtual absl::StatusOr<std::vector<LogEntry>> Read(uint64_t from, size_t max_entries) const = 0;

  // Adds entries that continue the log: the first one's seq is log_end() + 1, each next one's
  // one more, epochs never below the last stored one.
  virtual absl::Status Append(const std::vector<LogEntry>& entries) = 0;
  // Append without waiting for the disk: the entries are stored and read back at once, and
  // durable once SyncLog() returns; a power loss before may lose them, never an earlier call's
  // work without a later one's. A leader sends them to its followers meanwhile.
  virtual absl::Status AppendUnsynced(const std::vector<LogEntry>& entries) = 0;
  // Makes every earlier call durable.
  virtual absl::Status SyncLog() = 0;
  // Drops every entry above `seq` (applied_seq() <= seq): what older epochs left that the
  // current leader's log does not have.
  virtual absl::Status TruncateAfter(uint64_t seq) = 0;
  // Drops the stored entries through `seq` (seq <= applied_seq()): they are in the state. The
  // base becomes that entry's position.
  virtual absl::Status TrimThrough(uint64_t seq) = 0;

  // The state: applies the stored entries (applied_seq(), seq] in order (seq <= log_end()).
  virtual uint64_t applied_seq() const = 0;
  virtual absl::Status ApplyThrough(uint64_t seq) = 0;

  // Append(entries) and ApplyThrough(the last one) as one call, for entries committed by their
  // own append (a leader with no follower to wait for); every stored entry must be applied
  // already (applied_seq() == log_end()). Unless `keep_in_log`, the entries go straight into the
  // state and the log stays empty, based at the last of them: for a partition that has no other
  // replica to send them to. Durable when it returns, unless not `sync`: then as AppendUnsynced
  // (durable once SyncLog() returns).
  virtual absl::Status AppendCommitted(std::vector<LogEntry> entries, bool keep_in_log,
                                       bool sync) = 0;

  // A copy of the state as of applied_seq(), cut into chunks of at most `records_per_chunk`
  // records, each chunk a Transition of puts (jobs, dedup entries, policies). The real store cuts
  // them from a RocksDB snapshot as they are sent.
  virtual absl::StatusOr<std::vector<core::Transition>> SnapshotChunks(
      size_t records_per_chunk) const = 0;
  // Replaces the state with `chunks` (a leader's SnapshotChunks as of `at`) and the log with an
  // empty one based at `at`; applied_seq() becomes at.seq. The floor is kept.
  virtual absl::Status InstallSnapshot(LogPosition at,
                                       const std::vector<core::Transition>& chunks) = 0;
};

}  // namespace jobbroker::cluster
