// Queue policies that shape leasing: fairness across concurrency keys, max_concurrency_per_key,
// and the rate limit's token bucket, on the fake clock.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {
namespace {

using ::jobbroker::testing::StatusIs;
using ::testing::ElementsAre;

class BrokerPolicyTest : public BrokerFixture {
 protected:
  std::string EnqueueKeyed(const std::string& queue, const std::string& key,
                           const std::string& payload = "p") {
    auto r =
        broker_->Enqueue(EnqueueSpec{.queue = queue, .payload = payload, .concurrency_key = key});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id : "";
  }
  // The concurrency keys of the next `n` leases, one lease call each.
  std::vector<std::string> LeaseKeys(const std::string& queue, int n) {
    std::vector<std::string> keys;
    for (int i = 0; i < n; ++i) {
      auto r = broker_->Lease(LeaseSpec{queue, "w", 1, absl::Hours(1)});
      if (!r.ok() || r->empty()) break;
      keys.push_back(Get(r->front().job_id).concurrency_key);
    }
    return keys;
  }
  void SetPolicy(const std::string& queue, PolicyOverride p) {
    ASSERT_TRUE(broker_->UpdateQueuePolicy(queue, p).ok());
  }
};

TEST_F(BrokerPolicyTest, KeysTakeTurnsSoABusyTenantStarvesNoOne) {
  for (int i = 0; i < 1000; ++i) EnqueueKeyed("q", "big");
  for (int k = 0; k < 10; ++k)
    for (int i = 0; i < 10; ++i) EnqueueKeyed("q", absl::StrCat("small", k));
  std::vector<std::string> first = LeaseKeys("q", 11);
  std::vector<std::string> expected = {"big"};
  for (int k = 0; k < 10; ++k) expected.push_back(absl::StrCat("small", k));
  EXPECT_EQ(first, expected) << "the first round serves every key once";
  // After 10 rounds the small keys are done: 110 leases took 100 small jobs and 10 big ones.
  std::vector<std::string> rest = LeaseKeys("q", 99);
  std::map<std::string, int> per_key;
  for (const std::string& k : first) ++per_key[k];
  for (const std::string& k : rest) ++per_key[k];
  EXPECT_EQ(per_key["big"], 10);
  for (int k = 0; k < 10; ++k) EXPECT_EQ(per_key[absl::StrCat("small", k)], 10);
}

TEST_F(BrokerPolicyTest, PriorityOrdersJobsWithinAKey) {
  std::string low = EnqueueKeyed("q", "a", "low");
  ASSERT_TRUE(broker_
                  ->Enqueue(EnqueueSpec{
                      .queue = "q", .payload = "high", .priority = 9, .concurrency_key = "a"})
                  .ok());
  EXPECT_EQ(LeaseOne("q").payload, "high");
  EXPECT_EQ(LeaseOne("q").job_id, low);
}

TEST_F(BrokerPolicyTest, MaxConcurrencyPerKeyCapsEachKey) {
  PolicyOverride p;
  p.max_concurrency_per_key = 2;
  SetPolicy("q", p);
  for (int i = 0; i < 5; ++i) EnqueueKeyed("q", "tenant-a");
  for (int i = 0; i < 5; ++i) EnqueueKeyed("q", "tenant-b");
  for (int i = 0; i < 3; ++i) EnqueueKeyed("q", "");  // unkeyed jobs are not held back
  auto leased = broker_->Lease(LeaseSpec{"q", "w", 100, absl::Hours(1)});
  ASSERT_TRUE(leased.ok());
  std::map<std::string, int> per_key;
  for (const LeasedJob& j : *leased) ++per_key[Get(j.job_id).concurrency_key];
  EXPECT_EQ(per_key["tenant-a"], 2);
  EXPECT_EQ(per_key["tenant-b"], 2);
  EXPECT_EQ(per_key[""], 3);
  // Acking one of tenant-a's frees exactly one slot for tenant-a.
  for (const LeasedJob& j : *leased) {
    if (Get(j.job_id).concurrency_key == "tenant-a") {
      ASSERT_TRUE(broker_->Ack(AckSpec{j.job_id, j.lease_id, ""}).ok());
      break;
    }
  }
  EXPECT_THAT(LeaseKeys("q", 5), ElementsAre("tenant-a"));
}

TEST_F(BrokerPolicyTest, RaisingThePerKeyLimitLetsWaitingKeysRun) {
  PolicyOverride p;
  p.max_concurrency_per_key = 1;
  SetPolicy("q", p);
  for (int i = 0; i < 3; ++i) EnqueueKeyed("q", "k");
  EXPECT_EQ(LeaseKeys("q", 5).size(), 1u);
  p.max_concurrency_per_key = 3;
  SetPolicy("q", p);
  EXPECT_EQ(LeaseKeys("q", 5).size(), 2u);
}

TEST_F(BrokerPolicyTest, RateLimitIsATokenBucket) {
  PolicyOverride p;
  p.rate_per_second = 2;
  p.rate_burst = 4;
  SetPolicy("q", p);
  for (int i = 0; i < 20; ++i) Enqueue("q");
  EXPECT_EQ(Leasable("q"), 4u) << "a full bucket allows the burst";
  EXPECT_EQ(Leasable("q"), 0u);
  clock_.Advance(absl::Milliseconds(499));
  EXPECT_EQ(Leasable("q"), 0u);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(Leasable("q"), 1u) << "one token every 500 ms";
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(Leasable("q"), 4u) << "never more than the burst";
}

TEST_F(BrokerPolicyTest, ARateLimitChangeStartsAFullBucketOfTheNewSize) {
  PolicyOverride p;
  p.rate_per_second = 2;
  p.rate_burst = 2;
  SetPolicy("q", p);
  for (int i = 0; i < 10; ++i) Enqueue("q");
  EXPECT_EQ(Leasable("q"), 2u);
  EXPECT_EQ(Leasable("q"), 0u) << "the bucket is empty";
  PolicyOverride bigger;
  bigger.rate_burst = 3;
  SetPolicy("q", bigger);
  EXPECT_EQ(Leasable("q"), 3u) << "no time passed: the new bucket starts full";
  EXPECT_EQ(Leasable("q"), 0u);
}

TEST_F(BrokerPolicyTest, RateLimitedWaitersAreServedWhenATokenComesBack) {
  PolicyOverride p;
  p.rate_per_second = 1;
  SetPolicy("q", p);
  Enqueue("q");
  Enqueue("q");
  EXPECT_EQ(Leasable("q"), 1u);
  std::optional<absl::StatusOr<std::vector<LeasedJob>>> got;
  broker_->Lease(LeaseSpec{"q", "waiter", 1, {}}, absl::Seconds(30),
                 [&](absl::StatusOr<std::vector<LeasedJob>> r) { got = r; });
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(broker_->Tick(), clock_.Now() + absl::Seconds(1)) << "the ticker wakes for the token";
  clock_.Advance(absl::Seconds(1));
  broker_->Tick();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok());
  EXPECT_EQ((*got)->size(), 1u);
}

TEST_F(BrokerPolicyTest, LeasesStayFastWithManyKeys) {
  // Not a timing test: it checks the ring stays one entry per key with 10,000 keys, so picking
  // the next job does not scan keys.
  for (int k = 0; k < 10000; ++k) EnqueueKeyed("q", absl::StrCat("key", k));
  auto leased = broker_->Lease(LeaseSpec{"q", "w", 1000, absl::Hours(1)});
  ASSERT_TRUE(leased.ok());
  EXPECT_EQ(leased->size(), 1000u);
  EXPECT_EQ(broker_->GetQueue("q")->counts[JobState::kReady], 9000);
}

// The policy effects the e2e suite checks once through the real binary, pinned here on the fake
// clock (tests/e2e/policy_test.cc keeps one config -> effect check each).

TEST_F(BrokerPolicyTest, FailedRetentionByAgeRemovesDeadJobsOnceTheyAreOldEnough) {
  PolicyOverride p;
  p.max_attempts = 1;
  p.failed_max_age = absl::Minutes(10);
  SetPolicy("q", p);
  const std::string id = Enqueue("q");
  ASSERT_TRUE(Fail(LeaseOne("q"), "boom").ok());
  clock_.Advance(absl::Minutes(10) - absl::Seconds(1));
  broker_->Tick();
  EXPECT_TRUE(broker_->GetJob(id).ok()) << "not old enough yet";
  clock_.Advance(absl::Seconds(1));
  broker_->Tick();
  EXPECT_THAT(broker_->GetJob(id), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BrokerPolicyTest, FailedAndCancelledJobsShareFailedRetentionsCount) {
  PolicyOverride p;
  p.max_attempts = 1;
  p.failed_max_count = 1;
  SetPolicy("q", p);
  const std::string failed = Enqueue("q");
  ASSERT_TRUE(Fail(LeaseOne("q"), "boom").ok());
  clock_.Advance(absl::Seconds(1));
  const std::string cancelled = Enqueue("q");
  ASSERT_TRUE(broker_->CancelJob(cancelled).ok());
  broker_->Tick();
  EXPECT_THAT(broker_->GetJob(failed), StatusIs(absl::StatusCode::kNotFound))
      << "the older of the two dead jobs goes";
  EXPECT_TRUE(broker_->GetJob(cancelled).ok());
}

TEST_F(BrokerPolicyTest, AWorkersRetryAfterIsNotCappedByMaxBackoffAndAddsNoAttempt) {
  PolicyOverride p;
  p.max_backoff = absl::Seconds(5);
  p.max_attempts = 3;
  SetPolicy("q", p);
  const std::string id = Enqueue("q");
  LeasedJob first = LeaseOne("q");
  auto r = broker_->Fail(FailSpec{first.job_id, first.lease_id, "later", false, absl::Hours(1)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->next_attempt_at, clock_.Now() + absl::Hours(1));
  EXPECT_EQ(Get(id).attempt, 1);
  EXPECT_EQ(Get(id).max_attempts, 3);
}

TEST_F(BrokerPolicyTest, LeaseLengthIsTheWorkersElseTheJobsElseTheQueues) {
  PolicyOverride p;
  p.lease_duration = absl::Minutes(3);
  SetPolicy("q", p);
  Enqueue("q");
  EXPECT_EQ(LeaseOne("q").lease_deadline, clock_.Now() + absl::Minutes(3)) << "the queue's";
  auto own = broker_->Enqueue(EnqueueSpec{.queue = "q", .lease_duration = absl::Minutes(7)});
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(LeaseOne("q").lease_deadline, clock_.Now() + absl::Minutes(7)) << "the job's";
  ASSERT_TRUE(broker_->Enqueue(EnqueueSpec{.queue = "q", .lease_duration = absl::Minutes(7)}).ok());
  EXPECT_EQ(LeaseOne("q", "w1", absl::Seconds(30)).lease_deadline, clock_.Now() + absl::Seconds(30))
      << "the worker's";
}

TEST_F(BrokerPolicyTest, AJobKeepsTheMaxAttemptsItWasEnqueuedWith) {
  PolicyOverride p;
  p.max_attempts = 2;
  SetPolicy("q", p);
  const std::string id = Enqueue("q");
  p.max_attempts = 9;
  SetPolicy("q", p);
  EXPECT_EQ(Get(id).max_attempts, 2);
  ASSERT_TRUE(Fail(LeaseOne("q"), "one").ok());
  clock_.Advance(absl::Hours(1));
  auto r = Fail(LeaseOne("q"), "two");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, JobState::kFailed) << "dead after the 2 it had, not the 9 set later";
}

}  // namespace
}  // namespace jobbroker::core
