#include "core/policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::HasSubstr;

RetryPolicy Retry(Jitter jitter) {
  RetryPolicy r;
  r.initial_backoff = absl::Seconds(1);
  r.backoff_multiplier = 2.0;
  r.max_backoff = absl::Seconds(10);
  r.jitter = jitter;
  return r;
}

TEST(RetryPolicyTest, BaseBackoffGrowsExponentiallyUpToTheCap) {
  RetryPolicy r = Retry(Jitter::kNone);
  EXPECT_EQ(r.BaseBackoff(1), absl::Seconds(1));
  EXPECT_EQ(r.BaseBackoff(2), absl::Seconds(2));
  EXPECT_EQ(r.BaseBackoff(3), absl::Seconds(4));
  EXPECT_EQ(r.BaseBackoff(4), absl::Seconds(8));
  EXPECT_EQ(r.BaseBackoff(5), absl::Seconds(10));
  EXPECT_EQ(r.BaseBackoff(1000), absl::Seconds(10));  // no overflow on a poison job
}

TEST(RetryPolicyTest, NoJitterWaitsTheBaseBackoff) {
  RetryPolicy r = Retry(Jitter::kNone);
  EXPECT_EQ(r.Backoff(3, 0.0), absl::Seconds(4));
  EXPECT_EQ(r.Backoff(3, 0.99), absl::Seconds(4));
}

TEST(RetryPolicyTest, FullJitterIsUniformFromZeroToTheBackoff) {
  RetryPolicy r = Retry(Jitter::kFull);
  EXPECT_EQ(r.Backoff(3, 0.0), absl::ZeroDuration());
  EXPECT_EQ(r.Backoff(3, 0.25), absl::Seconds(1));
  EXPECT_EQ(r.Backoff(3, 0.5), absl::Seconds(2));
}

TEST(RetryPolicyTest, EqualJitterKeepsHalfAndRandomisesTheOtherHalf) {
  RetryPolicy r = Retry(Jitter::kEqual);
  EXPECT_EQ(r.Backoff(3, 0.0), absl::Seconds(2));
  EXPECT_EQ(r.Backoff(3, 0.5), absl::Seconds(3));
  EXPECT_EQ(r.Backoff(5, 0.5), absl::Seconds(7.5));
}

TEST(RetryPolicyTest, DefaultsAreTheDesignDefaults) {
  QueuePolicy p;
  EXPECT_EQ(p.retry.max_attempts, 5);
  EXPECT_EQ(p.retry.initial_backoff, absl::Seconds(1));
  EXPECT_EQ(p.retry.backoff_multiplier, 2.0);
  EXPECT_EQ(p.retry.max_backoff, absl::Minutes(5));
  EXPECT_EQ(p.retry.jitter, Jitter::kFull);
  EXPECT_EQ(p.lease_duration, absl::Seconds(30));
  EXPECT_EQ(p.dedup_ttl, absl::Hours(24));
  EXPECT_EQ(p.completed_retention.max_count, 1000);
  EXPECT_EQ(p.failed_retention.max_age, absl::Hours(24 * 7));
  EXPECT_EQ(p.max_payload_bytes, 1 << 20);
  EXPECT_EQ(p.durability, Durability::kSync);
  EXPECT_EQ(p.group_commit_delay, absl::Milliseconds(10));
}

TEST(PolicyOverrideTest, LayersApplyInOrderAndOnlySetFieldsOverride) {
  PolicyOverride config;
  config.max_attempts = 3;
  config.max_concurrency = 4;
  PolicyOverride runtime;
  runtime.max_concurrency = 9;
  PolicyOverride merged = config;
  merged.MergeFrom(runtime);
  QueuePolicy p = merged.ApplyTo(QueuePolicy{});
  EXPECT_EQ(p.retry.max_attempts, 3);
  EXPECT_EQ(p.max_concurrency, 9);
  EXPECT_EQ(p.lease_duration, absl::Seconds(30));
}

TEST(ValidatePolicyTest, NamesTheBadField) {
  QueuePolicy p;
  p.retry.max_attempts = 0;
  absl::Status s = ValidatePolicy(p, "queues[\"q\"]");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("queues[\"q\"].retry.max_attempts"));

  p = QueuePolicy{};
  p.retry.max_attempts = 1001;
  EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("retry.max_attempts"));
  p = QueuePolicy{};
  p.lease_duration = absl::Milliseconds(10);
  EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("policy.lease_duration"));
  p = QueuePolicy{};
  p.retry.backoff_multiplier = 0.5;
  EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("backoff_multiplier"));
  for (int64_t bad : {int64_t{0}, kMaxPayloadBytesCeiling + 1}) {
    p = QueuePolicy{};
    p.max_payload_bytes = bad;
    EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("policy.max_payload_bytes")) << bad;
  }
  p = QueuePolicy{};
  p.max_payload_bytes = kMaxPayloadBytesCeiling;
  EXPECT_TRUE(ValidatePolicy(p).ok());
  for (absl::Duration bad : {absl::Microseconds(999), absl::Seconds(1) + absl::Microseconds(1)}) {
    p = QueuePolicy{};
    p.group_commit_delay = bad;
    EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("policy.group_commit_delay")) << bad;
  }
  p = QueuePolicy{};
  p.durability = static_cast<Durability>(4);
  EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("policy.durability"));
  p = QueuePolicy{};
  p.durability = Durability::kGroup;
  p.group_commit_delay = absl::Seconds(1);
  EXPECT_TRUE(ValidatePolicy(p).ok());
  EXPECT_TRUE(ValidatePolicy(QueuePolicy{}).ok());
}

}  // namespace
}  // namespace jobbroker::core
