#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/store.h"

// Forward declarations keep RocksDB's headers out of everything that includes this one.
namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class EventListener;
class Logger;
class WriteBatch;
}  // namespace rocksdb

namespace jobbroker::storage {

// On-disk layout (format 2), for tools and tests. P is the partition as 4 bytes, big-endian, so
// each partition's keys are one contiguous range; record values are of storage/record.proto.
//   default  : "format" -> decimal store format version (kRocksDbStoreFormatVersion)
//              "partitions" -> decimal partition count, fixed when the store is created
//              "applied_seq" + P -> 8 bytes big-endian: the partition's last Transition::seq
//   jobs     : P + job id -> JobRecord
//   dedup    : P + queue + '\0' + dedup key -> DedupRecord
//   policies : P + queue -> PolicyRecord (run-time overrides)
//   replication_log : P + 8 bytes big-endian seq -> LogEntryRecord: an entry of the partition's
//              replication log (cluster mode; empty in a single-node store)
//   default  : "epoch_floor" + P -> 8 bytes big-endian: the replica's epoch floor (cluster mode)
//              "log_base" + P -> 16 bytes big-endian: seq, then epoch, of the entry before the
//              first one stored (trimmed, or the snapshot the replica was built from)
// Format 1 (before partitions) had the same column families without P and no replication_log; it
// is upgraded in place when opened (one partition, its keys moved under partition 0).
inline constexpr char kRocksDbFormatKey[] = "format";
inline constexpr char kRocksDbPartitionsKey[] = "partitions";
inline constexpr char kRocksDbAppliedSeqKey[] = "applied_seq";
inline constexpr char kRocksDbEpochFloorKey[] = "epoch_floor";
inline constexpr char kRocksDbLogBaseKey[] = "log_base";
inline constexpr char kRocksDbJobsColumnFamily[] = "jobs";
inline constexpr char kRocksDbDedupColumnFamily[] = "dedup";
inline constexpr char kRocksDbPoliciesColumnFamily[] = "policies";
inline constexpr char kRocksDbReplicationLogColumnFamily[] = "replication_log";
inline constexpr char kRocksDbSchedulesColumnFamily[] = "schedules";
// The store format this build writes and the newest it opens. Bump it when the layout above
// changes in a way an older build would misread.
inline constexpr int kRocksDbStoreFormatVersion = 2;
// The key prefix of `partition` (P above): 4 bytes, big-endian.
inline constexpr size_t kPartitionKeyPrefixBytes = 4;
std::string PartitionKeyPrefix(uint32_t partition);
// Bytes Resume() writes to a scratch file to see whether the disk takes writes again.
inline constexpr size_t kResumeProbeBytes = size_t{64} << 10;

struct RocksDbStoreOptions {
  // Partitions of a store created by Open; 1 to core::kMaxPartitions. An existing store keeps
  // the count it was created with (partitions() tells), since each queue's partition, and so
  // where its records are, follows from it.
  uint32_t partitions = 1;
  // Memtable size per column family, in bytes. Default 16 MiB: jobs are written once and deleted
  // soon, so a put and its delete often meet in the same memtable; bigger buys little.
  size_t write_buffer_size = size_t{16} << 20;
  // Total WAL size, in bytes, beyond which the column families pinning the oldest WAL file are
  // flushed. Bounds WAL replay at restart. Default 64 MiB.
  uint64_t max_total_wal_size = uint64_t{64} << 20;
  // Threads for background flushes and compactions. Default 2 (the target machine's cores).
  int background_threads = 2;
  // The Env (and through it the FileSystem) RocksDB works on. Borrowed: must outlive the store.
  // Default null: RocksDB's default Env, the local filesystem. Tests pass one that injects
  // faults (tests/storage/faulty_file_system.h).
  rocksdb::Env* env = nullptr;
};

// Cluster mode: a partition's replica records beside its state (the layout above), for
// cluster/replication/rocksdb_replica_storage.h, their one user. Single-node mode never writes
// them.
struct ReplicaLogRecord {
  uint64_t seq = 0;
  int64_t epoch = 0;
  core::Transition transition;
};
struct ReplicaRecords {
  int64_t epoch_floor = 0;
  uint64_t base_seq = 0;
  int64_t base_epoch = 0;
  uint64_t last_seq = 0;  // the last stored log entry: the base when there is none
  int64_t last_epoch = 0;
  uint64_t applied_seq = 0;
};
// One atomic, synced write of a replica's records, applied in the order of its fields.
struct ReplicaWrite {
  std::optional<int64_t> epoch_floor;
  // Deletes the partition's whole log and its jobs, dedup entries and policies (a snapshot
  // replaces them).
  bool clear_partition = false;
  // Deletes the log entries first..last (both included), with one range deletion.
  std::optional<std::pair<uint64_t, uint64_t>> delete_log;
  std::vector<ReplicaLogRecord> append;
  // Applied to the state as Write does; each numbered one advances applied_seq.
  std::vector<core::Transition> apply;
  // Sets applied_seq outright (a snapshot's position), after `apply`.
  std::optional<uint64_t> applied_seq;
  std::optional<std::pair<uint64_t, int64_t>> log_base;  // (seq, epoch)
  // false: written without an fsync of its own. A power loss may then lose it, but never
  // without losing every write after it (the write-ahead log comes back as a prefix), and the
  // next synced write makes it durable. For what the log can redo: applying and trimming.
  bool sync = true;
};

// The durable Store: one RocksDB database in a directory, with the column families above.
// Every Write is one WriteBatch written with sync = true (WAL always on), so an OK Write survives
// kill -9 and power loss. RocksDB serializes concurrent Writes and shares one fsync between them
// (group commit).
//
// Failures: a full disk is kResourceExhausted, other I/O errors kUnavailable. After a failed
// write RocksDB refuses writes (it keeps its background error) until Resume(). RocksDB's own
// automatic recovery is off: the caller decides when to try again, so one loop does it.
//
// Thread-safe. Only one RocksDbStore (indeed one process) may have a directory open at a time.
// The destructor closes the database; an open store owns its directory's lock until then.
class RocksDbStore final : public core::Store {
 public:
  // Opens the store in `dir`, creating it (and any missing column family) if needed, with
  // opts.partitions partitions. A format-1 store is upgraded in place first (crash-safe: an
  // interrupted upgrade goes on at the next open). kInvalidArgument for opts.partitions out of
  // range. kFailedPrecondition if the directory holds a store of a newer format than this build, or
  // a non-empty database without a format marker (not a jobbroker store). kUnavailable for I/O
  // errors, including another process (or RocksDbStore) holding the directory. kDataLoss if
  // RocksDB finds corruption or the format marker is unreadable.
  static absl::StatusOr<std::unique_ptr<RocksDbStore>> Open(const std::string& dir,
                                                            RocksDbStoreOptions opts = {});

  RocksDbStore(const RocksDbStore&) = delete;
  RocksDbStore& operator=(const RocksDbStore&) = delete;
  ~RocksDbStore() override;

  // Transitions apply in order; inside one Transition its fields apply in declaration order (job
  // puts, job deletes, dedup puts, dedup deletes, policy puts, policy deletes), so a later put of
  // the same key wins. kInvalidArgument (nothing written) if a dedup put or delete names a queue
  // containing '\0'.
  // kResourceExhausted when the disk is full, kUnavailable for other I/O errors: then the write
  // may or may not reach disk, and RocksDB refuses further writes until Resume(); the caller
  // must stop and not acknowledge anything.
  absl::Status Write(absl::Span<const core::Transition> transitions) override;
  absl::Status WriteUnsynced(absl::Span<const core::Transition> transitions) override;
  absl::Status Sync() override;

  absl::StatusOr<core::Job> ReadJob(uint32_t partition, const std::string& id) override;

  // Visits the partition's applied seq, its policies, then dedup entries, then jobs, each in key
  // order (keys as the broker knows them, without the partition prefix). A record that does not
  // decode (or a job record under another job's id) goes to OnCorrupt, with the column family,
  // the key (C-escaped) and what is wrong, and the scan goes on. kDataLoss if RocksDB reports
  // corruption (the visitor may have seen earlier records by then); kUnavailable for I/O errors.
  absl::Status Recover(uint32_t partition, core::RecoveryVisitor& visitor) override;

  // After a failed write: first a synced write of a scratch file next to the database (while
  // that fails, nothing else is tried and reads keep working); then DB::Resume() (flushes the
  // memtables, starts a new WAL) and a synced rewrite of the format marker to prove writes work.
  // If RocksDB will not resume (an I/O error it deems fatal), the database is closed and opened
  // again: WAL replay then yields what a restart would. Errors as Write; after a reopen that
  // failed, every call is kUnavailable until a Resume() reopens it.
  absl::Status Resume() override;

  // Cluster mode (ReplicaWrite above). kDataLoss if a record does not decode; kUnavailable for
  // I/O errors. WriteReplica: errors as Write; kInvalidArgument (nothing written) as Write.
  absl::StatusOr<ReplicaRecords> ReadReplica(uint32_t partition);
  // The log entries from `from` on, at most `max_entries`, in seq order.
  absl::StatusOr<std::vector<ReplicaLogRecord>> ReadReplicaLog(uint32_t partition, uint64_t from,
                                                               size_t max_entries);
  absl::Status WriteReplica(uint32_t partition, const ReplicaWrite& write);

  // RocksDB's estimates over every column family, for metrics: bytes of live data, and bytes
  // that compaction still has to rewrite (a growing figure means compaction cannot keep up).
  uint64_t LiveDataBytes() const;
  uint64_t PendingCompactionBytes() const;

  const std::string& dir() const { return dir_; }
  // The store's partition count (fixed at creation; 1 for an upgraded format-1 store).
  uint32_t partitions() const;
  // The format the directory had when this store first opened it, if Open upgraded it (0 if
  // it was new or already current): for the start-up log.
  int upgraded_from() const;

 private:
  // Out of line: the members' destructors need RocksDB's complete types.
  RocksDbStore(std::string dir, RocksDbStoreOptions opts);

  // Opens the database into the members below (which must be empty).
  absl::Status OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys the handles and closes the database; the members are empty afterwards.
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the format marker and the partition count, writing them if the database is new, and
  // upgrades a format-1 store.
  absl::Status CheckFormatLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Format 1 -> 2: every record moved under partition 0, in chunks, then the marker rewritten.
  absl::Status UpgradeFromFormat1Locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates, fills with kResumeProbeBytes, syncs and deletes a file in the directory: whether
  // the disk takes writes again, without touching the database.
  absl::Status ProbeDisk() const;
  // kUnavailable if a failed reopen left the store without a database.
  absl::Status CheckOpenLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Adds the puts and deletes of `transitions` to `batch`, with the outcome of applying them in
  // order. The job records go first, sorted by key, and only the last change of each job is
  // added: see the definition for why.
  absl::Status AddTransitionsLocked(absl::Span<const core::Transition> transitions,
                                    rocksdb::WriteBatch& batch) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Write (sync) and WriteUnsynced.
  absl::Status WriteTransitions(absl::Span<const core::Transition> transitions, bool sync);

  const std::string dir_;
  const RocksDbStoreOptions opts_;
  // Turns RocksDB's automatic error recovery off (see the class comment).
  const std::shared_ptr<rocksdb::EventListener> listener_;
  // RocksDB's info LOG (storage/rocksdb_info_log.h), kept across reopens.
  const std::shared_ptr<rocksdb::Logger> info_log_;
  // Readers use the database (RocksDB's own locking makes that thread-safe); Resume() takes it
  // exclusively, since it may close and reopen the database.
  mutable absl::Mutex mu_;
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(mu_);
  // Read from the store when it opens.
  uint32_t partitions_ ABSL_GUARDED_BY(mu_) = 0;
  int upgraded_from_ ABSL_GUARDED_BY(mu_) = 0;
  // The five handles are also in handles_, which owns them.
  rocksdb::ColumnFamilyHandle* meta_ ABSL_GUARDED_BY(mu_) = nullptr;  // "default": the marker
  rocksdb::ColumnFamilyHandle* jobs_ ABSL_GUARDED_BY(mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* dedup_ ABSL_GUARDED_BY(mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* policies_ ABSL_GUARDED_BY(mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* schedules_ ABSL_GUARDED_BY(mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* replication_log_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Every handle Open returned (ours and any column family a newer build added), destroyed
  // before the DB is closed.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_ ABSL_GUARDED_BY(mu_);
  // Why the last reopen failed, while db_ is null.
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::storage
