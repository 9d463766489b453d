// Durability: what the broker acknowledged survives kill -9 and a graceful stop, and leases that
// ran out while it was down become failed attempts on restart (DESIGN.md "Delivery semantics").

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/http_client.h"
#include "tests/testing/matchers.h"

namespace jobbroker::testing {
namespace {

// Retries due almost at once, exactly (no jitter); completed jobs are all kept, so that every
// acknowledged job can still be found after the test acked it.
constexpr char kConfig[] = R"({
  "defaultPolicy": {
    "retry": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s",
              "jitter": "JITTER_NONE"},
    "completedRetention": {"maxCount": "1000000", "maxAge": "86400s"}
  },
  "queues": {"crash-group": {"durability": "DURABILITY_GROUP", "groupCommitDelay": "0.2s"}}
})";

constexpr char kQueue[] = "crash";
constexpr absl::Duration kWait = absl::Seconds(10);

class CrashTest : public BrokerFixture {
 protected:
  CrashTest() : BrokerFixture({.config_json = kConfig}) {}
};

// The queue's durability is the parameter: SYNC (the default) answers after fsync, GROUP once the
// change is in the log (the kernel keeps it when the process dies; the fsync comes within
// 200 ms here). Neither may lose an answered enqueue to kill -9. "crash-cold" is SYNC with every
// waiting job cold (--max-hot-jobs 0): after the restart each one is read back from RocksDB.
class CrashDurabilityTest : public BrokerFixtureWithParam<const char*> {
 protected:
  CrashDurabilityTest() : BrokerFixtureWithParam(kStartInTest) {}

  void SetUp() override {
    BrokerProcessOptions options{.config_json = kConfig};
    if (std::string(GetParam()) == "crash-cold") options.extra_args = {"--max-hot-jobs", "0"};
    Start(std::move(options));
  }
};

TEST_P(CrashDurabilityTest, AcknowledgedEnqueuesSurviveKill9) {
  const std::string kQueue = GetParam();
  constexpr int kProducers = 8;
  constexpr int kKillAfter = 400;
  std::atomic<int> acked{0};
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  std::vector<std::string> acked_ids;           // guarded by mu
  std::map<std::string, std::string> payloads;  // guarded by mu

  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      // One channel per producer, so that the enqueues really run side by side.
      BrokerClient producer(process().NewChannel(), absl::Seconds(10));
      for (int i = 0; !stop.load(); ++i) {
        v1::EnqueueRequest req;
        req.set_queue(kQueue);
        req.set_payload(absl::StrCat("producer-", p, "-job-", i));
        v1::EnqueueResponse resp;
        // After the kill every call fails (UNAVAILABLE); that ends the producer.
        if (!producer.Enqueue(req, &resp).ok()) break;
        absl::MutexLock lock(&mu);
        acked_ids.push_back(resp.job_id());
        payloads[resp.job_id()] = req.payload();
        acked.fetch_add(1);
      }
    });
  }

  const bool enough = PollUntil([&] { return acked.load() >= kKillAfter; }, absl::Seconds(120));
  process().Kill9();
  stop.store(true);
  for (std::thread& t : producers) t.join();
  ASSERT_TRUE(enough) << "only " << acked.load() << " enqueues were acknowledged in 120 s";

  ASSERT_NO_FATAL_FAILURE(Restart());
  const int n = static_cast<int>(acked_ids.size());
  ASSERT_GE(n, kKillAfter);
  if (kQueue == "crash-cold") {
    // Recovery kept them as index entries only: each GetJob and lease below reads one back.
    const std::string metrics = HttpGet(process().http_address(), "/metrics");
    EXPECT_GE(Sample(metrics, R"(jobbroker_jobs_in_memory{form="index_only"})"), n) << metrics;
  }
  for (const std::string& id : acked_ids) {
    v1::Job job;
    ASSERT_THAT(client().GetJob(id, &job), IsOk()) << "acknowledged job " << id << " was lost";
    EXPECT_EQ(job.state(), v1::JOB_STATE_READY) << id;
    EXPECT_EQ(job.payload(), payloads[id]) << id;
  }

  // Every job there (the acknowledged ones, and any whose reply the kill cut off) can be leased
  // and acked.
  std::set<std::string> leased_ids;
  for (int round = 0; round < 100000; ++round) {
    std::vector<v1::LeasedJob> jobs = client().MustLease(kQueue, "drainer", 100);
    if (jobs.empty()) break;
    for (const v1::LeasedJob& job : jobs) {
      EXPECT_TRUE(leased_ids.insert(job.job_id()).second) << "leased twice: " << job.job_id();
      client().MustAck(job);
    }
    if (::testing::Test::HasFailure()) break;
  }
  for (const std::string& id : acked_ids) {
    EXPECT_TRUE(leased_ids.count(id) == 1) << "acknowledged job " << id << " was never leased";
  }
  std::map<std::string, int64_t> counts = client().Counts(kQueue);
  EXPECT_EQ(counts["JOB_STATE_COMPLETED"], static_cast<int64_t>(leased_ids.size()));
  EXPECT_EQ(counts["JOB_STATE_READY"], 0);
  EXPECT_EQ(counts["JOB_STATE_ACTIVE"], 0);
  EXPECT_EQ(counts["JOB_STATE_SCHEDULED"], 0);
  EXPECT_GE(static_cast<int>(leased_ids.size()), n);
  // For the log: the jobs beyond n are enqueues whose reply the kill cut off.
  RecordProperty("acknowledged_before_kill", n);
  RecordProperty("jobs_after_restart", static_cast<int>(leased_ids.size()));
}

INSTANTIATE_TEST_SUITE_P(Durability, CrashDurabilityTest,
                         ::testing::Values("crash", "crash-group", "crash-cold"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           const std::string queue = info.param;
                           if (queue == "crash-cold") return std::string("SyncCold");
                           return std::string(queue == "crash" ? "Sync" : "Group");
                         });

TEST_F(CrashTest, AcknowledgedAcksSurviveKill9) {
  constexpr int kJobs = 3000;
  constexpr int kWorkers = 8;
  constexpr int kKillAfter = 300;
  for (int first = 0; first < kJobs; first += 500) {
    v1::EnqueueBatchRequest batch;
    for (int i = first; i < first + 500; ++i) {
      v1::EnqueueRequest* job = batch.add_jobs();
      job->set_queue(kQueue);
      job->set_payload(absl::StrCat("job-", i));
    }
    v1::EnqueueBatchResponse resp;
    ASSERT_THAT(client().EnqueueBatch(batch, &resp), IsOk());
  }

  std::atomic<int> acked{0};
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  std::vector<std::string> acked_ids;  // guarded by mu
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      BrokerClient worker(process().NewChannel(), absl::Seconds(10));
      v1::LeaseRequest lease;
      lease.set_queue(kQueue);
      lease.set_worker_id(absl::StrCat("worker-", w));
      while (!stop.load()) {
        v1::LeaseResponse leased;
        if (!worker.Lease(lease, &leased).ok() || leased.jobs().empty()) break;
        v1::AckRequest ack;
        ack.set_job_id(leased.jobs(0).job_id());
        ack.set_lease_id(leased.jobs(0).lease_id());
        if (!worker.Ack(ack).ok()) break;
        absl::MutexLock lock(&mu);
        acked_ids.push_back(ack.job_id());
        acked.fetch_add(1);
      }
    });
  }
  const bool enough = PollUntil([&] { return acked.load() >= kKillAfter; }, absl::Seconds(120));
  process().Kill9();
  stop.store(true);
  for (std::thread& t : workers) t.join();
  ASSERT_TRUE(enough) << "only " << acked.load() << " acks in 120 s";
  ASSERT_LT(acked_ids.size(), static_cast<size_t>(kJobs)) << "the kill came after the last ack";

  ASSERT_NO_FATAL_FAILURE(Restart());
  for (const std::string& id : acked_ids) {
    v1::Job job;
    ASSERT_THAT(client().GetJob(id, &job), IsOk()) << id;
    EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << "acknowledged ack of " << id << " was lost";
  }
  std::map<std::string, int64_t> counts = client().Counts(kQueue);
  int64_t total = 0;
  for (const auto& [state, n] : counts) total += n;
  EXPECT_EQ(total, kJobs);
  EXPECT_GE(counts["JOB_STATE_COMPLETED"], static_cast<int64_t>(acked_ids.size()));
  RecordProperty("acks_before_kill", static_cast<int>(acked_ids.size()));
}

TEST_F(CrashTest, LeaseThatRanOutWhileDownIsRetriedWithItsCheckpoint) {
  const std::string id = client().MustEnqueue(kQueue, "resumable");
  std::optional<v1::LeasedJob> first =
      client().LeaseOne(kQueue, "worker-1", kWait, absl::Seconds(1));
  ASSERT_TRUE(first.has_value());

  v1::HeartbeatRequest hb;
  hb.set_job_id(id);
  hb.set_lease_id(first->lease_id());
  hb.set_checkpoint("page-42");
  v1::HeartbeatResponse hb_resp;
  ASSERT_THAT(client().Heartbeat(hb, &hb_resp), IsOk());
  const absl::Time deadline =
      std::max(FromProto(hb_resp.lease_deadline()), FromProto(first->lease_deadline()));

  process().Kill9();
  // Wall-clock wait: the lease must run out while the broker is down.
  absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(200));
  ASSERT_NO_FATAL_FAILURE(Restart());

  std::optional<v1::LeasedJob> second = client().LeaseOne(kQueue, "worker-2", kWait);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->job_id(), id);
  EXPECT_EQ(second->attempt(), 2);
  EXPECT_EQ(second->checkpoint(), "page-42");
  EXPECT_EQ(second->idempotency_key(), first->idempotency_key());

  v1::Job job = client().MustGetJob(id);
  ASSERT_THAT(job.attempts(), SizeIs(2));
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LEASE_EXPIRED);
  EXPECT_EQ(job.attempts(0).worker_id(), "worker-1");

  // The first attempt's lease is stale now that attempt 2 runs.
  v1::AckRequest ack;
  ack.set_job_id(id);
  ack.set_lease_id(first->lease_id());
  EXPECT_THAT(client().Ack(ack), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  client().MustAck(*second);
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(CrashTest, LeaseStillRunningAfterRestartCanBeAcked) {
  const std::string id = client().MustEnqueue(kQueue, "in-flight");
  std::optional<v1::LeasedJob> job =
      client().LeaseOne(kQueue, "worker-1", kWait, absl::Seconds(120));
  ASSERT_TRUE(job.has_value());

  ASSERT_NO_FATAL_FAILURE(Kill9AndRestart());

  v1::Job active = client().MustGetJob(id);
  EXPECT_EQ(active.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_THAT(client().MustLease(kQueue, "worker-2"), SizeIs(0));
  client().MustAck(*job, "finished across a restart");
  v1::Job done = client().MustGetJob(id);
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(done.result(), "finished across a restart");
}

TEST_F(CrashTest, SigtermWhileIdleExitsZeroAndLosesNothing) {
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(client().MustEnqueue(kQueue, absl::StrCat("j", i)));
  for (int i = 0; i < 5; ++i) {
    std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", kWait);
    ASSERT_TRUE(job.has_value());
    client().MustAck(*job, absl::StrCat("r", i));
  }
  std::optional<v1::LeasedJob> poison = client().LeaseOne(kQueue, "worker-1", kWait);
  ASSERT_TRUE(poison.has_value());
  v1::FailRequest fail;
  fail.set_job_id(poison->job_id());
  fail.set_lease_id(poison->lease_id());
  fail.set_permanent(true);
  fail.set_error("poison");
  v1::FailResponse fail_resp;
  ASSERT_THAT(client().Fail(fail, &fail_resp), IsOk());

  std::map<std::string, v1::Job> before;
  for (const std::string& id : ids) before[id] = client().MustGetJob(id);
  const std::map<std::string, int64_t> counts_before = client().Counts(kQueue);

  absl::StatusOr<int> code = process().Terminate();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << process().ReadStderr();
  ASSERT_NO_FATAL_FAILURE(Restart());

  EXPECT_EQ(client().Counts(kQueue), counts_before);
  for (const std::string& id : ids) {
    v1::Job after;
    ASSERT_THAT(client().GetJob(id, &after), IsOk()) << id;
    EXPECT_EQ(after.state(), before[id].state()) << id;
    EXPECT_EQ(after.payload(), before[id].payload()) << id;
    EXPECT_EQ(after.result(), before[id].result()) << id;
    EXPECT_EQ(after.attempt(), before[id].attempt()) << id;
    EXPECT_EQ(after.fail_reason(), before[id].fail_reason()) << id;
    EXPECT_EQ(after.attempts_size(), before[id].attempts_size()) << id;
  }
  // The READY ones are still leasable, in their order.
  for (size_t i = 6; i < ids.size(); ++i) {
    std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-2");
    ASSERT_TRUE(job.has_value());
    EXPECT_EQ(job->job_id(), ids[i]);
  }
}

TEST_F(CrashTest, SigtermExitsZeroWhileAWorkerLongPolls) {
  std::thread waiter([&] {
    BrokerClient worker(process().NewChannel());
    v1::LeaseRequest req;
    req.set_queue(kQueue);
    req.set_worker_id("waiting");
    *req.mutable_wait() = ToProto(absl::Seconds(30));
    v1::LeaseResponse resp;
    // Any outcome is fine (an empty reply, or UNAVAILABLE); it only must not hold up the stop.
    worker.Lease(req, &resp);
  });
  // The stop must come while the Lease waits in the broker.
  ASSERT_TRUE(WaitFor([&] {
    v1::QueueInfo info;
    return client().GetQueue(kQueue, &info).ok() && info.waiting_leases() == 1;
  })) << "the long poll never reached the broker";
  absl::StatusOr<int> code = process().Terminate(absl::Seconds(20));
  waiter.join();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << process().ReadStderr();
}

// NONE promises nothing across a crash, but a clean stop still writes and fsyncs everything:
// the stop's flush asks for the fsync that nothing else would (it used to wait for one for ever,
// and the broker sat out SIGTERM until it was killed).
class CleanStopTest : public BrokerFixture {
 protected:
  CleanStopTest()
      : BrokerFixture({.config_json = R"({"defaultPolicy": {"durability": "DURABILITY_NONE"}})"}) {}
};

TEST_F(CleanStopTest, SigtermWithNoneDurabilityFlushesAndExitsZero) {
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(client().MustEnqueue("throwaway", absl::StrCat(i)));
  absl::StatusOr<int> code = process().Terminate(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << process().ReadStderr();

  ASSERT_NO_FATAL_FAILURE(Restart());
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(client().MustGetJob(ids[i]).payload(), absl::StrCat(i)) << ids[i];
}

}  // namespace
}  // namespace jobbroker::testing
