// Work streams in core: push on arrival, max_in_flight, turns across streams and long polls,
// lost leases, flow control, cancellation notices.
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/recording_sink.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::RecordingSink;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

class BrokerStreamTest : public BrokerFixture {
 protected:
  uint64_t Subscribe(const std::shared_ptr<RecordingSink>& sink, std::vector<std::string> queues,
                     int max_in_flight, absl::Duration lease = absl::ZeroDuration(),
                     const std::string& worker = "streamer") {
    auto id =
        broker_->Subscribe(SubscribeSpec{std::move(queues), worker, max_in_flight, lease}, sink);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }

  void Ack(const LeasedJob& j) {
    ASSERT_TRUE(broker_->Ack(AckSpec{j.job_id, j.lease_id, ""}).ok());
  }
};

TEST_F(BrokerStreamTest, AJobIsPushedTheMomentItIsEnqueued) {
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"emails"}, 4);
  EXPECT_THAT(sink->jobs(), IsEmpty());
  std::string id = Enqueue("emails", "hi");
  ASSERT_EQ(sink->jobs().size(), 1u);
  LeasedJob j = sink->jobs()[0];
  EXPECT_EQ(j.job_id, id);
  EXPECT_EQ(j.payload, "hi");
  EXPECT_EQ(j.attempt, 1);
  EXPECT_EQ(Get(id).state, JobState::kActive);
  EXPECT_EQ(Get(id).worker_id, "streamer");
}

TEST_F(BrokerStreamTest, JobsWaitingAtSubscribeArePushedAtOnce) {
  std::string a = Enqueue("q", "a");
  std::string b = Enqueue("q", "b", /*priority=*/9);
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"q"}, 10);
  EXPECT_THAT(sink->job_ids(), ElementsAre(b, a));
}

TEST_F(BrokerStreamTest, NeverMoreThanMaxInFlightUnended) {
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"q"}, 2);
  for (int i = 0; i < 5; ++i) Enqueue("q");
  ASSERT_EQ(sink->jobs().size(), 2u);
  Ack(sink->jobs()[0]);
  ASSERT_EQ(sink->jobs().size(), 3u) << "an ack frees a slot and the next job is pushed";
  ASSERT_TRUE(Fail(sink->jobs()[1], "x").ok());
  ASSERT_EQ(sink->jobs().size(), 4u) << "a fail frees a slot too";
  ASSERT_TRUE(broker_->Release(ReleaseSpec{sink->jobs()[2].job_id, sink->jobs()[2].lease_id}).ok());
  EXPECT_EQ(sink->jobs().size(), 5u) << "and a release";
}

TEST_F(BrokerStreamTest, JobsAreSpreadAcrossStreams) {
  auto a = std::make_shared<RecordingSink>();
  auto b = std::make_shared<RecordingSink>();
  auto c = std::make_shared<RecordingSink>();
  Subscribe(a, {"q"}, 10, {}, "a");
  Subscribe(b, {"q"}, 10, {}, "b");
  Subscribe(c, {"q"}, 10, {}, "c");
  for (int i = 0; i < 9; ++i) Enqueue("q");
  EXPECT_EQ(a->jobs().size(), 3u);
  EXPECT_EQ(b->jobs().size(), 3u);
  EXPECT_EQ(c->jobs().size(), 3u);
}

TEST_F(BrokerStreamTest, StreamsAndLongPollsTakeTurns) {
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"q"}, 10);
  std::optional<absl::StatusOr<std::vector<LeasedJob>>> polled;
  broker_->Lease(LeaseSpec{"q", "poller", 1, {}}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { polled = r; });
  std::string first = Enqueue("q");
  std::string second = Enqueue("q");
  EXPECT_THAT(sink->job_ids(), ElementsAre(first));
  ASSERT_TRUE(polled.has_value() && polled->ok());
  EXPECT_EQ((*polled)->at(0).job_id, second);
}

TEST_F(BrokerStreamTest, MaxConcurrencyHoldsAcrossStreamsAndUnaryLeases) {
  PolicyOverride p;
  p.max_concurrency = 2;
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", p).ok());
  for (int i = 0; i < 5; ++i) Enqueue("q");
  LeasedJob unary = LeaseOne("q");
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"q"}, 5);
  EXPECT_EQ(sink->jobs().size(), 1u);
  EXPECT_EQ(Leasable("q"), 0u);
  Ack(unary);
  EXPECT_EQ(sink->jobs().size(), 2u) << "the slot the unary worker freed goes to the stream";
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kActive], 2);
}

TEST_F(BrokerStreamTest, AnExpiredLeaseIsReportedLostAndItsSlotReused) {
  uniform_ = 0;  // retry at once
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"q"}, 1, absl::Seconds(5));
  std::string a = Enqueue("q", "a");
  std::string b = Enqueue("q", "b");
  ASSERT_THAT(sink->job_ids(), ElementsAre(a));
  clock_.Advance(absl::Seconds(5));
  broker_->Tick();
  EXPECT_THAT(sink->lost(), ElementsAre(a));
  // The freed slot takes the next job in line: `a` (retried at once, and older) before `b`.
  ASSERT_EQ(sink->jobs().size(), 2u);
  EXPECT_EQ(sink->jobs()[1].job_id, a);
  EXPECT_EQ(sink->jobs()[1].attempt, 2);
}

TEST_F(BrokerStreamTest, FlowZeroDrainsAndFlowUpResumes) {
  auto sink = std::make_shared<RecordingSink>();
  uint64_t id = Subscribe(sink, {"q"}, 2);
  ASSERT_TRUE(broker_->SetFlow(id, 0).ok());
  Enqueue("q");
  EXPECT_THAT(sink->jobs(), IsEmpty());
  EXPECT_EQ(broker_->GetQueue("q")->waiting_leases, 0);
  ASSERT_TRUE(broker_->SetFlow(id, 1).ok());
  EXPECT_EQ(sink->jobs().size(), 1u);
  EXPECT_THAT(broker_->SetFlow(id + 100, 1), StatusIs(Code::kNotFound));
  EXPECT_THAT(broker_->SetFlow(id, -1), StatusIs(Code::kInvalidArgument));
}

TEST_F(BrokerStreamTest, AnEndedStreamGetsNothingAndItsLeasesRunOut) {
  uniform_ = 0;
  auto gone = std::make_shared<RecordingSink>();
  uint64_t id = Subscribe(gone, {"q"}, 1, absl::Seconds(5), "gone");
  std::string a = Enqueue("q");
  broker_->Unsubscribe(id);
  Enqueue("q");
  EXPECT_EQ(gone->jobs().size(), 1u);
  EXPECT_EQ(Get(a).state, JobState::kActive) << "a broken stream does not end its leases";

  auto next = std::make_shared<RecordingSink>();
  Subscribe(next, {"q"}, 5, absl::Minutes(5), "next");
  clock_.Advance(absl::Seconds(5));
  broker_->Tick();
  EXPECT_THAT(gone->lost(), IsEmpty()) << "nothing is sent to an ended stream";
  std::vector<LeasedJob> got = next->jobs();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].job_id, a);
  EXPECT_EQ(got[1].attempt, 2);
}

TEST_F(BrokerStreamTest, OneStreamServesSeveralQueues) {
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"a", "b"}, 10);
  std::string in_a = Enqueue("a");
  std::string in_b = Enqueue("b");
  EXPECT_THAT(sink->job_ids(), ElementsAre(in_a, in_b));
}

TEST_F(BrokerStreamTest, CancellingAHeldJobIsPushedToItsStream) {
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"q"}, 1);
  std::string id = Enqueue("q");
  ASSERT_TRUE(broker_->CancelJob(id).ok());
  EXPECT_THAT(sink->cancelled(), ElementsAre(id));
}

TEST_F(BrokerStreamTest, ShutdownEndsStreams) {
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {"q"}, 1);
  broker_->Shutdown();
  ASSERT_TRUE(sink->ended().has_value());
  EXPECT_THAT(*sink->ended(), StatusIs(Code::kUnavailable));
}

TEST_F(BrokerStreamTest, BadSubscribeNamesTheField) {
  auto sink = std::make_shared<RecordingSink>();
  auto none = broker_->Subscribe(SubscribeSpec{{}, "w", 1, {}}, sink);
  EXPECT_THAT(none, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(none.status().message(), HasSubstr("queues"));
  auto bad = broker_->Subscribe(SubscribeSpec{{"ok", "no spaces"}, "w", 1, {}}, sink);
  EXPECT_THAT(bad.status().message(), HasSubstr("queues[1]"));
  auto twice = broker_->Subscribe(SubscribeSpec{{"a", "a"}, "w", 1, {}}, sink);
  EXPECT_THAT(twice.status().message(), HasSubstr("repeats"));
  auto worker = broker_->Subscribe(SubscribeSpec{{"a"}, "", 1, {}}, sink);
  EXPECT_THAT(worker.status().message(), HasSubstr("worker_id"));
  auto flight = broker_->Subscribe(SubscribeSpec{{"a"}, "w", 5000, {}}, sink);
  EXPECT_THAT(flight.status().message(), HasSubstr("max_in_flight"));
  EXPECT_TRUE(broker_->ListQueues().empty()) << "a refused subscribe creates no queue";
}

// Writes go through at once; fsyncs (Sync) wait while held. A synced Write is counted, so a test
// can tell it was not split into a write and an fsync.
class SyncGateStore final : public Store {
 public:
  absl::Status Write(absl::Span<const Transition> t) override {
    absl::MutexLock lock(&mu_);
    ++synced_writes_;
    return inner_.Write(t);
  }
  absl::Status WriteUnsynced(absl::Span<const Transition> t) override { return inner_.Write(t); }
  absl::Status Sync() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* held) { return !*held; }, &held_));
    return absl::OkStatus();
  }
  absl::StatusOr<Job> ReadJob(uint32_t partition, const std::string& id) override {
    return inner_.ReadJob(partition, id);
  }
  absl::Status Recover(uint32_t partition, RecoveryVisitor& v) override {
    return inner_.Recover(partition, v);
  }
  absl::Status Resume() override { return inner_.Resume(); }

  void HoldSyncs(bool held) {
    absl::MutexLock lock(&mu_);
    held_ = held;
  }
  int synced_writes() {
    absl::MutexLock lock(&mu_);
    return synced_writes_;
  }

 private:
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  int synced_writes_ ABSL_GUARDED_BY(mu_) = 0;
  storage::MemoryStore inner_;
};

// Tells when the first job arrives.
class FirstPushSink : public StreamSink {
 public:
  void PushJob(LeasedJob job) override {
    if (!pushed.HasBeenNotified()) {
      payload = job.payload;
      pushed.Notify();
    }
  }
  void LeaseLost(std::string, core::AttemptOutcome) override {}
  void CancelRequested(std::string) override {}
  void End(absl::Status) override {}
  absl::Notification pushed;
  std::string payload;  // written before `pushed` is notified
};

TEST(BrokerEarlyPushTest, AStreamGetsItsJobOnceInTheLogWhileTheEnqueueWaitsForTheFsync) {
  SyncGateStore store;
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  BrokerOptions o;
  o.commit_mode = CommitPipeline::Mode::kBackground;
  auto opened = BlockingBroker::Open(store, clock, o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockingBroker& broker = **opened;
  auto sink = std::make_shared<FirstPushSink>();
  ASSERT_TRUE(broker.Subscribe(SubscribeSpec{{"q"}, "w", 1, absl::ZeroDuration()}, sink).ok());
  const int synced_before = store.synced_writes();

  store.HoldSyncs(true);
  absl::Notification answered;
  broker.EnqueueBatch({EnqueueSpec{.queue = "q", .payload = "p"}},
                      [&answered](absl::StatusOr<std::vector<EnqueueResult>> r) {
                        EXPECT_TRUE(r.ok()) << r.status();
                        answered.Notify();
                      });
  ASSERT_TRUE(sink->pushed.WaitForNotificationWithTimeout(absl::Seconds(60)))
      << "the job waits for the fsync too";
  EXPECT_EQ(sink->payload, "p");
  // The producer's answer still waits for the fsync: the job is not acknowledged yet.
  EXPECT_FALSE(answered.HasBeenNotified());
  EXPECT_EQ(store.synced_writes(), synced_before) << "written unsynced, then fsynced";
  store.HoldSyncs(false);
  answered.WaitForNotification();
  broker.Shutdown();
  ASSERT_TRUE(broker.Flush().ok());
}

}  // namespace
}  // namespace jobbroker::core
