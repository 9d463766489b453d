// The read fence (core::ReadFence): a read the server answers shows no change that a crash of
// the process or a failover can take back. Reads show memory at once; the fence holds the answer
// until what they could see is in the store, and refuses it when the change was taken back.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "core/broker.h"
#include "core/commit_pipeline.h"
#include "core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/gate_store.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {
namespace {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::FaultyStore;
using ::jobbroker::testing::GateStore;
using ::jobbroker::testing::StatusIs;
using ::testing::HasSubstr;

// What a fence's Await answered, and whether it has yet.
struct FenceOutcome {
  absl::Notification passed;
  absl::Status status;
  void Await(const ReadFence& fence) {
    fence.Await([this](absl::Status s) {
      status = std::move(s);
      passed.Notify();
    });
  }
};

class ReadFenceTest : public ::testing::Test {
 protected:
  // A broker on `store` whose writes go through the background pipeline, as in the server;
  // `pipeline` shared when given.
  std::unique_ptr<BlockingBroker> Open(Store& store, CommitPipeline* pipeline = nullptr) {
    BrokerOptions o;
    o.commit_mode = CommitPipeline::Mode::kBackground;
    o.pipeline = pipeline;
    auto opened = BlockingBroker::Open(store, clock_, o);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? *std::move(opened) : nullptr;
  }

  // Enqueues a job of "q" and leases it.
  static LeasedJob EnqueueAndLease(BlockingBroker& broker) {
    EXPECT_TRUE(broker.Enqueue({.queue = "q", .payload = "p"}).ok());
    auto leased = broker.Lease(LeaseSpec{"q", "w", 1, absl::ZeroDuration()});
    EXPECT_TRUE(leased.ok() && leased->size() == 1u);
    return leased.ok() && !leased->empty() ? (*leased)[0] : LeasedJob{};
  }

  FakeClock clock_{absl::FromUnixSeconds(1'800'000'000)};
};

TEST_F(ReadFenceTest, AReadIsAnsweredOnlyOnceTheChangeItShowsIsInTheStore) {
  GateStore store;
  auto broker = Open(store);
  ASSERT_NE(broker, nullptr);
  const LeasedJob leased = EnqueueAndLease(*broker);

  store.SetOpen(false);
  const int entered = store.entered();
  absl::Notification acked;
  broker->broker().Ack(AckSpec{leased.job_id, leased.lease_id, "done"}, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    acked.Notify();
  });
  store.AwaitEntered(entered + 1);  // the writer holds the ack's write

  ReadFence fence;
  absl::StatusOr<Job> job = broker->broker().GetJob(leased.job_id, &fence);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kCompleted) << "memory holds the ack already";
  FenceOutcome outcome;
  outcome.Await(fence);
  EXPECT_FALSE(outcome.passed.HasBeenNotified()) << "the ack is not in the store yet";
  EXPECT_FALSE(acked.HasBeenNotified());

  store.SetOpen(true);
  outcome.passed.WaitForNotification();
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  acked.WaitForNotification();
  broker->Shutdown();
  ASSERT_TRUE(broker->Flush().ok());
}

TEST_F(ReadFenceTest, ListJobsAndGetQueueWaitAsGetJobDoes) {
  GateStore store;
  auto broker = Open(store);
  ASSERT_NE(broker, nullptr);
  ASSERT_TRUE(broker->Enqueue({.queue = "q", .payload = "first"}).ok());

  store.SetOpen(false);
  const int entered = store.entered();
  absl::Notification enqueued;
  broker->broker().EnqueueBatch({EnqueueSpec{.queue = "q", .payload = "second"}},
                                [&](absl::StatusOr<std::vector<EnqueueResult>> r) {
                                  EXPECT_TRUE(r.ok()) << r.status();
                                  enqueued.Notify();
                                });
  store.AwaitEntered(entered + 1);

  ReadFence list_fence, queue_fence;
  auto page = broker->broker().ListJobs(ListJobsSpec{.queue = "q"}, &list_fence);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs.size(), 2u);
  auto info = broker->broker().GetQueue("q", &queue_fence);
  ASSERT_TRUE(info.ok()) << info.status();
  FenceOutcome listed, queued;
  listed.Await(list_fence);
  queued.Await(queue_fence);
  EXPECT_FALSE(listed.passed.HasBeenNotified());
  EXPECT_FALSE(queued.passed.HasBeenNotified());

  store.SetOpen(true);
  listed.passed.WaitForNotification();
  queued.passed.WaitForNotification();
  EXPECT_TRUE(listed.status.ok()) << listed.status;
  EXPECT_TRUE(queued.status.ok()) << queued.status;
  enqueued.WaitForNotification();
  broker->Shutdown();
  ASSERT_TRUE(broker->Flush().ok());
}

TEST_F(ReadFenceTest, AReadWithNothingPendingIsAnsweredAtOnceOnTheCallersThread) {
  GateStore store;
  auto broker = Open(store);
  ASSERT_NE(broker, nullptr);
  const LeasedJob leased = EnqueueAndLease(*broker);
  ASSERT_TRUE(broker->Ack(AckSpec{leased.job_id, leased.lease_id, ""}).ok());

  store.SetOpen(false);  // a write now would hold the answer: none is pending
  ReadFence fence;
  ASSERT_TRUE(broker->broker().GetJob(leased.job_id, &fence).ok());
  FenceOutcome outcome;
  outcome.Await(fence);
  EXPECT_TRUE(outcome.passed.HasBeenNotified());
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;

  ReadFence unused;  // an empty id never reaches memory: nothing to wait for
  EXPECT_THAT(broker->broker().GetJob("", &unused), StatusIs(absl::StatusCode::kInvalidArgument));
  FenceOutcome none;
  none.Await(unused);
  EXPECT_TRUE(none.passed.HasBeenNotified());
  store.SetOpen(true);
  broker->Shutdown();
  ASSERT_TRUE(broker->Flush().ok());
}

// Cluster mode: the node stops leading the partition while the ack is being committed (its
// pipeline is halted, core::NotStorageFailure). The new leader may not have the ack, so a read
// that showed it is refused instead of answered.
TEST_F(ReadFenceTest, AReadOfAChangeTakenBackByAHaltIsUnavailable) {
  GateStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  auto broker = Open(store, &pipeline);
  ASSERT_NE(broker, nullptr);
  const LeasedJob leased = EnqueueAndLease(*broker);

  store.SetOpen(false);
  const int entered = store.entered();
  absl::Notification acked;
  absl::Status ack_status;
  broker->broker().Ack(AckSpec{leased.job_id, leased.lease_id, "done"}, [&](absl::Status s) {
    ack_status = std::move(s);
    acked.Notify();
  });
  store.AwaitEntered(entered + 1);
  ReadFence fence;
  ASSERT_EQ(broker->broker().GetJob(leased.job_id, &fence)->state, JobState::kCompleted);
  FenceOutcome outcome;
  outcome.Await(fence);

  pipeline.Halt(NotStorageFailure(absl::UnavailableError("partition 0 is led by node-b now")));
  outcome.passed.WaitForNotification();
  EXPECT_THAT(outcome.status, StatusIs(absl::StatusCode::kUnavailable,
                                       HasSubstr("the read saw a change that was not committed")));
  EXPECT_THAT(outcome.status.message(), HasSubstr("partition 0 is led by node-b now"));
  acked.WaitForNotification();
  EXPECT_FALSE(ack_status.ok()) << "the ack was not answered OK either";

  store.SetOpen(true);
  broker->Shutdown();
  broker->Flush().IgnoreError();
}

// Leading again, the broker rebuilds its memory from the store. What the halt dropped is no
// longer in memory, so its reads are answered again, at once, without a new write to wait for.
TEST_F(ReadFenceTest, AfterARebuildReadsAreAnsweredAgain) {
  GateStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  auto broker = Open(store, &pipeline);
  ASSERT_NE(broker, nullptr);
  ASSERT_TRUE(broker->Enqueue({.queue = "q", .payload = "stored"}).ok());

  store.SetOpen(false);
  const int entered = store.entered();
  absl::Notification enqueued;
  broker->broker().EnqueueBatch(
      {EnqueueSpec{.queue = "q", .payload = "dropped"}},
      [&](absl::StatusOr<std::vector<EnqueueResult>>) { enqueued.Notify(); });
  store.AwaitEntered(entered + 1);
  pipeline.Halt(NotStorageFailure(absl::UnavailableError("partition 0 is led by node-b now")));
  enqueued.WaitForNotification();
  store.SetOpen(true);

  ASSERT_TRUE(broker->broker().ResumeWrites().ok());
  ReadFence fence;
  ASSERT_TRUE(broker->broker().GetQueue("q", &fence).ok());
  FenceOutcome outcome;
  outcome.Await(fence);
  outcome.passed.WaitForNotification();
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  broker->Shutdown();
  broker->Flush().IgnoreError();
}

// A single node whose disk fails keeps answering reads (docs/durability.md): the fence of a read
// that saw the failed write passes.
TEST_F(ReadFenceTest, AStoreFailureDoesNotFailAReadThatWaited) {
  FaultyStore store;
  auto broker = Open(store);
  ASSERT_NE(broker, nullptr);
  const LeasedJob leased = EnqueueAndLease(*broker);

  store.FailWritesAfter(0, absl::ResourceExhaustedError("injected: no space left on device"));
  EXPECT_FALSE(broker->Ack(AckSpec{leased.job_id, leased.lease_id, "done"}).ok());
  ReadFence fence;
  ASSERT_TRUE(broker->broker().GetJob(leased.job_id, &fence).ok());
  FenceOutcome outcome;
  outcome.Await(fence);
  outcome.passed.WaitForNotification();
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  broker->Shutdown();
  broker->Flush().IgnoreError();
}

}  // namespace
}  // namespace jobbroker::core
