#include "storage/rocksdb_store.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/ids.h"
#include "core/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/iterator.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/slice_transform.h"
#include "rocksdb/snapshot.h"
#include "rocksdb/status.h"
#include "rocksdb/utilities/table_properties_collectors.h"
#include "rocksdb/write_batch.h"
#include "storage/record_codec.h"
#include "storage/rocksdb_info_log.h"

namespace jobbroker::storage {
namespace {

// The memtable insert hint of the jobs and dedup column families: one per partition, the keys'
// first 4 bytes. With a hint, an insert starts from where the previous one of its partition went
// in the memtable's skip list and repairs only the levels that do not bracket the new key;
// without one, any key that is not right next to the previous insert is searched from the top
// level down. Writes add their job records sorted (AddTransitionsLocked), so the next key is near.
// Only keys longer than the prefix are in its domain: RocksDB 7.8 also hands range deletions to
// the hint (fixed in later versions), whose skip list is a separate one that a point key's hint
// would corrupt. The only range deletions of these column families are clear_partition's, whose
// start key is the bare prefix, so keeping the bare prefix out of the domain keeps them unhinted.
class PartitionInsertHint final : public rocksdb::SliceTransform {
 public:
  const char* Name() const override { return "jobbroker.PartitionInsertHint"; }
  rocksdb::Slice Transform(const rocksdb::Slice& key) const override {
    return rocksdb::Slice(key.data(), kPartitionKeyPrefixBytes);
  }
  bool InDomain(const rocksdb::Slice& key) const override {
    return key.size() > kPartitionKeyPrefixBytes;
  }
};

// Maps RocksDB's codes onto the canonical ones by who should act: a full disk is
// kResourceExhausted (the operator frees space, writes come back), other I/O trouble is
// kUnavailable (the operator fixes the disk, the caller retries later), corruption is kDataLoss.
absl::Status FromRocksDb(const rocksdb::Status& s, absl::string_view context) {
  if (s.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(context, ": ", s.ToString());
  if (s.IsNoSpace() || s.subcode() == rocksdb::Status::kSpaceLimit)
    return absl::ResourceExhaustedError(message);
  switch (s.code()) {
    case rocksdb::Status::kOk:
      return absl::OkStatus();
    case rocksdb::Status::kNotFound:
      return absl::NotFoundError(message);
    case rocksdb::Status::kCorruption:
      return absl::DataLossError(message);
    case rocksdb::Status::kNotSupported:
      return absl::UnimplementedError(message);
    case rocksdb::Status::kInvalidArgument:
      return absl::InvalidArgumentError(message);
    case rocksdb::Status::kIOError:
    case rocksdb::Status::kShutdownInProgress:
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTryAgain:
      return absl::UnavailableError(message);
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kExpired:
      return absl::DeadlineExceededError(message);
    case rocksdb::Status::kAborted:
      return absl::AbortedError(message);
    case rocksdb::Status::kCompactionTooLarge:
      return absl::ResourceExhaustedError(message);
    case rocksdb::Status::kMergeInProgress:
    case rocksdb::Status::kIncomplete:
    case rocksdb::Status::kColumnFamilyDropped:
      return absl::InternalError(message);
    default:
      return absl::UnknownError(message);
  }
}

absl::string_view View(const rocksdb::Slice& s) { return absl::string_view(s.data(), s.size()); }

// A NUL in the queue would make queue + '\0' + key ambiguous, and a delete could then hit
// another queue's entry.
absl::Status CheckDedupQueue(const std::string& queue) {
  if (queue.find('\0') == std::string::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("dedup entry queue \"", absl::CHexEscape(queue), "\" contains a NUL byte"));
}

std::string DedupKey(absl::string_view prefix, const std::string& queue, const std::string& key) {
  std::string out;
  out.reserve(prefix.size() + queue.size() + 1 + key.size());
  out.append(prefix.data(), prefix.size());
  out.append(queue);
  out.push_back('\0');
  out.append(key);
  return out;
}

std::string BigEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
  return out;
}

uint64_t FromBigEndian64(absl::string_view bytes) {
  uint64_t v = 0;
  for (unsigned char c : bytes) v = (v << 8) | c;
  return v;
}

std::string AppliedSeqKey(uint32_t partition) {
  return absl::StrCat(kRocksDbAppliedSeqKey, PartitionKeyPrefix(partition));
}

// Records moved per write batch by the format-1 upgrade: big enough to go fast, small enough
// that one batch of 1 MiB payloads stays a reasonable write.
constexpr int kUpgradeChunk = 256;

absl::Status RecordError(const char* column_family, absl::string_view key,
                         const absl::Status& cause) {
  return absl::Status(cause.code(), absl::StrCat(column_family, " record \"", absl::CHexEscape(key),
                                                 "\": ", cause.message()));
}

// RocksDB would otherwise try to recover from some background errors by itself (a full disk:
// polling free space; retryable I/O errors: resuming in a loop) while the broker runs its own
// retry loop. One loop is simpler to reason about and to log.
class NoAutoRecovery final : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status bg_error,
                            bool* auto_recovery) override {
    bg_error.PermitUncheckedError();
    *auto_recovery = false;
  }
};

}  // namespace

std::string PartitionKeyPrefix(uint32_t partition) {
  std::string out(kPartitionKeyPrefixBytes, '\0');
  for (int i = static_cast<int>(kPartitionKeyPrefixBytes) - 1; i >= 0; --i, partition >>= 8)
    out[i] = static_cast<char>(partition & 0xff);
  return out;
}

absl::StatusOr<std::unique_ptr<RocksDbStore>> RocksDbStore::Open(const std::string& dir,
                                                                 RocksDbStoreOptions opts) {
  if (opts.partitions < 1 || opts.partitions > core::kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat("partitions is ", opts.partitions,
                                                   "; it must be 1 to ", core::kMaxPartitions));
  }
  std::unique_ptr<RocksDbStore> store(new RocksDbStore(dir, opts));
  absl::MutexLock lock(&store->mu_);
  BROKER_RETURN_IF_ERROR(store->OpenLocked());
  return store;
}

RocksDbStore::RocksDbStore(std::string dir, RocksDbStoreOptions opts)
    : dir_(std::move(dir)),
      opts_(opts),
      listener_(std::make_shared<NoAutoRecovery>()),
      info_log_(std::make_shared<RocksDbInfoLog>(dir_, size_t{16} << 20)) {}

absl::Status RocksDbStore::OpenLocked() {
  const std::string& dir = dir_;
  const RocksDbStoreOptions& opts = opts_;
  rocksdb::DBOptions db_options;
  if (opts.env != nullptr) db_options.env = opts.env;
  db_options.listeners.push_back(listener_);
  db_options.max_bgerror_resume_count = 0;  // see NoAutoRecovery
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  // Flushes and compactions get their own threads instead of RocksDB's default of one shared
  // one, so a compaction does not hold up the flush that a write stall is waiting for.
  db_options.IncreaseParallelism(opts.background_threads);
  // With four column families the WAL can only be recycled once each has flushed the data it
  // holds; policies and dedup fill their memtables slowly and would otherwise pin old WAL files.
  // The cap forces those flushes and so bounds WAL replay at restart.
  db_options.max_total_wal_size = opts.max_total_wal_size;
  // RocksDB's default, stated because durability depends on it: after kill -9 or a power cut,
  // replay stops at a torn WAL tail (a write that was never acknowledged) and keeps every synced
  // write before it, instead of refusing to open.
  db_options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  // Our own info LOG (16 MiB, then LOG.old): RocksDB's would take the process down when the
  // disk fills (storage/rocksdb_info_log.h).
  db_options.info_log = info_log_;

  rocksdb::ColumnFamilyOptions base;
  base.write_buffer_size = opts.write_buffer_size;
  // Level compaction (the default style) with level sizes derived from the last level: steadier
  // space use for a data set that grows and shrinks as queues fill and drain.
  base.level_compaction_dynamic_level_bytes = true;
  // No Bloom filter: the broker keeps its indexes in memory and only scans the store at start,
  // so point lookups, which filters speed up, never happen.

  // jobs and dedup churn: every key is deleted soon after it is written, leaving tombstones that
  // the start-up scan must step over. Compact an SST file early when deletes are dense in it
  // (5,000 in any 10,000 consecutive entries, or half of the file).
  rocksdb::ColumnFamilyOptions churn = base;
  churn.table_properties_collector_factories.push_back(
      rocksdb::NewCompactOnDeletionCollectorFactory(10000, 5000, 0.5));
  // jobs and dedup: a memtable insert hint per partition (see PartitionInsertHint). The
  // replication log goes without: its keys are appended in order, which the skip list's own
  // memory of the last insert already serves, and its trims are range deletes.
  rocksdb::ColumnFamilyOptions hinted = churn;
  hinted.memtable_insert_with_hint_prefix_extractor = std::make_shared<PartitionInsertHint>();

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {
      {rocksdb::kDefaultColumnFamilyName, base},   {kRocksDbJobsColumnFamily, hinted},
      {kRocksDbDedupColumnFamily, hinted},         {kRocksDbPoliciesColumnFamily, base},
      {kRocksDbReplicationLogColumnFamily, churn}, {kRocksDbSchedulesColumnFamily, base},
  };
  // RocksDB refuses to open a database without naming all its column families. A newer build may
  // have added some; open them too so that the format check below, not that refusal, answers.
  // Listing fails for a database that does not exist yet, which is fine: Open creates it.
  std::vector<std::string> existing;
  if (rocksdb::DB::ListColumnFamilies(db_options, dir, &existing).ok()) {
    for (const std::string& name : existing) {
      bool known = std::any_of(descriptors.begin(), descriptors.end(),
                               [&](const auto& d) { return d.name == name; });
      if (!known) descriptors.emplace_back(name, base);
    }
  }

  rocksdb::DB* raw_db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::Status s = rocksdb::DB::Open(db_options, dir, descriptors, &handles, &raw_db);
  if (!s.ok()) return FromRocksDb(s, absl::StrCat("open ", dir));

  // From here the store owns the database (the destructor closes it on any error below).
  db_.reset(raw_db);
  handles_ = std::move(handles);
  meta_ = handles_[0];
  jobs_ = handles_[1];
  dedup_ = handles_[2];
  policies_ = handles_[3];
  replication_log_ = handles_[4];
  schedules_ = handles_[5];
  closed_ = absl::OkStatus();
  return CheckFormatLocked();
}

void RocksDbStore::CloseLocked() {
  if (db_ == nullptr) return;
  // RocksDB requires every handle Open returned to be destroyed before the DB is deleted.
  for (rocksdb::ColumnFamilyHandle* handle : handles_) {
    db_->DestroyColumnFamilyHandle(handle).PermitUncheckedError();
  }
  // Every acknowledged write was synced, so a failed Close loses nothing; there is no one left
  // to report it to.
  db_->Close().PermitUncheckedError();
  db_.reset();
  handles_.clear();
  meta_ = jobs_ = dedup_ = policies_ = replication_log_ = schedules_ = nullptr;
}

absl::Status RocksDbStore::CheckOpenLocked() const {
  if (db_ != nullptr) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("store in ", dir_, " is closed: reopening it failed: ", closed_.message()));
}

absl::Status RocksDbStore::CheckFormatLocked() {
  rocksdb::WriteOptions write_options;
  write_options.sync = true;
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_, kRocksDbFormatKey, &value);
  if (s.IsNotFound()) {
    // A new database, or one whose creation stopped before the marker was written: both are
    // empty. Data without a marker is someone else's; refuse rather than mix ours into it.
    for (rocksdb::ColumnFamilyHandle* handle : handles_) {
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), handle));
      it->SeekToFirst();
      BROKER_RETURN_IF_ERROR(FromRocksDb(it->status(), absl::StrCat("scan ", dir_)));
      if (it->Valid()) {
        return absl::FailedPreconditionError(absl::StrCat(
            dir_, " holds a database without a jobbroker format marker; refusing to use it"));
      }
    }
    rocksdb::WriteBatch batch;
    BROKER_RETURN_IF_ERROR(
        FromRocksDb(batch.Put(meta_, kRocksDbPartitionsKey, std::to_string(opts_.partitions)),
                    "build write batch"));
    BROKER_RETURN_IF_ERROR(
        FromRocksDb(batch.Put(meta_, kRocksDbFormatKey, std::to_string(kRocksDbStoreFormatVersion)),
                    "build write batch"));
    BROKER_RETURN_IF_ERROR(FromRocksDb(db_->Write(write_options, &batch),
                                       absl::StrCat("write format marker in ", dir_)));
    partitions_ = opts_.partitions;
    return absl::OkStatus();
  }
  BROKER_RETURN_IF_ERROR(FromRocksDb(s, absl::StrCat("read format marker in ", dir_)));

  int version = 0;
  if (!absl::SimpleAtoi(value, &version) || version <= 0) {
    return absl::DataLossError(absl::StrCat("format marker in ", dir_, " is unreadable: \"",
                                            absl::CHexEscape(value), "\""));
  }
  if (version > kRocksDbStoreFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("store in ", dir_, " has format ", version, ", newer than this build reads (",
                     kRocksDbStoreFormatVersion, "); upgrade jobbroker"));
  }
  if (version == 1) {
    BROKER_RETURN_IF_ERROR(UpgradeFromFormat1Locked());
    upgraded_from_ = 1;
  }

  s = db_->Get(rocksdb::ReadOptions(), meta_, kRocksDbPartitionsKey, &value);
  BROKER_RETURN_IF_ERROR(FromRocksDb(s, absl::StrCat("read the partition count in ", dir_)));
  int partitions = 0;
  if (!absl::SimpleAtoi(value, &partitions) || partitions < 1 ||
      static_cast<uint32_t>(partitions) > core::kMaxPartitions) {
    return absl::DataLossError(absl::StrCat("partition count in ", dir_, " is unreadable: \"",
                                            absl::CHexEscape(value), "\""));
  }
  partitions_ = static_cast<uint32_t>(partitions);
  return absl::OkStatus();
}

absl::Status RocksDbStore::UpgradeFromFormat1Locked() {
  // Format-1 keys are job ids and queue names, which never start with a NUL byte; partition 0's
  // prefix is four of them. So the keys still to move are exactly those from "\x01" on, and an
  // upgrade cut short by a crash goes on where it stopped.
  const std::string prefix = PartitionKeyPrefix(0);
  for (rocksdb::ColumnFamilyHandle* handle : {jobs_, dedup_, policies_}) {
    for (;;) {
      rocksdb::WriteBatch batch;
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), handle));
      int moved = 0;
      for (it->Seek("\x01"); it->Valid() && moved < kUpgradeChunk; it->Next(), ++moved) {
        BROKER_RETURN_IF_ERROR(FromRocksDb(
            batch.Put(handle, absl::StrCat(prefix, View(it->key())), it->value()), "upgrade"));
        BROKER_RETURN_IF_ERROR(FromRocksDb(batch.Delete(handle, it->key()), "upgrade"));
      }
      BROKER_RETURN_IF_ERROR(FromRocksDb(it->status(), absl::StrCat("upgrade scan of ", dir_)));
      if (moved == 0) break;
      // Unsynced: the synced marker write below makes every chunk before it durable, and a
      // chunk lost to a crash is moved again at the next open.
      BROKER_RETURN_IF_ERROR(
          FromRocksDb(db_->Write(rocksdb::WriteOptions(), &batch), absl::StrCat("upgrade ", dir_)));
    }
  }
  rocksdb::WriteBatch batch;
  BROKER_RETURN_IF_ERROR(
      FromRocksDb(batch.Put(meta_, kRocksDbPartitionsKey, "1"), "build write batch"));
  BROKER_RETURN_IF_ERROR(
      FromRocksDb(batch.Put(meta_, kRocksDbFormatKey, std::to_string(kRocksDbStoreFormatVersion)),
                  "build write batch"));
  rocksdb::WriteOptions sync;
  sync.sync = true;
  return FromRocksDb(db_->Write(sync, &batch),
                     absl::StrCat("write the upgraded format marker in ", dir_));
}

int RocksDbStore::upgraded_from() const {
  absl::ReaderMutexLock lock(&mu_);
  return upgraded_from_;
}

uint32_t RocksDbStore::partitions() const {
  absl::ReaderMutexLock lock(&mu_);
  return partitions_;
}

RocksDbStore::~RocksDbStore() {
  absl::MutexLock lock(&mu_);
  CloseLocked();
}

absl::Status RocksDbStore::ProbeDisk() const {
  rocksdb::Env* env = opts_.env != nullptr ? opts_.env : rocksdb::Env::Default();
  // Not a name RocksDB uses, so it never mistakes the file for one of its own.
  const std::string path = absl::StrCat(dir_, "/RESUME-PROBE");
  std::unique_ptr<rocksdb::WritableFile> file;
  rocksdb::Status s = env->NewWritableFile(path, &file, rocksdb::EnvOptions());
  if (s.ok()) {
    // A flush needs room for a few blocks at least; one byte fitting proves little.
    s = file->Append(std::string(kResumeProbeBytes, '\0'));
    if (s.ok()) s = file->Sync();
    rocksdb::Status closed = file->Close();
    if (s.ok()) s = closed;
  }
  env->DeleteFile(path).PermitUncheckedError();
  return FromRocksDb(s, absl::StrCat("write to ", dir_));
}

absl::Status RocksDbStore::Resume() {
  absl::MutexLock lock(&mu_);
  // While the disk still fails, leave the database alone: RocksDB keeps serving reads, and a
  // DB::Resume() that fails part-way can leave an error behind that a later one cannot clear.
  BROKER_RETURN_IF_ERROR(ProbeDisk());
  rocksdb::WriteOptions sync;
  sync.sync = true;
  // Rewriting the marker with its own value changes nothing, and proves a synced write works.
  auto probe = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return FromRocksDb(
        db_->Put(sync, meta_, kRocksDbFormatKey, std::to_string(kRocksDbStoreFormatVersion)),
        absl::StrCat("write to ", dir_));
  };
  if (db_ != nullptr) {
    absl::Status s = FromRocksDb(db_->Resume(), absl::StrCat("resume ", dir_));
    if (s.ok()) s = probe();
    if (s.ok()) return s;
  }
  // RocksDB will not resume (it deems the error fatal): close and open again, which replays the
  // WAL as a restart would. The broker serves reads from memory meanwhile, so a store left
  // closed by a failed reopen only waits for the next Resume().
  CloseLocked();
  if (absl::Status s = OpenLocked(); !s.ok()) {
    closed_ = s;
    CloseLocked();
    return s;
  }
  return probe();
}

absl::Status RocksDbStore::Write(absl::Span<const core::Transition> transitions) {
  return WriteTransitions(transitions, /*sync=*/true);
}

absl::Status RocksDbStore::WriteUnsynced(absl::Span<const core::Transition> transitions) {
  return WriteTransitions(transitions, /*sync=*/false);
}

absl::Status RocksDbStore::Sync() {
  absl::ReaderMutexLock lock(&mu_);
  BROKER_RETURN_IF_ERROR(CheckOpenLocked());
  return FromRocksDb(db_->SyncWAL(), absl::StrCat("sync the log of ", dir_));
}

// A write of many transitions (a group commit holds dozens) changes each job's record up to three
// times (enqueue, lease, ack), and each change would be one insert into the memtable's skip list:
// about a fifth of the broker's CPU per job (docs/performance.md, "One write per job per commit").
// So the job records are added once per job, the last change winning as it would in order, and
// sorted by key: consecutive inserts then land close together, and with the jobs column family's
// insert hint (OpenLocked) each one repairs only the lower levels of the previous one's path
// through the skip list instead of searching from the top. Keys of different column families never
// meet, so the other records keep their order and are added as they come.
absl::Status RocksDbStore::AddTransitionsLocked(absl::Span<const core::Transition> transitions,
                                                rocksdb::WriteBatch& batch) {
  auto add = [](const rocksdb::Status& s) { return FromRocksDb(s, "build write batch"); };
  struct JobChange {
    uint32_t partition;
    const std::string* id;
    const core::Job* put;  // null: the job is deleted
  };
  std::vector<JobChange> changes;
  for (const core::Transition& t : transitions) {
    // Within a transition puts come before deletes (core/store.h).
    for (const core::Job& job : t.put_jobs) changes.push_back({t.partition, &job.id, &job});
    for (const std::string& id : t.delete_jobs) changes.push_back({t.partition, &id, nullptr});
  }
  // Stable: the changes of one job stay in the order they were made, so the last one is last.
  std::stable_sort(changes.begin(), changes.end(), [](const JobChange& a, const JobChange& b) {
    if (a.partition != b.partition) return a.partition < b.partition;
    return *a.id < *b.id;
  });
  std::string key;
  uint32_t key_partition = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    const JobChange& c = changes[i];
    const bool superseded = i + 1 < changes.size() && changes[i + 1].partition == c.partition &&
                            *changes[i + 1].id == *c.id;
    if (superseded) continue;
    // Sorted by partition first: the prefix is rebuilt only when the partition changes.
    if (key.empty() || c.partition != key_partition) {
      key = PartitionKeyPrefix(c.partition);
      key_partition = c.partition;
    }
    key.resize(kPartitionKeyPrefixBytes);
    key.append(*c.id);
    BROKER_RETURN_IF_ERROR(add(c.put != nullptr ? batch.Put(jobs_, key, EncodeJob(*c.put))
                                                : batch.Delete(jobs_, key)));
  }

  for (const core::Transition& t : transitions) {
    const std::string prefix = PartitionKeyPrefix(t.partition);
    auto keyed = [&](absl::string_view name) -> const std::string& {
      key.assign(prefix);
      key.append(name.data(), name.size());
      return key;
    };
    for (const core::DedupEntry& d : t.put_dedup) {
      BROKER_RETURN_IF_ERROR(CheckDedupQueue(d.queue));
      BROKER_RETURN_IF_ERROR(
          add(batch.Put(dedup_, DedupKey(prefix, d.queue, d.key), EncodeDedup(d))));
    }
    for (const auto& [queue, dedup_key] : t.delete_dedup) {
      BROKER_RETURN_IF_ERROR(CheckDedupQueue(queue));
      BROKER_RETURN_IF_ERROR(add(batch.Delete(dedup_, DedupKey(prefix, queue, dedup_key))));
    }
    for (const auto& [queue, policy] : t.put_policies) {
      BROKER_RETURN_IF_ERROR(add(batch.Put(policies_, keyed(queue), EncodePolicy(policy))));
    }
    for (const std::string& queue : t.delete_policies) {
      BROKER_RETURN_IF_ERROR(add(batch.Delete(policies_, keyed(queue))));
    }
    for (const core::Schedule& s : t.put_schedules) {
      BROKER_RETURN_IF_ERROR(add(batch.Put(schedules_, keyed(s.id), EncodeSchedule(s))));
    }
    for (const std::string& id : t.delete_schedules) {
      BROKER_RETURN_IF_ERROR(add(batch.Delete(schedules_, keyed(id))));
    }
  }
  return absl::OkStatus();
}

absl::Status RocksDbStore::WriteTransitions(absl::Span<const core::Transition> transitions,
                                            bool sync) {
  absl::ReaderMutexLock lock(&mu_);
  BROKER_RETURN_IF_ERROR(CheckOpenLocked());
  rocksdb::WriteBatch batch;
  // The last numbered transition of each partition in this write: its applied_seq afterwards.
  std::vector<std::pair<uint32_t, uint64_t>> applied;
  BROKER_RETURN_IF_ERROR(AddTransitionsLocked(transitions, batch));
  for (const core::Transition& t : transitions) {
    if (t.seq == 0) continue;
    auto same = std::find_if(applied.begin(), applied.end(),
                             [&](const auto& a) { return a.first == t.partition; });
    if (same == applied.end()) {
      applied.emplace_back(t.partition, t.seq);
    } else {
      same->second = t.seq;
    }
  }
  for (const auto& [partition, seq] : applied) {
    BROKER_RETURN_IF_ERROR(FromRocksDb(batch.Put(meta_, AppliedSeqKey(partition), BigEndian64(seq)),
                                       "build write batch"));
  }
  if (batch.Count() == 0) {
    // Nothing to write, but earlier unsynced writes may still have to reach the disk.
    if (!sync) return absl::OkStatus();
    return FromRocksDb(db_->SyncWAL(), absl::StrCat("sync the log of ", dir_));
  }
  rocksdb::WriteOptions write_options;
  // The promise: OK means on disk (DESIGN.md, delivery semantics). A synced write also syncs
  // every unsynced one before it: they are earlier in the same log.
  write_options.sync = sync;
  return FromRocksDb(db_->Write(write_options, &batch), absl::StrCat("write to ", dir_));
}

absl::StatusOr<ReplicaRecords> RocksDbStore::ReadReplica(uint32_t partition) {
  absl::ReaderMutexLock lock(&mu_);
  BROKER_RETURN_IF_ERROR(CheckOpenLocked());
  ReplicaRecords records;
  // A missing key is the value of a new replica: 0.
  auto get = [&](const std::string& key, size_t size, std::string* value)
                 ABSL_SHARED_LOCKS_REQUIRED(mu_) -> absl::Status {
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_, key, value);
    if (s.IsNotFound()) {
      value->assign(size, '\0');
      return absl::OkStatus();
    }
    BROKER_RETURN_IF_ERROR(FromRocksDb(s, absl::StrCat("read ", absl::CHexEscape(key))));
    if (value->size() != size) {
      return absl::DataLossError(absl::StrCat("\"", absl::CHexEscape(key), "\" in ", dir_, " is ",
                                              value->size(), " bytes, not ", size));
    }
    return absl::OkStatus();
  };
  const std::string prefix = PartitionKeyPrefix(partition);
  std::string value;
  BROKER_RETURN_IF_ERROR(get(absl::StrCat(kRocksDbEpochFloorKey, prefix), 8, &value));
  records.epoch_floor = static_cast<int64_t>(FromBigEndian64(value));
  BROKER_RETURN_IF_ERROR(get(AppliedSeqKey(partition), 8, &value));
  records.applied_seq = FromBigEndian64(value);
  BROKER_RETURN_IF_ERROR(get(absl::StrCat(kRocksDbLogBaseKey, prefix), 16, &value));
  records.base_seq = FromBigEndian64(absl::string_view(value).substr(0, 8));
  records.base_epoch = static_cast<int64_t>(FromBigEndian64(absl::string_view(value).substr(8)));
  records.last_seq = records.base_seq;
  records.last_epoch = records.base_epoch;

  // The last entry: the greatest key of the partition's range.
  const std::string end = PartitionKeyPrefix(partition + 1);
  const rocksdb::Slice lower(prefix);
  const rocksdb::Slice upper(end);
  rocksdb::ReadOptions read_options;
  read_options.iterate_lower_bound = &lower;
  read_options.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, replication_log_));
  it->SeekToLast();
  if (it->Valid()) {
    absl::string_view key = View(it->key()).substr(prefix.size());
    if (key.size() != 8) {
      return absl::DataLossError(absl::StrCat("replication_log key \"",
                                              absl::CHexEscape(View(it->key())), "\" in ", dir_,
                                              " is not a partition and a seq"));
    }
    records.last_seq = FromBigEndian64(key);
    absl::StatusOr<DecodedLogEntry> entry =
        DecodeLogEntry(partition, records.last_seq, View(it->value()));
    if (!entry.ok()) {
      return RecordError(kRocksDbReplicationLogColumnFamily, View(it->key()), entry.status());
    }
    records.last_epoch = entry->epoch;
  }
  BROKER_RETURN_IF_ERROR(FromRocksDb(it->status(), absl::StrCat("scan replication_log in ", dir_)));
  return records;
}

absl::StatusOr<std::vector<ReplicaLogRecord>> RocksDbStore::ReadReplicaLog(uint32_t partition,
                                                                           uint64_t from,
                                                                           size_t max_entries) {
  absl::ReaderMutexLock lock(&mu_);
  BROKER_RETURN_IF_ERROR(CheckOpenLocked());
  const std::string prefix = PartitionKeyPrefix(partition);
  const std::string end = PartitionKeyPrefix(partition + 1);
  const rocksdb::Slice upper(end);
  rocksdb::ReadOptions read_options;
  read_options.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, replication_log_));
  std::vector<ReplicaLogRecord> out;
  for (it->Seek(absl::StrCat(prefix, BigEndian64(from))); it->Valid() && out.size() < max_entries;
       it->Next()) {
    absl::string_view key = View(it->key()).substr(prefix.size());
    const uint64_t seq = FromBigEndian64(key);
    absl::StatusOr<DecodedLogEntry> entry =
        key.size() == 8 ? DecodeLogEntry(partition, seq, View(it->value()))
                        : absl::DataLossError("the key is not a partition and a seq");
    if (!entry.ok()) {
      return RecordError(kRocksDbReplicationLogColumnFamily, View(it->key()), entry.status());
    }
    out.push_back({seq, entry->epoch, std::move(entry->transition)});
  }
  BROKER_RETURN_IF_ERROR(FromRocksDb(it->status(), absl::StrCat("scan replication_log in ", dir_)));
  return out;
}

absl::Status RocksDbStore::WriteReplica(uint32_t partition, const ReplicaWrite& write) {
  absl::ReaderMutexLock lock(&mu_);
  BROKER_RETURN_IF_ERROR(CheckOpenLocked());
  rocksdb::WriteBatch batch;
  auto add = [](const rocksdb::Status& s) { return FromRocksDb(s, "build write batch"); };
  const std::string prefix = PartitionKeyPrefix(partition);
  auto log_key = [&](uint64_t seq) { return absl::StrCat(prefix, BigEndian64(seq)); };
  if (write.epoch_floor.has_value()) {
    BROKER_RETURN_IF_ERROR(add(batch.Put(meta_, absl::StrCat(kRocksDbEpochFloorKey, prefix),
                                         BigEndian64(static_cast<uint64_t>(*write.epoch_floor)))));
  }
  if (write.clear_partition) {
    const std::string end = PartitionKeyPrefix(partition + 1);
    for (rocksdb::ColumnFamilyHandle* handle :
         {jobs_, dedup_, policies_, replication_log_, schedules_}) {
      BROKER_RETURN_IF_ERROR(add(batch.DeleteRange(handle, prefix, end)));
    }
  }
  if (write.delete_log.has_value() && write.delete_log->first <= write.delete_log->second) {
    // One range tombstone, not a delete per entry: a trim drops thousands of entries at a time,
    // and each point delete would cost a memtable insert now and a compaction's work later.
    BROKER_RETURN_IF_ERROR(add(batch.DeleteRange(replication_log_, log_key(write.delete_log->first),
                                                 log_key(write.delete_log->second + 1))));
  }
  for (const ReplicaLogRecord& entry : write.append) {
    BROKER_RETURN_IF_ERROR(add(batch.Put(replication_log_, log_key(entry.seq),
                                         EncodeLogEntry(entry.epoch, entry.transition))));
  }
  std::optional<uint64_t> applied = write.applied_seq;
  for (const core::Transition& t : write.apply) {
    if (t.partition != partition) {
      return absl::InvalidArgumentError(absl::StrCat("a replica write of partition ", partition,
                                                     " applies a transition of partition ",
                                                     t.partition));
    }
    if (t.seq != 0 && !write.applied_seq.has_value()) applied = t.seq;
  }
  // After clear_partition's range deletes above, so that the records applied survive them.
  BROKER_RETURN_IF_ERROR(AddTransitionsLocked(write.apply, batch));
  if (applied.has_value()) {
    BROKER_RETURN_IF_ERROR(add(batch.Put(meta_, AppliedSeqKey(partition), BigEndian64(*applied))));
  }
  if (write.log_base.has_value()) {
    BROKER_RETURN_IF_ERROR(
        add(batch.Put(meta_, absl::StrCat(kRocksDbLogBaseKey, prefix),
                      absl::StrCat(BigEndian64(write.log_base->first),
                                   BigEndian64(static_cast<uint64_t>(write.log_base->second))))));
  }
  if (batch.Count() == 0) return absl::OkStatus();
  rocksdb::WriteOptions write_options;
  write_options.sync = write.sync;
  return FromRocksDb(db_->Write(write_options, &batch), absl::StrCat("write to ", dir_));
}

uint64_t RocksDbStore::LiveDataBytes() const {
  absl::ReaderMutexLock lock(&mu_);
  if (db_ == nullptr) return 0;
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    uint64_t v = 0;
    if (db_->GetIntProperty(h, "rocksdb.estimate-live-data-size", &v)) total += v;
  }
  return total;
}

uint64_t RocksDbStore::PendingCompactionBytes() const {
  absl::ReaderMutexLock lock(&mu_);
  if (db_ == nullptr) return 0;
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    uint64_t v = 0;
    if (db_->GetIntProperty(h, "rocksdb.estimate-pending-compaction-bytes", &v)) total += v;
  }
  return total;
}

absl::StatusOr<core::Job> RocksDbStore::ReadJob(uint32_t partition, const std::string& id) {
  absl::ReaderMutexLock lock(&mu_);
  BROKER_RETURN_IF_ERROR(CheckOpenLocked());
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), jobs_,
                               absl::StrCat(PartitionKeyPrefix(partition), id), &value);
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat("no stored job ", id));
  BROKER_RETURN_IF_ERROR(FromRocksDb(s, absl::StrCat("read job in ", dir_)));
  absl::StatusOr<core::Job> job = DecodeJob(View(value));
  if (job.ok() && job->id != id)
    job = absl::DataLossError(absl::StrCat("record holds job \"", absl::CHexEscape(job->id), "\""));
  if (!job.ok()) return RecordError(kRocksDbJobsColumnFamily, id, job.status());
  return job;
}

absl::Status RocksDbStore::Recover(uint32_t partition, core::RecoveryVisitor& visitor) {
  absl::ReaderMutexLock lock(&mu_);
  BROKER_RETURN_IF_ERROR(CheckOpenLocked());
  // One snapshot for all column families, so the scans see the same instant.
  rocksdb::ManagedSnapshot snapshot(db_.get());
  rocksdb::ReadOptions read_options;
  read_options.snapshot = snapshot.snapshot();
  // Each block is read once at start; caching it would only evict what serving needs later.
  read_options.fill_cache = false;
  // The partition's key range: [prefix, prefix of the next partition).
  const std::string prefix = PartitionKeyPrefix(partition);
  const std::string end = PartitionKeyPrefix(partition + 1);
  const rocksdb::Slice upper(end);
  read_options.iterate_upper_bound = &upper;

  {
    std::string seq;
    rocksdb::Status s = db_->Get(read_options, meta_, AppliedSeqKey(partition), &seq);
    if (s.IsNotFound()) {
      visitor.OnAppliedSeq(0);
    } else {
      BROKER_RETURN_IF_ERROR(FromRocksDb(s, absl::StrCat("read applied_seq in ", dir_)));
      if (seq.size() != 8) {
        return absl::DataLossError(absl::StrCat("applied_seq of partition ", partition, " in ",
                                                dir_, " is ", seq.size(), " bytes, not 8"));
      }
      visitor.OnAppliedSeq(FromBigEndian64(seq));
    }
  }

  // A record that does not decode is reported and skipped: one bad record must not keep every
  // other job from being served. An error of the scan itself (a corrupt block, an I/O error)
  // ends it: RocksDB cannot step past it.
  auto scan = [&](rocksdb::ColumnFamilyHandle* handle, const char* name, core::RecordKind kind,
                  auto&& visit) ABSL_SHARED_LOCKS_REQUIRED(mu_) -> absl::Status {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, handle));
    for (it->Seek(prefix); it->Valid(); it->Next()) {
      absl::string_view key = View(it->key()).substr(prefix.size());
      absl::Status s = visit(key, View(it->value()));
      if (!s.ok()) visitor.OnCorrupt({kind, std::string(key), RecordError(name, key, s)});
    }
    return FromRocksDb(it->status(), absl::StrCat("scan ", name, " in ", dir_));
  };

  BROKER_RETURN_IF_ERROR(scan(policies_, kRocksDbPoliciesColumnFamily, core::RecordKind::kPolicy,
                              [&](absl::string_view key, absl::string_view value) {
                                absl::StatusOr<core::PolicyOverride> policy = DecodePolicy(value);
                                if (!policy.ok()) return policy.status();
                                visitor.OnPolicy(std::string(key), *std::move(policy));
                                return absl::OkStatus();
                              }));
  BROKER_RETURN_IF_ERROR(scan(dedup_, kRocksDbDedupColumnFamily, core::RecordKind::kDedup,
                              [&](absl::string_view key, absl::string_view value) {
                                size_t sep = key.find('\0');
                                if (sep == absl::string_view::npos) {
                                  return absl::DataLossError(
                                      "key has no NUL between queue and dedup key");
                                }
                                absl::StatusOr<core::DedupEntry> entry =
                                    DecodeDedup(key.substr(0, sep), key.substr(sep + 1), value);
                                if (!entry.ok()) return entry.status();
                                visitor.OnDedup(*std::move(entry));
                                return absl::OkStatus();
                              }));
  core::ColdJobFields cold;  // one for every record: its strings are reused, not reallocated
  BROKER_RETURN_IF_ERROR(scan(
      jobs_, kRocksDbJobsColumnFamily, core::RecordKind::kJob,
      [&](absl::string_view key, absl::string_view value) {
        if (visitor.NextJobMayBeCold()) {
          BROKER_RETURN_IF_ERROR(DecodeColdJobFields(value, cold));
          if (cold.id != key) {
            return absl::DataLossError(
                absl::StrCat("record holds job \"", absl::CHexEscape(cold.id), "\""));
          }
          if ((cold.state == core::JobState::kReady || cold.state == core::JobState::kScheduled) &&
              visitor.OnColdJob(cold))
            return absl::OkStatus();
        }
        absl::StatusOr<core::Job> job = DecodeJob(value);
        if (!job.ok()) return job.status();
        if (job->id != key) {
          return absl::DataLossError(
              absl::StrCat("record holds job \"", absl::CHexEscape(job->id), "\""));
        }
        visitor.OnJob(*std::move(job));
        return absl::OkStatus();
      }));
  BROKER_RETURN_IF_ERROR(scan(schedules_, kRocksDbSchedulesColumnFamily,
                              core::RecordKind::kSchedule,
                              [&](absl::string_view key, absl::string_view value) {
                                absl::StatusOr<core::Schedule> s = DecodeSchedule(value);
                                if (!s.ok()) return s.status();
                                if (s->id != key) {
                                  return absl::DataLossError(absl::StrCat(
                                      "record holds schedule \"", absl::CHexEscape(s->id), "\""));
                                }
                                visitor.OnSchedule(*std::move(s));
                                return absl::OkStatus();
                              }));
  return absl::OkStatus();
}

}  // namespace jobbroker::storage
