// One suite, run against every Etcd: the cluster coordinator (and its simulator) must not be able
// to tell the fake from etcd itself. Built twice (tests/cluster/CMakeLists.txt): with
// JOBBROKER_ETCD_BACKEND_FAKE over FakeEtcd (label unit), and with JOBBROKER_ETCD_BACKEND_REAL over
// GrpcEtcd against a real /usr/bin/etcd that each test starts (label etcd).

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

#if defined(JOBBROKER_ETCD_BACKEND_FAKE)
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_etcd.h"
#elif defined(JOBBROKER_ETCD_BACKEND_REAL)
#include "cluster/etcd/grpc_etcd.h"
#include "tests/testing/etcd_process.h"
#else
#error "define JOBBROKER_ETCD_BACKEND_FAKE or JOBBROKER_ETCD_BACKEND_REAL"
#endif

namespace jobbroker::cluster {
namespace {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Each backend provides: Start(); etcd(), the client under test; watcher(), a second client of
// the same store whose watch streams BreakWatchStreams() breaks and HealWatchStreams() lets
// resume; EndLeaseOnItsOwn(), which makes etcd end a lease without the client revoking it; and
// Compact().
#if defined(JOBBROKER_ETCD_BACKEND_FAKE)
class FakeBackend {
 public:
  static constexpr char kName[] = "FakeEtcd";
  FakeBackend() : clock_(absl::FromUnixSeconds(1'700'000'000)), fake_(clock_) {}
  absl::Status Start() {
    watcher_ = fake_.Connect("watcher");
    return absl::OkStatus();
  }
  Etcd& etcd() { return fake_; }
  Etcd& watcher() { return *watcher_; }
  // The lease expires: the fake clock passes its TTL.
  void EndLeaseOnItsOwn(LeaseId /*lease*/, absl::Duration ttl) {
    clock_.Advance(ttl + absl::Seconds(1));
    fake_.ExpireLeases();
  }
  absl::Status Compact(int64_t revision) { return fake_.Compact(revision); }
  // The watcher is cut off (its watches receive nothing) until healed.
  absl::Status BreakWatchStreams() {
    fake_.Partition("watcher");
    return absl::OkStatus();
  }
  void HealWatchStreams() { fake_.Heal("watcher"); }

 private:
  testing::FakeClock clock_;
  testing::FakeEtcd fake_;
  std::unique_ptr<Etcd> watcher_;
};
using Backends = ::testing::Types<FakeBackend>;
#else
class RealBackend {
 public:
  static constexpr char kName[] = "GrpcEtcd";
  ~RealBackend() {
    client_.reset();  // their watch threads end before etcd does
    watcher_.reset();
    etcd_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  absl::Status Start() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("jobbroker-etcd-", info->name(), "-", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    absl::StatusOr<std::unique_ptr<testing::EtcdProcess>> etcd =
        testing::EtcdProcess::Start((dir_ / "data").string());
    if (!etcd.ok()) return etcd.status();
    etcd_ = *std::move(etcd);
    GrpcEtcdOptions options;
    options.endpoints = {etcd_->client_url()};
    options.call_timeout = absl::Seconds(5);
    options.watch_retry_delay = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<GrpcEtcd>> client = GrpcEtcd::Create(std::move(options));
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    // The watcher waits a second before it reconnects a broken stream, so that the changes a
    // test makes right after etcd is back precede the resumed stream: a client that resumed from
    // "now" instead of its last revision + 1 would then miss them.
    GrpcEtcdOptions watcher_options;
    watcher_options.endpoints = {etcd_->client_url()};
    watcher_options.watch_retry_delay = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<GrpcEtcd>> watcher = GrpcEtcd::Create(watcher_options);
    if (!watcher.ok()) return watcher.status();
    watcher_ = *std::move(watcher);
    return absl::OkStatus();
  }
  Etcd& etcd() { return *client_; }
  Etcd& watcher() { return *watcher_; }
  // Waiting out a TTL would make the suite slow: revoking ends the lease as expiry does.
  void EndLeaseOnItsOwn(LeaseId lease, absl::Duration /*ttl*/) {
    EXPECT_THAT(client_->RevokeLease(lease), IsOk());
  }
  absl::Status Compact(int64_t revision) { return client_->Compact(revision); }
  // etcd is killed with SIGKILL and started again on the same data and ports: every stream
  // breaks, and the client must reconnect and resume on its own.
  absl::Status BreakWatchStreams() { return etcd_->Restart(); }
  void HealWatchStreams() {}

 private:
  std::filesystem::path dir_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<GrpcEtcd> client_;
  std::unique_ptr<GrpcEtcd> watcher_;
};
using Backends = ::testing::Types<RealBackend>;
#endif

// Collects a watch's batches; waits (on a real clock, for the real etcd's threads) until it has
// some number of events.
class WatchRecorder {
 public:
  WatchCallback Callback() {
    return [this](absl::StatusOr<std::vector<WatchEvent>> batch) {
      absl::MutexLock lock(&mu_);
      ++batches_;
      if (!batch.ok()) {
        error_ = batch.status();
        return;
      }
      if (batch->empty()) ++empty_batches_;
      for (WatchEvent& e : *batch) events_.push_back(std::move(e));
    };
  }
  // True once `count` events, or an error, have come. The wait is long (a slow CI machine must not
  // fail it) and is a wait, not a measurement: it ends as soon as they are there.
  bool WaitForEvents(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count] {
      mu_.AssertHeld();
      return events_.size() >= count || !error_.ok();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(60));
  }
  std::vector<WatchEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  absl::Status error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }
  int empty_batches() {
    absl::MutexLock lock(&mu_);
    return empty_batches_;
  }

 private:
  absl::Mutex mu_;
  std::vector<WatchEvent> events_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int batches_ ABSL_GUARDED_BY(mu_) = 0;
  int empty_batches_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<std::string> Keys(const std::vector<KeyValue>& kvs) {
  std::vector<std::string> keys;
  for (const KeyValue& kv : kvs) keys.push_back(kv.key);
  return keys;
}

// "put k=v@rev" / "delete k@rev", to compare event lists whole.
std::vector<std::string> Describe(const std::vector<WatchEvent>& events) {
  std::vector<std::string> out;
  for (const WatchEvent& e : events) {
    out.push_back(e.type == WatchEvent::Type::kPut
                      ? absl::StrCat("put ", e.kv.key, "=", e.kv.value, "@", e.kv.mod_revision)
                      : absl::StrCat("delete ", e.kv.key, "@", e.kv.mod_revision));
  }
  return out;
}

template <typename Backend>
class EtcdConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_THAT(backend_.Start(), IsOk()); }
  Etcd& etcd() { return backend_.etcd(); }

  int64_t PutOrDie(const std::string& key, const std::string& value, LeaseId lease = 0) {
    absl::StatusOr<int64_t> revision = etcd().Put(key, value, lease);
    EXPECT_THAT(revision, IsOk());
    return revision.value_or(-1);
  }
  KeyValue GetOrDie(const std::string& key) {
    absl::StatusOr<GetResult> got = etcd().Get(key);
    EXPECT_THAT(got, IsOk());
    EXPECT_THAT(got->kvs, SizeIs(1)) << key;
    return got.ok() && got->kvs.size() == 1 ? got->kvs[0] : KeyValue{};
  }
  // The election of CLUSTER.md: put `key` on `lease` if nobody holds it.
  absl::StatusOr<TxnResult> Elect(const std::string& key, const std::string& me, LeaseId lease) {
    return etcd().Txn({Compare::CreateRevision(key, Compare::Op::kEqual, 0)},
                      {TxnOp::Put(key, me, lease)}, {TxnOp::Get(key)});
  }

  Backend backend_;
};

struct BackendName {
  template <typename Backend>
  static std::string GetName(int) {
    return Backend::kName;
  }
};
TYPED_TEST_SUITE(EtcdConformanceTest, Backends, BackendName);

TYPED_TEST(EtcdConformanceTest, APutReturnsAHigherRevisionThanTheStoreHadBefore) {
  absl::StatusOr<GetResult> before = this->etcd().Get("/a");
  ASSERT_THAT(before, IsOk());
  EXPECT_THAT(before->kvs, IsEmpty());
  const int64_t first = this->PutOrDie("/a", "1");
  EXPECT_GT(first, before->revision);
  const int64_t second = this->PutOrDie("/a", "2");
  EXPECT_GT(second, first);
  absl::StatusOr<GetResult> after = this->etcd().Get("/a");
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->revision, second);
}

TYPED_TEST(EtcdConformanceTest, AKeyCarriesItsCreateRevisionModRevisionAndVersion) {
  const int64_t created = this->PutOrDie("/k", "1");
  const int64_t changed = this->PutOrDie("/k", "2");
  KeyValue kv = this->GetOrDie("/k");
  EXPECT_EQ(kv.value, "2");
  EXPECT_EQ(kv.create_revision, created);
  EXPECT_EQ(kv.mod_revision, changed);
  EXPECT_EQ(kv.version, 2);
  EXPECT_EQ(kv.lease, 0);
  // A delete resets it: the key is new again.
  ASSERT_THAT(this->etcd().Delete("/k"), IsOk());
  const int64_t recreated = this->PutOrDie("/k", "3");
  kv = this->GetOrDie("/k");
  EXPECT_EQ(kv.create_revision, recreated);
  EXPECT_EQ(kv.version, 1);
}

TYPED_TEST(EtcdConformanceTest, GetPrefixReturnsTheKeysUnderThePrefixInKeyOrder) {
  this->PutOrDie("/p/b", "");
  this->PutOrDie("/p/a", "");
  this->PutOrDie("/p0", "");  // '0' follows '/': outside "/p/"
  this->PutOrDie("/o", "");
  absl::StatusOr<GetResult> got = this->etcd().GetPrefix("/p/");
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(Keys(got->kvs), ElementsAre("/p/a", "/p/b"));
  absl::StatusOr<GetResult> all = this->etcd().GetPrefix("");
  ASSERT_THAT(all, IsOk());
  EXPECT_THAT(Keys(all->kvs), ElementsAre("/o", "/p/a", "/p/b", "/p0"));
}

TYPED_TEST(EtcdConformanceTest, ADeleteRaisesTheRevisionOnlyIfTheKeyExisted) {
  const int64_t put = this->PutOrDie("/d", "x");
  absl::StatusOr<int64_t> deleted = this->etcd().Delete("/d");
  ASSERT_THAT(deleted, IsOk());
  EXPECT_GT(*deleted, put);
  absl::StatusOr<int64_t> again = this->etcd().Delete("/d");
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(*again, *deleted);
  absl::StatusOr<GetResult> got = this->etcd().Get("/d");
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->kvs, IsEmpty());
}

TYPED_TEST(EtcdConformanceTest, AnElectionTxnGuardedByCreateRevisionZeroSucceedsOnlyOnce) {
  absl::StatusOr<TxnResult> first = this->Elect("/leader", "node-1", 0);
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(first->succeeded);
  absl::StatusOr<TxnResult> second = this->Elect("/leader", "node-2", 0);
  ASSERT_THAT(second, IsOk());
  EXPECT_FALSE(second->succeeded);
  // The else branch ran: it read the winner.
  ASSERT_THAT(second->results, SizeIs(1));
  EXPECT_EQ(second->results[0].type, TxnOp::Type::kGet);
  ASSERT_THAT(second->results[0].kvs, SizeIs(1));
  EXPECT_EQ(second->results[0].kvs[0].value, "node-1");
  // A txn that changed nothing left the revision as it was.
  EXPECT_EQ(second->revision, first->revision);
  EXPECT_EQ(this->GetOrDie("/leader").value, "node-1");
}

TYPED_TEST(EtcdConformanceTest, OfManyConcurrentCandidatesExactlyOneIsElected) {
  constexpr int kCandidates = 8;
  std::atomic<int> elected{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kCandidates; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<TxnResult> r = this->Elect("/race", absl::StrCat("node-", i), 0);
      if (!r.ok()) {
        ++failed;
      } else if (r->succeeded) {
        ++elected;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(elected.load(), 1);
}

TYPED_TEST(EtcdConformanceTest, TheElectionTxnsRevisionIsTheCreateRevisionOfTheKeyItPut) {
  this->PutOrDie("/other", "raise the revision");
  absl::StatusOr<TxnResult> won = this->Elect("/partitions/7/leader", "node-1", 0);
  ASSERT_THAT(won, IsOk());
  ASSERT_TRUE(won->succeeded);
  const KeyValue leader = this->GetOrDie("/partitions/7/leader");
  EXPECT_EQ(leader.create_revision, won->revision);  // the epoch
  EXPECT_EQ(leader.mod_revision, won->revision);
  // A write guarded by the epoch passes while the leader key is that epoch's...
  absl::StatusOr<TxnResult> guarded = this->etcd().Txn(
      {Compare::CreateRevision("/partitions/7/leader", Compare::Op::kEqual, won->revision)},
      {TxnOp::Put("/partitions/7/sync", "a,b")}, {});
  ASSERT_THAT(guarded, IsOk());
  EXPECT_TRUE(guarded->succeeded);
  // ...and not once the key was re-created, in a later epoch.
  ASSERT_THAT(this->etcd().Delete("/partitions/7/leader"), IsOk());
  ASSERT_THAT(this->Elect("/partitions/7/leader", "node-2", 0), IsOk());
  absl::StatusOr<TxnResult> stale = this->etcd().Txn(
      {Compare::CreateRevision("/partitions/7/leader", Compare::Op::kEqual, won->revision)},
      {TxnOp::Put("/partitions/7/sync", "a")}, {});
  ASSERT_THAT(stale, IsOk());
  EXPECT_FALSE(stale->succeeded);
  EXPECT_EQ(this->GetOrDie("/partitions/7/sync").value, "a,b");
}

TYPED_TEST(EtcdConformanceTest, TxnComparesEveryTargetWithEveryOperator) {
  this->PutOrDie("/c", "m");
  const int64_t mod = this->PutOrDie("/c", "m");  // version 2
  const KeyValue kv = this->GetOrDie("/c");
  using Op = Compare::Op;
  struct Case {
    Compare compare;
    bool holds;
  };
  const std::vector<Case> cases = {
      {Compare::ModRevision("/c", Op::kEqual, mod), true},
      {Compare::ModRevision("/c", Op::kNotEqual, mod), false},
      {Compare::ModRevision("/c", Op::kLess, mod + 1), true},
      {Compare::ModRevision("/c", Op::kGreater, mod), false},
      {Compare::CreateRevision("/c", Op::kLess, kv.create_revision), false},
      {Compare::CreateRevision("/c", Op::kGreater, 0), true},
      {Compare::Version("/c", Op::kEqual, 2), true},
      {Compare::Version("/c", Op::kGreater, 2), false},
      {Compare::Value("/c", Op::kEqual, "m"), true},
      {Compare::Value("/c", Op::kNotEqual, "m"), false},
      {Compare::Value("/c", Op::kLess, "n"), true},
      {Compare::Value("/c", Op::kGreater, "n"), false},
      // A missing key has revisions and version 0, and no value to compare.
      {Compare::Version("/missing", Op::kEqual, 0), true},
      {Compare::ModRevision("/missing", Op::kLess, 1), true},
      {Compare::Value("/missing", Op::kEqual, ""), false},
      {Compare::Value("/missing", Op::kNotEqual, ""), false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::StatusOr<TxnResult> r = this->etcd().Txn({cases[i].compare}, {}, {});
    ASSERT_THAT(r, IsOk()) << "case " << i;
    EXPECT_EQ(r->succeeded, cases[i].holds) << "case " << i;
  }
  // All compares must hold.
  absl::StatusOr<TxnResult> both =
      this->etcd().Txn({cases[0].compare, cases[1].compare}, {TxnOp::Put("/c", "x")}, {});
  ASSERT_THAT(both, IsOk());
  EXPECT_FALSE(both->succeeded);
  EXPECT_EQ(this->GetOrDie("/c").value, "m");
}

TYPED_TEST(EtcdConformanceTest, ATxnBranchRunsAtOneRevisionAndReportsEachOp) {
  this->PutOrDie("/t/a", "1");
  this->PutOrDie("/t/b", "2");
  absl::StatusOr<TxnResult> r =
      this->etcd().Txn({},
                       {TxnOp::Delete("/t/", /*prefix=*/true), TxnOp::Put("/u", "new"),
                        TxnOp::Get("/t/", /*prefix=*/true), TxnOp::Get("/u")},
                       {});
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->succeeded);
  ASSERT_THAT(r->results, SizeIs(4));
  EXPECT_EQ(r->results[0].type, TxnOp::Type::kDelete);
  EXPECT_EQ(r->results[0].deleted, 2);
  EXPECT_EQ(r->results[1].type, TxnOp::Type::kPut);
  EXPECT_THAT(r->results[2].kvs, IsEmpty());  // reads see the txn's own earlier writes
  ASSERT_THAT(r->results[3].kvs, SizeIs(1));
  EXPECT_EQ(r->results[3].kvs[0].value, "new");
  EXPECT_EQ(r->results[3].kvs[0].mod_revision, r->revision);
  EXPECT_EQ(this->GetOrDie("/u").create_revision, r->revision);
}

TYPED_TEST(EtcdConformanceTest, ATxnThatPutsOneKeyTwiceIsRefused) {
  EXPECT_THAT(this->etcd().Txn({}, {TxnOp::Put("/dup", "1"), TxnOp::Put("/dup", "2")}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // In the branch that would not run, too; and a put inside a range the branch deletes.
  EXPECT_THAT(this->etcd().Txn({}, {}, {TxnOp::Put("/dup", "1"), TxnOp::Put("/dup", "2")}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      this->etcd().Txn({}, {TxnOp::Delete("/d", /*prefix=*/true), TxnOp::Put("/dup", "1")}, {}),
      StatusIs(absl::StatusCode::kInvalidArgument));
  absl::StatusOr<GetResult> got = this->etcd().Get("/dup");
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->kvs, IsEmpty());
  // Different keys are fine.
  EXPECT_THAT(this->etcd().Txn({}, {TxnOp::Put("/dup/a", "1"), TxnOp::Put("/dup/b", "2")}, {}),
              IsOk());
}

TYPED_TEST(EtcdConformanceTest, KeepAliveOnceRenewsALeaseForItsTtl) {
  absl::StatusOr<LeaseId> lease = this->etcd().GrantLease(absl::Seconds(10));
  ASSERT_THAT(lease, IsOk());
  EXPECT_NE(*lease, 0);
  absl::StatusOr<absl::Duration> ttl = this->etcd().KeepAliveOnce(*lease);
  ASSERT_THAT(ttl, IsOk());
  EXPECT_EQ(*ttl, absl::Seconds(10));
}

TYPED_TEST(EtcdConformanceTest, ARevokedLeaseIsNotFoundToKeepAliveRevokeAndPut) {
  absl::StatusOr<LeaseId> lease = this->etcd().GrantLease(absl::Seconds(10));
  ASSERT_THAT(lease, IsOk());
  ASSERT_THAT(this->etcd().RevokeLease(*lease), IsOk());
  EXPECT_THAT(this->etcd().KeepAliveOnce(*lease),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(absl::StrCat(*lease))));
  EXPECT_THAT(this->etcd().RevokeLease(*lease), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(this->etcd().Put("/on-lease", "x", *lease),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(absl::StrCat(*lease))));
  // A txn putting on it fails whole.
  EXPECT_THAT(
      this->etcd().Txn({}, {TxnOp::Put("/plain", "x"), TxnOp::Put("/on-lease", "x", *lease)}, {}),
      StatusIs(absl::StatusCode::kNotFound));
  absl::StatusOr<GetResult> got = this->etcd().GetPrefix("/");
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->kvs, IsEmpty());
}

TYPED_TEST(EtcdConformanceTest, AKeyOnALeaseVanishesWhenTheLeaseIsRevoked) {
  absl::StatusOr<LeaseId> lease = this->etcd().GrantLease(absl::Seconds(10));
  ASSERT_THAT(lease, IsOk());
  this->PutOrDie("/nodes/a", "a", *lease);
  this->PutOrDie("/nodes/b", "b", *lease);
  this->PutOrDie("/nodes/c", "c");
  EXPECT_EQ(this->GetOrDie("/nodes/a").lease, *lease);
  ASSERT_THAT(this->etcd().RevokeLease(*lease), IsOk());
  absl::StatusOr<GetResult> got = this->etcd().GetPrefix("/nodes/");
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(Keys(got->kvs), ElementsAre("/nodes/c"));
}

TYPED_TEST(EtcdConformanceTest, AKeyOnALeaseVanishesWhenEtcdEndsTheLease) {
  absl::StatusOr<LeaseId> lease = this->etcd().GrantLease(absl::Seconds(3));
  ASSERT_THAT(lease, IsOk());
  this->PutOrDie("/leader", "me", *lease);
  const int64_t before = this->etcd().Get("/leader")->revision;
  WatchRecorder recorder;
  ASSERT_THAT(this->etcd().Watch("/leader", before + 1, recorder.Callback()), IsOk());
  this->backend_.EndLeaseOnItsOwn(*lease, absl::Seconds(3));
  ASSERT_TRUE(recorder.WaitForEvents(1));
  const std::vector<WatchEvent> events = recorder.events();
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(events[0].kv.key, "/leader");
  EXPECT_EQ(events[0].kv.mod_revision, before + 1);
  absl::StatusOr<GetResult> got = this->etcd().Get("/leader");
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->kvs, IsEmpty());
  EXPECT_THAT(this->etcd().KeepAliveOnce(*lease), StatusIs(absl::StatusCode::kNotFound));
}

TYPED_TEST(EtcdConformanceTest, AWatchFromAPastRevisionDeliversEveryLaterChangeInOrder) {
  const int64_t r1 = this->PutOrDie("/w/a", "1");
  const int64_t r2 = this->PutOrDie("/w/b", "2");
  const int64_t r3 = this->PutOrDie("/w/a", "3");
  WatchRecorder recorder;
  ASSERT_THAT(this->etcd().Watch("/w/", r2, recorder.Callback()), IsOk());
  absl::StatusOr<int64_t> r4 = this->etcd().Delete("/w/b");
  ASSERT_THAT(r4, IsOk());
  const int64_t r5 = this->PutOrDie("/w/c", "5");
  ASSERT_TRUE(recorder.WaitForEvents(4));
  EXPECT_THAT(recorder.error(), IsOk());
  const std::vector<WatchEvent> events = recorder.events();
  EXPECT_THAT(Describe(events),
              ElementsAre(absl::StrCat("put /w/b=2@", r2), absl::StrCat("put /w/a=3@", r3),
                          absl::StrCat("delete /w/b@", *r4), absl::StrCat("put /w/c=5@", r5)));
  ASSERT_THAT(events, SizeIs(4));
  // prev_kv: what the key was before each change.
  ASSERT_TRUE(events[1].prev_kv.has_value());
  EXPECT_EQ(events[1].prev_kv->value, "1");
  EXPECT_EQ(events[1].prev_kv->mod_revision, r1);
  EXPECT_EQ(events[1].kv.create_revision, r1);
  EXPECT_EQ(events[1].kv.version, 2);
  ASSERT_TRUE(events[2].prev_kv.has_value());
  EXPECT_EQ(events[2].prev_kv->value, "2");
  EXPECT_FALSE(events[3].prev_kv.has_value());
  EXPECT_EQ(recorder.empty_batches(), 0);
}

TYPED_TEST(EtcdConformanceTest, AWatchFromRevisionZeroSeesOnlyLaterChangesUnderItsPrefix) {
  this->PutOrDie("/z/old", "x");
  WatchRecorder recorder;
  ASSERT_THAT(this->etcd().Watch("/z/", 0, recorder.Callback()), IsOk());
  this->PutOrDie("/y", "outside");
  const int64_t r = this->PutOrDie("/z/new", "y");
  ASSERT_TRUE(recorder.WaitForEvents(1));
  // One more under the prefix, so that a wrongly delivered event before it would show.
  const int64_t r2 = this->PutOrDie("/z/new", "z");
  ASSERT_TRUE(recorder.WaitForEvents(2));
  EXPECT_THAT(Describe(recorder.events()),
              ElementsAre(absl::StrCat("put /z/new=y@", r), absl::StrCat("put /z/new=z@", r2)));
}

TYPED_TEST(EtcdConformanceTest, ACancelledWatchIsNotCalledAgain) {
  WatchRecorder cancelled;
  WatchRecorder kept;
  absl::StatusOr<WatchId> id = this->etcd().Watch("/x", 0, cancelled.Callback());
  ASSERT_THAT(id, IsOk());
  ASSERT_THAT(this->etcd().Watch("/x", 0, kept.Callback()), IsOk());
  this->PutOrDie("/x", "1");
  ASSERT_TRUE(cancelled.WaitForEvents(1));
  ASSERT_THAT(this->etcd().CancelWatch(*id), IsOk());
  this->PutOrDie("/x", "2");
  ASSERT_TRUE(kept.WaitForEvents(2));
  EXPECT_THAT(cancelled.events(), SizeIs(1));
  EXPECT_THAT(this->etcd().CancelWatch(*id), IsOk());  // again: nothing to do
  EXPECT_THAT(this->etcd().CancelWatch(*id + 1000), StatusIs(absl::StatusCode::kNotFound));
}

TYPED_TEST(EtcdConformanceTest, AWatchResumesAfterItsStreamBreaksWithoutLosingOrRepeatingEvents) {
  WatchRecorder recorder;
  const int64_t start = this->etcd().Get("/r")->revision + 1;
  ASSERT_THAT(this->backend_.watcher().Watch("/r/", start, recorder.Callback()), IsOk());
  std::vector<std::string> expected;
  for (int i = 0; i < 3; ++i) {
    const int64_t r = this->PutOrDie(absl::StrCat("/r/", i), "before");
    expected.push_back(absl::StrCat("put /r/", i, "=before@", r));
  }
  ASSERT_TRUE(recorder.WaitForEvents(3));
  ASSERT_THAT(this->backend_.BreakWatchStreams(), IsOk());
  // Made while the watch is broken (or reconnecting): it must fetch them from the history.
  for (int i = 3; i < 6; ++i) {
    const int64_t r = this->PutOrDie(absl::StrCat("/r/", i), "during");
    expected.push_back(absl::StrCat("put /r/", i, "=during@", r));
  }
  this->backend_.HealWatchStreams();
  ASSERT_TRUE(recorder.WaitForEvents(6)) << ::testing::PrintToString(Describe(recorder.events()));
  const int64_t last = this->PutOrDie("/r/last", "after");
  expected.push_back(absl::StrCat("put /r/last=after@", last));
  ASSERT_TRUE(recorder.WaitForEvents(7));
  EXPECT_THAT(recorder.error(), IsOk());
  EXPECT_THAT(Describe(recorder.events()), ::testing::ElementsAreArray(expected));
}

TYPED_TEST(EtcdConformanceTest, AWatchFromACompactedRevisionIsReportedAsOutOfRange) {
  const int64_t r1 = this->PutOrDie("/h", "1");
  const int64_t r2 = this->PutOrDie("/h", "2");
  ASSERT_THAT(this->backend_.Compact(r2), IsOk());
  WatchRecorder compacted;
  ASSERT_THAT(this->etcd().Watch("/h", r1, compacted.Callback()), IsOk());
  ASSERT_TRUE(compacted.WaitForEvents(1));
  EXPECT_THAT(compacted.error(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr(absl::StrCat(r2))));
  EXPECT_THAT(compacted.events(), IsEmpty());
  // The compaction revision itself is still there.
  WatchRecorder kept;
  ASSERT_THAT(this->etcd().Watch("/h", r2, kept.Callback()), IsOk());
  ASSERT_TRUE(kept.WaitForEvents(1));
  EXPECT_THAT(kept.error(), IsOk());
  EXPECT_THAT(Describe(kept.events()), ElementsAre(absl::StrCat("put /h=2@", r2)));
  // Compacting again at or below it, or in the future, is refused.
  EXPECT_THAT(this->backend_.Compact(r1), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(this->backend_.Compact(r2 + 100), StatusIs(absl::StatusCode::kOutOfRange));
}

}  // namespace
}  // namespace jobbroker::cluster
