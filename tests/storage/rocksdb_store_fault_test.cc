// RocksDbStore on a disk that fills up or breaks, then heals (FaultyFileSystem): writes fail with
// the code the broker maps to its refusals, reads keep working, Resume() brings writes back, and
// nothing written before the failure is lost, also across a close and reopen.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/rocksdb_store.h"
#include "tests/storage/faulty_file_system.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::storage {

using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Code = absl::StatusCode;
using Fault = FaultyFileSystem::Fault;

core::Transition Put(const std::string& id) {
  core::Transition t;
  t.put_jobs = {SimpleJob(id)};
  return t;
}

absl::Status WriteOne(RocksDbStore& store, const std::string& id) {
  core::Transition t = Put(id);
  return store.Write({&t, 1});
}

std::vector<std::string> StoredIds(RocksDbStore& store) {
  RecordingVisitor r;
  absl::Status s = store.Recover(0, r);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<std::string> ids;
  for (const core::Job& j : r.jobs) ids.push_back(j.id);
  return ids;
}

class RocksDbStoreFaultTest : public ::testing::TestWithParam<Fault> {
 protected:
  void SetUp() override {
    RocksDbStoreOptions opts;
    opts.env = faulty_.env.get();
    auto opened = RocksDbStore::Open(path_, opts);
    ASSERT_TRUE(opened.ok()) << opened.status();
    store_ = *std::move(opened);
  }

  Code Expected() const {
    return GetParam() == Fault::kNoSpace ? Code::kResourceExhausted : Code::kUnavailable;
  }

  ScopedTempDir tmp_;
  const std::string path_ = tmp_.Sub("db");
  FaultyEnv faulty_;
  std::unique_ptr<RocksDbStore> store_;
};

TEST_P(RocksDbStoreFaultTest, WritesFailWhileTheDiskFailsAndResumeAfterItHeals) {
  ASSERT_TRUE(WriteOne(*store_, "a-before").ok());
  ASSERT_TRUE(WriteOne(*store_, "b-before").ok());

  faulty_.fs->SetFault(GetParam());
  absl::Status failed = WriteOne(*store_, "c-failed");
  EXPECT_THAT(failed, StatusIs(Expected())) << failed;
  EXPECT_GT(faulty_.fs->injected(), 0) << "the failure must come from the injected fault";
  // RocksDB keeps refusing (its background error) even for a write the disk could take.
  EXPECT_THAT(WriteOne(*store_, "d-refused"), StatusIs(Expected()));
  // Reads keep working and see everything acknowledged before.
  EXPECT_THAT(StoredIds(*store_), ElementsAre("a-before", "b-before"));
  // A resume while the disk still fails fails the same way, and changes nothing.
  EXPECT_THAT(store_->Resume(), StatusIs(Expected()));
  EXPECT_THAT(WriteOne(*store_, "e-refused"), StatusIs(Expected()));
  EXPECT_THAT(StoredIds(*store_), ElementsAre("a-before", "b-before"));

  faulty_.fs->SetFault(Fault::kNone);
  absl::Status resumed = store_->Resume();
  ASSERT_TRUE(resumed.ok()) << resumed;
  ASSERT_TRUE(WriteOne(*store_, "f-after").ok());
  // The failed append never reached the file, so none of the refused writes is there.
  EXPECT_THAT(StoredIds(*store_), ElementsAre("a-before", "b-before", "f-after"));

  // And all of it is durable: a fresh open on the plain local filesystem reads it back.
  store_.reset();
  auto reopened = RocksDbStore::Open(path_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_THAT(StoredIds(**reopened), ElementsAre("a-before", "b-before", "f-after"));
  ASSERT_TRUE(WriteOne(**reopened, "g-later").ok());
}

TEST_P(RocksDbStoreFaultTest, FailsAgainAfterAResumeAndResumesAgain) {
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(WriteOne(*store_, absl::StrCat("ok-", round)).ok()) << round;
    faulty_.fs->SetFault(GetParam());
    EXPECT_THAT(WriteOne(*store_, absl::StrCat("lost-", round)), StatusIs(Expected())) << round;
    faulty_.fs->SetFault(Fault::kNone);
    absl::Status resumed = store_->Resume();
    ASSERT_TRUE(resumed.ok()) << round << ": " << resumed;
  }
  EXPECT_THAT(StoredIds(*store_), ElementsAre("ok-0", "ok-1", "ok-2"));
}

INSTANTIATE_TEST_SUITE_P(Faults, RocksDbStoreFaultTest,
                         ::testing::Values(Fault::kNoSpace, Fault::kIoError),
                         [](const ::testing::TestParamInfo<Fault>& info) {
                           return info.param == Fault::kNoSpace ? "NoSpace" : "IoError";
                         });

TEST(RocksDbStoreFaultMessageTest, NoSpaceSaysTheDiskIsFull) {
  ScopedTempDir tmp;
  FaultyEnv faulty;
  RocksDbStoreOptions opts;
  opts.env = faulty.env.get();
  auto store = RocksDbStore::Open(tmp.Sub("db"), opts);
  ASSERT_TRUE(store.ok()) << store.status();
  faulty.fs->SetFault(Fault::kNoSpace);
  absl::Status s = WriteOne(**store, "j");
  EXPECT_THAT(s, StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(s.message(), HasSubstr("write to "));
  EXPECT_THAT(s.message(), HasSubstr("No space"));
}

TEST(RocksDbStoreFaultMessageTest, ResumeWithoutAFailureIsOkAndWritesWork) {
  ScopedTempDir tmp;
  auto store = RocksDbStore::Open(tmp.Sub("db"));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Resume().ok());
  ASSERT_TRUE(WriteOne(**store, "j").ok());
  EXPECT_THAT(StoredIds(**store), ElementsAre("j"));
}

}  // namespace
}  // namespace jobbroker::storage
