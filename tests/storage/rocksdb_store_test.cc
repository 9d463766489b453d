// RocksDbStore specifics: durability across close/reopen, the format marker, and how corruption
// on disk is reported. Behaviour shared with MemoryStore is in store_conformance_test.cc.

#include "storage/rocksdb_store.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "storage/record_codec.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::storage {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;

// Partition 0's key prefix, which every record of a one-partition store has.
const std::string P0 = PartitionKeyPrefix(0);

// A plain RocksDB handle on a closed store's directory, to inspect or tamper with its records.
class RawDb {
 public:
  explicit RawDb(const std::string& dir) {
    rocksdb::DBOptions options;
    options.create_if_missing = true;
    options.create_missing_column_families = true;
    std::vector<std::string> names;
    if (!rocksdb::DB::ListColumnFamilies(options, dir, &names).ok()) {
      names = {rocksdb::kDefaultColumnFamilyName};
    }
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    for (const std::string& name : names)
      descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions());
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(options, dir, descriptors, &handles_, &db);
    EXPECT_TRUE(s.ok()) << s.ToString();
    db_.reset(db);
    names_ = names;
  }
  ~RawDb() {
    if (db_ == nullptr) return;
    for (rocksdb::ColumnFamilyHandle* h : handles_) {
      EXPECT_TRUE(db_->DestroyColumnFamilyHandle(h).ok());
    }
    EXPECT_TRUE(db_->Close().ok());
  }

  rocksdb::ColumnFamilyHandle* Cf(const std::string& name) {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == name) return handles_[i];
    }
    rocksdb::ColumnFamilyHandle* h = nullptr;
    EXPECT_TRUE(db_->CreateColumnFamily(rocksdb::ColumnFamilyOptions(), name, &h).ok());
    names_.push_back(name);
    handles_.push_back(h);
    return h;
  }
  void Put(const std::string& cf, const std::string& key, const std::string& value) {
    rocksdb::WriteOptions w;
    w.sync = true;
    ASSERT_TRUE(db_->Put(w, Cf(cf), key, value).ok());
  }
  std::string Get(const std::string& cf, const std::string& key) {
    std::string value;
    EXPECT_TRUE(db_->Get(rocksdb::ReadOptions(), Cf(cf), key, &value).ok());
    return value;
  }
  void Delete(const std::string& cf, const std::string& key) {
    rocksdb::WriteOptions w;
    w.sync = true;
    ASSERT_TRUE(db_->Delete(w, Cf(cf), key).ok());
  }
  // Every key of `cf`, in order.
  std::vector<std::string> Keys(const std::string& cf) {
    std::vector<std::string> keys;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), Cf(cf)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) keys.push_back(it->key().ToString());
    EXPECT_TRUE(it->status().ok());
    return keys;
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<std::string> names_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
};

class RocksDbStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<RocksDbStore> OpenOk() {
    absl::StatusOr<std::unique_ptr<RocksDbStore>> store = RocksDbStore::Open(path_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Writes `t` through a fresh store and closes it again.
  void WriteAndClose(const core::Transition& t) {
    std::unique_ptr<RocksDbStore> store = OpenOk();
    ASSERT_NE(store, nullptr);
    ASSERT_THAT(store->Write({&t, 1}), IsOk());
  }

  ScopedTempDir tmp_;
  const std::string path_ = tmp_.Sub("db");
};

TEST_F(RocksDbStoreTest, WriteReopenRecover) {
  std::vector<core::Job> jobs;
  for (int i = 0; i < 200; ++i) {
    core::Job job =
        i % 10 == 0 ? FullJob(absl::StrCat("job-", i)) : SimpleJob(absl::StrCat("job-", i));
    job.seq = i;
    jobs.push_back(job);
  }
  {
    std::unique_ptr<RocksDbStore> store = OpenOk();
    ASSERT_NE(store, nullptr);
    // Many small writes, as the broker makes them, and one that deletes half of the jobs.
    for (const core::Job& job : jobs) {
      core::Transition t;
      t.put_jobs = {job};
      t.put_dedup = {Dedup("q", job.id, job.id)};
      ASSERT_THAT(store->Write({&t, 1}), IsOk());
    }
    core::Transition cleanup;
    for (int i = 0; i < 200; i += 2) {
      cleanup.delete_jobs.push_back(jobs[i].id);
      cleanup.delete_dedup.emplace_back("q", jobs[i].id);
    }
    cleanup.put_policies = {{"q", FullPolicy()}};
    ASSERT_THAT(store->Write({&cleanup, 1}), IsOk());
  }  // closed here

  std::unique_ptr<RocksDbStore> reopened = OpenOk();
  ASSERT_NE(reopened, nullptr);
  RecordingVisitor r;
  ASSERT_THAT(reopened->Recover(0, r), IsOk());

  std::vector<core::Job> want_jobs;
  std::vector<core::DedupEntry> want_dedup;
  for (int i = 1; i < 200; i += 2) {
    want_jobs.push_back(jobs[i]);
    want_dedup.push_back(Dedup("q", jobs[i].id, jobs[i].id));
  }
  auto by_id = [](const core::Job& a, const core::Job& b) { return a.id < b.id; };
  std::sort(want_jobs.begin(), want_jobs.end(), by_id);
  std::sort(want_dedup.begin(), want_dedup.end(),
            [](const core::DedupEntry& a, const core::DedupEntry& b) { return a.key < b.key; });
  EXPECT_EQ(r.jobs, want_jobs);
  EXPECT_EQ(r.dedup, want_dedup);
  EXPECT_THAT(r.policies, ElementsAre(Pair("q", FullPolicy())));
}

// A visitor that keeps jobs cold past `hot_limit` (as the broker's RecoveredState does), taking
// only their index fields; ids that start with "whole" it wants whole after all.
class ColdRecordingVisitor final : public core::RecoveryVisitor {
 public:
  explicit ColdRecordingVisitor(size_t hot_limit) : hot_limit_(hot_limit) {}
  void OnJob(core::Job job) override { whole.push_back(std::move(job)); }
  bool NextJobMayBeCold() const override { return whole.size() >= hot_limit_; }
  bool OnColdJob(core::ColdJobFields& job) override {
    if (absl::StartsWith(job.id, "whole")) return false;
    cold.push_back(std::move(job));
    return true;
  }
  void OnDedup(core::DedupEntry) override {}
  void OnPolicy(std::string, core::PolicyOverride) override {}
  void OnSchedule(core::Schedule) override {}
  void OnCorrupt(core::CorruptRecord record) override { corrupt.push_back(std::move(record)); }

  std::vector<core::Job> whole;
  std::vector<core::ColdJobFields> cold;
  std::vector<core::CorruptRecord> corrupt;

 private:
  const size_t hot_limit_;
};

// Job and dedup records are inserted with a memtable hint per partition, and a snapshot's
// clear_partition is a range deletion in the same memtables: RocksDB 7.8 would hand the range
// deletion the point keys' hint and corrupt its skip list (rocksdb_store.cc,
// PartitionInsertHint). Hinted writes, the clear, and more hinted writes, all before any flush.
TEST_F(RocksDbStoreTest, ASnapshotsClearBetweenHintedWritesLeavesOnlyWhatCameAfter) {
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  for (int round = 0; round < 3; ++round) {
    core::Transition before;
    before.partition = 0;
    for (int i = 0; i < 50; ++i) {
      before.put_jobs.push_back(SimpleJob(absl::StrCat("old-", round, "-", i)));
      before.put_dedup.push_back(Dedup("q", absl::StrCat("k", round, "-", i), "old"));
    }
    before.delete_jobs.push_back(absl::StrCat("old-", round, "-7"));
    ASSERT_THAT(store->Write({&before, 1}), IsOk());
  }
  ReplicaWrite snapshot;
  snapshot.clear_partition = true;
  core::Transition installed;
  installed.partition = 0;
  installed.put_jobs = {SimpleJob("new-b"), SimpleJob("new-a")};
  snapshot.apply = {installed};
  ASSERT_THAT(store->WriteReplica(0, snapshot), IsOk());
  core::Transition after;
  after.partition = 0;
  after.put_jobs = {SimpleJob("new-c"), SimpleJob("old-1-3")};
  after.put_dedup = {Dedup("q", "k", "new-c")};
  ASSERT_THAT(store->Write({&after, 1}), IsOk());

  for (int reopened = 0; reopened < 2; ++reopened) {
    RecordingVisitor r;
    ASSERT_THAT(store->Recover(0, r), IsOk());
    EXPECT_THAT(r.events, ::testing::ElementsAre("dedup:q/k", "job:new-a", "job:new-b", "job:new-c",
                                                 "job:old-1-3"));
    store.reset();
    store = OpenOk();
    ASSERT_NE(store, nullptr);
  }
}

TEST_F(RocksDbStoreTest, RecoveryHandsJobsPastTheHotLimitOverAsTheirIndexFields) {
  core::Transition t;
  const core::JobState states[] = {core::JobState::kReady, core::JobState::kScheduled,
                                   core::JobState::kActive, core::JobState::kCompleted};
  for (int i = 0; i < 8; ++i) {
    core::Job job = FullJob(absl::StrCat("job-", i));
    job.seq = i + 1;
    job.state = states[i % 4];
    job.priority = -i;
    job.depends_on = {absl::StrCat("dep-", i)};
    t.put_jobs.push_back(job);
  }
  core::Job wanted_whole = SimpleJob("whole-1");
  wanted_whole.seq = 100;
  t.put_jobs.push_back(wanted_whole);
  WriteAndClose(t);

  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  ColdRecordingVisitor r(/*hot_limit=*/2);
  ASSERT_THAT(store->Recover(0, r), IsOk());
  EXPECT_THAT(r.corrupt, IsEmpty());
  // In key order: job-0 and job-1 fill the hot limit; after them, READY and SCHEDULED jobs come
  // as fields, ACTIVE and ended ones whole, and "whole-1" whole because the visitor asked.
  std::vector<std::string> whole_ids, cold_ids;
  for (const core::Job& job : r.whole) whole_ids.push_back(job.id);
  for (const core::ColdJobFields& job : r.cold) cold_ids.push_back(job.id);
  EXPECT_THAT(whole_ids,
              ElementsAre("job-0", "job-1", "job-2", "job-3", "job-6", "job-7", "whole-1"));
  EXPECT_THAT(cold_ids, ElementsAre("job-4", "job-5"));
  EXPECT_EQ(r.whole.back(), wanted_whole);
  for (const core::ColdJobFields& cold : r.cold)
    ExpectSameIndexFields(cold, t.put_jobs[cold.seq - 1]);
}

TEST_F(RocksDbStoreTest, AColdCandidateThatDoesNotDecodeIsReportedAndSkipped) {
  core::Transition t;
  for (int i = 0; i < 3; ++i) {
    core::Job job = SimpleJob(absl::StrCat("job-", i));
    job.seq = i + 1;
    t.put_jobs.push_back(job);
  }
  WriteAndClose(t);
  {
    RawDb raw(path_);
    raw.Put(kRocksDbJobsColumnFamily, P0 + "job-2", "garbage");
  }
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  ColdRecordingVisitor r(/*hot_limit=*/1);
  ASSERT_THAT(store->Recover(0, r), IsOk());
  ASSERT_EQ(r.corrupt.size(), 1u);
  EXPECT_EQ(r.corrupt[0].key, "job-2");
  EXPECT_EQ(r.whole.size(), 1u);
  ASSERT_EQ(r.cold.size(), 1u);
  EXPECT_EQ(r.cold[0].id, "job-1");
}

TEST_F(RocksDbStoreTest, CreationWritesFormatMarker) {
  OpenOk();
  RawDb raw(path_);
  EXPECT_EQ(raw.Get(rocksdb::kDefaultColumnFamilyName, kRocksDbFormatKey),
            std::to_string(kRocksDbStoreFormatVersion));
}

TEST_F(RocksDbStoreTest, OpenRefusesNewerFormat) {
  OpenOk();
  {
    RawDb raw(path_);
    raw.Put(rocksdb::kDefaultColumnFamilyName, kRocksDbFormatKey,
            std::to_string(kRocksDbStoreFormatVersion + 1));
  }
  absl::StatusOr<std::unique_ptr<RocksDbStore>> store = RocksDbStore::Open(path_);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(store.status().message(), HasSubstr("has format 3"));
}

// A newer build may add a column family; the format check must still be what answers.
TEST_F(RocksDbStoreTest, OpenRefusesNewerFormatWithExtraColumnFamily) {
  OpenOk();
  {
    RawDb raw(path_);
    raw.Put("added_by_v3", "x", "y");
    raw.Put(rocksdb::kDefaultColumnFamilyName, kRocksDbFormatKey, "3");
  }
  EXPECT_THAT(RocksDbStore::Open(path_), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(RocksDbStoreTest, OpenRefusesUnreadableFormatMarker) {
  OpenOk();
  {
    RawDb raw(path_);
    raw.Put(rocksdb::kDefaultColumnFamilyName, kRocksDbFormatKey, "one");
  }
  absl::StatusOr<std::unique_ptr<RocksDbStore>> store = RocksDbStore::Open(path_);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(store.status().message(), HasSubstr("unreadable"));
}

TEST_F(RocksDbStoreTest, OpenRefusesForeignDatabase) {
  {
    RawDb raw(path_);
    raw.Put(rocksdb::kDefaultColumnFamilyName, "someone-else", "data");
  }
  absl::StatusOr<std::unique_ptr<RocksDbStore>> store = RocksDbStore::Open(path_);
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(store.status().message(), HasSubstr("without a jobbroker format marker"));
}

TEST_F(RocksDbStoreTest, SecondOpenOfSameDirectoryIsUnavailable) {
  std::unique_ptr<RocksDbStore> first = OpenOk();
  ASSERT_NE(first, nullptr);
  EXPECT_THAT(RocksDbStore::Open(path_), StatusIs(absl::StatusCode::kUnavailable));
}

// A record that does not decode is reported with its key and skipped; the scan goes on, so the
// records after it (in key order) are still read.
TEST_F(RocksDbStoreTest, CorruptJobRecordIsReportedNamingTheKeyAndSkipped) {
  core::Transition t;
  t.put_jobs = {SimpleJob("a-good"), SimpleJob("z-good")};
  WriteAndClose(t);
  {
    RawDb raw(path_);
    raw.Put(kRocksDbJobsColumnFamily, P0 + "bad-job", "\xff\xff\xff\xff secret payload");
  }
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  RecordingVisitor r;
  ASSERT_TRUE(store->Recover(0, r).ok());
  EXPECT_THAT(r.events, ElementsAre("job:a-good", "corrupt:job/bad-job", "job:z-good"));
  ASSERT_EQ(r.corrupt.size(), 1u);
  EXPECT_EQ(r.corrupt[0].key, "bad-job");
  EXPECT_THAT(r.corrupt[0].reason, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(r.corrupt[0].reason.message(), HasSubstr("jobs record \"bad-job\""));
  EXPECT_THAT(r.corrupt[0].reason.message(), HasSubstr("JobRecord does not parse"));
  EXPECT_THAT(r.corrupt[0].reason.message(), Not(HasSubstr("secret"))) << "never the bytes";
}

TEST_F(RocksDbStoreTest, NewerJobRecordVersionIsReportedAndSkipped) {
  WriteAndClose(core::Transition{});
  {
    RawDb raw(path_);
    // A valid record of a format this build does not know.
    std::string bytes = EncodeJob(SimpleJob("j"));
    bytes += std::string("\x08\x63", 2);  // format_version = 99; the last value parsed wins
    raw.Put(kRocksDbJobsColumnFamily, P0 + "j", bytes);
  }
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  RecordingVisitor r;
  ASSERT_TRUE(store->Recover(0, r).ok());
  ASSERT_EQ(r.corrupt.size(), 1u);
  EXPECT_TRUE(r.jobs.empty());
  EXPECT_THAT(r.corrupt[0].reason, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(r.corrupt[0].reason.message(),
              HasSubstr("jobs record \"j\": JobRecord format_version 99"));
}

TEST_F(RocksDbStoreTest, JobRecordUnderAnotherKeyIsReportedAndSkipped) {
  WriteAndClose(core::Transition{});
  {
    RawDb raw(path_);
    raw.Put(kRocksDbJobsColumnFamily, P0 + "key", EncodeJob(SimpleJob("other")));
  }
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  RecordingVisitor r;
  ASSERT_TRUE(store->Recover(0, r).ok());
  EXPECT_THAT(r.events, ElementsAre("corrupt:job/key"));
  EXPECT_THAT(r.corrupt[0].reason.message(),
              HasSubstr("jobs record \"key\": record holds job \"other\""));
}

TEST_F(RocksDbStoreTest, ReadJobOfUndecodableOrMisfiledRecordIsDataLoss) {
  WriteAndClose(core::Transition{});
  {
    RawDb raw(path_);
    raw.Put(kRocksDbJobsColumnFamily, P0 + "bad", "\xff\xff\xff\xff secret payload");
    raw.Put(kRocksDbJobsColumnFamily, P0 + "key", EncodeJob(SimpleJob("other")));
  }
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  absl::Status bad = store->ReadJob(0, "bad").status();
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(bad.message(), HasSubstr("jobs record \"bad\""));
  EXPECT_THAT(bad.message(), Not(HasSubstr("secret"))) << "never the bytes";
  absl::Status misfiled = store->ReadJob(0, "key").status();
  EXPECT_THAT(misfiled, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(misfiled.message(), HasSubstr("record holds job \"other\""));
}

TEST_F(RocksDbStoreTest, DedupKeyWithoutSeparatorIsReportedAndSkipped) {
  WriteAndClose(core::Transition{});
  {
    RawDb raw(path_);
    raw.Put(kRocksDbDedupColumnFamily, P0 + "no-separator", EncodeDedup(Dedup("q", "k", "j")));
  }
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  RecordingVisitor r;
  ASSERT_TRUE(store->Recover(0, r).ok());
  EXPECT_THAT(r.events, ElementsAre("corrupt:dedup/no-separator"));
  EXPECT_THAT(r.corrupt[0].reason.message(), HasSubstr("dedup record \"no-separator\""));
}

TEST_F(RocksDbStoreTest, CorruptPolicyRecordIsReportedAndSkipped) {
  WriteAndClose(core::Transition{});
  {
    RawDb raw(path_);
    raw.Put(kRocksDbPoliciesColumnFamily, P0 + "q", "\xff\xff");
  }
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  RecordingVisitor r;
  ASSERT_TRUE(store->Recover(0, r).ok());
  EXPECT_THAT(r.events, ElementsAre("corrupt:policy/q"));
  EXPECT_THAT(r.corrupt[0].reason.message(), HasSubstr("policies record \"q\""));
}

// The on-disk layout is a contract with older data and with tools: check it directly.
TEST_F(RocksDbStoreTest, RecordsUseTheDocumentedKeys) {
  core::Transition t;
  t.partition = 258;
  t.seq = 0x0102030405060708;
  t.put_jobs = {SimpleJob("j")};
  t.put_dedup = {Dedup("q", "k", "j")};
  t.put_policies = {{"q", FullPolicy()}};
  {
    absl::StatusOr<std::unique_ptr<RocksDbStore>> store =
        RocksDbStore::Open(path_, {.partitions = 300});
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->Write({&t, 1}), IsOk());
  }
  RawDb raw(path_);
  const std::string p258("\0\0\x01\x02", 4);
  EXPECT_EQ(PartitionKeyPrefix(258), p258);
  EXPECT_EQ(raw.Get(kRocksDbJobsColumnFamily, p258 + "j"), EncodeJob(SimpleJob("j")));
  EXPECT_EQ(raw.Get(kRocksDbDedupColumnFamily, p258 + std::string("q\0k", 3)),
            EncodeDedup(Dedup("q", "k", "j")));
  EXPECT_EQ(raw.Get(kRocksDbPoliciesColumnFamily, p258 + "q"), EncodePolicy(FullPolicy()));
  EXPECT_EQ(raw.Get(rocksdb::kDefaultColumnFamilyName, "format"), "2");
  EXPECT_EQ(raw.Get(rocksdb::kDefaultColumnFamilyName, "partitions"), "300");
  EXPECT_EQ(raw.Get(rocksdb::kDefaultColumnFamilyName, "applied_seq" + p258),
            std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  EXPECT_THAT(raw.Keys(kRocksDbReplicationLogColumnFamily), ::testing::IsEmpty());
}

TEST_F(RocksDbStoreTest, TheStoreKeepsThePartitionCountItWasCreatedWith) {
  {
    absl::StatusOr<std::unique_ptr<RocksDbStore>> store =
        RocksDbStore::Open(path_, {.partitions = 8});
    ASSERT_THAT(store, IsOk());
    EXPECT_EQ((*store)->partitions(), 8u);
  }
  absl::StatusOr<std::unique_ptr<RocksDbStore>> reopened =
      RocksDbStore::Open(path_, {.partitions = 3});
  ASSERT_THAT(reopened, IsOk());
  EXPECT_EQ((*reopened)->partitions(), 8u);
}

TEST_F(RocksDbStoreTest, APartitionCountOutOfRangeIsRefusedNamingIt) {
  for (uint32_t bad : {0u, core::kMaxPartitions + 1}) {
    absl::StatusOr<std::unique_ptr<RocksDbStore>> store =
        RocksDbStore::Open(path_, {.partitions = bad});
    EXPECT_THAT(store, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(store.status().message(), HasSubstr("partitions"));
  }
}

// A directory as a format-1 build (before partitions) left it: the same column families,
// records keyed without a partition, marker "1".
void MakeFormat1Directory(const std::string& path) {
  RawDb raw(path);
  raw.Put(rocksdb::kDefaultColumnFamilyName, "format", "1");
  for (int i = 0; i < 600; ++i) {  // more than one upgrade chunk
    const std::string id = absl::StrCat("01HF3Z8K2Q", 100000 + i, "XYV7W5R4N3M2").substr(0, 26);
    raw.Put(kRocksDbJobsColumnFamily, id, EncodeJob(SimpleJob(id)));
  }
  raw.Put(kRocksDbDedupColumnFamily, std::string("q\0k", 3), EncodeDedup(Dedup("q", "k", "j")));
  raw.Put(kRocksDbPoliciesColumnFamily, "q", EncodePolicy(FullPolicy()));
}

TEST_F(RocksDbStoreTest, AFormat1DirectoryIsUpgradedInPlaceToOnePartition) {
  MakeFormat1Directory(path_);
  {
    absl::StatusOr<std::unique_ptr<RocksDbStore>> store =
        RocksDbStore::Open(path_, {.partitions = 16});  // the stored layout wins: one partition
    ASSERT_THAT(store, IsOk());
    EXPECT_EQ((*store)->partitions(), 1u);
    EXPECT_EQ((*store)->upgraded_from(), 1);
    RecordingVisitor r;
    ASSERT_THAT((*store)->Recover(0, r), IsOk());
    EXPECT_EQ(r.jobs.size(), 600u);
    EXPECT_TRUE(r.corrupt.empty());
    ASSERT_EQ(r.dedup.size(), 1u);
    EXPECT_EQ(r.dedup[0].queue, "q");
    EXPECT_EQ(r.dedup[0].key, "k");
    EXPECT_THAT(r.policies, ElementsAre(Pair("q", FullPolicy())));
    const std::string some_id = r.jobs[123].id;
    EXPECT_THAT((*store)->ReadJob(0, some_id), IsOk());
  }
  EXPECT_EQ(OpenOk()->upgraded_from(), 0) << "upgraded once";
  RawDb raw(path_);
  EXPECT_EQ(raw.Get(rocksdb::kDefaultColumnFamilyName, "format"), "2");
  for (const std::string& key : raw.Keys(kRocksDbJobsColumnFamily))
    EXPECT_EQ(key.substr(0, 4), P0) << "every record moved under partition 0";
}

TEST_F(RocksDbStoreTest, AnUpgradeCutShortGoesOnAtTheNextOpen) {
  MakeFormat1Directory(path_);
  {
    // What a crash halfway through the upgrade leaves: some records moved, the marker still 1.
    RawDb raw(path_);
    std::vector<std::string> keys = raw.Keys(kRocksDbJobsColumnFamily);
    for (size_t i = 0; i < keys.size() / 2; ++i) {
      raw.Put(kRocksDbJobsColumnFamily, P0 + keys[i], raw.Get(kRocksDbJobsColumnFamily, keys[i]));
      raw.Delete(kRocksDbJobsColumnFamily, keys[i]);
    }
  }
  std::unique_ptr<RocksDbStore> store = OpenOk();
  ASSERT_NE(store, nullptr);
  RecordingVisitor r;
  ASSERT_THAT(store->Recover(0, r), IsOk());
  EXPECT_EQ(r.jobs.size(), 600u);
  EXPECT_TRUE(r.corrupt.empty());
}

}  // namespace
}  // namespace jobbroker::storage
