#include "cluster/replication/rocksdb_replica_storage.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/replication/snapshot_chunks.h"

namespace jobbroker::cluster {
namespace {

// The replica (replica.h) never makes these calls; one that does has a bug, and the store is
// left as it was.
absl::Status Misuse(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat("replica storage misused: ", what));
}

// About the memory a kept entry holds: its strings and a fixed cost per record.
size_t ApproxBytes(const core::Transition& t) {
  size_t bytes = sizeof(LogEntry);
  for (const core::Job& job : t.put_jobs) {
    bytes += sizeof(core::Job) + job.id.size() + job.queue.size() + job.payload.size() +
             job.result.size() + job.checkpoint.size() + job.last_error.size();
    for (const auto& [name, value] : job.headers) bytes += 64 + name.size() + value.size();
  }
  for (const std::string& id : t.delete_jobs) bytes += 32 + id.size();
  bytes += (t.put_dedup.size() + t.delete_dedup.size()) * 128;
  bytes += (t.put_policies.size() + t.delete_policies.size()) * 256;
  for (const core::Schedule& s : t.put_schedules) bytes += 512 + s.job.payload.size();
  bytes += t.delete_schedules.size() * 64;
  return bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RocksDbReplicaStorage>> RocksDbReplicaStorage::Open(
    storage::RocksDbStore* store, uint32_t partition) {
  absl::StatusOr<storage::ReplicaRecords> records = store->ReadReplica(partition);
  if (!records.ok()) return records.status();
  if (records->applied_seq > records->last_seq && records->last_seq == records->base_seq) {
    // The state went on without a log: a single-node store that became a replica. Its state is
    // the truth, and its log starts after it.
    records->base_seq = records->last_seq = records->applied_seq;
  } else if (records->applied_seq < records->base_seq || records->applied_seq > records->last_seq) {
    return absl::DataLossError(absl::StrCat(
        "partition ", partition, " in ", store->dir(), " has applied_seq ", records->applied_seq,
        " outside its replication log (", records->base_seq, ", ", records->last_seq, "]"));
  }
  return std::unique_ptr<RocksDbReplicaStorage>(
      new RocksDbReplicaStorage(store, partition, *records));
}

RocksDbReplicaStorage::RocksDbReplicaStorage(storage::RocksDbStore* store, uint32_t partition,
                                             const storage::ReplicaRecords& records)
    : store_(store),
      partition_(partition),
      floor_(records.epoch_floor),
      base_{records.base_seq, records.base_epoch},
      end_{records.last_seq, records.last_epoch},
      applied_(records.applied_seq) {}

absl::Status RocksDbReplicaStorage::RaiseEpochFloor(int64_t epoch) {
  if (epoch <= floor_) return absl::OkStatus();
  storage::ReplicaWrite write;
  write.epoch_floor = epoch;
  if (absl::Status s = store_->WriteReplica(partition_, write); !s.ok()) return s;
  floor_ = epoch;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RocksDbReplicaStorage::EpochAt(uint64_t seq) const {
  if (seq == base_.seq) return base_.epoch;
  if (seq == end_.seq) return end_.epoch;
  if (seq < base_.seq || seq > end_.seq) {
    return absl::NotFoundError(absl::StrCat("no log entry ", seq));
  }
  if (seq >= RecentFirst()) return recent_[seq - RecentFirst()].epoch;
  absl::StatusOr<std::vector<storage::ReplicaLogRecord>> records =
      store_->ReadReplicaLog(partition_, seq, 1);
  if (!records.ok()) return records.status();
  if (records->empty() || records->front().seq != seq) {
    return absl::DataLossError(absl::StrCat("log entry ", seq, " of partition ", partition_,
                                            " is missing from ", store_->dir()));
  }
  return records->front().epoch;
}

absl::StatusOr<std::vector<LogEntry>> RocksDbReplicaStorage::Read(uint64_t from,
                                                                  size_t max_entries) const {
  if (from <= base_.seq) return Misuse(absl::StrCat("read from ", from, " at or below the base"));
  std::vector<LogEntry> entries;
  if (from > end_.seq || max_entries == 0) return entries;
  const size_t wanted = static_cast<size_t>(std::min<uint64_t>(max_entries, end_.seq - from + 1));
  if (from >= RecentFirst()) {
    const auto first = recent_.begin() + static_cast<std::ptrdiff_t>(from - RecentFirst());
    entries.assign(first, first + static_cast<std::ptrdiff_t>(wanted));
    return entries;
  }
  absl::StatusOr<std::vector<storage::ReplicaLogRecord>> records =
      store_->ReadReplicaLog(partition_, from, wanted);
  if (!records.ok()) return records.status();
  entries.reserve(records->size());
  for (storage::ReplicaLogRecord& record : *records) {
    if (record.seq != from + entries.size()) break;
    entries.push_back({record.seq, record.epoch, std::move(record.transition)});
  }
  // The log holds every seq of (base, end]: a gap is a store that lost records.
  if (entries.size() < wanted) {
    return absl::DataLossError(absl::StrCat("log entry ", from + entries.size(), " of partition ",
                                            partition_, " is missing from ", store_->dir()));
  }
  return entries;
}

absl::Status RocksDbReplicaStorage::Append(const std::vector<LogEntry>& entries) {
  return AppendWith(entries, /*sync=*/true);
}

absl::Status RocksDbReplicaStorage::AppendUnsynced(const std::vector<LogEntry>& entries) {
  return AppendWith(entries, /*sync=*/false);
}

absl::Status RocksDbReplicaStorage::SyncLog() { return store_->Sync(); }

absl::Status RocksDbReplicaStorage::AppendWith(const std::vector<LogEntry>& entries, bool sync) {
  if (entries.empty()) return absl::OkStatus();
  storage::ReplicaWrite write;
  write.sync = sync;
  uint64_t expected = end_.seq + 1;
  for (const LogEntry& entry : entries) {
    if (entry.seq != expected++) return Misuse(absl::StrCat("append of entry ", entry.seq));
    write.append.push_back({entry.seq, entry.epoch, entry.transition});
  }
  if (absl::Status s = store_->WriteReplica(partition_, write); !s.ok()) return s;
  end_ = {entries.back().seq, entries.back().epoch};
  KeepRecent(entries);
  return absl::OkStatus();
}

void RocksDbReplicaStorage::KeepRecent(const std::vector<LogEntry>& entries) {
  for (const LogEntry& entry : entries) {
    const size_t bytes = ApproxBytes(entry.transition);
    recent_bytes_ += bytes;
    recent_sizes_.push_back(bytes);
    recent_.push_back(entry);
  }
  while (!recent_.empty() &&
         (recent_.size() > kRecentMaxEntries || recent_bytes_ > kRecentMaxBytes)) {
    ForgetRecentThrough(recent_.front().seq);
  }
}

void RocksDbReplicaStorage::ForgetRecentAfter(uint64_t seq) {
  // Called before end_ moves down to seq.
  while (!recent_.empty() && recent_.back().seq > seq) {
    recent_bytes_ -= recent_sizes_.back();
    recent_sizes_.pop_back();
    recent_.pop_back();
  }
}

void RocksDbReplicaStorage::ForgetRecent() {
  recent_.clear();
  recent_sizes_.clear();
  recent_bytes_ = 0;
}

void RocksDbReplicaStorage::ForgetRecentThrough(uint64_t seq) {
  while (!recent_.empty() && recent_.front().seq <= seq) {
    recent_bytes_ -= recent_sizes_.front();
    recent_sizes_.pop_front();
    recent_.pop_front();
  }
}

absl::Status RocksDbReplicaStorage::TruncateAfter(uint64_t seq) {
  if (seq < applied_) return Misuse(absl::StrCat("truncation below the applied ", applied_));
  if (seq >= end_.seq) return absl::OkStatus();
  absl::StatusOr<int64_t> epoch = EpochAt(seq);
  if (!epoch.ok()) return epoch.status();
  storage::ReplicaWrite write;
  write.delete_log = {{seq + 1, end_.seq}};
  if (absl::Status s = store_->WriteReplica(partition_, write); !s.ok()) return s;
  ForgetRecentAfter(seq);
  end_ = {seq, *epoch};
  return absl::OkStatus();
}

absl::Status RocksDbReplicaStorage::TrimThrough(uint64_t seq) {
  if (seq > applied_) return Misuse(absl::StrCat("trim above the applied ", applied_));
  if (seq <= base_.seq) return absl::OkStatus();
  absl::StatusOr<int64_t> epoch = EpochAt(seq);
  if (!epoch.ok()) return epoch.status();
  storage::ReplicaWrite write;
  write.delete_log = {{base_.seq + 1, seq}};
  write.log_base = {{seq, *epoch}};
  write.sync = false;  // the entries are in the state; a lost trim only keeps them longer
  if (absl::Status s = store_->WriteReplica(partition_, write); !s.ok()) return s;
  ForgetRecentThrough(seq);
  base_ = {seq, *epoch};
  return absl::OkStatus();
}

absl::Status RocksDbReplicaStorage::ApplyThrough(uint64_t seq) {
  if (seq > end_.seq) return Misuse(absl::StrCat("apply through ", seq, " beyond the log"));
  if (seq <= applied_) return absl::OkStatus();
  absl::StatusOr<std::vector<LogEntry>> entries = Read(applied_ + 1, seq - applied_);
  if (!entries.ok()) return entries.status();
  storage::ReplicaWrite write;
  // The entries stay in the log until a trim, which comes after this in the write-ahead log:
  // a power loss that undoes this apply leaves them there to apply again (replica_storage.h).
  write.sync = false;
  write.apply.reserve(entries->size());
  for (LogEntry& entry : *entries) {
    core::Transition& t = write.apply.emplace_back(std::move(entry.transition));
    t.partition = partition_;
    t.seq = entry.seq;  // an epoch-start entry is empty but still moves applied_seq
  }
  if (absl::Status s = store_->WriteReplica(partition_, write); !s.ok()) return s;
  applied_ = seq;
  if (applied_ > kRecentKeptApplied) ForgetRecentThrough(applied_ - kRecentKeptApplied);
  return absl::OkStatus();
}

absl::Status RocksDbReplicaStorage::AppendCommitted(std::vector<LogEntry> entries, bool keep_in_log,
                                                    bool sync) {
  if (entries.empty()) return absl::OkStatus();
  if (applied_ != end_.seq) {
    return Misuse(absl::StrCat("committed append with entries ", applied_ + 1, "..", end_.seq,
                               " not applied"));
  }
  storage::ReplicaWrite write;
  write.sync = sync;
  uint64_t expected = end_.seq + 1;
  for (const LogEntry& entry : entries) {
    if (entry.seq != expected++) return Misuse(absl::StrCat("append of entry ", entry.seq));
  }
  const LogPosition last{entries.back().seq, entries.back().epoch};
  if (keep_in_log) {
    write.append.reserve(entries.size());
    for (const LogEntry& entry : entries)
      write.append.push_back({entry.seq, entry.epoch, entry.transition});
  } else {
    // The log of (base, end] is empty afterwards; what it held before is applied, so it goes.
    if (end_.seq > base_.seq) write.delete_log = {{base_.seq + 1, end_.seq}};
    write.log_base = {{last.seq, last.epoch}};
  }
  write.apply.reserve(entries.size());
  for (LogEntry& entry : entries) {
    core::Transition& t = write.apply.emplace_back(std::move(entry.transition));
    t.partition = partition_;
    t.seq = entry.seq;
  }
  if (absl::Status s = store_->WriteReplica(partition_, write); !s.ok()) return s;
  end_ = last;
  applied_ = last.seq;
  if (keep_in_log) {
    // The transitions went into write.apply; what followers are sent is rebuilt from it.
    std::vector<LogEntry> kept;
    kept.reserve(write.append.size());
    for (size_t i = 0; i < write.append.size(); ++i) {
      kept.push_back({write.append[i].seq, write.append[i].epoch, write.apply[i]});
    }
    KeepRecent(kept);
    if (applied_ > kRecentKeptApplied) ForgetRecentThrough(applied_ - kRecentKeptApplied);
  } else {
    base_ = last;
    ForgetRecent();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<core::Transition>> RocksDbReplicaStorage::SnapshotChunks(
    size_t records_per_chunk) const {
  return CutSnapshotChunks(*store_, partition_, records_per_chunk);
}

absl::Status RocksDbReplicaStorage::InstallSnapshot(LogPosition at,
                                                    const std::vector<core::Transition>& chunks) {
  storage::ReplicaWrite write;
  write.clear_partition = true;
  write.apply.reserve(chunks.size());
  for (const core::Transition& chunk : chunks) {
    core::Transition& t = write.apply.emplace_back(chunk);
    t.partition = partition_;
    t.seq = 0;
  }
  write.applied_seq = at.seq;
  write.log_base = {{at.seq, at.epoch}};
  if (absl::Status s = store_->WriteReplica(partition_, write); !s.ok()) return s;
  base_ = end_ = at;
  applied_ = at.seq;
  ForgetRecent();
  return absl::OkStatus();
}

}  // namespace jobbroker::cluster
