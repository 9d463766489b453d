// Broker.Work, the streaming worker protocol, against the real binary.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/work_stream_client.h"

namespace jobbroker::testing {
namespace {

using ::grpc::StatusCode;

// Retries due almost at once and exactly, so lease-expiry tests wait little.
constexpr char kConfig[] = R"({
  "defaultPolicy": {
    "retry": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s",
              "jitter": "JITTER_NONE"}
  }
})";

class StreamTest : public BrokerFixture {
 protected:
  StreamTest() : BrokerFixture({.config_json = kConfig}) {}

  std::unique_ptr<WorkStreamClient> NewStream() {
    return std::make_unique<WorkStreamClient>(broker());
  }
};

TEST_F(StreamTest, AJobEnqueuedToAnIdleWorkerIsPushed) {
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"emails"}, 1), StatusCode::OK);
  std::string id = client().MustEnqueue("emails", "welcome");
  // The push rides on the enqueue's own transition: by the time Enqueue returned, the job was
  // leased to the stream. The worker never asked again.
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_ACTIVE);
  std::optional<v1::LeasedJob> job = stream->NextJob();
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->job_id(), id);
  EXPECT_EQ(job->payload(), "welcome");
  EXPECT_EQ(job->attempt(), 1);
  EXPECT_EQ(job->idempotency_key(), id);
  EXPECT_EQ(stream->Ack(*job), StatusCode::OK);
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(StreamTest, MaxInFlightIsRespected) {
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"q"}, 2), StatusCode::OK);
  for (int i = 0; i < 5; ++i) client().MustEnqueue("q", absl::StrCat(i));
  std::map<std::string, int64_t> counts = client().Counts("q");
  EXPECT_EQ(counts["JOB_STATE_ACTIVE"], 2);
  EXPECT_EQ(counts["JOB_STATE_READY"], 3);
  std::optional<v1::LeasedJob> first = stream->NextJob();
  std::optional<v1::LeasedJob> second = stream->NextJob();
  ASSERT_TRUE(first && second);
  ASSERT_EQ(stream->Ack(*first), StatusCode::OK);
  std::optional<v1::LeasedJob> third = stream->NextJob();
  ASSERT_TRUE(third.has_value()) << "an ack frees a slot";
  counts = client().Counts("q");
  EXPECT_EQ(counts["JOB_STATE_ACTIVE"], 2);
  EXPECT_EQ(counts["JOB_STATE_READY"], 2);
}

TEST_F(StreamTest, JobsAreSpreadOverSeveralStreams) {
  std::vector<std::unique_ptr<WorkStreamClient>> streams;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(NewStream());
    ASSERT_EQ(streams.back()->Subscribe({"q"}, 10, absl::ZeroDuration(), absl::StrCat("w", i)),
              StatusCode::OK);
  }
  for (int i = 0; i < 9; ++i) client().MustEnqueue("q", absl::StrCat(i));
  std::set<std::string> seen;
  for (auto& s : streams) {
    for (int i = 0; i < 3; ++i) {
      std::optional<v1::LeasedJob> job = s->NextJob();
      ASSERT_TRUE(job.has_value()) << "each of three streams gets three of nine jobs";
      seen.insert(job->job_id());
    }
    EXPECT_EQ(s->pending_jobs(), 0u);
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST_F(StreamTest, MaxConcurrencyHoldsAcrossStreamsAndUnaryWorkers) {
  v1::UpdateQueuePolicyRequest policy;
  policy.set_queue("limited");
  policy.mutable_policy()->set_max_concurrency(2);
  v1::QueueInfo info;
  grpc::ClientContext ctx;
  ASSERT_TRUE(client().admin().UpdateQueuePolicy(&ctx, policy, &info).ok());
  for (int i = 0; i < 4; ++i) client().MustEnqueue("limited", absl::StrCat(i));
  std::optional<v1::LeasedJob> unary = client().LeaseOne("limited", "unary-worker");
  ASSERT_TRUE(unary.has_value());
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"limited"}, 5), StatusCode::OK);
  ASSERT_TRUE(stream->NextJob().has_value());
  EXPECT_EQ(client().Counts("limited")["JOB_STATE_ACTIVE"], 2);
  EXPECT_FALSE(client().LeaseOne("limited", "unary-2", absl::ZeroDuration()).has_value());
  client().MustAck(*unary);
  std::optional<v1::LeasedJob> freed = stream->NextJob();
  ASSERT_TRUE(freed.has_value()) << "the unary worker's slot goes to the stream";
  EXPECT_EQ(client().Counts("limited")["JOB_STATE_ACTIVE"], 2);
}

TEST_F(StreamTest, AnExpiredLeaseIsReportedLost) {
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"q"}, 1, absl::Milliseconds(500)), StatusCode::OK);
  std::string id = client().MustEnqueue("q");
  ASSERT_TRUE(stream->NextJob().has_value());
  std::optional<std::string> lost = stream->NextLeaseLost(absl::Seconds(30));
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(*lost, id);
}

TEST_F(StreamTest, FlowZeroDrains) {
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"q"}, 5), StatusCode::OK);
  ASSERT_EQ(stream->Flow(0), StatusCode::OK);
  std::string id = client().MustEnqueue("q");
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_READY)
      << "a drained stream gets nothing";
  ASSERT_EQ(stream->Flow(1), StatusCode::OK);
  std::optional<v1::LeasedJob> job = stream->NextJob();
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->job_id(), id);
}

TEST_F(StreamTest, ABrokenStreamsLeaseRunsOutAndAnotherWorkerGetsAttempt2) {
  auto dying = NewStream();
  ASSERT_EQ(dying->Subscribe({"q"}, 1, absl::Seconds(1), "dying"), StatusCode::OK);
  std::string id = client().MustEnqueue("q", "work");
  std::optional<v1::LeasedJob> first = dying->NextJob();
  ASSERT_TRUE(first.has_value());
  dying->Cancel();  // the worker's connection dies mid-job
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_ACTIVE)
      << "a broken stream does not end its leases";

  auto survivor = NewStream();
  ASSERT_EQ(survivor->Subscribe({"q"}, 1, absl::ZeroDuration(), "survivor"), StatusCode::OK);
  std::optional<v1::LeasedJob> second = survivor->NextJob(absl::Seconds(30));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->job_id(), id);
  EXPECT_EQ(second->attempt(), 2);
  EXPECT_EQ(survivor->Ack(*second), StatusCode::OK);
  v1::Job job = client().MustGetJob(id);
  ASSERT_EQ(job.attempts_size(), 2);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LEASE_EXPIRED);
  EXPECT_EQ(job.attempts(0).worker_id(), "dying");
  EXPECT_EQ(job.attempts(1).worker_id(), "survivor");
}

TEST_F(StreamTest, HeartbeatFailAndReleaseAreAnsweredOnTheStream) {
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"q"}, 1, absl::Seconds(30)), StatusCode::OK);
  std::string id = client().MustEnqueue("q");
  std::optional<v1::LeasedJob> job = stream->NextJob();
  ASSERT_TRUE(job.has_value());

  v1::WorkRequest hb;
  hb.mutable_heartbeat()->set_job_id(id);
  hb.mutable_heartbeat()->set_lease_id(job->lease_id());
  hb.mutable_heartbeat()->set_checkpoint("halfway");
  v1::WorkResult r = stream->Call(hb);
  EXPECT_EQ(r.code(), 0) << r.message();
  EXPECT_TRUE(r.has_lease_deadline());
  EXPECT_EQ(client().MustGetJob(id).checkpoint(), "halfway");

  v1::WorkRequest release;
  release.mutable_release()->set_job_id(id);
  release.mutable_release()->set_lease_id(job->lease_id());
  EXPECT_EQ(stream->Call(release).code(), 0);
  std::optional<v1::LeasedJob> again = stream->NextJob();
  ASSERT_TRUE(again.has_value()) << "released, it comes back to the free slot";
  EXPECT_EQ(again->attempt(), 1) << "a release counts no attempt";
  EXPECT_EQ(again->checkpoint(), "halfway");

  v1::WorkRequest fail;
  fail.mutable_fail()->set_job_id(id);
  fail.mutable_fail()->set_lease_id(again->lease_id());
  fail.mutable_fail()->set_error("bad input");
  fail.mutable_fail()->set_permanent(true);
  EXPECT_EQ(stream->Call(fail).code(), 0);
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_FAILED);

  // A stale lease is refused with the reason, on the stream too.
  v1::WorkResult stale = stream->Call(hb);
  EXPECT_EQ(stale.code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_FALSE(stale.message().empty());
}

TEST_F(StreamTest, CancellingAHeldJobIsPushed) {
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"q"}, 1), StatusCode::OK);
  std::string id = client().MustEnqueue("q");
  ASSERT_TRUE(stream->NextJob().has_value());
  v1::Job cancelled;
  ASSERT_TRUE(client().CancelJob(id, &cancelled).ok());
  std::optional<std::string> notice = stream->NextCancel();
  ASSERT_TRUE(notice.has_value());
  EXPECT_EQ(*notice, id);
}

// Enqueues `n` jobs into `queue` in one EnqueueBatch; their ids in order.
std::vector<std::string> EnqueueMany(BrokerClient& client, const std::string& queue, int n) {
  v1::EnqueueBatchRequest req;
  for (int i = 0; i < n; ++i) {
    v1::EnqueueRequest* job = req.add_jobs();
    job->set_queue(queue);
    job->set_payload(absl::StrCat("job-", i));
  }
  v1::EnqueueBatchResponse resp;
  grpc::Status s = client.EnqueueBatch(req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::vector<std::string> ids;
  for (const v1::EnqueueResponse& r : resp.results()) ids.push_back(r.job_id());
  return ids;
}

TEST_F(StreamTest, AStreamThatTakesBatchesGetsJobsLeasedTogetherInOneMessage) {
  std::vector<std::string> ids = EnqueueMany(client(), "bulk", 200);
  ASSERT_EQ(ids.size(), 200u);
  auto stream = NewStream();
  // The subscription leases all 200 in one transition; they reach the stream together.
  ASSERT_EQ(stream->Subscribe({"bulk"}, 200, absl::ZeroDuration(), "batcher",
                              /*batch_pushes=*/true),
            StatusCode::OK);
  std::set<std::string> got;
  for (int i = 0; i < 200; ++i) {
    std::optional<v1::LeasedJob> job = stream->NextJob();
    ASSERT_TRUE(job.has_value()) << "job " << i << " of 200 did not arrive";
    EXPECT_TRUE(got.insert(job->job_id()).second) << "pushed twice: " << job->job_id();
  }
  EXPECT_EQ(got, std::set<std::string>(ids.begin(), ids.end()));
  EXPECT_EQ(stream->job_messages(), 1u) << "200 jobs leased together should be one message";
  EXPECT_EQ(stream->job_batches(), 1u);
  EXPECT_EQ(client().Counts("bulk")["JOB_STATE_ACTIVE"], 200);
}

TEST_F(StreamTest, AStreamThatDoesNotAskForBatchesGetsOneJobPerMessage) {
  EnqueueMany(client(), "single", 50);
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"single"}, 50), StatusCode::OK);
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(stream->NextJob().has_value()) << i;
  EXPECT_EQ(stream->job_messages(), 50u);
  EXPECT_EQ(stream->job_batches(), 0u);
}

TEST_F(StreamTest, AnAckBatchAppliesEachAckAndListsTheOnesThatFailed) {
  EnqueueMany(client(), "acks", 3);
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"acks"}, 3), StatusCode::OK);
  std::vector<v1::LeasedJob> jobs;
  for (int i = 0; i < 3; ++i) {
    std::optional<v1::LeasedJob> job = stream->NextJob();
    ASSERT_TRUE(job.has_value());
    jobs.push_back(*job);
  }
  v1::WorkRequest r;
  for (const v1::LeasedJob& job : jobs) {
    v1::AckRequest* ack = r.mutable_ack_batch()->add_acks();
    ack->set_job_id(job.job_id());
    ack->set_lease_id(job.lease_id());
    ack->set_result(absl::StrCat("done-", job.job_id()));
  }
  r.mutable_ack_batch()->mutable_acks(1)->set_lease_id("stale");
  v1::WorkResult result = stream->Call(r);
  EXPECT_EQ(result.code(), grpc::StatusCode::OK) << result.message();
  ASSERT_EQ(result.item_errors_size(), 1);
  EXPECT_EQ(result.item_errors(0).index(), 1);
  EXPECT_EQ(result.item_errors(0).code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(result.item_errors(0).message(), ::testing::StartsWith("acks[1]: lease stale"));
  EXPECT_EQ(client().MustGetJob(jobs[0].job_id()).state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(client().MustGetJob(jobs[0].job_id()).result(), "done-" + jobs[0].job_id());
  EXPECT_EQ(client().MustGetJob(jobs[1].job_id()).state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(client().MustGetJob(jobs[2].job_id()).state(), v1::JOB_STATE_COMPLETED);

  // Sent again (a worker that reconnected before it saw the answer): the applied acks stay OK.
  r.mutable_ack_batch()->mutable_acks(1)->set_lease_id(jobs[1].lease_id());
  result = stream->Call(r);
  EXPECT_EQ(result.code(), grpc::StatusCode::OK) << result.message();
  EXPECT_EQ(result.item_errors_size(), 0);
  EXPECT_EQ(client().Counts("acks")["JOB_STATE_COMPLETED"], 3);
}

TEST_F(StreamTest, BadRequestsGetAResultNamingTheField) {
  auto stream = NewStream();
  EXPECT_EQ(stream->Flow(1), StatusCode::FAILED_PRECONDITION) << "flow before subscribe";
  v1::WorkRequest bad;
  bad.mutable_subscribe()->set_worker_id("w");
  v1::WorkResult r = stream->Call(bad);
  EXPECT_EQ(r.code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.message(), ::testing::HasSubstr("queues"));
  v1::WorkResult empty = stream->Call(v1::WorkRequest());
  EXPECT_EQ(empty.code(), StatusCode::INVALID_ARGUMENT);
  ASSERT_EQ(stream->Subscribe({"q"}, 1), StatusCode::OK);
  EXPECT_EQ(stream->Subscribe({"q"}, 1), StatusCode::FAILED_PRECONDITION) << "subscribe twice";
}

TEST_F(StreamTest, AHalfClosedStreamFinishesOk) {
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"q"}, 1), StatusCode::OK);
  EXPECT_TRUE(stream->Close().ok());
  std::string id = client().MustEnqueue("q");
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_READY);
}

TEST_F(StreamTest, ShutdownEndsStreamsWithUnavailable) {
  auto stream = NewStream();
  ASSERT_EQ(stream->Subscribe({"q"}, 1), StatusCode::OK);
  absl::StatusOr<int> code = process().Terminate();
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  grpc::Status end = stream->Close();
  EXPECT_EQ(end.error_code(), StatusCode::UNAVAILABLE) << end.error_message();
}

}  // namespace
}  // namespace jobbroker::testing

namespace jobbroker::testing {
namespace {

// The limit is a flag; the second test starts no broker that serves.
class StreamLimitTest : public BrokerFixture {
 protected:
  StreamLimitTest() : BrokerFixture(kStartInTest) {}
};

TEST_F(StreamLimitTest, StreamsBeyondMaxWorkStreamsAreRefusedUntilOneCloses) {
  ASSERT_NO_FATAL_FAILURE(Start({.extra_args = {"--max-work-streams", "2"}}));
  v1::Broker::Stub* stub = &broker();
  auto first = std::make_unique<WorkStreamClient>(*stub);
  auto second = std::make_unique<WorkStreamClient>(*stub);
  ASSERT_EQ(first->Subscribe({"q"}, 1), StatusCode::OK);
  ASSERT_EQ(second->Subscribe({"q"}, 1), StatusCode::OK);

  // The third is finished at once, before it can subscribe.
  WorkStreamClient third(*stub);
  grpc::Status refused = third.Close();
  EXPECT_EQ(refused.error_code(), StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("--max-work-streams"));

  // A closed stream gives its slot back.
  EXPECT_TRUE(first->Close().ok());
  first.reset();
  // The broker learns of the close asynchronously: try again until it has.
  EXPECT_TRUE(WaitFor([&] {
    WorkStreamClient again(*stub);
    return again.Subscribe({"q"}, 1) == StatusCode::OK;
  }));
}

TEST_F(StreamLimitTest, ABadMaxWorkStreamsIsRefusedAtStart) {
  auto dir = TempDir::Create();
  ASSERT_TRUE(dir.ok());
  for (const char* bad : {"0", "-1", "many", "1000001"}) {
    auto result = RunBrokerToExit(**dir, {"--check-config", "--max-work-streams", bad});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 1) << bad;
    EXPECT_THAT(result->stderr_text, ::testing::HasSubstr("--max-work-streams")) << bad;
  }
}

}  // namespace
}  // namespace jobbroker::testing
