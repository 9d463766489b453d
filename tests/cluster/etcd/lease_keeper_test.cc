// LeaseKeeper on a FakeClock and a FakeEtcd, driven by Tick() (and once by its own thread).

#include "cluster/etcd/lease_keeper.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_etcd.h"
#include "tests/testing/forwarding_etcd.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::cluster {
namespace {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr absl::Duration kTtl = absl::Seconds(3);

// An Etcd whose KeepAliveOnce takes `delay` of the fake clock, as a slow answer does.
class SlowKeepAlive final : public testing::ForwardingEtcd {
 public:
  SlowKeepAlive(Etcd& etcd, testing::FakeClock& clock, absl::Duration delay)
      : ForwardingEtcd(etcd), clock_(clock), delay_(delay) {}
  absl::StatusOr<absl::Duration> KeepAliveOnce(LeaseId lease) override {
    absl::StatusOr<absl::Duration> ttl = ForwardingEtcd::KeepAliveOnce(lease);
    clock_.Advance(delay_);
    return ttl;
  }

 private:
  testing::FakeClock& clock_;
  const absl::Duration delay_;
};

class LeaseKeeperTest : public ::testing::Test {
 protected:
  LeaseKeeperTest() : clock_(absl::FromUnixSeconds(1'700'000'000)), etcd_(clock_) {
    node_ = etcd_.Connect("node");
    start_ = clock_.Now();
    absl::StatusOr<LeaseId> lease = node_->GrantLease(kTtl);
    EXPECT_THAT(lease, IsOk());
    lease_ = lease.value_or(0);
    EXPECT_THAT(node_->Put("/leader", "node", lease_), IsOk());
  }

  std::unique_ptr<LeaseKeeper> Keeper(Etcd& etcd, LeaseKeeperOptions options = {}) {
    options.ttl = kTtl;
    return std::make_unique<LeaseKeeper>(etcd, clock_, lease_, start_, options,
                                         [this](absl::Status status) {
                                           absl::MutexLock lock(&mu_);
                                           reports_.push_back(std::move(status));
                                         });
  }
  std::unique_ptr<LeaseKeeper> Keeper(LeaseKeeperOptions options = {}) {
    return Keeper(*node_, options);
  }
  // Whether etcd (as another client sees it) still holds the key on the lease.
  bool LeaderKeyExists() {
    etcd_.ExpireLeases();
    absl::StatusOr<GetResult> got = etcd_.Get("/leader");
    EXPECT_THAT(got, IsOk());
    return got.ok() && !got->kvs.empty();
  }
  std::vector<absl::Status> reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

  testing::FakeClock clock_;
  testing::FakeEtcd etcd_;
  std::unique_ptr<Etcd> node_;
  absl::Time start_;
  LeaseId lease_ = 0;
  absl::Mutex mu_;
  std::vector<absl::Status> reports_ ABSL_GUARDED_BY(mu_);
};

TEST_F(LeaseKeeperTest, ItRenewsTheLeaseEveryThirdOfItsTtlAndSoKeepsItAlive) {
  auto keeper = Keeper();
  EXPECT_EQ(keeper->Tick(), absl::Seconds(1));  // nothing due yet
  for (int i = 1; i <= 10; ++i) {
    clock_.Advance(absl::Seconds(1));
    EXPECT_EQ(keeper->Tick(), absl::Seconds(1)) << i;
    EXPECT_TRUE(keeper->MayServe()) << i;
    ASSERT_TRUE(LeaderKeyExists()) << i;  // 10 s: the 3 s TTL ran out three times over
  }
  // Renewed at start + 10 s: serving until then + TTL - the margin (TTL / 6).
  EXPECT_EQ(keeper->serving_deadline(), start_ + absl::Seconds(10) + kTtl - kTtl / 6);
  EXPECT_THAT(reports(), IsEmpty());
}

TEST_F(LeaseKeeperTest, WhenRenewalsFailTheHolderStopsServingBeforeEtcdDropsTheLease) {
  auto keeper = Keeper();
  etcd_.Partition("node");
  absl::Time now = start_;
  while (keeper->MayServe()) {
    const absl::Duration wait = keeper->Tick();
    ASSERT_LT(wait, absl::InfiniteDuration()) << "lost at " << (now - start_);
    ASSERT_GT(wait, absl::ZeroDuration());
    clock_.Advance(wait);
    now += wait;
  }
  // It stopped at TTL - margin after the grant...
  EXPECT_EQ(now - start_, kTtl - kTtl / 6);
  EXPECT_EQ(keeper->Tick(), absl::InfiniteDuration());
  ASSERT_THAT(reports(), SizeIs(1));
  EXPECT_THAT(reports()[0], StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     ::testing::HasSubstr(absl::StrCat(lease_))));
  EXPECT_THAT(keeper->lost(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  // ...while etcd still held the lease: nobody else could have been elected yet.
  EXPECT_TRUE(LeaderKeyExists());
  clock_.Advance(kTtl / 6);
  EXPECT_FALSE(LeaderKeyExists());
  EXPECT_THAT(reports(), SizeIs(1));  // reported once
}

TEST_F(LeaseKeeperTest, ALeaseEtcdNoLongerHasIsReportedLostAtTheNextRenewal) {
  auto keeper = Keeper();
  ASSERT_THAT(etcd_.RevokeLease(lease_), IsOk());
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(keeper->Tick(), absl::InfiniteDuration());
  EXPECT_FALSE(keeper->MayServe());
  ASSERT_THAT(reports(), SizeIs(1));
  EXPECT_THAT(reports()[0], StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(LeaseKeeperTest, AFailedRenewalIsRetriedSoonAndTheNextSuccessMovesTheDeadline) {
  auto keeper = Keeper();
  clock_.Advance(absl::Seconds(1));
  etcd_.FailNextCalls(1);
  EXPECT_EQ(keeper->Tick(), kTtl / 10);
  EXPECT_EQ(keeper->serving_deadline(), start_ + kTtl - kTtl / 6);  // unchanged
  clock_.Advance(kTtl / 10);
  EXPECT_EQ(keeper->Tick(), absl::Seconds(1));
  EXPECT_EQ(keeper->serving_deadline(), start_ + absl::Seconds(1) + kTtl / 10 + kTtl - kTtl / 6);
  EXPECT_THAT(reports(), IsEmpty());
}

TEST_F(LeaseKeeperTest, TheDeadlineCountsFromWhenTheRenewalWasSentNotAnswered) {
  SlowKeepAlive slow(*node_, clock_, absl::Milliseconds(400));
  auto keeper = Keeper(slow);
  clock_.Advance(absl::Seconds(1));
  keeper->Tick();
  EXPECT_EQ(keeper->serving_deadline(), start_ + absl::Seconds(1) + kTtl - kTtl / 6);
  EXPECT_TRUE(keeper->MayServe());
}

TEST_F(LeaseKeeperTest, AnAnswerLaterThanTheDeadlineDoesNotLetTheHolderServe) {
  SlowKeepAlive slow(*node_, clock_, kTtl);  // the answer comes after the TTL ran out
  auto keeper = Keeper(slow);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(keeper->Tick(), absl::InfiniteDuration());
  EXPECT_FALSE(keeper->MayServe());
  ASSERT_THAT(reports(), SizeIs(1));
  EXPECT_THAT(reports()[0], StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(LeaseKeeperTest, ItsThreadReportsALostLease) {
  LeaseKeeperOptions options;
  options.renew_every = absl::Milliseconds(10);  // the thread's sleeps are real time
  absl::Notification lost;
  options.ttl = kTtl;
  LeaseKeeper keeper(*node_, clock_, lease_, start_, options, [&](absl::Status status) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound));
    lost.Notify();
  });
  ASSERT_THAT(etcd_.RevokeLease(lease_), IsOk());
  clock_.Advance(absl::Milliseconds(10));
  keeper.Start();
  // A wait, not a measurement: it ends as soon as the thread has reported.
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_FALSE(keeper.MayServe());
  keeper.Stop();
}

}  // namespace
}  // namespace jobbroker::cluster
