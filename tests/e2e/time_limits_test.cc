// Run-time limits, snoozes and expiry against the real binary: one config -> effect check each
// (core/broker_time_limits_test.cc pins the arithmetic on the fake clock). Waits are for events
// with generous deadlines, never assertions on how long something took.
#include <memory>
#include <string>

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
using ::testing::HasSubstr;

// Retries at once by default; "limited" times attempts out after 0.3 s and retries a minute
// later (so the timed-out job is not pushed again while the test looks at it).
constexpr char kConfig[] = R"({
  "defaultPolicy": {
    "retry": {"maxAttempts": 2, "initialBackoff": "0s", "maxBackoff": "0s",
              "jitter": "JITTER_NONE"}
  },
  "queues": {"limited": {"timeout": "0.3s", "retry": {"initialBackoff": "60s", "maxBackoff": "60s"}}, "capped": {"maxSnoozes": 1}}
})";

google::protobuf::Duration Dur(absl::Duration d) {
  google::protobuf::Duration out;
  out.set_seconds(absl::IDivDuration(d, absl::Seconds(1), &d));
  out.set_nanos(static_cast<int32_t>(d / absl::Nanoseconds(1)));
  return out;
}

class TimeLimitsTest : public BrokerFixture {
 protected:
  TimeLimitsTest() : BrokerFixture({.config_json = kConfig}) {}

  v1::Job Job(const std::string& id) { return client().MustGetJob(id); }
};

TEST_F(TimeLimitsTest, AHeartbeatingAttemptPastItsTimeoutEndsAndItsStreamIsToldAtOnce) {
  WorkStreamClient stream(broker());
  ASSERT_EQ(stream.Subscribe({"limited"}, 1, absl::Minutes(5)), StatusCode::OK);
  const std::string id = client().MustEnqueue("limited", "slow");
  std::optional<v1::LeasedJob> job = stream.NextJob();
  ASSERT_TRUE(job.has_value());
  ASSERT_TRUE(job->has_timeout_at()) << "helpers need it to cancel the handler";
  std::optional<v1::LeaseLost> lost = stream.NextLeaseLostNotice(absl::Seconds(20));
  ASSERT_TRUE(lost.has_value()) << "the stream was not told of the time-out";
  EXPECT_EQ(lost->job_id(), id);
  EXPECT_EQ(lost->outcome(), v1::ATTEMPT_OUTCOME_TIMED_OUT);

  v1::WorkRequest heartbeat;
  heartbeat.mutable_heartbeat()->set_job_id(job->job_id());
  heartbeat.mutable_heartbeat()->set_lease_id(job->lease_id());
  v1::WorkResult answer = stream.Call(heartbeat);
  EXPECT_EQ(answer.code(), static_cast<int>(StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(answer.message(), HasSubstr("timed out"));
  EXPECT_EQ(stream.Ack(*job), StatusCode::FAILED_PRECONDITION);

  v1::Job after = Job(id);
  ASSERT_GE(after.attempts_size(), 1);
  EXPECT_EQ(after.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_TIMED_OUT);
}

TEST_F(TimeLimitsTest, ASnoozedJobComesBackWithoutSpendingAnAttemptUntilItsLimit) {
  v1::EnqueueRequest req;
  req.set_queue("snoozy");
  req.set_payload("later");
  req.set_max_attempts(1);
  const std::string id = client().MustEnqueue(req);
  std::optional<v1::LeasedJob> first = client().LeaseOne("snoozy", "w");
  ASSERT_TRUE(first.has_value());
  v1::ReleaseRequest snooze;
  snooze.set_job_id(first->job_id());
  snooze.set_lease_id(first->lease_id());
  *snooze.mutable_delay() = Dur(absl::Milliseconds(200));
  ASSERT_TRUE(client().Release(snooze).ok());
  v1::Job snoozed = Job(id);
  EXPECT_EQ(snoozed.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(snoozed.snoozes(), 1);
  std::optional<v1::LeasedJob> second = client().LeaseOne("snoozy", "w", absl::Seconds(20));
  ASSERT_TRUE(second.has_value()) << "the snoozed job never came back";
  EXPECT_EQ(second->attempt(), 1) << "a snooze is not an attempt";
  client().MustAck(*second);
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_COMPLETED);

  // "capped" allows one snooze: the second fails the job.
  const std::string capped = client().MustEnqueue("capped", "capped");
  for (int i = 0; i < 2; ++i) {
    std::optional<v1::LeasedJob> leased = client().LeaseOne("capped", "w", absl::Seconds(20));
    ASSERT_TRUE(leased.has_value());
    v1::ReleaseRequest r;
    r.set_job_id(leased->job_id());
    r.set_lease_id(leased->lease_id());
    *r.mutable_delay() = Dur(absl::Milliseconds(100));
    ASSERT_TRUE(client().Release(r).ok());
  }
  v1::Job dead = Job(capped);
  EXPECT_EQ(dead.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(dead.fail_reason(), v1::FAIL_REASON_SNOOZE_LIMIT);
}

TEST_F(TimeLimitsTest, AJobNotStartedByItsExpireAtDiesExpiredAndIsNeverLeased) {
  v1::UpdateQueuePolicyRequest pause;
  pause.set_queue("expiring");
  pause.mutable_policy()->set_paused(true);
  v1::QueueInfo info;
  ASSERT_TRUE(client().UpdateQueuePolicy(pause, &info).ok());
  v1::EnqueueRequest req;
  req.set_queue("expiring");
  req.set_payload("stale soon");
  const absl::Time expire_at = absl::Now() + absl::Milliseconds(300);
  req.mutable_expire_at()->set_seconds(absl::ToUnixSeconds(expire_at));
  req.mutable_expire_at()->set_nanos(
      static_cast<int32_t>(absl::ToUnixNanos(expire_at) % 1'000'000'000));
  const std::string id = client().MustEnqueue(req);
  ASSERT_TRUE(WaitFor([&] { return Job(id).state() == v1::JOB_STATE_FAILED; }))
      << "the job did not expire";
  EXPECT_EQ(Job(id).fail_reason(), v1::FAIL_REASON_EXPIRED);
  ASSERT_TRUE(client().ResumeQueue("expiring", &info).ok());
  EXPECT_FALSE(client().LeaseOne("expiring", "w", absl::Milliseconds(300)).has_value());
}

TEST_F(TimeLimitsTest, ARunTimeLimitHoldsAcrossAKill9) {
  v1::EnqueueRequest req;
  req.set_queue("durable-limit");
  req.set_payload("p");
  *req.mutable_timeout() = Dur(absl::Seconds(1));
  const std::string id = client().MustEnqueue(req);
  std::optional<v1::LeasedJob> job =
      client().LeaseOne("durable-limit", "w", absl::ZeroDuration(), absl::Hours(1));
  ASSERT_TRUE(job.has_value());
  Kill9AndRestart();
  // The lease has an hour left; only the limit can end the attempt.
  ASSERT_TRUE(WaitFor([&] {
    v1::Job j = Job(id);
    return j.attempts_size() >= 1 && j.attempts(0).outcome() == v1::ATTEMPT_OUTCOME_TIMED_OUT;
  })) << "the attempt did not time out after the restart";
  EXPECT_EQ(Job(id).timeout().seconds(), 1);
}

}  // namespace
}  // namespace jobbroker::testing
