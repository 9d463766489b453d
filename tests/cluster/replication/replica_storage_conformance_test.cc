// One suite, run against every ReplicaStorage: the replica (cluster/replication/replica.h) must
// not be able to tell the simulator's in-memory storage from the node's RocksDB one, so what the
// simulator proves of the protocol holds over the real store. Each backend can be reopened, as a
// node restart would; the memory one outlives its "process" by design.

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cluster/replication/replica_storage.h"
#include "cluster/replication/rocksdb_replica_storage.h"
#include "core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/rocksdb_store.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/memory_replica_storage.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::cluster {
namespace {

using ::jobbroker::storage::Dedup;
using ::jobbroker::storage::FullJob;
using ::jobbroker::storage::FullPolicy;
using ::jobbroker::storage::FullSchedule;
using ::jobbroker::storage::RecordingVisitor;
using ::jobbroker::storage::ScopedTempDir;
using ::jobbroker::storage::SimpleJob;
using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;

constexpr uint32_t kPartition = 0;

// Each backend provides storage(), state() (the store its applied state is in) and Reopen().
class MemoryBackend {
 public:
  static constexpr char kName[] = "MemoryReplicaStorage";
  ReplicaStorage& storage() { return storage_; }
  core::Store& state() { return storage_.state(); }
  void Reopen() {}  // it outlives the simulated node's crash; nothing to do

 private:
  testing::MemoryReplicaStorage storage_{kPartition};
};

class RocksDbBackend {
 public:
  static constexpr char kName[] = "RocksDbReplicaStorage";
  RocksDbBackend() { Open(); }
  // A store that failed to open has failed the test already (Open's ASSERTs); stop it here
  // rather than with a null dereference.
  ReplicaStorage& storage() {
    if (storage_ == nullptr) std::abort();
    return *storage_;
  }
  core::Store& state() {
    if (store_ == nullptr) std::abort();
    return *store_;
  }
  void Reopen() {
    storage_.reset();
    store_.reset();  // closes the DB and releases the directory lock
    Open();
  }

 private:
  void Open() {
    auto store = storage::RocksDbStore::Open(dir_.Sub("db"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    auto replica = RocksDbReplicaStorage::Open(store_.get(), kPartition);
    ASSERT_TRUE(replica.ok()) << replica.status();
    storage_ = *std::move(replica);
  }

  ScopedTempDir dir_;  // declared first: removed after the store is closed
  std::unique_ptr<storage::RocksDbStore> store_;
  std::unique_ptr<RocksDbReplicaStorage> storage_;
};

struct BackendName {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};

template <typename Backend>
class ReplicaStorageConformanceTest : public ::testing::Test {
 protected:
  ReplicaStorage& storage() { return backend_.storage(); }
  void Reopen() { backend_.Reopen(); }

  RecordingVisitor State() {
    RecordingVisitor visitor;
    absl::Status s = backend_.state().Recover(kPartition, visitor);
    EXPECT_TRUE(s.ok()) << s;
    return visitor;
  }

  // Entries first..last of `epoch`, entry n putting job "j<n>".
  static std::vector<LogEntry> Entries(uint64_t first, uint64_t last, int64_t epoch) {
    std::vector<LogEntry> entries;
    for (uint64_t seq = first; seq <= last; ++seq) {
      LogEntry entry{seq, epoch, {}};
      entry.transition.partition = kPartition;
      entry.transition.seq = seq;
      entry.transition.put_jobs = {SimpleJob(absl::StrCat("j", seq))};
      entries.push_back(std::move(entry));
    }
    return entries;
  }

  static std::vector<std::string> JobIds(const RecordingVisitor& r) {
    std::vector<std::string> ids;
    for (const core::Job& job : r.jobs) ids.push_back(job.id);
    return ids;
  }

  static std::vector<std::pair<uint64_t, int64_t>> Positions(
      const absl::StatusOr<std::vector<LogEntry>>& entries) {
    std::vector<std::pair<uint64_t, int64_t>> out;
    if (!entries.ok()) return out;
    for (const LogEntry& e : *entries) out.emplace_back(e.seq, e.epoch);
    return out;
  }

  Backend backend_;
  Backend other_;  // a second replica, to install snapshots into
};

using Backends = ::testing::Types<MemoryBackend, RocksDbBackend>;
TYPED_TEST_SUITE(ReplicaStorageConformanceTest, Backends, BackendName);

TYPED_TEST(ReplicaStorageConformanceTest, NewReplicaIsEmpty) {
  ReplicaStorage& s = this->storage();
  EXPECT_EQ(s.epoch_floor(), 0);
  EXPECT_EQ(s.log_base(), (LogPosition{0, 0}));
  EXPECT_EQ(s.log_end(), 0u);
  EXPECT_EQ(s.applied_seq(), 0u);
  EXPECT_THAT(s.EpochAt(0), IsOk());
  EXPECT_THAT(s.EpochAt(1).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(s.Read(1, 10), IsOk());
  EXPECT_THAT(*s.Read(1, 10), IsEmpty());
}

TYPED_TEST(ReplicaStorageConformanceTest, FloorOnlyRisesAndSurvivesReopen) {
  ASSERT_THAT(this->storage().RaiseEpochFloor(7), IsOk());
  ASSERT_THAT(this->storage().RaiseEpochFloor(3), IsOk());
  EXPECT_EQ(this->storage().epoch_floor(), 7);
  this->Reopen();
  EXPECT_EQ(this->storage().epoch_floor(), 7);
  ASSERT_THAT(this->storage().RaiseEpochFloor(9), IsOk());
  this->Reopen();
  EXPECT_EQ(this->storage().epoch_floor(), 9);
}

TYPED_TEST(ReplicaStorageConformanceTest, AppendedEntriesReadBackWholeAfterReopen) {
  std::vector<LogEntry> entries = this->Entries(1, 2, 5);
  entries[1].transition.put_jobs = {FullJob("full")};
  entries[1].transition.delete_jobs = {"gone"};
  entries[1].transition.put_dedup = {Dedup("emails", "k", "full")};
  entries[1].transition.delete_dedup = {{"emails", "old-key"}};
  entries[1].transition.put_policies = {{"emails", FullPolicy()}};
  entries[1].transition.delete_policies = {"other"};
  ASSERT_THAT(this->storage().Append(entries), IsOk());
  ASSERT_THAT(this->storage().Append(this->Entries(3, 3, 7)), IsOk());
  this->Reopen();

  ReplicaStorage& s = this->storage();
  EXPECT_EQ(s.log_end(), 3u);
  EXPECT_EQ(*s.EpochAt(1), 5);
  EXPECT_EQ(*s.EpochAt(2), 5);
  EXPECT_EQ(*s.EpochAt(3), 7);
  absl::StatusOr<std::vector<LogEntry>> read = s.Read(2, 1);
  ASSERT_THAT(read, IsOk());
  ASSERT_THAT(*read, SizeIs(1));
  const core::Transition& t = (*read)[0].transition;
  EXPECT_EQ((*read)[0].seq, 2u);
  EXPECT_EQ((*read)[0].epoch, 5);
  EXPECT_THAT(t.put_jobs, ElementsAre(FullJob("full")));
  EXPECT_THAT(t.delete_jobs, ElementsAre("gone"));
  EXPECT_THAT(t.put_dedup, ElementsAre(Dedup("emails", "k", "full")));
  EXPECT_THAT(t.delete_dedup, ElementsAre(Pair("emails", "old-key")));
  EXPECT_THAT(t.put_policies, ElementsAre(Pair("emails", FullPolicy())));
  EXPECT_THAT(t.delete_policies, ElementsAre("other"));
  EXPECT_THAT(this->Positions(s.Read(1, 10)), ElementsAre(Pair(1, 5), Pair(2, 5), Pair(3, 7)));
  // Appending is not applying: the state is untouched.
  EXPECT_EQ(s.applied_seq(), 0u);
  EXPECT_THAT(this->State().jobs, IsEmpty());
}

TYPED_TEST(ReplicaStorageConformanceTest, AppendThatDoesNotContinueTheLogChangesNothing) {
  ASSERT_THAT(this->storage().Append(this->Entries(1, 2, 1)), IsOk());
  EXPECT_THAT(this->storage().Append(this->Entries(4, 4, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(this->storage().Append(this->Entries(2, 3, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  this->Reopen();
  EXPECT_EQ(this->storage().log_end(), 2u);
  EXPECT_THAT(this->Positions(this->storage().Read(1, 10)), ElementsAre(Pair(1, 1), Pair(2, 1)));
}

TYPED_TEST(ReplicaStorageConformanceTest, ApplyThroughWritesTheStateAndItsSeq) {
  std::vector<LogEntry> entries = this->Entries(1, 2, 3);
  LogEntry epoch_start{3, 4, {}};  // empty, like an epoch-start entry
  entries.push_back(epoch_start);
  LogEntry removal = this->Entries(4, 4, 4)[0];
  removal.transition.put_jobs.clear();
  removal.transition.delete_jobs = {"j1"};
  removal.transition.put_policies = {{"q", FullPolicy()}};
  entries.push_back(removal);
  ASSERT_THAT(this->storage().Append(entries), IsOk());

  ASSERT_THAT(this->storage().ApplyThrough(2), IsOk());
  EXPECT_EQ(this->storage().applied_seq(), 2u);
  RecordingVisitor state = this->State();
  EXPECT_THAT(this->JobIds(state), ElementsAre("j1", "j2"));
  EXPECT_EQ(state.applied_seq, 2u);

  ASSERT_THAT(this->storage().ApplyThrough(3), IsOk());
  EXPECT_EQ(this->State().applied_seq, 3u);  // the empty entry moves it too
  ASSERT_THAT(this->storage().ApplyThrough(4), IsOk());
  this->Reopen();
  EXPECT_EQ(this->storage().applied_seq(), 4u);
  state = this->State();
  EXPECT_THAT(this->JobIds(state), ElementsAre("j2"));
  EXPECT_THAT(state.policies, ElementsAre(Pair("q", FullPolicy())));
  EXPECT_EQ(state.applied_seq, 4u);
  // Applying does not trim: followers may still need the entries.
  EXPECT_EQ(this->storage().log_end(), 4u);
  EXPECT_THAT(this->storage().Read(1, 10), IsOk());
  EXPECT_THAT(*this->storage().Read(1, 10), SizeIs(4));

  EXPECT_THAT(this->storage().ApplyThrough(5), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(this->storage().applied_seq(), 4u);
}

// A batch committed by its own append (a leader with no follower to wait for) is appended and
// applied at once, in one durable call.
TYPED_TEST(ReplicaStorageConformanceTest, AppendCommittedAppendsAndAppliesInOneCall) {
  ASSERT_THAT(this->storage().Append(this->Entries(1, 2, 2)), IsOk());
  ASSERT_THAT(this->storage().ApplyThrough(2), IsOk());
  ASSERT_THAT(
      this->storage().AppendCommitted(this->Entries(3, 4, 2), /*keep_in_log=*/true, /*sync=*/true),
      IsOk());
  EXPECT_EQ(this->storage().log_end(), 4u);
  EXPECT_EQ(this->storage().applied_seq(), 4u);
  this->Reopen();
  ReplicaStorage& s = this->storage();
  EXPECT_EQ(s.log_end(), 4u);
  EXPECT_EQ(s.applied_seq(), 4u);
  EXPECT_EQ(s.log_base(), (LogPosition{0, 0}));
  // Kept in the log, for followers that catch up.
  EXPECT_THAT(this->Positions(s.Read(1, 10)),
              ElementsAre(Pair(1, 2), Pair(2, 2), Pair(3, 2), Pair(4, 2)));
  RecordingVisitor state = this->State();
  EXPECT_THAT(this->JobIds(state), ElementsAre("j1", "j2", "j3", "j4"));
  EXPECT_EQ(state.applied_seq, 4u);
}

// Without a replica to send them to, committed entries go straight into the state: the log stays
// empty, based at the last of them, and goes on from there.
TYPED_TEST(ReplicaStorageConformanceTest, AppendCommittedOutsideTheLogLeavesItEmpty) {
  ASSERT_THAT(this->storage().Append(this->Entries(1, 2, 2)), IsOk());
  ASSERT_THAT(this->storage().ApplyThrough(2), IsOk());
  ASSERT_THAT(
      this->storage().AppendCommitted(this->Entries(3, 5, 3), /*keep_in_log=*/false, /*sync=*/true),
      IsOk());
  this->Reopen();
  ReplicaStorage& s = this->storage();
  EXPECT_EQ(s.log_base(), (LogPosition{5, 3}));
  EXPECT_EQ(s.log_end(), 5u);
  EXPECT_EQ(s.applied_seq(), 5u);
  EXPECT_EQ(*s.EpochAt(5), 3);
  EXPECT_THAT(s.EpochAt(2).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(s.Read(6, 10), IsOk());
  EXPECT_THAT(*s.Read(6, 10), IsEmpty());
  RecordingVisitor state = this->State();
  EXPECT_THAT(this->JobIds(state), ElementsAre("j1", "j2", "j3", "j4", "j5"));
  EXPECT_EQ(state.applied_seq, 5u);
  // The log goes on after it, as an ordinary append.
  ASSERT_THAT(s.Append(this->Entries(6, 6, 3)), IsOk());
  EXPECT_THAT(this->Positions(s.Read(6, 10)), ElementsAre(Pair(6, 3)));
}

// Unsynced, then made durable by SyncLog: what a reopen (a restart) finds is the same.
TYPED_TEST(ReplicaStorageConformanceTest, UnsyncedAppendsAreKeptOnceTheLogIsSynced) {
  ASSERT_THAT(this->storage().AppendUnsynced(this->Entries(1, 2, 2)), IsOk());
  EXPECT_THAT(this->Positions(this->storage().Read(1, 10)), ElementsAre(Pair(1, 2), Pair(2, 2)));
  ASSERT_THAT(this->storage().ApplyThrough(2), IsOk());
  ASSERT_THAT(this->storage().AppendCommitted(this->Entries(3, 3, 2), /*keep_in_log=*/false,
                                              /*sync=*/false),
              IsOk());
  ASSERT_THAT(this->storage().SyncLog(), IsOk());
  this->Reopen();
  EXPECT_EQ(this->storage().log_end(), 3u);
  EXPECT_EQ(this->storage().applied_seq(), 3u);
  EXPECT_THAT(this->JobIds(this->State()), ElementsAre("j1", "j2", "j3"));
}

// Entries not applied yet, or ones that do not continue the log: refused, nothing changed.
TYPED_TEST(ReplicaStorageConformanceTest, AppendCommittedBehindUnappliedEntriesChangesNothing) {
  ASSERT_THAT(this->storage().Append(this->Entries(1, 2, 2)), IsOk());
  ASSERT_THAT(this->storage().ApplyThrough(1), IsOk());
  EXPECT_THAT(this->storage().AppendCommitted(this->Entries(3, 3, 2), true, true),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(this->storage().ApplyThrough(2), IsOk());
  EXPECT_THAT(this->storage().AppendCommitted(this->Entries(4, 4, 2), false, true),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  this->Reopen();
  EXPECT_EQ(this->storage().log_end(), 2u);
  EXPECT_EQ(this->storage().applied_seq(), 2u);
  EXPECT_EQ(this->storage().log_base(), (LogPosition{0, 0}));
  EXPECT_THAT(this->JobIds(this->State()), ElementsAre("j1", "j2"));
}

TYPED_TEST(ReplicaStorageConformanceTest, TruncateAfterDropsTheTailAboveTheApplied) {
  ASSERT_THAT(this->storage().Append(this->Entries(1, 4, 2)), IsOk());
  ASSERT_THAT(this->storage().ApplyThrough(1), IsOk());
  EXPECT_THAT(this->storage().TruncateAfter(0), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(this->storage().TruncateAfter(2), IsOk());
  EXPECT_EQ(this->storage().log_end(), 2u);
  EXPECT_EQ(*this->storage().EpochAt(2), 2);
  EXPECT_THAT(this->storage().EpochAt(3).status(), StatusIs(absl::StatusCode::kNotFound));
  // The new leader's entries take the freed seqs.
  ASSERT_THAT(this->storage().Append(this->Entries(3, 3, 6)), IsOk());
  ASSERT_THAT(this->storage().TruncateAfter(9), IsOk());  // beyond the end: nothing to drop
  this->Reopen();
  EXPECT_EQ(this->storage().log_end(), 3u);
  EXPECT_THAT(this->Positions(this->storage().Read(1, 10)),
              ElementsAre(Pair(1, 2), Pair(2, 2), Pair(3, 6)));
  EXPECT_EQ(this->storage().applied_seq(), 1u);
}

TYPED_TEST(ReplicaStorageConformanceTest, TrimThroughMovesTheBaseUpToTheApplied) {
  std::vector<LogEntry> entries = this->Entries(1, 4, 2);
  entries[3].epoch = 3;
  ASSERT_THAT(this->storage().Append(entries), IsOk());
  ASSERT_THAT(this->storage().ApplyThrough(3), IsOk());
  EXPECT_THAT(this->storage().TrimThrough(4), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(this->storage().TrimThrough(2), IsOk());
  ASSERT_THAT(this->storage().TrimThrough(1), IsOk());  // below the base: nothing to drop
  this->Reopen();
  ReplicaStorage& s = this->storage();
  EXPECT_EQ(s.log_base(), (LogPosition{2, 2}));
  EXPECT_EQ(*s.EpochAt(2), 2);
  EXPECT_THAT(s.EpochAt(1).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(s.Read(2, 10).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(this->Positions(s.Read(3, 10)), ElementsAre(Pair(3, 2), Pair(4, 3)));
  // Trimmed entries stay in the state.
  EXPECT_THAT(this->JobIds(this->State()), ElementsAre("j1", "j2", "j3"));
}

TYPED_TEST(ReplicaStorageConformanceTest, SnapshotCarriesTheStateIntoAnotherReplica) {
  std::vector<LogEntry> entries = this->Entries(1, 5, 4);
  entries[0].transition.put_dedup = {Dedup("q", "k", "j1")};
  entries[0].transition.put_policies = {{"q", FullPolicy()}};
  entries[1].transition.put_schedules = {FullSchedule("nightly")};
  ASSERT_THAT(this->storage().Append(entries), IsOk());
  ASSERT_THAT(this->storage().ApplyThrough(5), IsOk());

  absl::StatusOr<std::vector<core::Transition>> chunks = this->storage().SnapshotChunks(3);
  ASSERT_THAT(chunks, IsOk());
  size_t records = 0;
  for (const core::Transition& chunk : *chunks) {
    size_t in_chunk = chunk.put_jobs.size() + chunk.put_dedup.size() + chunk.put_policies.size() +
                      chunk.put_schedules.size();
    EXPECT_LE(in_chunk, 3u);
    EXPECT_TRUE(chunk.delete_jobs.empty() && chunk.delete_dedup.empty() &&
                chunk.delete_policies.empty() && chunk.delete_schedules.empty());
    records += in_chunk;
  }
  EXPECT_EQ(records, 8u);  // five jobs, a dedup entry, a policy, a schedule

  // The other replica has a floor, a state and a log of its own, which the snapshot replaces.
  ReplicaStorage& other = this->other_.storage();
  ASSERT_THAT(other.RaiseEpochFloor(6), IsOk());
  std::vector<LogEntry> stale = this->Entries(1, 3, 1);
  stale[0].transition.put_jobs = {SimpleJob("stale")};
  ASSERT_THAT(other.Append(stale), IsOk());
  ASSERT_THAT(other.ApplyThrough(1), IsOk());
  ASSERT_THAT(other.InstallSnapshot({5, 4}, *chunks), IsOk());
  this->other_.Reopen();

  ReplicaStorage& installed = this->other_.storage();
  EXPECT_EQ(installed.epoch_floor(), 6);
  EXPECT_EQ(installed.applied_seq(), 5u);
  EXPECT_EQ(installed.log_base(), (LogPosition{5, 4}));
  EXPECT_EQ(installed.log_end(), 5u);
  EXPECT_EQ(*installed.EpochAt(5), 4);
  EXPECT_THAT(installed.Read(6, 10), IsOk());
  EXPECT_THAT(*installed.Read(6, 10), IsEmpty());
  RecordingVisitor copy;
  ASSERT_THAT(this->other_.state().Recover(kPartition, copy), IsOk());
  RecordingVisitor original = this->State();
  EXPECT_EQ(copy.applied_seq, 5u);
  EXPECT_EQ(copy.events, original.events);
  EXPECT_EQ(copy.jobs, original.jobs);
  EXPECT_EQ(copy.dedup, original.dedup);
  EXPECT_THAT(copy.schedules, ElementsAre(FullSchedule("nightly")));
  // And the log goes on from the snapshot.
  ASSERT_THAT(installed.Append(this->Entries(6, 6, 7)), IsOk());
  ASSERT_THAT(installed.ApplyThrough(6), IsOk());
  EXPECT_THAT(installed.Read(6, 10), IsOk());
  EXPECT_THAT(this->Positions(installed.Read(6, 10)), ElementsAre(Pair(6, 7)));
}

}  // namespace
}  // namespace jobbroker::cluster
