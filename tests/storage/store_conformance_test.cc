// One suite, run against every Store: the broker must not be able to tell them apart.

#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/memory_store.h"
#include "storage/rocksdb_store.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::storage {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

// Each backend provides: store(), and Reopen() to simulate a broker restart over the same data.
class MemoryBackend {
 public:
  static constexpr char kName[] = "MemoryStore";
  core::Store& store() { return store_; }
  void Reopen() {}  // a MemoryStore outlives the broker; nothing to do

 private:
  MemoryStore store_;
};

class RocksDbBackend {
 public:
  static constexpr char kName[] = "RocksDbStore";
  RocksDbBackend() { Open(); }
  core::Store& store() { return *store_; }
  void Reopen() {
    store_.reset();  // closes the DB and releases the directory lock
    Open();
  }

 private:
  void Open() {
    auto store = RocksDbStore::Open(dir_.Sub("db"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  ScopedTempDir dir_;  // declared first: removed after the store is closed
  std::unique_ptr<RocksDbStore> store_;
};

template <typename Backend>
class StoreConformanceTest : public ::testing::Test {
 protected:
  core::Store& store() { return backend_.store(); }
  void Reopen() { backend_.Reopen(); }

  absl::Status Write(std::vector<core::Transition> transitions) {
    return store().Write(transitions);
  }
  absl::Status Write(core::Transition t) { return store().Write({&t, 1}); }

  RecordingVisitor Recover(uint32_t partition = 0) {
    RecordingVisitor visitor;
    absl::Status s = store().Recover(partition, visitor);
    EXPECT_TRUE(s.ok()) << s;
    return visitor;
  }

  Backend backend_;
};

struct BackendNames {
  template <typename Backend>
  static std::string GetName(int) {
    return Backend::kName;
  }
};

using Backends = ::testing::Types<MemoryBackend, RocksDbBackend>;
TYPED_TEST_SUITE(StoreConformanceTest, Backends, BackendNames);

TYPED_TEST(StoreConformanceTest, EmptyStoreRecoversNothing) {
  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.events, IsEmpty());
}

TYPED_TEST(StoreConformanceTest, EmptySpanAndEmptyTransitionAreOk) {
  EXPECT_THAT(this->store().Write({}), IsOk());
  EXPECT_THAT(this->Write(core::Transition{}), IsOk());
  EXPECT_THAT(this->Write(std::vector<core::Transition>(3)), IsOk());
  EXPECT_THAT(this->Recover().events, IsEmpty());
}

TYPED_TEST(StoreConformanceTest, WritesAndRecoversJobs) {
  core::Transition t;
  t.put_jobs = {SimpleJob("b"), SimpleJob("a", "other"), SimpleJob("c")};
  ASSERT_THAT(this->Write(t), IsOk());

  RecordingVisitor r = this->Recover();
  // Key order, whatever the write order.
  EXPECT_THAT(r.jobs, ElementsAre(SimpleJob("a", "other"), SimpleJob("b"), SimpleJob("c")));
}

TYPED_TEST(StoreConformanceTest, FullJobRecoversEqual) {
  core::Transition t;
  t.put_jobs = {FullJob()};
  ASSERT_THAT(this->Write(t), IsOk());
  RecordingVisitor r = this->Recover();
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(r.jobs[0], FullJob());

  this->Reopen();
  r = this->Recover();
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(r.jobs[0], FullJob());
}

TYPED_TEST(StoreConformanceTest, EachPartitionRecoversOnlyItsOwnRecords) {
  core::Transition in0;
  in0.put_jobs = {SimpleJob("a")};
  in0.put_dedup = {Dedup("q", "k", "a")};
  core::Transition in5;
  in5.partition = 5;
  in5.put_jobs = {SimpleJob("a", "other"), SimpleJob("b")};  // the same id, another job
  in5.put_dedup = {Dedup("q", "k", "b")};
  in5.put_policies = {{"q", FullPolicy()}};
  ASSERT_THAT(this->Write({in0, in5}), IsOk());
  this->Reopen();

  EXPECT_THAT(this->Recover(0).events, ElementsAre("dedup:q/k", "job:a"));
  RecordingVisitor r5 = this->Recover(5);
  EXPECT_THAT(r5.events, ElementsAre("policy:q", "dedup:q/k", "job:a", "job:b"));
  EXPECT_EQ(r5.dedup[0].job_id, "b");
  EXPECT_EQ(r5.jobs[0], SimpleJob("a", "other"));
  EXPECT_THAT(this->Recover(4).events, IsEmpty());
  EXPECT_EQ(*this->store().ReadJob(0, "a"), SimpleJob("a"));
  EXPECT_EQ(*this->store().ReadJob(5, "a"), SimpleJob("a", "other"));
  EXPECT_THAT(this->store().ReadJob(0, "b"), StatusIs(absl::StatusCode::kNotFound));

  core::Transition delete5;
  delete5.partition = 5;
  delete5.delete_jobs = {"a"};
  ASSERT_THAT(this->Write(delete5), IsOk());
  EXPECT_THAT(this->store().ReadJob(0, "a"), IsOk()) << "a delete stays in its partition";
}

TYPED_TEST(StoreConformanceTest, APartitionsAppliedSeqIsItsLastNumberedTransition) {
  EXPECT_EQ(this->Recover(0).applied_seq, 0u) << "none yet";
  core::Transition a;
  a.partition = 2;
  a.seq = 7;
  a.put_jobs = {SimpleJob("a")};
  core::Transition unnumbered;  // a tool's write: leaves applied_seq alone
  unnumbered.partition = 2;
  unnumbered.put_jobs = {SimpleJob("b")};
  core::Transition b = a;
  b.seq = 8;
  core::Transition other;
  other.partition = 3;
  other.seq = 100;
  other.put_jobs = {SimpleJob("c")};
  ASSERT_THAT(this->Write({a, b, unnumbered, other}), IsOk());
  this->Reopen();
  EXPECT_EQ(this->Recover(2).applied_seq, 8u);
  EXPECT_EQ(this->Recover(3).applied_seq, 100u);
  EXPECT_EQ(this->Recover(0).applied_seq, 0u);

  core::Transition next = a;
  next.seq = 9;
  ASSERT_THAT(this->Write(next), IsOk());
  EXPECT_EQ(this->Recover(2).applied_seq, 9u);
}

TYPED_TEST(StoreConformanceTest, ReadJobReturnsTheLastWrittenRecord) {
  core::Job job = FullJob();
  core::Transition t;
  t.put_jobs = {job};
  ASSERT_THAT(this->Write(t), IsOk());
  absl::StatusOr<core::Job> read = this->store().ReadJob(0, job.id);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, job);

  // An unsynced write is already visible: the broker reads cold jobs while syncs are pending.
  job.state = core::JobState::kActive;
  core::Transition update;
  update.put_jobs = {job};
  ASSERT_THAT(this->store().WriteUnsynced({&update, 1}), IsOk());
  read = this->store().ReadJob(0, job.id);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->state, core::JobState::kActive);
}

TYPED_TEST(StoreConformanceTest, ReadJobOfMissingOrDeletedJobIsNotFound) {
  EXPECT_THAT(this->store().ReadJob(0, "never"), StatusIs(absl::StatusCode::kNotFound));
  core::Transition put;
  put.put_jobs = {SimpleJob("a")};
  ASSERT_THAT(this->Write(put), IsOk());
  core::Transition del;
  del.delete_jobs = {"a"};
  ASSERT_THAT(this->Write(del), IsOk());
  EXPECT_THAT(this->store().ReadJob(0, "a"), StatusIs(absl::StatusCode::kNotFound));
}

TYPED_TEST(StoreConformanceTest, WritesAndRecoversDedupEntries) {
  core::Transition t;
  // An empty key and a key holding NUL bytes are legal: only the queue must be NUL-free.
  t.put_dedup = {Dedup("q2", "k", "j1"), Dedup("q", std::string("k\0x", 3), "j2"),
                 Dedup("q", "", "j3"), Dedup("q", "k", "j4")};
  ASSERT_THAT(this->Write(t), IsOk());

  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.dedup,
              ElementsAre(Dedup("q", "", "j3"), Dedup("q", "k", "j4"),
                          Dedup("q", std::string("k\0x", 3), "j2"), Dedup("q2", "k", "j1")));
}

TYPED_TEST(StoreConformanceTest, WritesAndRecoversPolicies) {
  core::PolicyOverride paused;
  paused.paused = true;
  core::Transition t;
  t.put_policies = {
      {"reports", FullPolicy()}, {"emails", paused}, {"empty", core::PolicyOverride{}}};
  ASSERT_THAT(this->Write(t), IsOk());

  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.policies, ElementsAre(Pair("emails", paused), Pair("empty", core::PolicyOverride{}),
                                      Pair("reports", FullPolicy())));
}

TYPED_TEST(StoreConformanceTest, WritesRecoversAndDeletesSchedules) {
  core::Transition put;
  put.put_schedules = {FullSchedule("b"), FullSchedule("a"), FullSchedule("gone")};
  ASSERT_THAT(this->Write(put), IsOk());
  core::Schedule moved = FullSchedule("a");
  moved.last_run_at = moved.next_run_at;
  moved.next_run_at += absl::Hours(24);
  moved.last_job_id = "01JNEXTJOB0000000000000000";
  core::Transition advance;
  advance.put_schedules = {moved};
  advance.delete_schedules = {"gone", "never-existed"};
  ASSERT_THAT(this->Write(advance), IsOk());

  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.schedules, ElementsAre(moved, FullSchedule("b")));
}

TYPED_TEST(StoreConformanceTest, RecoverVisitsPoliciesThenDedupThenJobs) {
  core::Transition t;
  t.put_jobs = {SimpleJob("a")};
  t.put_dedup = {Dedup("q", "k", "a")};
  t.put_policies = {{"q", FullPolicy()}};
  ASSERT_THAT(this->Write(t), IsOk());
  EXPECT_THAT(this->Recover().events, ElementsAre("policy:q", "dedup:q/k", "job:a"));
}

TYPED_TEST(StoreConformanceTest, LaterPutOfSameIdInOneWriteWins) {
  core::Job first = SimpleJob("j", "q", "first");
  core::Job second = SimpleJob("j", "q", "second");
  core::Job third = SimpleJob("j", "q", "third");
  second.state = core::JobState::kActive;
  third.state = core::JobState::kCompleted;

  // Twice in one transition, then again in a later transition of the same Write.
  core::Transition t1;
  t1.put_jobs = {first, second};
  t1.put_dedup = {Dedup("q", "k", "old")};
  t1.put_policies = {{"q", core::PolicyOverride{}}};
  core::Transition t2;
  t2.put_jobs = {third};
  t2.put_dedup = {Dedup("q", "k", "new")};
  t2.put_policies = {{"q", FullPolicy()}};
  ASSERT_THAT(this->Write({t1, t2}), IsOk());

  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.jobs, ElementsAre(third));
  EXPECT_THAT(r.dedup, ElementsAre(Dedup("q", "k", "new")));
  EXPECT_THAT(r.policies, ElementsAre(Pair("q", FullPolicy())));
}

TYPED_TEST(StoreConformanceTest, DeletesRemoveRecords) {
  core::Transition put;
  put.put_jobs = {SimpleJob("a"), SimpleJob("b")};
  put.put_dedup = {Dedup("q", "k1", "a"), Dedup("q", "k2", "b")};
  put.put_policies = {{"q", FullPolicy()}, {"r", FullPolicy()}};
  ASSERT_THAT(this->Write(put), IsOk());

  core::Transition del;
  del.delete_jobs = {"a", "never-existed"};
  del.delete_dedup = {{"q", "k1"}, {"nope", "k2"}};
  del.delete_policies = {"r", "missing"};
  ASSERT_THAT(this->Write(del), IsOk());

  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.jobs, ElementsAre(SimpleJob("b")));
  EXPECT_THAT(r.dedup, ElementsAre(Dedup("q", "k2", "b")));
  EXPECT_THAT(r.policies, ElementsAre(Pair("q", FullPolicy())));
}

// Inside one Transition the fields apply in declaration order: puts before deletes.
TYPED_TEST(StoreConformanceTest, DeleteInSameTransitionBeatsPut) {
  core::Transition t;
  t.put_jobs = {SimpleJob("a"), SimpleJob("b")};
  t.delete_jobs = {"a"};
  t.put_dedup = {Dedup("q", "k", "a")};
  t.delete_dedup = {{"q", "k"}};
  t.put_policies = {{"q", FullPolicy()}};
  t.delete_policies = {"q"};
  ASSERT_THAT(this->Write(t), IsOk());

  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.jobs, ElementsAre(SimpleJob("b")));
  EXPECT_THAT(r.dedup, IsEmpty());
  EXPECT_THAT(r.policies, IsEmpty());
}

// Transitions apply in order, so a put in a later transition revives a deleted key.
TYPED_TEST(StoreConformanceTest, SeveralTransitionsInOneWriteApplyInOrder) {
  core::Transition enqueue;
  enqueue.put_jobs = {SimpleJob("a"), SimpleJob("b")};
  enqueue.put_dedup = {Dedup("q", "k", "a")};
  core::Transition finish;
  finish.delete_jobs = {"a"};
  finish.delete_dedup = {{"q", "k"}};
  core::Transition requeue;
  requeue.put_jobs = {SimpleJob("a", "q", "again")};
  core::Transition lease;
  core::Job leased = SimpleJob("b");
  leased.state = core::JobState::kActive;
  leased.attempt = 1;
  lease.put_jobs = {leased};
  ASSERT_THAT(this->Write({enqueue, finish, requeue, lease}), IsOk());

  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.jobs, ElementsAre(SimpleJob("a", "q", "again"), leased));
  EXPECT_THAT(r.dedup, IsEmpty());
}

// A group commit writes dozens of transitions at once, and a store may reorder or drop the
// changes of a job within them (RocksDbStore writes each job once, sorted by key): whatever it
// does, the outcome must be that of applying them one by one. Checked against a map on random
// writes of puts and deletes over a few ids in two partitions, the ids out of order.
TYPED_TEST(StoreConformanceTest, AWriteOfManyTransitionsEndsAsIfAppliedOneByOne) {
  std::mt19937 rng(20261205);
  std::map<std::pair<uint32_t, std::string>, core::Job> model;
  const std::vector<std::string> ids = {"m", "c", "x", "a", "k", "b"};
  for (int write = 0; write < 40; ++write) {
    std::vector<core::Transition> transitions(1 + rng() % 6);
    int version = 0;
    for (core::Transition& t : transitions) {
      t.partition = rng() % 2 == 0 ? 0 : 3;
      for (int n = rng() % 4; n > 0; --n) {
        core::Job job = SimpleJob(ids[rng() % ids.size()], "q",
                                  absl::StrCat("write ", write, " change ", version++));
        model[{t.partition, job.id}] = job;
        t.put_jobs.push_back(std::move(job));
      }
      // Deletes come after the transition's puts (core/store.h).
      for (int n = rng() % 3; n > 0; --n) {
        const std::string& id = ids[rng() % ids.size()];
        model.erase({t.partition, id});
        t.delete_jobs.push_back(id);
      }
    }
    ASSERT_THAT(this->Write(transitions), IsOk());
  }
  this->Reopen();

  for (uint32_t partition : {0u, 3u}) {
    std::vector<core::Job> expected;
    for (const auto& [key, job] : model)
      if (key.first == partition) expected.push_back(job);
    EXPECT_EQ(this->Recover(partition).jobs, expected) << "partition " << partition;
  }
}

TYPED_TEST(StoreConformanceTest, RecordsSurviveReopen) {
  core::Transition t;
  t.put_jobs = {FullJob("x"), SimpleJob("y")};
  t.put_dedup = {Dedup("q", "k", "x")};
  t.put_policies = {{"q", FullPolicy()}};
  ASSERT_THAT(this->Write(t), IsOk());
  core::Transition del;
  del.delete_jobs = {"y"};
  ASSERT_THAT(this->Write(del), IsOk());

  this->Reopen();
  RecordingVisitor r = this->Recover();
  EXPECT_THAT(r.jobs, ElementsAre(FullJob("x")));
  EXPECT_THAT(r.dedup, ElementsAre(Dedup("q", "k", "x")));
  EXPECT_THAT(r.policies, ElementsAre(Pair("q", FullPolicy())));

  // And the reopened store takes writes.
  core::Transition more;
  more.put_jobs = {SimpleJob("z")};
  ASSERT_THAT(this->Write(more), IsOk());
  EXPECT_EQ(this->Recover().jobs.size(), 2u);
}

TYPED_TEST(StoreConformanceTest, RecoverCanRunTwice) {
  core::Transition t;
  t.put_jobs = {SimpleJob("a")};
  ASSERT_THAT(this->Write(t), IsOk());
  EXPECT_THAT(this->Recover().events, ElementsAre("job:a"));
  EXPECT_THAT(this->Recover().events, ElementsAre("job:a"));
}

// A NUL in a dedup queue cannot be keyed unambiguously; the whole Write is refused.
TYPED_TEST(StoreConformanceTest, NulInDedupQueueIsRefusedAndNothingApplied) {
  core::Transition good;
  good.put_jobs = {SimpleJob("a")};
  core::Transition bad_put;
  bad_put.put_dedup = {Dedup(std::string("q\0r", 3), "k", "a")};
  EXPECT_THAT(this->Write({good, bad_put}), StatusIs(absl::StatusCode::kInvalidArgument));

  core::Transition bad_delete;
  bad_delete.delete_dedup = {{std::string("q\0r", 3), "k"}};
  EXPECT_THAT(this->Write({good, bad_delete}), StatusIs(absl::StatusCode::kInvalidArgument));

  EXPECT_THAT(this->Recover().events, IsEmpty());
}

}  // namespace
}  // namespace jobbroker::storage
