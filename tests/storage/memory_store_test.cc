// MemoryStore's inspection, and the fault injection tests/testing/faulty_store.h puts in front of
// it; MemoryStore's Store behaviour is covered by store_conformance_test.cc.

#include "storage/memory_store.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::storage {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;

namespace {

core::Transition PutJob(const std::string& id) {
  core::Transition t;
  t.put_jobs = {SimpleJob(id)};
  return t;
}

absl::Status WriteOne(core::Store& store, const core::Transition& t) {
  return store.Write({&t, 1});
}

using FaultyStore = ::jobbroker::testing::FaultyStore;

TEST(FaultyStoreTest, FailWritesAfterLetsNWritesThroughThenFailsAndAppliesNothing) {
  FaultyStore store;
  store.FailWritesAfter(2);
  EXPECT_THAT(WriteOne(store, PutJob("a")), IsOk());
  EXPECT_THAT(store.Write({}), IsOk());  // an empty write counts too

  absl::Status failed = WriteOne(store, PutJob("b"));
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(failed.message(), "injected write failure");
  EXPECT_THAT(WriteOne(store, PutJob("c")), StatusIs(absl::StatusCode::kUnavailable));

  EXPECT_EQ(store.job_count(), 1u);
  EXPECT_TRUE(store.FindJob("a").has_value());
  EXPECT_FALSE(store.FindJob("b").has_value());
  EXPECT_EQ(store.successful_writes(), 2);
}

TEST(FaultyStoreTest, FailWritesAfterZeroFailsTheNextWriteAndNegativeHeals) {
  FaultyStore store;
  store.FailWritesAfter(0);
  EXPECT_THAT(WriteOne(store, PutJob("a")), StatusIs(absl::StatusCode::kUnavailable));
  store.FailWritesAfter(-1);
  EXPECT_THAT(WriteOne(store, PutJob("a")), IsOk());
  EXPECT_EQ(store.job_count(), 1u);
}

TEST(FaultyStoreTest, FailedMultiTransitionWriteAppliesNoneOfIt) {
  FaultyStore store;
  ASSERT_THAT(WriteOne(store, PutJob("keep")), IsOk());
  store.FailWritesAfter(0);
  core::Transition del;
  del.delete_jobs = {"keep"};
  core::Transition put = PutJob("new");
  put.put_dedup = {Dedup("q", "k", "new")};
  put.put_policies = {{"q", core::PolicyOverride{}}};
  EXPECT_THAT(store.Write({del, put}), StatusIs(absl::StatusCode::kUnavailable));

  EXPECT_EQ(store.FindJob("keep"), SimpleJob("keep"));
  EXPECT_EQ(store.job_count(), 1u);
  EXPECT_EQ(store.dedup_count(), 0u);
  EXPECT_EQ(store.policy_count(), 0u);
}

TEST(FaultyStoreTest, ResumeIsCountedAndFailsWhileAWriteWould) {
  FaultyStore store;
  store.FailWritesAfter(0, absl::ResourceExhaustedError("disk full"));
  EXPECT_THAT(store.Resume(), StatusIs(absl::StatusCode::kResourceExhausted));
  store.FailWritesAfter(-1);
  EXPECT_THAT(store.Resume(), IsOk());
  EXPECT_EQ(store.resume_calls(), 2);
}

// The store is the state that survives a "restart": a second reader sees what the first wrote.
TEST(MemoryStoreTest, ContentsOutliveTheirReaders) {
  MemoryStore store;
  ASSERT_THAT(WriteOne(store, PutJob("a")), IsOk());
  {
    RecordingVisitor first;
    ASSERT_THAT(store.Recover(0, first), IsOk());
    EXPECT_EQ(first.jobs.size(), 1u);
  }
  RecordingVisitor second;
  ASSERT_THAT(store.Recover(0, second), IsOk());
  ASSERT_EQ(second.jobs.size(), 1u);
  EXPECT_EQ(second.jobs[0], SimpleJob("a"));
}

}  // namespace
}  // namespace jobbroker::storage
