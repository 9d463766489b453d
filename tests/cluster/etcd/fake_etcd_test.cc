// What only FakeEtcd has: its fault hooks, its clock-driven lease expiry and its deterministic
// watch delivery (the conformance suite covers what it shares with etcd).

#include "tests/testing/fake_etcd.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::testing {
namespace {

using ::jobbroker::cluster::Etcd;
using ::jobbroker::cluster::GetResult;
using ::jobbroker::cluster::LeaseId;
using ::jobbroker::cluster::WatchEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class FakeEtcdTest : public ::testing::Test {
 protected:
  FakeEtcdTest() : clock_(absl::FromUnixSeconds(1'700'000'000)), etcd_(clock_) {}

  // Records each callback: its thread and its events' keys.
  struct Delivery {
    std::thread::id thread;
    std::vector<std::string> keys;
  };
  cluster::WatchCallback Record(std::vector<Delivery>& out) {
    return [&out](absl::StatusOr<std::vector<WatchEvent>> batch) {
      ASSERT_THAT(batch, IsOk());
      Delivery d{std::this_thread::get_id(), {}};
      for (const WatchEvent& e : *batch) d.keys.push_back(e.kv.key);
      out.push_back(d);
    };
  }

  FakeClock clock_;
  FakeEtcd etcd_;
};

TEST_F(FakeEtcdTest, FailNextCallsFailsThatManyCallsWithoutEffect) {
  etcd_.FailNextCalls(2);
  EXPECT_THAT(etcd_.Put("/a", "1"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(etcd_.Get("/a"), StatusIs(absl::StatusCode::kUnavailable));
  absl::StatusOr<GetResult> got = etcd_.Get("/a");
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->kvs, IsEmpty());
  EXPECT_EQ(got->revision, 1);
}

TEST_F(FakeEtcdTest, APartitionedClientIsUnavailableUntilHealedAndOthersAreNot) {
  std::unique_ptr<Etcd> node = etcd_.Connect("node-1");
  etcd_.Partition("node-1");
  EXPECT_THAT(node->Put("/a", "1"), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("node-1")));
  EXPECT_THAT(node->GrantLease(absl::Seconds(3)), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(etcd_.Put("/a", "2"), IsOk());
  etcd_.Heal("node-1");
  absl::StatusOr<GetResult> got = node->Get("/a");
  ASSERT_THAT(got, IsOk());
  ASSERT_THAT(got->kvs, SizeIs(1));
  EXPECT_EQ(got->kvs[0].value, "2");
}

TEST_F(FakeEtcdTest, ALeaseExpiresOnlyOnceTheClockPassesItsTtlDeletingItsKeysInOneRevision) {
  absl::StatusOr<LeaseId> lease = etcd_.GrantLease(absl::Milliseconds(2500));  // rounded up: 3 s
  ASSERT_THAT(lease, IsOk());
  ASSERT_THAT(etcd_.Put("/n/a", "", *lease), IsOk());
  ASSERT_THAT(etcd_.Put("/n/b", "", *lease), IsOk());
  std::vector<Delivery> deliveries;
  ASSERT_THAT(etcd_.Watch("/n/", 0, Record(deliveries)), IsOk());
  clock_.Advance(absl::Seconds(3) - absl::Milliseconds(1));
  etcd_.ExpireLeases();
  EXPECT_THAT(etcd_.GetPrefix("/n/")->kvs, SizeIs(2));
  const int64_t before = etcd_.revision();
  clock_.Advance(absl::Milliseconds(1));
  etcd_.ExpireLeases();
  EXPECT_THAT(etcd_.GetPrefix("/n/")->kvs, IsEmpty());
  EXPECT_EQ(etcd_.revision(), before + 1);
  ASSERT_THAT(deliveries, SizeIs(1));  // both deletes in one batch: one revision
  EXPECT_THAT(deliveries[0].keys, ElementsAre("/n/a", "/n/b"));
}

TEST_F(FakeEtcdTest, WatchCallbacksRunOnTheChangingThreadBeforeTheChangeReturns) {
  std::vector<Delivery> deliveries;
  ASSERT_THAT(etcd_.Watch("/", 0, Record(deliveries)), IsOk());
  ASSERT_THAT(etcd_.Put("/a", "1"), IsOk());
  ASSERT_THAT(deliveries, SizeIs(1));
  EXPECT_EQ(deliveries[0].thread, std::this_thread::get_id());
  std::thread other([&] { ASSERT_THAT(etcd_.Put("/b", "1"), IsOk()); });
  const std::thread::id other_id = other.get_id();
  other.join();
  ASSERT_THAT(deliveries, SizeIs(2));
  EXPECT_EQ(deliveries[1].thread, other_id);
}

TEST_F(FakeEtcdTest, AChangeMadeInACallbackIsDeliveredAfterItInRevisionOrder) {
  std::vector<std::string> seen;
  ASSERT_THAT(etcd_.Watch("/", 0,
                          [&](absl::StatusOr<std::vector<WatchEvent>> batch) {
                            ASSERT_THAT(batch, IsOk());
                            for (const WatchEvent& e : *batch) {
                              seen.push_back(e.kv.key);
                              if (e.kv.key == "/first") {
                                EXPECT_THAT(etcd_.Put("/second", ""), IsOk());
                              }
                            }
                          }),
              IsOk());
  ASSERT_THAT(etcd_.Put("/first", ""), IsOk());
  EXPECT_THAT(seen, ElementsAre("/first", "/second"));
}

TEST_F(FakeEtcdTest, APartitionedClientsWatchGetsWhatItMissedWhenHealed) {
  std::unique_ptr<Etcd> node = etcd_.Connect("node-1");
  std::vector<Delivery> deliveries;
  ASSERT_THAT(node->Watch("/", 0, Record(deliveries)), IsOk());
  etcd_.Partition("node-1");
  ASSERT_THAT(etcd_.Put("/a", ""), IsOk());
  ASSERT_THAT(etcd_.Put("/b", ""), IsOk());
  EXPECT_THAT(deliveries, IsEmpty());
  etcd_.Heal("node-1");
  ASSERT_THAT(deliveries, SizeIs(2));
  EXPECT_THAT(deliveries[0].keys, ElementsAre("/a"));
  EXPECT_THAT(deliveries[1].keys, ElementsAre("/b"));
}

TEST_F(FakeEtcdTest, AWatchHealedAfterItsRevisionsWereCompactedGetsOutOfRange) {
  std::unique_ptr<Etcd> node = etcd_.Connect("node-1");
  absl::Status error;
  ASSERT_THAT(node->Watch("/", 0,
                          [&](absl::StatusOr<std::vector<WatchEvent>> batch) {
                            if (!batch.ok()) error = batch.status();
                          }),
              IsOk());
  etcd_.Partition("node-1");
  ASSERT_THAT(etcd_.Put("/a", ""), IsOk());
  absl::StatusOr<int64_t> last = etcd_.Put("/a", "again");
  ASSERT_THAT(last, IsOk());
  ASSERT_THAT(etcd_.Compact(*last), IsOk());
  etcd_.Heal("node-1");
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kOutOfRange));
}

}  // namespace
}  // namespace jobbroker::testing
