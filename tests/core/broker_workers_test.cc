// Admin.ListWorkers in core: who is connected (streams, waiting Leases) and what each runs, on
// the fake clock.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/recording_sink.h"

namespace jobbroker::core {
namespace {

using ::jobbroker::testing::RecordingSink;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

class BrokerWorkersTest : public BrokerFixture {
 protected:
  uint64_t Subscribe(const std::shared_ptr<RecordingSink>& sink, std::vector<std::string> queues,
                     const std::string& worker, int max_in_flight = 1) {
    auto id = broker_->Subscribe(
        SubscribeSpec{std::move(queues), worker, max_in_flight, absl::ZeroDuration()}, sink);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  std::vector<WorkerInfo> Workers(const std::string& queue = "") {
    return broker_->broker().ListWorkers(queue);
  }
  static std::vector<std::string> Ids(const std::vector<WorkerInfo>& workers) {
    std::vector<std::string> ids;
    for (const WorkerInfo& w : workers) ids.push_back(w.worker_id);
    return ids;
  }
};

TEST_F(BrokerWorkersTest, NoWorkersWhileNobodyIsConnected) {
  Enqueue("emails");
  EXPECT_THAT(Workers(), IsEmpty());
}

TEST_F(BrokerWorkersTest, AStreamIsListedWithItsQueuesSinceItSubscribedAndWhatItRuns) {
  auto sink = std::make_shared<RecordingSink>();
  const absl::Time subscribed = clock_.Now();
  Subscribe(sink, {"emails", "bills"}, "mailer-1", 4);
  clock_.Advance(absl::Seconds(3));
  const std::string id = Enqueue("emails");
  ASSERT_EQ(sink->jobs().size(), 1u);
  std::vector<WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  const WorkerInfo& w = workers[0];
  EXPECT_EQ(w.worker_id, "mailer-1");
  EXPECT_THAT(w.queues, ElementsAre("bills", "emails"));
  EXPECT_EQ(w.streams, 1);
  EXPECT_EQ(w.lease_waits, 0);
  EXPECT_EQ(w.max_in_flight, 4);
  EXPECT_EQ(w.connected_at, subscribed);
  ASSERT_EQ(w.running.size(), 1u);
  EXPECT_EQ(w.running[0].job_id, id);
  EXPECT_EQ(w.running[0].queue, "emails");
  EXPECT_EQ(w.running[0].attempt, 1);
  EXPECT_EQ(w.running[0].started_at, subscribed + absl::Seconds(3));
  EXPECT_EQ(w.running[0].lease_deadline, sink->jobs()[0].lease_deadline);
  EXPECT_EQ(w.running[0].timeout_at, absl::InfiniteFuture());
}

TEST_F(BrokerWorkersTest, TwoStreamsOfOneWorkerAreOneEntryAndAWaitingLeaseCounts) {
  auto a = std::make_shared<RecordingSink>();
  auto b = std::make_shared<RecordingSink>();
  Subscribe(a, {"emails"}, "box", 2);
  Subscribe(b, {"bills"}, "box", 3);
  uint64_t waiter = broker_->broker().Lease(LeaseSpec{"reports", "poller", 1, absl::ZeroDuration()},
                                            absl::Minutes(1), [](auto) {});
  ASSERT_NE(waiter, 0u);
  std::vector<WorkerInfo> workers = Workers();
  EXPECT_THAT(Ids(workers), ElementsAre("box", "poller"));
  EXPECT_EQ(workers[0].streams, 2);
  EXPECT_EQ(workers[0].max_in_flight, 5);
  EXPECT_THAT(workers[0].queues, ElementsAre("bills", "emails"));
  EXPECT_EQ(workers[1].streams, 0);
  EXPECT_EQ(workers[1].lease_waits, 1);
  EXPECT_THAT(workers[1].queues, ElementsAre("reports"));
  broker_->broker().CancelWait(waiter);
}

TEST_F(BrokerWorkersTest, AUnaryLesseeIsListedWithItsJobsThenForFiveMinutesAfterItsLastLease) {
  const std::string id = Enqueue("emails");
  LeaseSpec lease{"emails", "poller", 1, absl::Seconds(30)};
  lease.origin = WorkerOrigin{"ipv4:10.0.0.7:5000", "jobbroker-go/0.4.0", "node-2"};
  const absl::Time leased_at = clock_.Now();
  ASSERT_TRUE(broker_->Lease(lease).ok());
  std::vector<WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id, "poller");
  EXPECT_EQ(workers[0].origin, lease.origin);
  EXPECT_THAT(workers[0].queues, ElementsAre("emails"));
  EXPECT_EQ(workers[0].streams, 0);
  EXPECT_EQ(workers[0].connected_at, absl::InfiniteFuture());
  EXPECT_EQ(workers[0].last_seen, leased_at);
  ASSERT_EQ(workers[0].running.size(), 1u);
  EXPECT_EQ(workers[0].running[0].job_id, id);

  // Its lease runs out: the job is READY again, and the worker is still a recent lessee.
  clock_.Advance(absl::Seconds(31));
  broker_->Tick();
  workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_THAT(workers[0].running, IsEmpty());
  clock_.Advance(RecentWorkers::kListedFor);
  EXPECT_THAT(Workers(), IsEmpty()) << "no lease for over five minutes, nothing held";
}

TEST_F(BrokerWorkersTest, LastSeenIsTheLatestHeartbeatOrAck) {
  Enqueue("emails");
  Enqueue("emails");
  LeasedJob first = LeaseOne("emails", "w");
  LeasedJob second = LeaseOne("emails", "w");
  clock_.Advance(absl::Seconds(10));
  HeartbeatSpec beat;
  beat.job_id = first.job_id;
  beat.lease_id = first.lease_id;
  ASSERT_TRUE(broker_->Heartbeat(beat).ok());
  EXPECT_EQ(Workers()[0].last_seen, clock_.Now());
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(broker_->Ack(AckSpec{second.job_id, second.lease_id, ""}).ok());
  EXPECT_EQ(Workers()[0].last_seen, clock_.Now());
}

TEST_F(BrokerWorkersTest, AStreamShowsWhereItIsConnectedFrom) {
  auto sink = std::make_shared<RecordingSink>();
  SubscribeSpec spec{{"emails"}, "mailer", 1, absl::ZeroDuration()};
  spec.origin = WorkerOrigin{"ipv6:[::1]:40000", "jobbroker-cpp", "local"};
  ASSERT_TRUE(broker_->Subscribe(spec, sink).ok());
  std::vector<WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].origin, spec.origin);
  EXPECT_EQ(workers[0].last_seen, clock_.Now());
}

TEST_F(BrokerWorkersTest, AnUnsubscribedStreamIsNoLongerListed) {
  auto sink = std::make_shared<RecordingSink>();
  const uint64_t stream = Subscribe(sink, {"emails"}, "short-lived");
  ASSERT_EQ(Workers().size(), 1u);
  broker_->Unsubscribe(stream);
  EXPECT_THAT(Workers(), IsEmpty());
}

TEST_F(BrokerWorkersTest, AQueueFilterKeepsTheWorkersThatTouchIt) {
  auto mail = std::make_shared<RecordingSink>();
  auto bill = std::make_shared<RecordingSink>();
  Subscribe(mail, {"emails"}, "mailer");
  Subscribe(bill, {"bills"}, "biller");
  Enqueue("reports");
  LeaseOne("reports", "mailer");
  EXPECT_THAT(Ids(Workers("bills")), ElementsAre("biller"));
  EXPECT_THAT(Ids(Workers("reports")), ElementsAre("mailer")) << "it runs a job of it";
  EXPECT_THAT(Ids(Workers("nothing")), IsEmpty());
  EXPECT_THAT(Ids(Workers()), ElementsAre("biller", "mailer"));
}

TEST_F(BrokerWorkersTest, ARunningJobShowsItsRunTimeLimitAndProgress) {
  EnqueueSpec s;
  s.queue = "renders";
  s.payload = "p";
  s.timeout = absl::Minutes(5);
  auto r = broker_->Enqueue(std::move(s));
  ASSERT_TRUE(r.ok()) << r.status();
  LeasedJob job = LeaseOne("renders", "gpu-1");
  HeartbeatSpec beat;
  beat.job_id = job.job_id;
  beat.lease_id = job.lease_id;
  beat.progress = R"({"percent": 40})";
  ASSERT_TRUE(broker_->Heartbeat(beat).ok());
  std::vector<WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  ASSERT_EQ(workers[0].running.size(), 1u);
  EXPECT_EQ(workers[0].running[0].timeout_at, clock_.Now() + absl::Minutes(5));
  EXPECT_EQ(workers[0].running[0].progress, R"({"percent": 40})");
}

}  // namespace
}  // namespace jobbroker::core
