// The read fence (core::ReadFence): a read the server answers shows no change that a crash of
// the process or a failover can take back. Reads show memory at once; the fence holds the answer
// until what they could see is in the store, and refuses it when the change was taken back.
#include <memory>
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

// A cluster partition's halt: this node no longer leads it.
absl::Status LeaderMoved() {
  return NotStorageFailure(absl::UnavailableError("partition 0 is led by node-b now"));
}

class ReadFenceTest : public ::testing::Test {
 protected:
  ~ReadFenceTest() override {
    gate_.SetOpen(true);
    if (broker_ == nullptr) return;
    broker_->Shutdown();
    broker_->Flush().IgnoreError();  // some tests leave a failed write behind
  }

  // broker_, on `store` (the gate by default) through the background pipeline, as in the
  // server; on the shared `pipeline` when given, as a test that halts it needs.
  BlockingBroker& Open(Store* store = nullptr, CommitPipeline* pipeline = nullptr) {
    BrokerOptions o;
    o.commit_mode = CommitPipeline::Mode::kBackground;
    o.pipeline = pipeline;
    auto opened = BlockingBroker::Open(store != nullptr ? *store : gate_, clock_, o);
    EXPECT_TRUE(opened.ok()) << opened.status();
    broker_ = *std::move(opened);
    return *broker_;
  }
  BlockingBroker& OpenOnHaltablePipeline() {
    pipeline_.emplace(gate_, CommitPipeline::Mode::kBackground);
    return Open(&gate_, &*pipeline_);
  }

  // Enqueues a job of "q" and leases it.
  LeasedJob EnqueueAndLease() {
    EXPECT_TRUE(broker_->Enqueue({.queue = "q", .payload = "p"}).ok());
    auto leased = broker_->Lease(LeaseSpec{"q", "w", 1, absl::ZeroDuration()});
    EXPECT_TRUE(leased.ok() && leased->size() == 1u);
    return leased.ok() && !leased->empty() ? (*leased)[0] : LeasedJob{};
  }

  // Each closes the gate and starts a change, and returns once the pipeline's writer holds its
  // write: the change is in memory, not in the store. `done` is told when it is answered.
  void HoldAck(const LeasedJob& leased, absl::Notification& done, absl::Status& answer) {
    HoldWriteOf([&] {
      broker_->broker().Ack(AckSpec{leased.job_id, leased.lease_id, "done"}, [&](absl::Status s) {
        answer = std::move(s);
        done.Notify();
      });
    });
  }
  void HoldEnqueue(const std::string& payload, absl::Notification& done) {
    HoldWriteOf([&] {
      broker_->broker().EnqueueBatch(
          {EnqueueSpec{.queue = "q", .payload = payload}},
          [&](absl::StatusOr<std::vector<EnqueueResult>>) { done.Notify(); });
    });
  }
  template <typename Change>
  void HoldWriteOf(Change change) {
    gate_.SetOpen(false);
    const int entered = gate_.entered();
    change();
    gate_.AwaitEntered(entered + 1);
  }

  FakeClock clock_{absl::FromUnixSeconds(1'800'000'000)};
  GateStore gate_;
  std::optional<CommitPipeline> pipeline_;
  std::unique_ptr<BlockingBroker> broker_;
};

TEST_F(ReadFenceTest, AReadIsAnsweredOnlyOnceTheChangeItShowsIsInTheStore) {
  Open();
  const LeasedJob leased = EnqueueAndLease();
  absl::Notification acked;
  absl::Status ack_answer;
  HoldAck(leased, acked, ack_answer);

  ReadFence fence;
  absl::StatusOr<Job> job = broker_->broker().GetJob(leased.job_id, &fence);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kCompleted) << "memory holds the ack already";
  FenceOutcome outcome;
  outcome.Await(fence);
  EXPECT_FALSE(outcome.passed.HasBeenNotified()) << "the ack is not in the store yet";
  EXPECT_FALSE(acked.HasBeenNotified());

  gate_.SetOpen(true);
  outcome.passed.WaitForNotification();
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  acked.WaitForNotification();
  EXPECT_TRUE(ack_answer.ok()) << ack_answer;
}

TEST_F(ReadFenceTest, ListJobsAndGetQueueWaitAsGetJobDoes) {
  Open();
  ASSERT_TRUE(broker_->Enqueue({.queue = "q", .payload = "first"}).ok());
  absl::Notification enqueued;
  HoldEnqueue("second", enqueued);

  ReadFence list_fence, queue_fence;
  auto page = broker_->broker().ListJobs(ListJobsSpec{.queue = "q"}, &list_fence);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs.size(), 2u);
  ASSERT_TRUE(broker_->broker().GetQueue("q", &queue_fence).ok());
  FenceOutcome listed, queued;
  listed.Await(list_fence);
  queued.Await(queue_fence);
  EXPECT_FALSE(listed.passed.HasBeenNotified());
  EXPECT_FALSE(queued.passed.HasBeenNotified());

  gate_.SetOpen(true);
  listed.passed.WaitForNotification();
  queued.passed.WaitForNotification();
  EXPECT_TRUE(listed.status.ok()) << listed.status;
  EXPECT_TRUE(queued.status.ok()) << queued.status;
  enqueued.WaitForNotification();
}

TEST_F(ReadFenceTest, ListQueuesAndTheScheduleReadsWaitAsGetJobDoes) {
  Open();
  Schedule every_minute;
  every_minute.id = "nightly";
  every_minute.every = absl::Minutes(1);
  every_minute.job.queue = "q";
  ASSERT_TRUE(broker_->PutSchedule(every_minute).ok());
  absl::Notification enqueued;
  HoldEnqueue("held", enqueued);

  ReadFence queues_fence, list_fence, get_fence, missing_fence;
  std::vector<QueueInfo> queues = broker_->broker().ListQueues(&queues_fence);
  ASSERT_EQ(queues.size(), 1u);
  EXPECT_EQ(queues[0].counts[JobState::kReady], 1) << "memory holds the enqueue already";
  EXPECT_EQ(broker_->broker().ListSchedules("", &list_fence).size(), 1u);
  ASSERT_TRUE(broker_->broker().GetSchedule("nightly", &get_fence).ok());
  // A NOT_FOUND is fenced too: it could be a delete under way.
  EXPECT_THAT(broker_->broker().GetSchedule("weekly", &missing_fence),
              StatusIs(absl::StatusCode::kNotFound));
  FenceOutcome queues_read, list_read, get_read, missing_read;
  queues_read.Await(queues_fence);
  list_read.Await(list_fence);
  get_read.Await(get_fence);
  missing_read.Await(missing_fence);
  for (FenceOutcome* read : {&queues_read, &list_read, &get_read, &missing_read})
    EXPECT_FALSE(read->passed.HasBeenNotified()) << "the enqueue is not in the store yet";

  gate_.SetOpen(true);
  for (FenceOutcome* read : {&queues_read, &list_read, &get_read, &missing_read}) {
    read->passed.WaitForNotification();
    EXPECT_TRUE(read->status.ok()) << read->status;
  }
  enqueued.WaitForNotification();
}

// A read over several partitions (ListQueues, ListSchedules) hands one fence to each partition's
// broker: it passes once every change any of them showed is stored, and is refused if one of
// those changes is taken back, whatever the others did.
TEST_F(ReadFenceTest, AFenceOverTwoBrokersPassesOnlyOnceBothHave) {
  OpenOnHaltablePipeline();
  GateStore other_gate;
  BrokerOptions o;
  o.commit_mode = CommitPipeline::Mode::kBackground;
  auto other = BlockingBroker::Open(other_gate, clock_, o);
  ASSERT_TRUE(other.ok()) << other.status();
  absl::Notification here_enqueued, there_enqueued;
  HoldEnqueue("here", here_enqueued);
  other_gate.SetOpen(false);
  const int entered = other_gate.entered();
  (*other)->broker().EnqueueBatch(
      {EnqueueSpec{.queue = "elsewhere", .payload = "there"}},
      [&](absl::StatusOr<std::vector<EnqueueResult>>) { there_enqueued.Notify(); });
  other_gate.AwaitEntered(entered + 1);

  ReadFence both;
  EXPECT_EQ(broker_->broker().ListQueues(&both).size(), 1u);
  EXPECT_EQ((*other)->broker().ListQueues(&both).size(), 1u);
  FenceOutcome first;
  first.Await(both);
  gate_.SetOpen(true);
  here_enqueued.WaitForNotification();
  EXPECT_FALSE(first.passed.HasBeenNotified()) << "the other broker's change is still unstored";
  other_gate.SetOpen(true);
  first.passed.WaitForNotification();
  EXPECT_TRUE(first.status.ok()) << first.status;
  there_enqueued.WaitForNotification();

  // Again, and this time the first broker's change is taken back.
  absl::Notification dropped;
  HoldEnqueue("dropped", dropped);
  ReadFence taken_back;
  (*other)->broker().ListQueues(&taken_back);  // nothing pending there now
  broker_->broker().ListQueues(&taken_back);
  FenceOutcome second;
  second.Await(taken_back);
  pipeline_->Halt(LeaderMoved());
  second.passed.WaitForNotification();
  EXPECT_THAT(second.status, StatusIs(absl::StatusCode::kUnavailable,
                                      HasSubstr("the read saw a change that was not committed")));
  dropped.WaitForNotification();
  (*other)->Shutdown();
  (*other)->Flush().IgnoreError();
}

TEST_F(ReadFenceTest, AReadWithNothingPendingIsAnsweredAtOnceOnTheCallersThread) {
  Open();
  const LeasedJob leased = EnqueueAndLease();
  ASSERT_TRUE(broker_->Ack(AckSpec{leased.job_id, leased.lease_id, ""}).ok());

  gate_.SetOpen(false);  // a write now would hold the answer: none is pending
  ReadFence fence;
  ASSERT_TRUE(broker_->broker().GetJob(leased.job_id, &fence).ok());
  FenceOutcome outcome;
  outcome.Await(fence);
  EXPECT_TRUE(outcome.passed.HasBeenNotified());
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;

  ReadFence unused;  // an empty id never reaches memory: nothing to wait for
  EXPECT_THAT(broker_->broker().GetJob("", &unused), StatusIs(absl::StatusCode::kInvalidArgument));
  FenceOutcome none;
  none.Await(unused);
  EXPECT_TRUE(none.passed.HasBeenNotified());
}

// Cluster mode: the node stops leading the partition while the ack is being committed (its
// pipeline is halted, core::NotStorageFailure). The new leader may not have the ack, so a read
// that showed it is refused instead of answered.
TEST_F(ReadFenceTest, AReadOfAChangeTakenBackByAHaltIsUnavailable) {
  OpenOnHaltablePipeline();
  const LeasedJob leased = EnqueueAndLease();
  absl::Notification acked;
  absl::Status ack_answer;
  HoldAck(leased, acked, ack_answer);
  ReadFence fence;
  ASSERT_EQ(broker_->broker().GetJob(leased.job_id, &fence)->state, JobState::kCompleted);
  FenceOutcome outcome;
  outcome.Await(fence);

  pipeline_->Halt(LeaderMoved());
  outcome.passed.WaitForNotification();
  EXPECT_THAT(outcome.status, StatusIs(absl::StatusCode::kUnavailable,
                                       HasSubstr("the read saw a change that was not committed")));
  EXPECT_THAT(outcome.status.message(), HasSubstr("partition 0 is led by node-b now"));
  acked.WaitForNotification();
  EXPECT_FALSE(ack_answer.ok()) << "the ack was not answered OK either";
}

// Leading again, the broker rebuilds its memory from the store. What the halt dropped is no
// longer in memory, so its reads are answered again.
TEST_F(ReadFenceTest, AfterARebuildReadsAreAnsweredAgain) {
  OpenOnHaltablePipeline();
  ASSERT_TRUE(broker_->Enqueue({.queue = "q", .payload = "stored"}).ok());
  absl::Notification enqueued;
  HoldEnqueue("dropped", enqueued);
  pipeline_->Halt(LeaderMoved());
  enqueued.WaitForNotification();
  gate_.SetOpen(true);

  ASSERT_TRUE(broker_->broker().ResumeWrites().ok());
  ReadFence fence;
  ASSERT_TRUE(broker_->broker().GetQueue("q", &fence).ok());
  FenceOutcome outcome;
  outcome.Await(fence);
  outcome.passed.WaitForNotification();
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
}

// A single node whose disk fails keeps answering reads (docs/durability.md): the fence of a read
// that saw the failed write passes.
TEST_F(ReadFenceTest, AStoreFailureDoesNotFailAReadThatWaited) {
  FaultyStore store;
  Open(&store);
  const LeasedJob leased = EnqueueAndLease();

  store.FailWritesAfter(0, absl::ResourceExhaustedError("injected: no space left on device"));
  EXPECT_FALSE(broker_->Ack(AckSpec{leased.job_id, leased.lease_id, "done"}).ok());
  ReadFence fence;
  ASSERT_TRUE(broker_->broker().GetJob(leased.job_id, &fence).ok());
  FenceOutcome outcome;
  outcome.Await(fence);
  outcome.passed.WaitForNotification();
  EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  broker_->Shutdown();  // before `store` goes
  broker_->Flush().IgnoreError();
  broker_.reset();
}

}  // namespace
}  // namespace jobbroker::core
