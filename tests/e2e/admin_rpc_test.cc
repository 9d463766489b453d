// The Admin RPCs that move jobs by hand and switch queues, end to end against the real binary:
// RetryJob (one job and bulk redrive), DeleteJob, PauseQueue/ResumeQueue (and that a pause
// survives restarts), PurgeQueue, and QueueInfo's active/dead. Exact status codes throughout.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/matchers.h"

namespace jobbroker::testing {
namespace {

constexpr char kQueue[] = "ops";
constexpr absl::Duration kWait = absl::Seconds(10);

class AdminRpcTest : public BrokerFixture {
 protected:
  // `n` jobs of `queue` that failed for good (one attempt each, error "boom <i>"), in order.
  std::vector<std::string> FailedJobs(int n, const std::string& queue = kQueue) {
    v1::EnqueueBatchRequest batch;
    for (int i = 0; i < n; ++i) {
      v1::EnqueueRequest* job = batch.add_jobs();
      job->set_queue(queue);
      job->set_payload(absl::StrCat("job-", i));
      job->set_max_attempts(1);
    }
    v1::EnqueueBatchResponse enqueued;
    EXPECT_THAT(client().EnqueueBatch(batch, &enqueued), IsOk());
    std::vector<v1::LeasedJob> leased = client().MustLease(queue, "worker-1", n);
    EXPECT_THAT(leased, SizeIs(n));
    std::vector<std::string> ids;
    for (const v1::LeasedJob& job : leased) {
      v1::FailRequest fail;
      fail.set_job_id(job.job_id());
      fail.set_lease_id(job.lease_id());
      fail.set_error(absl::StrCat("boom ", ids.size()));
      v1::FailResponse resp;
      EXPECT_THAT(client().Fail(fail, &resp), IsOk());
      EXPECT_EQ(resp.state(), v1::JOB_STATE_FAILED);
      ids.push_back(job.job_id());
    }
    return ids;
  }

  std::string CancelledJob(const std::string& queue = kQueue) {
    const std::string id = client().MustEnqueue(queue, "to-cancel");
    v1::Job job;
    EXPECT_THAT(client().CancelJob(id, &job), IsOk());
    return id;
  }

  grpc::Status Retry(const std::string& job_id, v1::RetryJobResponse* resp) {
    v1::RetryJobRequest req;
    req.set_job_id(job_id);
    return client().RetryJob(req, resp);
  }

  grpc::Status Purge(const std::string& queue, const std::vector<v1::JobState>& states,
                     int64_t* purged) {
    v1::PurgeQueueRequest req;
    req.set_queue(queue);
    for (v1::JobState s : states) req.add_states(s);
    v1::PurgeQueueResponse resp;
    grpc::Status status = client().PurgeQueue(req, &resp);
    *purged = resp.purged();
    return status;
  }

  int64_t Count(const std::string& state) {
    std::map<std::string, int64_t> counts = client().Counts(kQueue);
    auto it = counts.find(state);
    return it == counts.end() ? 0 : it->second;
  }
};

// ---------------------------------------------------------------------------------------------
// RetryJob

TEST_F(AdminRpcTest, RetryJobPutsAFailedJobBackToReadyWithItsHistory) {
  const std::string id = FailedJobs(1)[0];
  v1::RetryJobResponse resp;
  ASSERT_THAT(Retry(id, &resp), IsOk());
  EXPECT_EQ(resp.job().id(), id);
  EXPECT_EQ(resp.job().state(), v1::JOB_STATE_READY);
  EXPECT_EQ(resp.job().attempt(), 0);
  EXPECT_EQ(resp.job().fail_reason(), v1::FAIL_REASON_UNSPECIFIED);
  EXPECT_EQ(resp.job().last_error(), "boom 0");
  EXPECT_THAT(resp.job().attempts(), SizeIs(1));
  EXPECT_EQ(resp.matched(), 1);
  EXPECT_EQ(resp.retried(), 1);

  std::optional<v1::LeasedJob> again = client().LeaseOne(kQueue, "worker-2", kWait);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->job_id(), id);
  EXPECT_EQ(again->attempt(), 1);
  client().MustAck(*again, "done");
  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED);
  ASSERT_THAT(job.attempts(), SizeIs(2));
  EXPECT_EQ(job.attempts(0).attempt(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_ERROR);
  EXPECT_EQ(job.attempts(1).attempt(), 1);
  EXPECT_EQ(job.attempts(1).worker_id(), "worker-2");
  EXPECT_EQ(job.attempts(1).outcome(), v1::ATTEMPT_OUTCOME_COMPLETED);
}

TEST_F(AdminRpcTest, RetryJobOfACancelledJob) {
  const std::string id = CancelledJob();
  v1::RetryJobResponse resp;
  ASSERT_THAT(Retry(id, &resp), IsOk());
  EXPECT_EQ(resp.job().state(), v1::JOB_STATE_READY);
  EXPECT_FALSE(resp.job().cancel_requested());
}

TEST_F(AdminRpcTest, RetryJobRefusalsHaveExactCodes) {
  const std::string ready = client().MustEnqueue(kQueue, "x");
  v1::RetryJobResponse resp;
  EXPECT_THAT(Retry(ready, &resp),
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION, HasSubstr("JOB_STATE_READY")));
  EXPECT_EQ(client().MustGetJob(ready).state(), v1::JOB_STATE_READY);
  EXPECT_THAT(Retry("01NOSUCHJOB", &resp), StatusIs(grpc::StatusCode::NOT_FOUND));

  v1::RetryJobRequest req;
  EXPECT_THAT(
      client().RetryJob(req, &resp),
      StatusIs(grpc::StatusCode::INVALID_ARGUMENT, AllOf(HasSubstr("job_id"), HasSubstr("queue"))));
  req.set_job_id(ready);
  req.set_queue(kQueue);
  EXPECT_THAT(
      client().RetryJob(req, &resp),
      StatusIs(grpc::StatusCode::INVALID_ARGUMENT, AllOf(HasSubstr("job_id"), HasSubstr("queue"))));
  req.clear_queue();
  req.set_dry_run(true);
  EXPECT_THAT(client().RetryJob(req, &resp),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("dry_run")));

  v1::RetryJobRequest bulk;
  bulk.set_queue(kQueue);
  bulk.set_state(v1::JOB_STATE_COMPLETED);
  EXPECT_THAT(client().RetryJob(bulk, &resp),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("state")));
  bulk.set_state(static_cast<v1::JobState>(42));
  EXPECT_THAT(client().RetryJob(bulk, &resp),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("state")));
  bulk.clear_state();
  bulk.set_limit(100001);
  EXPECT_THAT(client().RetryJob(bulk, &resp),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("limit")));
  bulk.set_limit(-1);
  EXPECT_THAT(client().RetryJob(bulk, &resp),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("limit")));
  bulk.set_limit(0);
  bulk.set_queue("never-used");
  EXPECT_THAT(client().RetryJob(bulk, &resp), StatusIs(grpc::StatusCode::NOT_FOUND));
  bulk.set_dry_run(true);
  EXPECT_THAT(client().RetryJob(bulk, &resp), StatusIs(grpc::StatusCode::NOT_FOUND));
}

TEST_F(AdminRpcTest, BulkRedriveDryRunThenLimitThenTheRest) {
  const std::vector<std::string> failed = FailedJobs(30);
  const std::string cancelled = CancelledJob();
  FailedJobs(2, "elsewhere");

  v1::RetryJobRequest req;
  req.set_queue(kQueue);
  req.set_dry_run(true);
  v1::RetryJobResponse resp;
  ASSERT_THAT(client().RetryJob(req, &resp), IsOk());
  EXPECT_EQ(resp.matched(), 30);
  EXPECT_EQ(resp.retried(), 0);
  EXPECT_FALSE(resp.has_job());
  EXPECT_EQ(Count("JOB_STATE_FAILED"), 30) << "a dry run changes nothing";

  req.set_dry_run(false);
  req.set_limit(10);
  ASSERT_THAT(client().RetryJob(req, &resp), IsOk());
  EXPECT_EQ(resp.matched(), 10);
  EXPECT_EQ(resp.retried(), 10);
  EXPECT_EQ(Count("JOB_STATE_READY"), 10);
  // The oldest failures first: they failed in lease order.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(client().MustGetJob(failed[i]).state(), v1::JOB_STATE_READY) << i;
  }

  req.clear_limit();
  ASSERT_THAT(client().RetryJob(req, &resp), IsOk());
  EXPECT_EQ(resp.retried(), 20);
  EXPECT_EQ(Count("JOB_STATE_FAILED"), 0);
  EXPECT_EQ(client().MustGetJob(cancelled).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(client().Counts("elsewhere").at("JOB_STATE_FAILED"), 2);

  req.set_state(v1::JOB_STATE_CANCELLED);
  ASSERT_THAT(client().RetryJob(req, &resp), IsOk());
  EXPECT_EQ(resp.retried(), 1);
  EXPECT_EQ(client().MustGetJob(cancelled).state(), v1::JOB_STATE_READY);
  EXPECT_THAT(client().MustLease(kQueue, "worker-2", 100), SizeIs(31));
}

// ---------------------------------------------------------------------------------------------
// DeleteJob

TEST_F(AdminRpcTest, DeleteJobRemovesItAndRefusesActiveJobs) {
  const std::string dead = FailedJobs(1)[0];
  const std::string active = client().MustEnqueue(kQueue, "running");
  std::optional<v1::LeasedJob> lease = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(lease.has_value());
  const std::string ready = client().MustEnqueue(kQueue, "waiting");

  for (const std::string& id : {dead, ready}) {
    ASSERT_THAT(client().DeleteJob(id), IsOk());
    v1::Job job;
    EXPECT_THAT(client().GetJob(id, &job), StatusIs(grpc::StatusCode::NOT_FOUND));
    EXPECT_THAT(client().DeleteJob(id), StatusIs(grpc::StatusCode::NOT_FOUND));
  }
  EXPECT_THAT(client().DeleteJob(active),
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION, HasSubstr("cancel it first")));
  EXPECT_EQ(client().MustGetJob(active).state(), v1::JOB_STATE_ACTIVE);
  EXPECT_THAT(client().DeleteJob(""), StatusIs(grpc::StatusCode::INVALID_ARGUMENT));
  client().MustAck(*lease);
  EXPECT_THAT(client().DeleteJob(active), IsOk());
  EXPECT_THAT(client().Counts(kQueue), IsEmpty()) << "no job left in any state";
  v1::QueueInfo info;
  EXPECT_THAT(client().GetQueue(kQueue, &info), IsOk()) << "the queue itself stays";
}

// ---------------------------------------------------------------------------------------------
// PauseQueue / ResumeQueue

TEST_F(AdminRpcTest, PauseStopsLeasingAndResumeHandsJobsToWaitingWorkers) {
  client().MustEnqueue(kQueue, "first");
  v1::QueueInfo info;
  ASSERT_THAT(client().PauseQueue(kQueue, &info), IsOk());
  EXPECT_EQ(info.name(), kQueue);
  EXPECT_TRUE(info.policy().paused());
  EXPECT_THAT(client().MustLease(kQueue, "worker-1"), IsEmpty());
  client().MustEnqueue(kQueue, "second");  // a paused queue still accepts jobs
  EXPECT_EQ(Count("JOB_STATE_READY"), 2);

  // A long poll waits through the pause and gets the jobs the moment the queue resumes.
  std::vector<v1::LeasedJob> got;
  std::thread waiter([&] { got = client().MustLease(kQueue, "worker-2", 2, absl::Seconds(20)); });
  ASSERT_TRUE(PollUntil(
      [&] {
        v1::QueueInfo now;
        return client().GetQueue(kQueue, &now).ok() && now.waiting_leases() == 1;
      },
      kWait))
      << "the long poll never arrived";
  ASSERT_THAT(client().ResumeQueue(kQueue, &info), IsOk());
  EXPECT_FALSE(info.policy().paused());
  waiter.join();
  EXPECT_THAT(got, SizeIs(2));
}

TEST_F(AdminRpcTest, PauseAndResumeOfAnUnknownQueueAreNotFound) {
  v1::QueueInfo info;
  EXPECT_THAT(client().PauseQueue("never-used", &info), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(client().ResumeQueue("never-used", &info), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(client().GetQueue("never-used", &info), StatusIs(grpc::StatusCode::NOT_FOUND))
      << "a pause must not create the queue";
  EXPECT_THAT(client().PauseQueue("bad queue!", &info),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("queue")));
}

TEST_F(AdminRpcTest, PauseSurvivesAGracefulRestartAndKill9) {
  client().MustEnqueue(kQueue, "held");
  v1::QueueInfo info;
  ASSERT_THAT(client().PauseQueue(kQueue, &info), IsOk());

  absl::StatusOr<int> code = process().Terminate();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << process().ReadStderr();
  ASSERT_NO_FATAL_FAILURE(Restart());
  ASSERT_THAT(client().GetQueue(kQueue, &info), IsOk());
  EXPECT_TRUE(info.policy().paused());
  EXPECT_THAT(client().MustLease(kQueue, "worker-1"), IsEmpty());

  ASSERT_NO_FATAL_FAILURE(Kill9AndRestart());
  ASSERT_THAT(client().GetQueue(kQueue, &info), IsOk());
  EXPECT_TRUE(info.policy().paused());
  EXPECT_THAT(client().MustLease(kQueue, "worker-1"), IsEmpty());

  // A resume is persisted the same way.
  ASSERT_THAT(client().ResumeQueue(kQueue, &info), IsOk());
  ASSERT_NO_FATAL_FAILURE(Kill9AndRestart());
  EXPECT_THAT(client().MustLease(kQueue, "worker-1"), SizeIs(1));
}

// ---------------------------------------------------------------------------------------------
// PurgeQueue

TEST_F(AdminRpcTest, PurgeRemovesEndedJobsByDefaultAndWaitingOnesWhenNamed) {
  FailedJobs(3);
  CancelledJob();
  const std::string done = client().MustEnqueue(kQueue, "done");
  std::optional<v1::LeasedJob> lease = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(lease.has_value());
  client().MustAck(*lease);
  const std::string active = client().MustEnqueue(kQueue, "running");
  ASSERT_TRUE(client().LeaseOne(kQueue, "worker-1", kWait).has_value());
  client().MustEnqueue(kQueue, "ready-1");
  client().MustEnqueue(kQueue, "ready-2");
  v1::EnqueueRequest later;
  later.set_queue(kQueue);
  *later.mutable_delay() = ToProto(absl::Hours(1));
  client().MustEnqueue(later);

  int64_t purged = -1;
  ASSERT_THAT(Purge(kQueue, {}, &purged), IsOk());
  EXPECT_EQ(purged, 5);  // 3 failed, 1 cancelled, 1 completed
  EXPECT_EQ(client().Counts(kQueue), (std::map<std::string, int64_t>{
                                         {"JOB_STATE_READY", 2},
                                         {"JOB_STATE_SCHEDULED", 1},
                                         {"JOB_STATE_ACTIVE", 1},
                                     }));
  v1::Job job;
  EXPECT_THAT(client().GetJob(done, &job), StatusIs(grpc::StatusCode::NOT_FOUND));

  ASSERT_THAT(Purge(kQueue, {v1::JOB_STATE_READY, v1::JOB_STATE_SCHEDULED}, &purged), IsOk());
  EXPECT_EQ(purged, 3);
  EXPECT_EQ(Count("JOB_STATE_ACTIVE"), 1);
  EXPECT_EQ(client().MustGetJob(active).state(), v1::JOB_STATE_ACTIVE);
}

TEST_F(AdminRpcTest, PurgeRefusalsHaveExactCodes) {
  client().MustEnqueue(kQueue, "x");
  int64_t purged = -1;
  EXPECT_THAT(Purge(kQueue, {v1::JOB_STATE_READY, v1::JOB_STATE_ACTIVE}, &purged),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("states")));
  EXPECT_THAT(Purge(kQueue, {v1::JOB_STATE_UNSPECIFIED}, &purged),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("states[0]")));
  EXPECT_THAT(Purge(kQueue, {v1::JOB_STATE_READY, static_cast<v1::JobState>(9)}, &purged),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr("states[1]")));
  EXPECT_EQ(Count("JOB_STATE_READY"), 1) << "a refused purge removes nothing";
  EXPECT_THAT(Purge("never-used", {}, &purged), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(Purge("", {}, &purged), StatusIs(grpc::StatusCode::INVALID_ARGUMENT));
}

// ---------------------------------------------------------------------------------------------
// GetQueue

TEST_F(AdminRpcTest, QueueInfoHasActiveAndDeadCounts) {
  FailedJobs(2);
  CancelledJob();
  client().MustEnqueue(kQueue, "a");
  ASSERT_TRUE(client().LeaseOne(kQueue, "worker-1", kWait).has_value());
  v1::QueueInfo info;
  ASSERT_THAT(client().GetQueue(kQueue, &info), IsOk());
  EXPECT_EQ(info.active(), 1);
  EXPECT_EQ(info.dead(), 2);
  EXPECT_EQ(info.counts().at("JOB_STATE_CANCELLED"), 1);
}

}  // namespace
}  // namespace jobbroker::testing
