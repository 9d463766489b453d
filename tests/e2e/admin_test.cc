// The Admin service end to end: job and queue inspection, pagination, run-time policy changes
// (and that they persist), and config-file validation at start.

#include <map>
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
#include "tests/testing/matchers.h"

namespace jobbroker::testing {
namespace {

constexpr char kQueue[] = "admin";
constexpr absl::Duration kWait = absl::Seconds(10);

class AdminTest : public BrokerFixture {
 protected:
  // Enqueues `n` jobs with payloads "<prefix>0".. in one batch; returns their ids in order.
  std::vector<std::string> EnqueueN(int n, const std::string& queue = kQueue,
                                    const std::string& prefix = "job-") {
    v1::EnqueueBatchRequest req;
    for (int i = 0; i < n; ++i) {
      v1::EnqueueRequest* job = req.add_jobs();
      job->set_queue(queue);
      job->set_payload(absl::StrCat(prefix, i));
    }
    v1::EnqueueBatchResponse resp;
    EXPECT_THAT(client().EnqueueBatch(req, &resp), IsOk());
    std::vector<std::string> ids;
    for (const v1::EnqueueResponse& r : resp.results()) ids.push_back(r.job_id());
    EXPECT_THAT(ids, SizeIs(n));
    return ids;
  }

  grpc::Status SetMaxConcurrency(const std::string& queue, int n, v1::QueueInfo* info) {
    v1::UpdateQueuePolicyRequest req;
    req.set_queue(queue);
    req.mutable_policy()->set_max_concurrency(n);
    return client().UpdateQueuePolicy(req, info);
  }
};

std::vector<std::string> IdsOf(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const v1::Job& j : jobs) ids.push_back(j.id());
  return ids;
}

TEST_F(AdminTest, GetJobShowsWhatWasEnqueued) {
  v1::EnqueueRequest req;
  req.set_queue(kQueue);
  req.set_payload("payload-bytes");
  (*req.mutable_headers())["content-type"] = "text/plain";
  req.set_priority(7);
  req.set_dedup_key("dedup-1");
  req.set_concurrency_key("tenant-a");
  req.set_max_attempts(4);
  const absl::Time before = absl::Now();
  const std::string id = client().MustEnqueue(req);

  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.id(), id);
  EXPECT_EQ(job.queue(), kQueue);
  EXPECT_EQ(job.state(), v1::JOB_STATE_READY);
  EXPECT_EQ(job.payload(), "payload-bytes");
  EXPECT_EQ(job.headers().at("content-type"), "text/plain");
  EXPECT_EQ(job.priority(), 7);
  EXPECT_EQ(job.attempt(), 0);
  EXPECT_EQ(job.max_attempts(), 4);
  EXPECT_EQ(job.dedup_key(), "dedup-1");
  EXPECT_EQ(job.concurrency_key(), "tenant-a");
  EXPECT_EQ(job.idempotency_key(), "dedup-1");
  EXPECT_GE(FromProto(job.created_at()), before - absl::Seconds(1));
  EXPECT_THAT(job.attempts(), SizeIs(0));
  EXPECT_EQ(job.fail_reason(), v1::FAIL_REASON_UNSPECIFIED);
}

TEST_F(AdminTest, ListJobsFiltersByState) {
  const std::vector<std::string> ids = EnqueueN(5);
  for (int i = 0; i < 2; ++i) {
    std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait);
    ASSERT_TRUE(job.has_value());
    client().MustAck(*job);
  }
  std::optional<v1::LeasedJob> active = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(active.has_value());

  EXPECT_EQ(IdsOf(client().ListAll(kQueue, v1::JOB_STATE_COMPLETED)),
            (std::vector<std::string>{ids[0], ids[1]}));
  EXPECT_EQ(IdsOf(client().ListAll(kQueue, v1::JOB_STATE_ACTIVE)),
            (std::vector<std::string>{ids[2]}));
  EXPECT_EQ(IdsOf(client().ListAll(kQueue, v1::JOB_STATE_READY)),
            (std::vector<std::string>{ids[3], ids[4]}));
  EXPECT_THAT(client().ListAll(kQueue, v1::JOB_STATE_FAILED), SizeIs(0));
  EXPECT_EQ(IdsOf(client().ListAll(kQueue, v1::JOB_STATE_UNSPECIFIED)), ids);
  for (const v1::Job& job : client().ListAll(kQueue, v1::JOB_STATE_READY)) {
    EXPECT_EQ(job.state(), v1::JOB_STATE_READY);
  }
}

TEST_F(AdminTest, ListJobsPaginatesUntilTheTokenIsEmpty) {
  const std::vector<std::string> ids = EnqueueN(25);
  EnqueueN(3, "other-queue");

  std::vector<std::string> seen;
  v1::ListJobsRequest req;
  req.set_queue(kQueue);
  req.set_page_size(7);
  int pages = 0;
  while (true) {
    v1::ListJobsResponse resp;
    ASSERT_THAT(client().ListJobs(req, &resp), IsOk());
    ASSERT_LE(resp.jobs_size(), 7);
    for (const v1::Job& job : resp.jobs()) seen.push_back(job.id());
    ++pages;
    ASSERT_LE(pages, 10) << "pagination does not end";
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  EXPECT_GE(pages, 4);
  // Oldest first, each exactly once, nothing from the other queue.
  EXPECT_EQ(seen, ids);

  // newest_first reverses the order.
  std::vector<std::string> newest;
  req.set_page_token("");
  req.set_newest_first(true);
  for (int page = 0; page < 10; ++page) {
    v1::ListJobsResponse resp;
    ASSERT_THAT(client().ListJobs(req, &resp), IsOk());
    for (const v1::Job& job : resp.jobs()) newest.push_back(job.id());
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  EXPECT_EQ(newest, std::vector<std::string>(ids.rbegin(), ids.rend()));
}

TEST_F(AdminTest, GetQueueCountsJobsByState) {
  EnqueueN(6);
  v1::EnqueueRequest delayed;
  delayed.set_queue(kQueue);
  *delayed.mutable_delay() = ToProto(absl::Hours(1));
  client().MustEnqueue(delayed);

  std::vector<v1::LeasedJob> leased = client().MustLease(kQueue, "worker-1", 3, kWait);
  ASSERT_THAT(leased, SizeIs(3));
  client().MustAck(leased[0]);
  v1::FailRequest fail;
  fail.set_job_id(leased[1].job_id());
  fail.set_lease_id(leased[1].lease_id());
  fail.set_permanent(true);
  fail.set_error("bad");
  v1::FailResponse fail_resp;
  ASSERT_THAT(client().Fail(fail, &fail_resp), IsOk());

  v1::QueueInfo info;
  ASSERT_THAT(client().GetQueue(kQueue, &info), IsOk());
  EXPECT_EQ(info.name(), kQueue);
  EXPECT_EQ(client().Counts(kQueue), (std::map<std::string, int64_t>{
                                         {"JOB_STATE_READY", 3},
                                         {"JOB_STATE_SCHEDULED", 1},
                                         {"JOB_STATE_ACTIVE", 1},
                                         {"JOB_STATE_COMPLETED", 1},
                                         {"JOB_STATE_FAILED", 1},
                                     }));
  // The effective policy has every field set: the built-in defaults here.
  EXPECT_TRUE(info.policy().has_max_concurrency());
  EXPECT_EQ(info.policy().retry().max_attempts(), 5);
  EXPECT_EQ(FromProto(info.policy().lease_duration()), absl::Seconds(30));
  EXPECT_EQ(info.policy().retry().jitter(), v1::JITTER_FULL);
}

TEST_F(AdminTest, GetQueueOfAnUnknownQueueIsNotFound) {
  v1::QueueInfo info;
  EXPECT_THAT(client().GetQueue("nobody-used-this", &info), StatusIs(grpc::StatusCode::NOT_FOUND));
}

TEST_F(AdminTest, MaxConcurrencyOneHoldsTheSecondLease) {
  v1::QueueInfo info;
  ASSERT_THAT(SetMaxConcurrency(kQueue, 1, &info), IsOk());
  EXPECT_EQ(info.policy().max_concurrency(), 1);
  EnqueueN(2);

  std::optional<v1::LeasedJob> first = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(first.has_value());
  EXPECT_THAT(client().MustLease(kQueue, "worker-2"), SizeIs(0));
  EXPECT_THAT(client().MustLease(kQueue, "worker-2", 5), SizeIs(0));

  client().MustAck(*first);
  std::optional<v1::LeasedJob> second = client().LeaseOne(kQueue, "worker-2", kWait);
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(second->job_id(), first->job_id());
}

TEST_F(AdminTest, PolicyChangeKeepsFieldsNotNamed) {
  v1::UpdateQueuePolicyRequest req;
  req.set_queue(kQueue);
  req.mutable_policy()->mutable_retry()->set_max_attempts(9);
  v1::QueueInfo info;
  ASSERT_THAT(client().UpdateQueuePolicy(req, &info), IsOk());
  ASSERT_THAT(SetMaxConcurrency(kQueue, 2, &info), IsOk());
  EXPECT_EQ(info.policy().max_concurrency(), 2);
  EXPECT_EQ(info.policy().retry().max_attempts(), 9);
}

TEST_F(AdminTest, PolicyChangeSurvivesAGracefulRestart) {
  v1::UpdateQueuePolicyRequest req;
  req.set_queue(kQueue);
  req.mutable_policy()->set_max_concurrency(1);
  req.mutable_policy()->mutable_retry()->set_max_attempts(7);
  v1::QueueInfo info;
  ASSERT_THAT(client().UpdateQueuePolicy(req, &info), IsOk());
  EnqueueN(2);

  absl::StatusOr<int> code = process().Terminate();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << process().ReadStderr();
  ASSERT_NO_FATAL_FAILURE(Restart());

  ASSERT_THAT(client().GetQueue(kQueue, &info), IsOk());
  EXPECT_EQ(info.policy().max_concurrency(), 1);
  EXPECT_EQ(info.policy().retry().max_attempts(), 7);
  std::optional<v1::LeasedJob> first = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->max_attempts(), 7);
  EXPECT_THAT(client().MustLease(kQueue, "worker-2"), SizeIs(0));
}

TEST_F(AdminTest, PolicyChangeSurvivesKill9) {
  v1::QueueInfo info;
  ASSERT_THAT(SetMaxConcurrency(kQueue, 1, &info), IsOk());
  EnqueueN(2);
  ASSERT_NO_FATAL_FAILURE(Kill9AndRestart());

  ASSERT_THAT(client().GetQueue(kQueue, &info), IsOk());
  EXPECT_EQ(info.policy().max_concurrency(), 1);
  ASSERT_TRUE(client().LeaseOne(kQueue, "worker-1", kWait).has_value());
  EXPECT_THAT(client().MustLease(kQueue, "worker-2"), SizeIs(0));
}

TEST_F(AdminTest, ConfigFilePoliciesApply) {
  ASSERT_NO_FATAL_FAILURE(Start({.config_json = R"({"queues": {"configured": {"maxConcurrency": 2,
      "retry": {"maxAttempts": 2, "initialBackoff": "1s", "jitter": "JITTER_NONE"}}}})"}));
  v1::QueueInfo info;
  EnqueueN(3, "configured");
  ASSERT_THAT(client().GetQueue("configured", &info), IsOk());
  EXPECT_EQ(info.policy().max_concurrency(), 2);
  EXPECT_EQ(info.policy().retry().max_attempts(), 2);
  EXPECT_EQ(FromProto(info.policy().retry().initial_backoff()), absl::Seconds(1));
  EXPECT_EQ(info.policy().retry().jitter(), v1::JITTER_NONE);
  EXPECT_THAT(client().MustLease("configured", "worker-1", 3, kWait), SizeIs(2));
}

// The binary itself refuses a bad config, before it serves.
class BadConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
  }

  ExitResult RunWithConfig(const std::string& json) {
    absl::StatusOr<std::string> config = WriteConfig(*dir_, json);
    EXPECT_TRUE(config.ok()) << config.status();
    absl::StatusOr<ExitResult> result = RunBrokerToExit(
        *dir_, {"--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--data-dir",
                absl::StrCat(dir_->path(), "/data"), "--config", config.value_or("")});
    EXPECT_TRUE(result.ok()) << result.status();
    return result.value_or(ExitResult{});
  }

  std::unique_ptr<TempDir> dir_;
};

TEST_F(BadConfigTest, ZeroMaxAttemptsIsRefusedNamingTheField) {
  ExitResult result = RunWithConfig(R"({"defaultPolicy":{"retry":{"maxAttempts":0}}})");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.stderr_text, HasSubstr("max_attempts"));
  EXPECT_THAT(result.stdout_text, Not(HasSubstr("serving")));
}

TEST_F(BadConfigTest, BadQueuePolicyIsRefusedNamingTheField) {
  ExitResult result =
      RunWithConfig(R"({"queues":{"q":{"retry":{"maxAttempts":3,"backoffMultiplier":0.5}}}})");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.stderr_text, HasSubstr("backoff_multiplier"));
  EXPECT_THAT(result.stdout_text, Not(HasSubstr("serving")));
}

TEST_F(BadConfigTest, InvalidJsonIsRefused) {
  ExitResult result = RunWithConfig(R"({"queues": {"q": )");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_FALSE(result.stderr_text.empty());
  EXPECT_THAT(result.stdout_text, Not(HasSubstr("serving")));
}

TEST_F(BadConfigTest, UnknownFieldIsRefused) {
  ExitResult result = RunWithConfig(R"({"defaultPolicy":{"maxConcurency":2}})");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.stderr_text, HasSubstr("maxConcurency"));
  EXPECT_THAT(result.stdout_text, Not(HasSubstr("serving")));
}

}  // namespace
}  // namespace jobbroker::testing
