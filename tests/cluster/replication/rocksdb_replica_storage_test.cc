// What only the RocksDB ReplicaStorage has: partitions side by side in one store, a single-node
// store turned replica, a failing disk, and records that do not decode. The rest is in
// replica_storage_conformance_test.cc.

#include "cluster/replication/rocksdb_replica_storage.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "storage/rocksdb_store.h"
#include "tests/storage/faulty_file_system.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::cluster {
namespace {

using ::jobbroker::storage::FaultyEnv;
using ::jobbroker::storage::FaultyFileSystem;
using ::jobbroker::storage::RecordingVisitor;
using ::jobbroker::storage::RocksDbStore;
using ::jobbroker::storage::RocksDbStoreOptions;
using ::jobbroker::storage::ScopedTempDir;
using ::jobbroker::storage::SimpleJob;
using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<LogEntry> Entries(uint32_t partition, uint64_t first, uint64_t last, int64_t epoch,
                              const std::string& prefix) {
  std::vector<LogEntry> entries;
  for (uint64_t seq = first; seq <= last; ++seq) {
    LogEntry entry{seq, epoch, {}};
    entry.transition.partition = partition;
    entry.transition.put_jobs = {SimpleJob(prefix + std::to_string(seq))};
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::vector<std::string> JobIds(RocksDbStore& store, uint32_t partition) {
  RecordingVisitor visitor;
  EXPECT_THAT(store.Recover(partition, visitor), IsOk());
  std::vector<std::string> ids;
  for (const core::Job& job : visitor.jobs) ids.push_back(job.id);
  return ids;
}

std::unique_ptr<RocksDbStore> OpenStore(const std::string& dir, RocksDbStoreOptions opts = {}) {
  auto store = RocksDbStore::Open(dir, opts);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

std::unique_ptr<RocksDbReplicaStorage> OpenReplica(RocksDbStore* store, uint32_t partition) {
  auto replica = RocksDbReplicaStorage::Open(store, partition);
  EXPECT_TRUE(replica.ok()) << replica.status();
  return replica.ok() ? *std::move(replica) : nullptr;
}

TEST(RocksDbReplicaStorageTest, PartitionsOfOneStoreKeepTheirLogsAndStatesApart) {
  ScopedTempDir tmp;
  RocksDbStoreOptions opts;
  opts.partitions = 3;
  std::unique_ptr<RocksDbStore> store = OpenStore(tmp.Sub("db"), opts);
  ASSERT_NE(store, nullptr);
  std::unique_ptr<RocksDbReplicaStorage> zero = OpenReplica(store.get(), 0);
  std::unique_ptr<RocksDbReplicaStorage> one = OpenReplica(store.get(), 1);
  std::unique_ptr<RocksDbReplicaStorage> two = OpenReplica(store.get(), 2);
  ASSERT_TRUE(zero != nullptr && one != nullptr && two != nullptr);
  ASSERT_THAT(zero->Append(Entries(0, 1, 3, 2, "zero-")), IsOk());
  ASSERT_THAT(zero->ApplyThrough(3), IsOk());
  ASSERT_THAT(zero->RaiseEpochFloor(2), IsOk());
  ASSERT_THAT(two->Append(Entries(2, 1, 2, 5, "two-")), IsOk());
  ASSERT_THAT(two->ApplyThrough(2), IsOk());
  ASSERT_THAT(one->Append(Entries(1, 1, 4, 9, "one-")), IsOk());
  ASSERT_THAT(one->ApplyThrough(2), IsOk());
  // A snapshot into the middle partition clears its range only.
  ASSERT_THAT(one->InstallSnapshot({7, 9}, {}), IsOk());

  one.reset();
  zero.reset();
  two.reset();
  store.reset();
  store = OpenStore(tmp.Sub("db"), opts);
  zero = OpenReplica(store.get(), 0);
  one = OpenReplica(store.get(), 1);
  two = OpenReplica(store.get(), 2);
  ASSERT_TRUE(zero != nullptr && one != nullptr && two != nullptr);
  EXPECT_EQ(zero->log_end(), 3u);
  EXPECT_EQ(zero->applied_seq(), 3u);
  EXPECT_EQ(zero->epoch_floor(), 2);
  EXPECT_EQ(two->log_end(), 2u);
  EXPECT_EQ(*two->EpochAt(2), 5);
  EXPECT_EQ(two->epoch_floor(), 0);
  EXPECT_EQ(one->log_base(), (LogPosition{7, 9}));
  EXPECT_EQ(one->log_end(), 7u);
  EXPECT_THAT(JobIds(*store, 0), ElementsAre("zero-1", "zero-2", "zero-3"));
  EXPECT_THAT(JobIds(*store, 1), IsEmpty());
  EXPECT_THAT(JobIds(*store, 2), ElementsAre("two-1", "two-2"));
}

TEST(RocksDbReplicaStorageTest, ASingleNodeStoreBecomesAReplicaWhoseLogStartsAfterItsState) {
  ScopedTempDir tmp;
  std::unique_ptr<RocksDbStore> store = OpenStore(tmp.Sub("db"));
  ASSERT_NE(store, nullptr);
  core::Transition t;
  t.seq = 7;
  t.put_jobs = {SimpleJob("before")};
  ASSERT_THAT(store->Write({&t, 1}), IsOk());

  std::unique_ptr<RocksDbReplicaStorage> replica = OpenReplica(store.get(), 0);
  ASSERT_NE(replica, nullptr);
  EXPECT_EQ(replica->applied_seq(), 7u);
  EXPECT_EQ(replica->log_base(), (LogPosition{7, 0}));
  EXPECT_EQ(replica->log_end(), 7u);
  ASSERT_THAT(replica->Append(Entries(0, 8, 8, 3, "after-")), IsOk());
  ASSERT_THAT(replica->ApplyThrough(8), IsOk());
  EXPECT_THAT(JobIds(*store, 0), ElementsAre("after-8", "before"));
}

// The newest entries are kept in memory and served from there (what is not applied yet and the
// last 1,024 applied ones); older ones are read from the store. Reads on either side of that
// boundary, truncations into the kept ones, trims and applies all see the log as stored.
TEST(RocksDbReplicaStorageTest, EntriesPastThoseKeptInMemoryAreReadFromTheStore) {
  ScopedTempDir tmp;
  std::unique_ptr<RocksDbStore> store = OpenStore(tmp.Sub("db"));
  ASSERT_NE(store, nullptr);
  std::unique_ptr<RocksDbReplicaStorage> replica = OpenReplica(store.get(), 0);
  ASSERT_NE(replica, nullptr);
  for (uint64_t first = 1; first <= 6000; first += 1000) {
    ASSERT_THAT(replica->Append(Entries(0, first, first + 999, 1, "j")), IsOk());
  }
  // Applied through 3,000: entries through 1,976 are no longer kept.
  ASSERT_THAT(replica->ApplyThrough(3000), IsOk());
  auto ids = [](const absl::StatusOr<std::vector<LogEntry>>& entries) {
    std::vector<std::string> out;
    if (!entries.ok()) return out;
    for (const LogEntry& e : *entries) {
      out.push_back(absl::StrCat(e.seq, "/", e.epoch, "/", e.transition.put_jobs.at(0).id));
    }
    return out;
  };
  EXPECT_THAT(ids(replica->Read(1, 2)), ElementsAre("1/1/j1", "2/1/j2"));
  EXPECT_THAT(ids(replica->Read(1976, 2)), ElementsAre("1976/1/j1976", "1977/1/j1977"));
  EXPECT_THAT(ids(replica->Read(1977, 2)), ElementsAre("1977/1/j1977", "1978/1/j1978"));
  EXPECT_THAT(ids(replica->Read(5999, 10)), ElementsAre("5999/1/j5999", "6000/1/j6000"));
  EXPECT_EQ(*replica->EpochAt(1000), 1);
  EXPECT_EQ(*replica->EpochAt(4000), 1);

  // A new epoch's leader truncates into the kept entries and appends its own.
  ASSERT_THAT(replica->TruncateAfter(5000), IsOk());
  ASSERT_THAT(replica->Append(Entries(0, 5001, 5002, 2, "k")), IsOk());
  EXPECT_THAT(ids(replica->Read(4999, 10)),
              ElementsAre("4999/1/j4999", "5000/1/j5000", "5001/2/k5001", "5002/2/k5002"));
  EXPECT_EQ(*replica->EpochAt(5001), 2);

  // Applied, then trimmed: the rest still reads, from memory and from the store.
  ASSERT_THAT(replica->ApplyThrough(5002), IsOk());
  ASSERT_THAT(replica->TrimThrough(3500), IsOk());
  EXPECT_THAT(ids(replica->Read(3501, 1)), ElementsAre("3501/1/j3501"));
  EXPECT_THAT(ids(replica->Read(5000, 10)),
              ElementsAre("5000/1/j5000", "5001/2/k5001", "5002/2/k5002"));
  std::vector<std::string> stored = JobIds(*store, 0);
  EXPECT_EQ(stored.size(), 5002u);
  EXPECT_THAT(stored, ::testing::Contains("k5002"));
  EXPECT_THAT(stored, ::testing::Not(::testing::Contains("j5001")));

  // What a reopened replica (nothing kept) reads is the same.
  replica = OpenReplica(store.get(), 0);
  ASSERT_NE(replica, nullptr);
  EXPECT_THAT(ids(replica->Read(5000, 10)),
              ElementsAre("5000/1/j5000", "5001/2/k5001", "5002/2/k5002"));
}

TEST(RocksDbReplicaStorageTest, AFailedWriteLeavesTheReplicaAsItWas) {
  ScopedTempDir tmp;
  FaultyEnv faulty;
  RocksDbStoreOptions opts;
  opts.env = faulty.env.get();
  std::unique_ptr<RocksDbStore> store = OpenStore(tmp.Sub("db"), opts);
  ASSERT_NE(store, nullptr);
  std::unique_ptr<RocksDbReplicaStorage> replica = OpenReplica(store.get(), 0);
  ASSERT_NE(replica, nullptr);
  ASSERT_THAT(replica->Append(Entries(0, 1, 2, 1, "j")), IsOk());

  faulty.fs->SetFault(FaultyFileSystem::Fault::kNoSpace);
  EXPECT_THAT(replica->Append(Entries(0, 3, 3, 1, "j")),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(replica->ApplyThrough(2), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(replica->RaiseEpochFloor(4), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_GT(faulty.fs->injected(), 0);
  EXPECT_EQ(replica->log_end(), 2u);
  EXPECT_EQ(replica->applied_seq(), 0u);
  EXPECT_EQ(replica->epoch_floor(), 0);

  // After the disk heals and the store resumes, a rebuilt replica sees what is durable.
  faulty.fs->SetFault(FaultyFileSystem::Fault::kNone);
  ASSERT_THAT(store->Resume(), IsOk());
  replica = OpenReplica(store.get(), 0);
  ASSERT_NE(replica, nullptr);
  EXPECT_EQ(replica->log_end(), 2u);
  ASSERT_THAT(replica->ApplyThrough(2), IsOk());
  EXPECT_THAT(JobIds(*store, 0), ElementsAre("j1", "j2"));
}

TEST(RocksDbReplicaStorageTest, AnEntryThatDoesNotDecodeIsDataLossNamingIt) {
  ScopedTempDir tmp;
  {
    std::unique_ptr<RocksDbStore> store = OpenStore(tmp.Sub("db"));
    ASSERT_NE(store, nullptr);
    std::unique_ptr<RocksDbReplicaStorage> replica = OpenReplica(store.get(), 0);
    ASSERT_NE(replica, nullptr);
    ASSERT_THAT(replica->Append(Entries(0, 1, 2, 1, "j")), IsOk());
  }
  {
    // Overwrite entry 1 with bytes that are not a LogEntryRecord, through RocksDB itself.
    rocksdb::DBOptions db_options;
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    std::vector<std::string> names;
    ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(db_options, tmp.Sub("db"), &names).ok());
    for (const std::string& name : names)
      families.emplace_back(name, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(db_options, tmp.Sub("db"), families, &handles, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    rocksdb::ColumnFamilyHandle* log = nullptr;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == storage::kRocksDbReplicationLogColumnFamily) log = handles[i];
    }
    ASSERT_NE(log, nullptr);
    std::string key = storage::PartitionKeyPrefix(0) + std::string(7, '\0') + "\x01";
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), log, key, "not a record").ok());
    for (rocksdb::ColumnFamilyHandle* h : handles)
      ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  }
  std::unique_ptr<RocksDbStore> store = OpenStore(tmp.Sub("db"));
  ASSERT_NE(store, nullptr);
  std::unique_ptr<RocksDbReplicaStorage> replica = OpenReplica(store.get(), 0);
  ASSERT_NE(replica, nullptr);  // the last entry, which Open reads, is fine
  absl::StatusOr<std::vector<LogEntry>> read = replica->Read(1, 10);
  EXPECT_THAT(read.status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("replication_log record"));
  EXPECT_THAT(replica->ApplyThrough(2), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(replica->applied_seq(), 0u);
}

}  // namespace
}  // namespace jobbroker::cluster
