// The Broker RPCs end to end against the real binary: the happy paths, retries, fencing, dedup,
// batches, long polls and cancellation, as DESIGN.md promises them.

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/matchers.h"

namespace jobbroker::testing {
namespace {

// Short, exact backoff so retries and lease expiry are due quickly without sleeping long.
constexpr char kConfig[] = R"({
  "defaultPolicy": {
    "retry": {"maxAttempts": 3, "initialBackoff": "0.2s", "maxBackoff": "0.2s",
              "jitter": "JITTER_NONE"}
  }
})";

constexpr char kQueue[] = "rpc";
// Long enough that a job being there is not a race, short enough to keep the suite fast.
constexpr absl::Duration kWait = absl::Seconds(10);

class BrokerRpcTest : public BrokerFixture {
 protected:
  BrokerRpcTest() : BrokerFixture({.config_json = kConfig}) {}

  v1::HeartbeatResponse MustHeartbeat(const v1::LeasedJob& job,
                                      std::optional<std::string> checkpoint = std::nullopt) {
    v1::HeartbeatRequest req;
    req.set_job_id(job.job_id());
    req.set_lease_id(job.lease_id());
    if (checkpoint.has_value()) req.set_checkpoint(*checkpoint);
    v1::HeartbeatResponse resp;
    EXPECT_THAT(client().Heartbeat(req, &resp), IsOk());
    return resp;
  }

  grpc::Status FailJob(const v1::LeasedJob& job, const std::string& error, bool permanent,
                       v1::FailResponse* resp, absl::Duration retry_after = absl::ZeroDuration()) {
    v1::FailRequest req;
    req.set_job_id(job.job_id());
    req.set_lease_id(job.lease_id());
    req.set_error(error);
    req.set_permanent(permanent);
    if (retry_after > absl::ZeroDuration()) *req.mutable_retry_after() = ToProto(retry_after);
    return client().Fail(req, resp);
  }

  grpc::Status AckWith(const std::string& job_id, const std::string& lease_id) {
    v1::AckRequest req;
    req.set_job_id(job_id);
    req.set_lease_id(lease_id);
    return client().Ack(req);
  }
};

TEST_F(BrokerRpcTest, EnqueueLeaseHeartbeatAck) {
  v1::EnqueueRequest enqueue;
  enqueue.set_queue(kQueue);
  enqueue.set_payload("hello");
  (*enqueue.mutable_headers())["trace-id"] = "t-1";
  const absl::Time before = absl::Now();
  const std::string id = client().MustEnqueue(enqueue);
  ASSERT_FALSE(id.empty());

  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->job_id(), id);
  EXPECT_FALSE(job->lease_id().empty());
  EXPECT_EQ(job->queue(), kQueue);
  EXPECT_EQ(job->payload(), "hello");
  EXPECT_EQ(job->headers().at("trace-id"), "t-1");
  EXPECT_EQ(job->attempt(), 1);
  EXPECT_EQ(job->max_attempts(), 3);
  // Without a dedup key the idempotency key is the job id.
  EXPECT_EQ(job->idempotency_key(), id);
  EXPECT_EQ(job->checkpoint(), "");
  EXPECT_GT(FromProto(job->lease_deadline()), before);
  EXPECT_GE(FromProto(job->enqueued_at()), before - absl::Seconds(1));

  v1::Job active = client().MustGetJob(id);
  EXPECT_EQ(active.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(active.attempt(), 1);

  v1::HeartbeatResponse hb = MustHeartbeat(*job, "step-1");
  EXPECT_GT(FromProto(hb.lease_deadline()), before);
  EXPECT_FALSE(hb.cancel_requested());
  EXPECT_EQ(client().MustGetJob(id).checkpoint(), "step-1");

  client().MustAck(*job, "done");
  v1::Job done = client().MustGetJob(id);
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(done.result(), "done");
  EXPECT_EQ(done.payload(), "hello");
  EXPECT_GT(done.completed_at().seconds(), 0);
  ASSERT_THAT(done.attempts(), SizeIs(1));
  EXPECT_EQ(done.attempts(0).attempt(), 1);
  EXPECT_EQ(done.attempts(0).worker_id(), "worker-1");
  EXPECT_EQ(done.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_COMPLETED);
  EXPECT_GT(done.attempts(0).ended_at().seconds(), 0);
}

TEST_F(BrokerRpcTest, FailSchedulesRetryThatCarriesTheCheckpoint) {
  const std::string id = client().MustEnqueue(kQueue, "work");
  std::optional<v1::LeasedJob> first = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(first.has_value());
  MustHeartbeat(*first, "halfway");

  const absl::Time before_fail = absl::Now();
  v1::FailResponse fail;
  ASSERT_THAT(FailJob(*first, "boom", /*permanent=*/false, &fail), IsOk());
  EXPECT_EQ(fail.state(), v1::JOB_STATE_SCHEDULED);
  ASSERT_TRUE(fail.has_next_attempt_at());
  // The queue's backoff is exactly 0.2 s (no jitter), counted from the server's "now".
  EXPECT_GE(FromProto(fail.next_attempt_at()),
            before_fail + absl::Milliseconds(200) - absl::Milliseconds(1));

  std::optional<v1::LeasedJob> second = client().LeaseOne(kQueue, "worker-2", kWait);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->job_id(), id);
  EXPECT_EQ(second->attempt(), 2);
  EXPECT_EQ(second->checkpoint(), "halfway");
  EXPECT_NE(second->lease_id(), first->lease_id());
  EXPECT_EQ(second->idempotency_key(), first->idempotency_key());

  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(job.last_error(), "boom");
  ASSERT_THAT(job.attempts(), SizeIs(2));
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_ERROR);
  EXPECT_EQ(job.attempts(0).error(), "boom");
  EXPECT_EQ(job.attempts(0).worker_id(), "worker-1");
  EXPECT_EQ(job.attempts(1).worker_id(), "worker-2");
}

TEST_F(BrokerRpcTest, RetryAfterReplacesTheBackoff) {
  const std::string id = client().MustEnqueue(kQueue, "rate-limited");
  std::optional<v1::LeasedJob> first = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(first.has_value());

  const absl::Time before_fail = absl::Now();
  v1::FailResponse fail;
  ASSERT_THAT(FailJob(*first, "429", false, &fail, absl::Seconds(3)), IsOk());
  EXPECT_EQ(fail.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_GE(FromProto(fail.next_attempt_at()), before_fail + absl::Seconds(3));
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(client().MustLease(kQueue, "worker-1"), SizeIs(0));

  std::optional<v1::LeasedJob> second = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->attempt(), 2);
  EXPECT_GE(absl::Now(), before_fail + absl::Seconds(3));
}

TEST_F(BrokerRpcTest, PermanentFailKillsTheJob) {
  const std::string id = client().MustEnqueue(kQueue, "poison");
  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(job.has_value());

  v1::FailResponse fail;
  ASSERT_THAT(FailJob(*job, "cannot parse payload", /*permanent=*/true, &fail), IsOk());
  EXPECT_EQ(fail.state(), v1::JOB_STATE_FAILED);

  v1::Job dead = client().MustGetJob(id);
  EXPECT_EQ(dead.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(dead.fail_reason(), v1::FAIL_REASON_PERMANENT);
  EXPECT_EQ(dead.last_error(), "cannot parse payload");
  ASSERT_THAT(dead.attempts(), SizeIs(1));
  EXPECT_EQ(dead.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_PERMANENT_ERROR);
  EXPECT_EQ(dead.attempts(0).error(), "cannot parse payload");
  EXPECT_THAT(client().MustLease(kQueue, "worker-1"), SizeIs(0));
}

TEST_F(BrokerRpcTest, LastAttemptFailedMeansAttemptsExhausted) {
  v1::EnqueueRequest enqueue;
  enqueue.set_queue(kQueue);
  enqueue.set_payload("once");
  enqueue.set_max_attempts(1);
  const std::string id = client().MustEnqueue(enqueue);
  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->max_attempts(), 1);

  v1::FailResponse fail;
  ASSERT_THAT(FailJob(*job, "transient", false, &fail), IsOk());
  EXPECT_EQ(fail.state(), v1::JOB_STATE_FAILED);
  v1::Job dead = client().MustGetJob(id);
  EXPECT_EQ(dead.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(dead.fail_reason(), v1::FAIL_REASON_ATTEMPTS_EXHAUSTED);
  EXPECT_EQ(dead.last_error(), "transient");
}

TEST_F(BrokerRpcTest, ReleaseMakesTheJobReadyWithoutCountingAnAttempt) {
  const std::string id = client().MustEnqueue(kQueue, "give-back");
  std::optional<v1::LeasedJob> first = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(first.has_value());

  v1::ReleaseRequest release;
  release.set_job_id(first->job_id());
  release.set_lease_id(first->lease_id());
  ASSERT_THAT(client().Release(release), IsOk());
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_READY);

  std::optional<v1::LeasedJob> second = client().LeaseOne(kQueue, "worker-2", kWait);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->job_id(), id);
  EXPECT_EQ(second->attempt(), 1);
  // The released lease is no longer the job's.
  EXPECT_THAT(AckWith(id, first->lease_id()), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(AckWith(id, second->lease_id()), IsOk());
}

TEST_F(BrokerRpcTest, HigherPriorityFirstThenFifo) {
  auto enqueue = [&](const std::string& payload, int priority) {
    v1::EnqueueRequest req;
    req.set_queue(kQueue);
    req.set_payload(payload);
    req.set_priority(priority);
    return client().MustEnqueue(req);
  };
  enqueue("a", 0);
  enqueue("b", 5);
  enqueue("c", 0);
  enqueue("d", 10);
  enqueue("e", 5);
  enqueue("f", -1);

  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1");
    ASSERT_TRUE(job.has_value()) << "lease " << i;
    order.push_back(job->payload());
  }
  EXPECT_THAT(order, ElementsAre("d", "b", "e", "a", "c", "f"));
}

TEST_F(BrokerRpcTest, DelayedJobIsNotLeasedBeforeItsDelay) {
  // Long enough that the checks right after the enqueue run well before it is due.
  constexpr absl::Duration kDelay = absl::Seconds(3);
  v1::EnqueueRequest req;
  req.set_queue(kQueue);
  req.set_payload("later");
  *req.mutable_delay() = ToProto(kDelay);
  const absl::Time before = absl::Now();
  const std::string id = client().MustEnqueue(req);

  v1::Job scheduled = client().MustGetJob(id);
  EXPECT_EQ(scheduled.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_GE(FromProto(scheduled.run_at()), before + kDelay);
  EXPECT_THAT(client().MustLease(kQueue, "worker-1"), SizeIs(0));

  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->job_id(), id);
  // A lower bound only: the job must not have been handed out early.
  EXPECT_GE(absl::Now(), before + kDelay);
}

TEST_F(BrokerRpcTest, RunAtInThePastIsReadyAtOnce) {
  v1::EnqueueRequest req;
  req.set_queue(kQueue);
  req.set_payload("overdue");
  *req.mutable_run_at() = ToProtoTime(absl::Now() - absl::Hours(1));
  const std::string id = client().MustEnqueue(req);
  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1");
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->job_id(), id);
}

TEST_F(BrokerRpcTest, DedupKeyReturnsTheSameJob) {
  v1::EnqueueRequest req;
  req.set_queue(kQueue);
  req.set_payload("charge order 17");
  req.set_dedup_key("order-17");

  v1::EnqueueResponse first;
  ASSERT_THAT(client().Enqueue(req, &first), IsOk());
  EXPECT_FALSE(first.deduplicated());

  v1::EnqueueResponse again;
  ASSERT_THAT(client().Enqueue(req, &again), IsOk());
  EXPECT_EQ(again.job_id(), first.job_id());
  EXPECT_TRUE(again.deduplicated());

  req.set_payload("charge order 17 twice");
  v1::EnqueueResponse conflict;
  EXPECT_THAT(client().Enqueue(req, &conflict),
              StatusIs(grpc::StatusCode::ALREADY_EXISTS, HasSubstr(first.job_id())));

  EXPECT_EQ(client().Counts(kQueue), (std::map<std::string, int64_t>{{"JOB_STATE_READY", 1}}));
  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1");
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->idempotency_key(), "order-17");
  EXPECT_EQ(job->payload(), "charge order 17");
}

TEST_F(BrokerRpcTest, EnqueueBatchIsAllOrNothing) {
  v1::EnqueueBatchRequest good;
  for (const char* payload : {"one", "two", "three"}) {
    v1::EnqueueRequest* job = good.add_jobs();
    job->set_queue(kQueue);
    job->set_payload(payload);
  }
  v1::EnqueueBatchResponse results;
  ASSERT_THAT(client().EnqueueBatch(good, &results), IsOk());
  ASSERT_THAT(results.results(), SizeIs(3));
  std::vector<std::string> ids;
  for (const v1::EnqueueResponse& r : results.results()) ids.push_back(r.job_id());
  for (const std::string& id : ids) EXPECT_EQ(client().MustGetJob(id).queue(), kQueue);

  v1::EnqueueBatchRequest bad = good;
  *bad.mutable_jobs(1)->mutable_delay() = ToProto(absl::Seconds(-5));
  v1::EnqueueBatchResponse bad_results;
  EXPECT_THAT(client().EnqueueBatch(bad, &bad_results),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("delay")));

  v1::EnqueueBatchRequest bad_queue = good;
  bad_queue.mutable_jobs(2)->set_queue("");
  EXPECT_THAT(client().EnqueueBatch(bad_queue, &bad_results),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("queue")));

  // Only the first batch exists, in its order.
  std::vector<v1::Job> jobs = client().ListAll(kQueue);
  ASSERT_THAT(jobs, SizeIs(3));
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(jobs[i].id(), ids[i]);
  EXPECT_EQ(client().Counts(kQueue), (std::map<std::string, int64_t>{{"JOB_STATE_READY", 3}}));
}

TEST_F(BrokerRpcTest, LongPollLeaseReturnsAJobEnqueuedWhileWaiting) {
  std::optional<v1::LeasedJob> leased;
  std::thread waiter([&] {
    BrokerClient worker(process().NewChannel());
    leased = worker.LeaseOne(kQueue, "waiting-worker", absl::Seconds(30));
  });
  // Enqueue only once the Lease waits in the broker, so that the wait is what hands the job over.
  ASSERT_TRUE(WaitFor([&] {
    v1::QueueInfo info;
    return client().GetQueue(kQueue, &info).ok() && info.waiting_leases() == 1;
  })) << "the long poll never reached the broker";
  const std::string id = client().MustEnqueue(kQueue, "wake-up");
  waiter.join();
  ASSERT_TRUE(leased.has_value());
  EXPECT_EQ(leased->job_id(), id);
  EXPECT_EQ(leased->payload(), "wake-up");
}

TEST_F(BrokerRpcTest, StaleLeaseIsFencedAfterExpiryAndRelease) {
  const std::string id = client().MustEnqueue(kQueue, "slow");
  std::optional<v1::LeasedJob> first =
      client().LeaseOne(kQueue, "hung-worker", kWait, absl::Milliseconds(500));
  ASSERT_TRUE(first.has_value());

  // The lease runs out, then 0.2 s of backoff, then someone else gets attempt 2.
  std::optional<v1::LeasedJob> second = client().LeaseOne(kQueue, "worker-2", kWait);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->job_id(), id);
  EXPECT_EQ(second->attempt(), 2);

  v1::HeartbeatRequest hb;
  hb.set_job_id(id);
  hb.set_lease_id(first->lease_id());
  v1::HeartbeatResponse hb_resp;
  EXPECT_THAT(client().Heartbeat(hb, &hb_resp), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(AckWith(id, first->lease_id()), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  v1::FailResponse fail;
  EXPECT_THAT(FailJob(*first, "late", false, &fail),
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  v1::ReleaseRequest release;
  release.set_job_id(id);
  release.set_lease_id(first->lease_id());
  EXPECT_THAT(client().Release(release), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));

  // The refused calls changed nothing: attempt 2 is still running and can finish.
  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(job.attempt(), 2);
  ASSERT_THAT(job.attempts(), SizeIs(2));
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LEASE_EXPIRED);
  EXPECT_THAT(AckWith(id, second->lease_id()), IsOk());
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(BrokerRpcTest, LateAckOfAnExpiredLeaseIsAcceptedWhileNoNewerAttemptRuns) {
  const std::string id = client().MustEnqueue(kQueue, "salvage");
  std::optional<v1::LeasedJob> job =
      client().LeaseOne(kQueue, "slow-worker", kWait, absl::Milliseconds(500));
  ASSERT_TRUE(job.has_value());

  // Wait (wall clock: nothing else to wait on) until the broker has noticed the expiry.
  const bool expired = PollUntil(
      [&] { return client().MustGetJob(id).state() != v1::JOB_STATE_ACTIVE; }, absl::Seconds(10));
  EXPECT_TRUE(expired) << "job still ACTIVE 10 s after its 0.5 s lease ran out";
  EXPECT_THAT(AckWith(id, job->lease_id()), IsOk());
  v1::Job done = client().MustGetJob(id);
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_THAT(client().MustLease(kQueue, "worker-2"), SizeIs(0));
}

TEST_F(BrokerRpcTest, HeartbeatsKeepTheLease) {
  const std::string id = client().MustEnqueue(kQueue, "kept-alive");
  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait, absl::Seconds(2));
  ASSERT_TRUE(job.has_value());
  // Outlive the 2 s lease by heartbeating well inside it (wall clock: that is the point).
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(400));
    v1::HeartbeatResponse hb = MustHeartbeat(*job);
    EXPECT_GT(FromProto(hb.lease_deadline()), absl::Now());
  }
  EXPECT_THAT(client().MustLease(kQueue, "worker-2"), SizeIs(0));
  v1::Job active = client().MustGetJob(id);
  EXPECT_EQ(active.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(active.attempt(), 1);
  EXPECT_THAT(AckWith(id, job->lease_id()), IsOk());
}

TEST_F(BrokerRpcTest, ExpiryOfTheLastAttemptKillsTheJob) {
  v1::EnqueueRequest req;
  req.set_queue(kQueue);
  req.set_payload("abandoned");
  req.set_max_attempts(1);
  const std::string id = client().MustEnqueue(req);
  std::optional<v1::LeasedJob> job =
      client().LeaseOne(kQueue, "vanishing-worker", kWait, absl::Milliseconds(500));
  ASSERT_TRUE(job.has_value());

  // Wall-clock wait for the expiry.
  const bool dead = PollUntil(
      [&] { return client().MustGetJob(id).state() == v1::JOB_STATE_FAILED; }, absl::Seconds(10));
  ASSERT_TRUE(dead) << client().MustGetJob(id).DebugString();
  v1::Job failed = client().MustGetJob(id);
  EXPECT_EQ(failed.fail_reason(), v1::FAIL_REASON_ATTEMPTS_EXHAUSTED);
  ASSERT_THAT(failed.attempts(), SizeIs(1));
  EXPECT_EQ(failed.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LEASE_EXPIRED);
  EXPECT_THAT(client().MustLease(kQueue, "worker-2"), SizeIs(0));
}

TEST_F(BrokerRpcTest, LeaseOfManyJobsFollowsPriorityOrder) {
  for (int priority : {1, 3, 2}) {
    v1::EnqueueRequest req;
    req.set_queue(kQueue);
    req.set_payload(absl::StrCat("p", priority));
    req.set_priority(priority);
    client().MustEnqueue(req);
  }
  std::vector<v1::LeasedJob> jobs = client().MustLease(kQueue, "worker-1", 10);
  std::vector<std::string> payloads;
  for (const v1::LeasedJob& job : jobs) payloads.push_back(job.payload());
  EXPECT_THAT(payloads, ElementsAre("p3", "p2", "p1"));
}

TEST_F(BrokerRpcTest, AckIsIdempotentPerLease) {
  const std::string id = client().MustEnqueue(kQueue, "twice");
  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(job.has_value());
  EXPECT_THAT(AckWith(id, job->lease_id()), IsOk());
  EXPECT_THAT(AckWith(id, job->lease_id()), IsOk());
  v1::Job done = client().MustGetJob(id);
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_THAT(done.attempts(), SizeIs(1));
}

TEST_F(BrokerRpcTest, CancellingAnActiveJobIsSeenInTheNextHeartbeat) {
  const std::string id = client().MustEnqueue(kQueue, "long-running");
  std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(job.has_value());
  EXPECT_FALSE(MustHeartbeat(*job).cancel_requested());

  v1::Job cancelled;
  ASSERT_THAT(client().CancelJob(id, &cancelled), IsOk());
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(cancelled.cancel_requested());

  EXPECT_TRUE(MustHeartbeat(*job).cancel_requested());
}

TEST_F(BrokerRpcTest, CancellingAReadyJobEndsIt) {
  const std::string id = client().MustEnqueue(kQueue, "never-mind");
  v1::Job cancelled;
  ASSERT_THAT(client().CancelJob(id, &cancelled), IsOk());
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(client().MustLease(kQueue, "worker-1"), SizeIs(0));
}

TEST_F(BrokerRpcTest, HealthCheckIsServing) {
  int serving_status = 0;
  ASSERT_THAT(CheckHealth(process().NewChannel(), "", &serving_status), IsOk());
  EXPECT_EQ(serving_status, 1);  // grpc.health.v1.HealthCheckResponse.SERVING
}

}  // namespace
}  // namespace jobbroker::testing
