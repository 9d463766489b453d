// AwaitEtcd on a FakeClock and a FakeEtcd: a node that starts before its etcd waits for it,
// and gives up only on what waiting cannot fix.

#include "cluster/etcd/await_etcd.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kKey[] = "jobbroker/config";

// An etcd whose reads are refused with `refusal` (a wrong password, say), all else as `etcd`.
class RefusingReads final : public testing::ForwardingEtcd {
 public:
  RefusingReads(Etcd& etcd, absl::Status refusal) : ForwardingEtcd(etcd), refusal_(refusal) {}
  absl::StatusOr<GetResult> Get(const std::string&) override { return refusal_; }

 private:
  const absl::Status refusal_;
};

class AwaitEtcdTest : public ::testing::Test {
 protected:
  AwaitEtcdTest() : clock_(absl::FromUnixSeconds(1'700'000'000)), etcd_(clock_) {
    node_ = etcd_.Connect("node");
    start_ = clock_.Now();
    options_.patience = absl::Seconds(10);
    options_.retry_every = absl::Milliseconds(250);
    options_.report_every = absl::Seconds(2);
  }

  // AwaitEtcd through `etcd`: each pause advances the fake clock (and is counted); each report
  // is kept as the wait it reported.
  absl::Status Await(Etcd& etcd) {
    AwaitEtcdHooks hooks;
    hooks.sleep = [this](absl::Duration d) {
      ++pauses_;
      clock_.Advance(d);
    };
    hooks.on_waiting = [this](const absl::Status& why, absl::Duration waited) {
      EXPECT_THAT(why, StatusIs(absl::StatusCode::kUnavailable));
      reported_.push_back(waited);
    };
    return AwaitEtcd(etcd, kKey, clock_, options_, hooks);
  }

  testing::FakeClock clock_;
  testing::FakeEtcd etcd_;
  std::unique_ptr<Etcd> node_;
  absl::Time start_;
  AwaitEtcdOptions options_;
  int pauses_ = 0;
  std::vector<absl::Duration> reported_;
};

TEST_F(AwaitEtcdTest, AnEtcdThatAnswersIsNotWaitedFor) {
  EXPECT_THAT(Await(*node_), IsOk());
  EXPECT_EQ(pauses_, 0);
  EXPECT_THAT(reported_, IsEmpty());
}

TEST_F(AwaitEtcdTest, AnEtcdThatComesUpLaterIsWaitedForAndTheWaitIsReportedNowAndThen) {
  etcd_.FailNextCalls(12);  // 12 tries of 250 ms apart: 2.75 s without an answer
  EXPECT_THAT(Await(*node_), IsOk());
  EXPECT_EQ(pauses_, 12);
  EXPECT_EQ(clock_.Now() - start_, absl::Milliseconds(3000));
  // At the first failure, then once per report_every (2 s), not once per try.
  EXPECT_THAT(reported_, ElementsAre(absl::ZeroDuration(), absl::Seconds(2)));
}

TEST_F(AwaitEtcdTest, AnEtcdThatNeverAnswersIsGivenUpOnAfterThePatience) {
  etcd_.Partition("node");
  EXPECT_THAT(Await(*node_), StatusIs(absl::StatusCode::kUnavailable,
                                      HasSubstr("etcd did not answer within 10s")));
  EXPECT_EQ(clock_.Now() - start_, options_.patience) << "the last pause ends at the patience";
  EXPECT_EQ(reported_.size(), 5u) << "at 0, 2, 4, 6 and 8 s";
}

TEST_F(AwaitEtcdTest, NoPatienceMeansOneTry) {
  options_.patience = absl::ZeroDuration();
  etcd_.Partition("node");
  EXPECT_THAT(Await(*node_), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(pauses_, 0);
}

TEST_F(AwaitEtcdTest, ARefusalIsReturnedAtOnceForWaitingWouldNotHealIt) {
  RefusingReads refusing(*node_, absl::PermissionDeniedError("user jobbroker may not read"));
  EXPECT_THAT(Await(refusing),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("may not read")));
  EXPECT_EQ(pauses_, 0);
}

}  // namespace
}  // namespace jobbroker::cluster
