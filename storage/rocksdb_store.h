#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/store.h"

// Forward declarations keep RocksDB's headers out of everything that includes this one.
namespace rocksdb {
class ColumnFamilyHandle;
class DB;
}  // namespace rocksdb

namespace jobbroker {

// On-disk layout, for tools and tests. Every value is a record of storage/record.proto.
//   default  : "format" -> decimal store format version (kRocksDbStoreFormatVersion at creation)
//   jobs     : job id -> JobRecord
//   dedup    : queue + '\0' + dedup key -> DedupRecord
//   policies : queue -> PolicyRecord (run-time overrides)
inline constexpr char kRocksDbFormatKey[] = "format";
inline constexpr char kRocksDbJobsColumnFamily[] = "jobs";
inline constexpr char kRocksDbDedupColumnFamily[] = "dedup";
inline constexpr char kRocksDbPoliciesColumnFamily[] = "policies";
// The store format this build writes and the newest it opens. Bump it when the layout above
// changes in a way an older build would misread.
inline constexpr int kRocksDbStoreFormatVersion = 1;

struct RocksDbStoreOptions {
  // Memtable size per column family, in bytes. Default 16 MiB: jobs are written once and deleted
  // soon, so a put and its delete often meet in the same memtable; bigger buys little.
  size_t write_buffer_size = size_t{16} << 20;
  // Total WAL size, in bytes, beyond which the column families pinning the oldest WAL file are
  // flushed. Bounds WAL replay at restart. Default 64 MiB.
  uint64_t max_total_wal_size = uint64_t{64} << 20;
  // Threads for background flushes and compactions. Default 2 (the target machine's cores).
  int background_threads = 2;
};

// The durable Store: one RocksDB database in a directory, with the column families above.
// Every Write is one WriteBatch written with sync = true (WAL always on), so an OK Write survives
// kill -9 and power loss. RocksDB serializes concurrent Writes and shares one fsync between them
// (group commit).
//
// Thread-safe. Only one RocksDbStore (indeed one process) may have a directory open at a time.
// The destructor closes the database; an open store owns its directory's lock until then.
class RocksDbStore final : public Store {
 public:
  // Opens the store in `dir`, creating it (and any missing column family) if needed.
  // kFailedPrecondition if the directory holds a store of a newer format than this build, or a
  // non-empty database without a format marker (not a jobbroker store). kUnavailable for I/O
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
  // kUnavailable for I/O errors: then the write may or may not reach disk, and RocksDB refuses
  // further writes until the error clears; the caller must stop and not acknowledge anything.
  absl::Status Write(absl::Span<const Transition> transitions) override;

  // Visits policies, then dedup entries, then jobs, each in key order. kDataLoss naming the
  // column family and key (C-escaped) of the first record that does not decode, or if RocksDB
  // reports corruption; the visitor may have seen earlier records by then.
  absl::Status Recover(RecoveryVisitor& visitor) override;

  // RocksDB's estimates over every column family, for metrics: bytes of live data, and bytes
  // that compaction still has to rewrite (a growing figure means compaction cannot keep up).
  uint64_t LiveDataBytes() const;
  uint64_t PendingCompactionBytes() const;

  const std::string& dir() const { return dir_; }

 private:
  // Out of line: the members' destructors need RocksDB's complete types.
  explicit RocksDbStore(std::string dir);

  // Reads the format marker, writing it if the database is new.
  absl::Status CheckFormat();

  const std::string dir_;
  // Set once by Open; RocksDB's own locking makes their use thread-safe. The four handles are
  // also in handles_, which owns them.
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* meta_ = nullptr;  // "default": the format marker
  rocksdb::ColumnFamilyHandle* jobs_ = nullptr;
  rocksdb::ColumnFamilyHandle* dedup_ = nullptr;
  rocksdb::ColumnFamilyHandle* policies_ = nullptr;
  // Every handle Open returned (ours and any column family a newer build added), destroyed
  // before the DB is closed.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
};

}  // namespace jobbroker
