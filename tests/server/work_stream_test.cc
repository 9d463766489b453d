// The Work stream reactor (server/grpc/work_stream.cc) through a real in-process gRPC channel, on
// a real broker: what a worker on the stream sees.
#include "server/grpc/work_stream.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/in_process_server.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::server {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::HasSubstr;
using Stream = grpc::ClientReaderWriter<v1::WorkRequest, v1::WorkResponse>;

constexpr int kOk = 0;

class WorkStreamTest : public ::testing::Test {
 protected:
  WorkStreamTest() : broker_(server_.NewBrokerStub()), admin_(server_.NewAdminStub()) {
    InProcessServer::SetDeadline(ctx_);
    stream_ = broker_->Work(&ctx_);
  }
  // A test that did not finish its stream leaves it to be cancelled, as a vanished client would.
  ~WorkStreamTest() override { ctx_.TryCancel(); }

  std::string Enqueue(const std::string& queue, const std::string& payload = "p") {
    grpc::ClientContext ctx;
    InProcessServer::SetDeadline(ctx);
    v1::EnqueueRequest req;
    req.set_queue(queue);
    req.set_payload(payload);
    v1::EnqueueResponse resp;
    EXPECT_THAT(broker_->Enqueue(&ctx, req, &resp), IsOk());
    return resp.job_id();
  }

  v1::Job GetJob(const std::string& id) {
    grpc::ClientContext ctx;
    InProcessServer::SetDeadline(ctx);
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    EXPECT_THAT(admin_->GetJob(&ctx, req, &job), IsOk());
    return job;
  }

  v1::QueueInfo GetQueue(const std::string& queue) {
    grpc::ClientContext ctx;
    InProcessServer::SetDeadline(ctx);
    v1::GetQueueRequest req;
    req.set_queue(queue);
    v1::QueueInfo info;
    EXPECT_THAT(admin_->GetQueue(&ctx, req, &info), IsOk());
    return info;
  }

  void Send(uint64_t id, v1::WorkRequest req) {
    req.set_request_id(id);
    ASSERT_TRUE(stream_->Write(req));
  }
  void Subscribe(uint64_t id, const std::string& queue, int max_in_flight) {
    Subscribe(id, std::vector<std::string>{queue}, max_in_flight);
  }
  void Subscribe(uint64_t id, const std::vector<std::string>& queues, int max_in_flight) {
    v1::WorkRequest req;
    for (const std::string& queue : queues) req.mutable_subscribe()->add_queues(queue);
    req.mutable_subscribe()->set_worker_id("w1");
    req.mutable_subscribe()->set_max_in_flight(max_in_flight);
    Send(id, req);
  }
  void Ack(uint64_t id, const v1::LeasedJob& job) {
    v1::WorkRequest req;
    req.mutable_ack()->set_job_id(job.job_id());
    req.mutable_ack()->set_lease_id(job.lease_id());
    Send(id, req);
  }
  void Flow(uint64_t id, int max_in_flight) {
    v1::WorkRequest req;
    req.mutable_flow()->set_max_in_flight(max_in_flight);
    Send(id, req);
  }

  // The next message; blocks until one comes (the context's deadline ends a hang).
  v1::WorkResponse Next() {
    v1::WorkResponse m;
    EXPECT_TRUE(stream_->Read(&m)) << "the stream ended";
    return m;
  }
  v1::WorkResult NextResult() {
    v1::WorkResponse m = Next();
    EXPECT_TRUE(m.has_result()) << m.DebugString();
    return m.result();
  }
  v1::LeasedJob NextJob() {
    v1::WorkResponse m = Next();
    EXPECT_TRUE(m.has_job()) << m.DebugString();
    return m.job();
  }
  // The next message answers request `id` with OK.
  void ExpectOk(uint64_t id) {
    v1::WorkResult r = NextResult();
    EXPECT_EQ(r.request_id(), id);
    EXPECT_EQ(r.code(), kOk) << r.message();
  }

  InProcessServer server_;
  std::unique_ptr<v1::Broker::Stub> broker_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  grpc::ClientContext ctx_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(WorkStreamTest, ASubscribedWorkerIsPushedAJobAsSoonAsOneIsEnqueued) {
  Subscribe(1, "emails", 1);
  ExpectOk(1);
  const std::string id = Enqueue("emails", "hello");
  v1::LeasedJob job = NextJob();
  EXPECT_EQ(job.job_id(), id);
  EXPECT_EQ(job.queue(), "emails");
  EXPECT_EQ(job.payload(), "hello");
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_FALSE(job.lease_id().empty());
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_ACTIVE);
}

TEST_F(WorkStreamTest, JobsWaitingBeforeTheSubscribeArePushedAfterItsAnswer) {
  const std::string id = Enqueue("emails");
  Subscribe(7, "emails", 1);
  ExpectOk(7);
  EXPECT_EQ(NextJob().job_id(), id);
}

TEST_F(WorkStreamTest, AnAckOverTheStreamIsAnsweredAndCompletesTheJob) {
  Subscribe(1, "emails", 1);
  ExpectOk(1);
  const std::string id = Enqueue("emails");
  Ack(2, NextJob());
  ExpectOk(2);
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(WorkStreamTest, AnAckWithAStaleLeaseIsAnsweredFailedPreconditionOnTheStream) {
  Subscribe(1, "emails", 1);
  ExpectOk(1);
  Enqueue("emails");
  v1::LeasedJob job = NextJob();
  job.set_lease_id("not-the-lease");
  Ack(2, job);
  v1::WorkResult r = NextResult();
  EXPECT_EQ(r.request_id(), 2u);
  EXPECT_EQ(r.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_EQ(GetJob(job.job_id()).state(), v1::JOB_STATE_ACTIVE) << "a refused ack changes nothing";
}

TEST_F(WorkStreamTest, NoMoreThanMaxInFlightJobsArePushedUntilOneIsAcked) {
  Subscribe(1, "emails", 2);
  ExpectOk(1);
  for (int i = 0; i < 3; ++i) Enqueue("emails");
  v1::LeasedJob first = NextJob();
  NextJob();
  // The enqueues have returned, so the broker has already handed out what it would.
  v1::QueueInfo info = GetQueue("emails");
  EXPECT_EQ(info.active(), 2);
  EXPECT_EQ(info.counts().at("JOB_STATE_READY"), 1);

  Ack(2, first);
  // The ack's answer and the third job, in either order.
  bool answered = false;
  bool pushed = false;
  for (int i = 0; i < 2; ++i) {
    v1::WorkResponse m = Next();
    if (m.has_result()) {
      EXPECT_EQ(m.result().request_id(), 2u);
      EXPECT_EQ(m.result().code(), kOk);
      answered = true;
    }
    if (m.has_job()) pushed = true;
  }
  EXPECT_TRUE(answered);
  EXPECT_TRUE(pushed);
  EXPECT_EQ(GetQueue("emails").active(), 2);
}

// Under the "partitioned." run (4 partitions) these queues live in several partitions, so the
// stream's limit is one budget shared by their brokers (core/stream_credit.h).
TEST_F(WorkStreamTest, AStreamOverManyQueuesHoldsAtMostItsLimitAndGetsEveryQueuesJobs) {
  const std::vector<std::string> queues = {"emails", "sms", "push", "webhooks", "reports"};
  Subscribe(1, queues, 2);
  ExpectOk(1);
  for (const std::string& q : queues) Enqueue(q, q);
  std::set<std::string> payloads;
  std::vector<v1::LeasedJob> held = {NextJob(), NextJob()};
  for (uint64_t request = 2; payloads.size() < queues.size(); ++request) {
    int active = 0;
    for (const std::string& q : queues) active += GetQueue(q).active();
    ASSERT_EQ(active, static_cast<int>(held.size())) << "the broker pushed past the limit";
    v1::LeasedJob done = held.front();
    held.erase(held.begin());
    payloads.insert(done.payload());
    Ack(request, done);
    if (payloads.size() + held.size() == queues.size()) {
      ExpectOk(request);
      continue;
    }
    // The ack's answer and the next job, in either order.
    for (int i = 0; i < 2; ++i) {
      v1::WorkResponse m = Next();
      if (m.has_job()) held.push_back(m.job());
    }
  }
  EXPECT_EQ(payloads, std::set<std::string>(queues.begin(), queues.end()));
}

TEST_F(WorkStreamTest, RaisingTheFlowLimitPushesAJobThatWasWaiting) {
  Subscribe(1, "emails", 1);
  ExpectOk(1);
  Enqueue("emails");
  Enqueue("emails");
  std::set<std::string> got = {NextJob().job_id()};
  Flow(2, 2);
  for (int i = 0; i < 2; ++i) {
    v1::WorkResponse m = Next();
    if (m.has_result()) {
      EXPECT_EQ(m.result().request_id(), 2u);
      EXPECT_EQ(m.result().code(), kOk);
    } else {
      ASSERT_TRUE(m.has_job()) << m.DebugString();
      got.insert(m.job().job_id());
    }
  }
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(GetQueue("emails").active(), 2);
}

TEST_F(WorkStreamTest, AFlowOfZeroDrainsTheStreamSoAnAckFreesNoSlotForANewJob) {
  Subscribe(1, "emails", 1);
  ExpectOk(1);
  Enqueue("emails");
  Enqueue("emails");
  v1::LeasedJob job = NextJob();
  Flow(2, 0);
  ExpectOk(2);
  Ack(3, job);
  ExpectOk(3);
  v1::QueueInfo info = GetQueue("emails");
  EXPECT_EQ(info.active(), 0);
  EXPECT_EQ(info.counts().at("JOB_STATE_READY"), 1);
}

TEST_F(WorkStreamTest, FlowBeforeSubscribeIsRefused) {
  Flow(1, 5);
  v1::WorkResult r = NextResult();
  EXPECT_EQ(r.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(r.message(), HasSubstr("subscribe first"));
}

TEST_F(WorkStreamTest, ASecondSubscribeOnTheSameStreamIsRefused) {
  Subscribe(1, "emails", 1);
  ExpectOk(1);
  Subscribe(2, "reports", 1);
  v1::WorkResult r = NextResult();
  EXPECT_EQ(r.request_id(), 2u);
  EXPECT_EQ(r.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
}

TEST_F(WorkStreamTest, ASubscribeWithAMalformedLeaseDurationIsRefusedNamingTheField) {
  v1::WorkRequest req;
  req.mutable_subscribe()->add_queues("emails");
  req.mutable_subscribe()->set_worker_id("w1");
  req.mutable_subscribe()->mutable_lease_duration()->set_seconds(1);
  req.mutable_subscribe()->mutable_lease_duration()->set_nanos(-1);
  Send(1, req);
  v1::WorkResult r = NextResult();
  EXPECT_EQ(r.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(r.message(), HasSubstr("lease_duration"));
}

TEST_F(WorkStreamTest, AStreamThatEndsLeavesItsLeaseToRunOut) {
  Subscribe(1, "emails", 1);
  ExpectOk(1);
  const std::string id = Enqueue("emails");
  NextJob();
  stream_->WritesDone();
  v1::WorkResponse m;
  EXPECT_FALSE(stream_->Read(&m)) << "nothing more after the client closed: " << m.DebugString();
  EXPECT_THAT(stream_->Finish(), IsOk());
  EXPECT_EQ(GetJob(id).state(), v1::JOB_STATE_ACTIVE) << "the lease outlives the stream";

  server_.clock().Advance(absl::Minutes(5));  // past the default 30 s lease
  server_.broker().Tick();
  v1::Job job = GetJob(id);
  EXPECT_NE(job.state(), v1::JOB_STATE_ACTIVE);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LEASE_EXPIRED);
}

TEST_F(WorkStreamTest, JobsPushedThatAWorkerNeverGotAreGivenBackAtOnceWhenItGoesAway) {
  Subscribe(1, "emails", 4);
  ExpectOk(1);
  for (int i = 0; i < 4; ++i) Enqueue("emails");
  const v1::LeasedJob got = NextJob();  // the worker reads one job, then stops reading
  EXPECT_EQ(GetQueue("emails").active(), 4) << "all four were leased to the stream";
  ctx_.TryCancel();  // and goes away

  // The clock stands still, so no lease can run out: a job that is READY again was given back.
  // The in-process transport completes a write only when the client reads it, so the three it
  // did not read were never delivered.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  v1::QueueInfo info = GetQueue("emails");
  while (info.active() > 1 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
    info = GetQueue("emails");
  }
  EXPECT_EQ(info.active(), 1) << "only the job the worker read is still leased";
  EXPECT_EQ(info.counts().at("JOB_STATE_READY"), 3);
  EXPECT_EQ(GetJob(got.job_id()).state(), v1::JOB_STATE_ACTIVE) << "the lease it got stays";
  // Counted apart from workers' own releases (jobbroker_work_given_back_total), once each
  // Release is done.
  while (server_.work_streams().given_back() < 3 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server_.work_streams().given_back(), 3u);

  // Given back unstarted: no attempt counted, none in the history; the next worker gets
  // attempt 1 of each.
  grpc::ClientContext ctx;
  InProcessServer::SetDeadline(ctx);
  auto next = broker_->Work(&ctx);
  v1::WorkRequest subscribe;
  subscribe.set_request_id(1);
  subscribe.mutable_subscribe()->add_queues("emails");
  subscribe.mutable_subscribe()->set_worker_id("w2");
  subscribe.mutable_subscribe()->set_max_in_flight(4);
  ASSERT_TRUE(next->Write(subscribe));
  std::set<std::string> leased;
  v1::WorkResponse m;
  while (leased.size() < 3 && next->Read(&m)) {
    if (!m.has_job()) continue;
    EXPECT_NE(m.job().job_id(), got.job_id());
    EXPECT_EQ(m.job().attempt(), 1) << m.job().job_id();
    const v1::Job job = GetJob(m.job().job_id());
    ASSERT_EQ(job.attempts_size(), 1) << job.DebugString();
    EXPECT_EQ(job.attempts(0).worker_id(), "w2");
    leased.insert(m.job().job_id());
  }
  EXPECT_EQ(leased.size(), 3u);
  ctx.TryCancel();
}

TEST_F(WorkStreamTest, ABrokerShuttingDownEndsTheStreamWithUnavailable) {
  Subscribe(1, "emails", 1);
  ExpectOk(1);
  server_.broker().Shutdown();
  v1::WorkResponse m;
  while (stream_->Read(&m)) {
  }
  EXPECT_THAT(stream_->Finish(), StatusIs(grpc::StatusCode::UNAVAILABLE, ::testing::_));
}

}  // namespace
}  // namespace jobbroker::server
