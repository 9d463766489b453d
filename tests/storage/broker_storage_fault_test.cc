// The broker on RocksDB on a disk that fills up or breaks, then heals: changes are refused with
// RESOURCE_EXHAUSTED (full) or UNAVAILABLE (I/O error) and change nothing, reads keep answering,
// Tick retries the store and writes resume without a restart, and every acknowledged job is
// intact, in memory and after a reopen from disk.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/broker.h"
#include "core/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/rocksdb_store.h"
#include "tests/storage/faulty_file_system.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::storage {

using ::jobbroker::testing::StatusIs;

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;

namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using Code = absl::StatusCode;
using Fault = FaultyFileSystem::Fault;

class BrokerOnFaultyDiskTest : public ::testing::TestWithParam<Fault> {
 protected:
  static constexpr absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

  void SetUp() override { Open(faulty_.env.get()); }

  void Open(rocksdb::Env* env) {
    broker_.reset();
    store_.reset();
    RocksDbStoreOptions store_options;
    store_options.env = env;
    auto store = RocksDbStore::Open(path_, store_options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    core::BrokerOptions o;
    o.commit_mode = core::CommitPipeline::Mode::kInline;
    o.uniform = [] { return 0.5; };
    o.wake = [this] { ++wakes_; };
    auto broker = BlockingBroker::Open(*store_, clock_, o);
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
  }

  Code Expected() const {
    return GetParam() == Fault::kNoSpace ? Code::kResourceExhausted : Code::kUnavailable;
  }
  const char* ExpectedWords() const {
    return GetParam() == Fault::kNoSpace ? "storage is full" : "storage is failing";
  }

  std::string Enqueue(const std::string& payload) {
    auto r = broker_->Enqueue(core::EnqueueSpec{.queue = "q", .payload = payload});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id : "";
  }

  // Id -> state of every job of "q".
  std::vector<std::pair<std::string, core::JobState>> Jobs() {
    auto r = broker_->ListJobs(core::ListJobsSpec{.queue = "q"});
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::pair<std::string, core::JobState>> out;
    if (r.ok())
      for (const core::Job& j : r->jobs) out.emplace_back(j.id, j.state);
    return out;
  }

  ScopedTempDir tmp_;
  const std::string path_ = tmp_.Sub("db");
  FaultyEnv faulty_;
  FakeClock clock_{kStart};
  int wakes_ = 0;
  std::unique_ptr<RocksDbStore> store_;
  std::unique_ptr<BlockingBroker> broker_;
};

TEST_P(BrokerOnFaultyDiskTest, RefusesChangesKeepsReadsAndResumesWithoutLosingAcknowledgedJobs) {
  const std::string a = Enqueue("a");
  const std::string b = Enqueue("b");
  const std::string c = Enqueue("c");
  auto leased = broker_->Lease(core::LeaseSpec{"q", "w", 1, absl::Seconds(60)});
  ASSERT_TRUE(leased.ok() && leased->size() == 1u) << leased.status();
  const core::LeasedJob held = leased->front();
  ASSERT_EQ(held.job_id, a);

  faulty_.fs->SetFault(GetParam());
  const int wakes_before = wakes_;
  auto failed = broker_->Enqueue(core::EnqueueSpec{.queue = "q", .payload = "d"});
  EXPECT_THAT(failed, StatusIs(Expected())) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("could not be made durable"));
  EXPECT_THAT(failed.status().message(), HasSubstr(ExpectedWords()));
  EXPECT_GT(faulty_.fs->injected(), 0);
  EXPECT_GT(wakes_, wakes_before) << "the ticker must be woken to schedule the retries";

  // Every change is refused now, with the same code and a message that says why.
  auto refused = broker_->Enqueue(core::EnqueueSpec{.queue = "q", .payload = "e"});
  EXPECT_THAT(refused, StatusIs(Expected()));
  EXPECT_THAT(refused.status().message(), HasSubstr(ExpectedWords()));
  EXPECT_THAT(refused.status().message(), HasSubstr("writes resume"));
  EXPECT_THAT(broker_->Ack(core::AckSpec{held.job_id, held.lease_id, "r"}), StatusIs(Expected()));
  EXPECT_THAT(broker_->Lease(core::LeaseSpec{"q", "w", 1, {}}), StatusIs(Expected()));
  EXPECT_THAT(broker_->CancelJob(b), StatusIs(Expected()));
  EXPECT_THAT(broker_->storage_status(), StatusIs(Expected()));

  // Reads answer, and show the acknowledged jobs as they were.
  ASSERT_TRUE(broker_->GetJob(a).ok());
  EXPECT_EQ(broker_->GetJob(a)->state, core::JobState::kActive);
  EXPECT_EQ(broker_->GetJob(b)->state, core::JobState::kReady);
  EXPECT_EQ(broker_->GetJob(c)->state, core::JobState::kReady);
  EXPECT_TRUE(broker_->GetQueue("q").ok());
  EXPECT_FALSE(broker_->ListQueues().empty());

  // The retry comes after store_retry_interval (1 s), and fails while the disk does.
  broker_->Tick();
  EXPECT_THAT(broker_->storage_status(), StatusIs(Expected()));
  clock_.Advance(absl::Seconds(1));
  broker_->Tick();
  EXPECT_THAT(broker_->storage_status(), StatusIs(Expected())) << "the disk still fails";
  EXPECT_THAT(broker_->Enqueue(core::EnqueueSpec{.queue = "q"}), StatusIs(Expected()));

  faulty_.fs->SetFault(Fault::kNone);
  clock_.Advance(absl::Milliseconds(500));
  broker_->Tick();
  EXPECT_FALSE(broker_->storage_status().ok()) << "not before the next retry is due";
  clock_.Advance(absl::Milliseconds(500));
  broker_->Tick();
  ASSERT_TRUE(broker_->storage_status().ok()) << broker_->storage_status();

  // Memory was rebuilt from the store: the refused enqueue left nothing, the lease held.
  EXPECT_THAT(Jobs(), UnorderedElementsAre(std::pair(a, core::JobState::kActive),
                                           std::pair(b, core::JobState::kReady),
                                           std::pair(c, core::JobState::kReady)));
  // Writes work again, the worker's lease is still good.
  EXPECT_TRUE(broker_->Ack(core::AckSpec{held.job_id, held.lease_id, "r"}).ok());
  const std::string f = Enqueue("f");
  auto next = broker_->Lease(core::LeaseSpec{"q", "w", 1, absl::Seconds(60)});
  ASSERT_TRUE(next.ok() && next->size() == 1u);
  EXPECT_EQ(next->front().job_id, b);

  // All of it is on disk: a restart on the plain filesystem sees the same.
  Open(nullptr);
  EXPECT_THAT(Jobs(), UnorderedElementsAre(std::pair(a, core::JobState::kCompleted),
                                           std::pair(b, core::JobState::kActive),
                                           std::pair(c, core::JobState::kReady),
                                           std::pair(f, core::JobState::kReady)));
  EXPECT_EQ(broker_->GetJob(a)->result, "r");
}

TEST_P(BrokerOnFaultyDiskTest, ResumeWritesTriesAtOnce) {
  const std::string a = Enqueue("a");
  faulty_.fs->SetFault(GetParam());
  EXPECT_THAT(broker_->Enqueue(core::EnqueueSpec{.queue = "q"}), StatusIs(Expected()));
  EXPECT_THAT(broker_->ResumeWrites(), StatusIs(Expected()));
  faulty_.fs->SetFault(Fault::kNone);
  ASSERT_TRUE(broker_->ResumeWrites().ok());
  EXPECT_TRUE(broker_->ResumeWrites().ok()) << "nothing to do is OK";
  const std::string b = Enqueue("b");
  Open(nullptr);
  EXPECT_THAT(Jobs(), UnorderedElementsAre(std::pair(a, core::JobState::kReady),
                                           std::pair(b, core::JobState::kReady)));
}

INSTANTIATE_TEST_SUITE_P(Faults, BrokerOnFaultyDiskTest,
                         ::testing::Values(Fault::kNoSpace, Fault::kIoError),
                         [](const ::testing::TestParamInfo<Fault>& info) {
                           return info.param == Fault::kNoSpace ? "NoSpace" : "IoError";
                         });

}  // namespace
}  // namespace jobbroker::storage
