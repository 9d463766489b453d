#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "core/broker.h"
#include "core/clock.h"
#include "gtest/gtest.h"
#include "storage/memory_store.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/faulty_store.h"

namespace jobbroker::core {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;

// A broker on a FakeClock and a MemoryStore, writing inline, with jitter pinned by `uniform`.
class BrokerFixture : public ::testing::Test {
 protected:
  static constexpr absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

  BrokerFixture() : clock_(kStart) {}
  void SetUp() override { Reopen(); }

  BrokerOptions Options() {
    BrokerOptions o;
    o.commit_mode = CommitPipeline::Mode::kInline;
    o.uniform = [this] { return uniform_; };
    o.default_policy = default_policy_;
    o.queue_policies = queue_policies_;
    // The suite runs twice (tests/core/CMakeLists.txt): as is, and with 0 here, so that every
    // READY and SCHEDULED job goes cold as soon as it is written and each test also checks the
    // read-back path.
    if (const char* hot = std::getenv("JOBBROKER_TEST_MAX_HOT_JOBS"))
      o.max_hot_jobs = std::atoll(hot);
    return o;
  }

  // A restart: a new broker over the same store.
  void Reopen() {
    broker_.reset();
    auto opened = BlockingBroker::Open(store_, clock_, Options());
    ASSERT_TRUE(opened.ok()) << opened.status();
    broker_ = std::move(*opened);
  }

  std::string Enqueue(const std::string& queue, const std::string& payload = "p",
                      int32_t priority = 0) {
    EnqueueSpec s;
    s.queue = queue;
    s.payload = payload;
    s.priority = priority;
    auto r = broker_->Enqueue(std::move(s));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id : "";
  }

  // Leases one job; fails the test if none is ready.
  LeasedJob LeaseOne(const std::string& queue, const std::string& worker = "w1",
                     absl::Duration lease = absl::ZeroDuration()) {
    auto r = broker_->Lease(LeaseSpec{queue, worker, 1, lease});
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r.ok() ? r->size() : 0u, 1u) << "no job was ready in " << queue;
    return r.ok() && !r->empty() ? r->front() : LeasedJob{};
  }

  size_t Leasable(const std::string& queue, int max = 100) {
    auto r = broker_->Lease(LeaseSpec{queue, "probe", max, absl::ZeroDuration()});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->size() : 0;
  }

  Job Get(const std::string& id) {
    auto r = broker_->GetJob(id);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : Job{};
  }

  absl::StatusOr<FailResult> Fail(const LeasedJob& j, const std::string& error,
                                  bool permanent = false) {
    return broker_->Fail(FailSpec{j.job_id, j.lease_id, error, permanent, std::nullopt});
  }

  FakeClock clock_;
  testing::FaultyStore store_;
  double uniform_ = 0.5;
  PolicyOverride default_policy_;
  std::map<std::string, PolicyOverride> queue_policies_;
  std::unique_ptr<BlockingBroker> broker_;
};

}  // namespace jobbroker::core
