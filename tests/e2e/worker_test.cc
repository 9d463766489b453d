// The C++ worker runner (jobbroker::client::Worker) against the real binary.
#include "jobbroker/worker.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"

namespace jobbroker::testing {
namespace {

using client::JobContext;
using client::Worker;
using client::WorkerOptions;

constexpr char kConfig[] = R"({
  "defaultPolicy": {
    "retry": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s",
              "jitter": "JITTER_NONE"}
  }
})";

class WorkerTest : public BrokerFixture {
 protected:
  WorkerTest() : BrokerFixture({.config_json = kConfig}) {}

  WorkerOptions Options(int concurrency = 1) {
    WorkerOptions o;
    o.address = process().address();
    o.worker_id = "test-worker";
    o.concurrency = concurrency;
    return o;
  }

  // Waits (polling: the worker acts on its own threads) until the job is in `state`.
  bool AwaitState(const std::string& id, v1::JobState state,
                  absl::Duration timeout = absl::Seconds(30)) {
    return WaitFor([&] { return client().MustGetJob(id).state() == state; }, timeout);
  }
};

TEST_F(WorkerTest, RunsTheHandlerAndAcksWithItsResult) {
  Worker worker(Options());
  std::atomic<int> seen_attempt{0};
  std::string seen_key;
  absl::Mutex mu;
  worker.Handle("emails", [&](JobContext& job) {
    seen_attempt = job.attempt();
    absl::MutexLock lock(&mu);
    seen_key = job.idempotency_key();
    job.SetResult(absl::StrCat("sent to ", job.payload()));
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  std::string id = client().MustEnqueue("emails", "ada@example.com");
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  EXPECT_EQ(client().MustGetJob(id).result(), "sent to ada@example.com");
  EXPECT_EQ(seen_attempt.load(), 1);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen_key, id);
}

TEST_F(WorkerTest, HeartbeatsKeepAOneSecondLeaseAliveForAThreeSecondJob) {
  WorkerOptions options = Options();
  options.lease_duration = absl::Seconds(1);
  Worker worker(options);
  std::atomic<bool> saw_cancel{false};
  worker.Handle("slow", [&](JobContext& job) {
    absl::Time end = absl::Now() + absl::Seconds(3);
    while (absl::Now() < end) {
      if (job.cancelled()) saw_cancel = true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  std::string id = client().MustEnqueue("slow");
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.attempts_size(), 1) << "the lease never ran out";
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_COMPLETED);
  EXPECT_FALSE(saw_cancel.load());
}

TEST_F(WorkerTest, PermanentErrorFailsAfterOneAttempt) {
  Worker worker(Options());
  worker.Handle("emails", [](JobContext&) { return client::PermanentError("no such mailbox"); });
  ASSERT_TRUE(worker.Start().ok());
  std::string id = client().MustEnqueue("emails");
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_FAILED));
  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.fail_reason(), v1::FAIL_REASON_PERMANENT);
  EXPECT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.last_error(), "no such mailbox");
}

TEST_F(WorkerTest, AnErrorIsRetriedAndTheNextAttemptSeesTheCheckpoint) {
  Worker worker(Options());
  absl::Mutex mu;
  std::vector<std::string> checkpoints;
  worker.Handle("import", [&](JobContext& job) {
    {
      absl::MutexLock lock(&mu);
      checkpoints.push_back(job.checkpoint());
    }
    if (job.attempt() == 1) {
      job.SaveCheckpoint("row 500");
      return absl::UnavailableError("database went away");
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  std::string id = client().MustEnqueue("import");
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  v1::Job job = client().MustGetJob(id);
  ASSERT_EQ(job.attempts_size(), 2);
  EXPECT_EQ(job.attempts(0).error(), "database went away");
  absl::MutexLock lock(&mu);
  EXPECT_THAT(checkpoints, ::testing::ElementsAre("", "row 500"));
}

TEST_F(WorkerTest, RetryAfterReplacesTheBackoff) {
  Worker worker(Options());
  worker.Handle("api", [](JobContext&) { return client::RetryAfter(absl::Hours(1), "429"); });
  ASSERT_TRUE(worker.Start().ok());
  absl::Time before = absl::Now();
  std::string id = client().MustEnqueue("api");
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_SCHEDULED));
  v1::Job job = client().MustGetJob(id);
  absl::Time run_at = absl::FromUnixSeconds(job.run_at().seconds());
  EXPECT_GT(run_at, before + absl::Minutes(59));
  EXPECT_EQ(job.last_error(), "429");
}

TEST_F(WorkerTest, SnoozeGivesTheJobBackWithoutSpendingAnAttempt) {
  Worker worker(Options());
  std::atomic<int> runs{0};
  worker.Handle("not-yet", [&](JobContext& job) {
    if (runs.fetch_add(1) == 0) return client::Snooze(absl::Milliseconds(200));
    job.SetResult(absl::StrCat("attempt ", job.attempt()));
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  v1::EnqueueRequest req;
  req.set_queue("not-yet");
  req.set_max_attempts(1);
  std::string id = client().MustEnqueue(req);
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.result(), "attempt 1") << "the snooze was not counted as an attempt";
  EXPECT_EQ(job.snoozes(), 1);
  EXPECT_EQ(worker.stats().snoozed, 1);
}

TEST_F(WorkerTest, AHandlerPastItsRunTimeLimitSeesCancelledAndTheAttemptTimesOut) {
  Worker worker(Options());
  absl::Notification started;
  std::atomic<bool> had_limit{false};
  worker.Handle("hangs", [&](JobContext& job) {
    had_limit = job.timeout_at() != absl::InfiniteFuture();
    job.SetProgress(R"({"percent": 10})");
    started.Notify();
    while (!job.cancelled()) absl::SleepFor(absl::Milliseconds(20));
    return absl::DeadlineExceededError("gave up at the limit");
  });
  ASSERT_TRUE(worker.Start().ok());
  v1::EnqueueRequest req;
  req.set_queue("hangs");
  req.set_max_attempts(1);
  req.mutable_timeout()->set_nanos(500'000'000);
  std::string id = client().MustEnqueue(req);
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_FAILED));
  v1::Job job = client().MustGetJob(id);
  EXPECT_TRUE(had_limit.load());
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_TIMED_OUT);
}

TEST_F(WorkerTest, ProgressTravelsWithTheHeartbeatsIntoTheJob) {
  WorkerOptions options = Options();
  options.lease_duration = absl::Milliseconds(300);  // heartbeats every 100 ms
  Worker worker(options);
  absl::Notification seen;
  worker.Handle("reports", [&](JobContext& job) {
    job.SetProgress(R"({"percent": 40})");
    seen.WaitForNotificationWithTimeout(absl::Seconds(30));
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  std::string id = client().MustEnqueue("reports");
  EXPECT_TRUE(WaitFor([&] { return client().MustGetJob(id).progress() == R"({"percent": 40})"; }));
  seen.Notify();
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
}

TEST_F(WorkerTest, ACancelledJobsHandlerIsTold) {
  Worker worker(Options());
  absl::Notification started;
  worker.Handle("long", [&](JobContext& job) {
    started.Notify();
    while (!job.cancelled()) absl::SleepFor(absl::Milliseconds(20));
    return absl::CancelledError("stopped on request");
  });
  ASSERT_TRUE(worker.Start().ok());
  std::string id = client().MustEnqueue("long");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  v1::Job cancelled;
  ASSERT_TRUE(client().CancelJob(id, &cancelled).ok());
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_CANCELLED));
}

TEST_F(WorkerTest, GracefulStopReleasesUnstartedJobsAndFinishesRunningOnes) {
  WorkerOptions options = Options(/*concurrency=*/1);
  options.prefetch = 2;  // two jobs wait in the worker, leased but not started
  Worker worker(options);
  absl::Notification started;
  absl::Notification finish;
  worker.Handle("q", [&](JobContext&) {
    started.Notify();
    finish.WaitForNotificationWithTimeout(absl::Seconds(30));
    return absl::OkStatus();
  });
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(client().MustEnqueue("q", absl::StrCat(i)));
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(WaitFor([&] { return client().Counts("q")["JOB_STATE_ACTIVE"] == 3; }));
  // The running job finishes only once the stop has given the two unstarted ones back.
  std::thread stopper([&] { worker.Stop(absl::Seconds(10)); });
  const bool released = WaitFor([&] { return client().Counts("q")["JOB_STATE_READY"] == 2; });
  finish.Notify();
  stopper.join();
  ASSERT_TRUE(released) << "the stop did not release the unstarted jobs";
  EXPECT_EQ(worker.stats().acked, 1);
  EXPECT_EQ(worker.stats().released, 2);
  std::map<std::string, int64_t> counts = client().Counts("q");
  EXPECT_EQ(counts["JOB_STATE_COMPLETED"], 1);
  EXPECT_EQ(counts["JOB_STATE_READY"], 2) << "nothing left ACTIVE to wait out a lease";
  EXPECT_EQ(counts["JOB_STATE_ACTIVE"], 0);
  for (const v1::Job& j : client().ListAll("q", v1::JOB_STATE_READY))
    EXPECT_EQ(j.attempt(), 0) << "a released job counts no attempt";
}

TEST_F(WorkerTest, ReconnectsAfterTheBrokerRestarts) {
  std::string address = process().address();
  std::string port = address.substr(address.rfind(':') + 1);
  Worker worker(Options());
  worker.Handle("q", [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());
  std::string first = client().MustEnqueue("q");
  ASSERT_TRUE(AwaitState(first, v1::JOB_STATE_COMPLETED));

  absl::StatusOr<int> code = process().Terminate();
  ASSERT_TRUE(code.ok() && *code == 0);
  // The same data and the same port: the worker's address stays right.
  BrokerProcessOptions again;
  again.data_dir = process().data_dir();
  again.config_json = kConfig;
  again.extra_args = {"--listen", absl::StrCat("127.0.0.1:", port)};
  auto restarted = BrokerProcess::Start(again);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  BrokerClient client((*restarted)->NewChannel());
  std::string second = client.MustEnqueue("q");
  ASSERT_TRUE(
      PollUntil([&] { return client.MustGetJob(second).state() == v1::JOB_STATE_COMPLETED; },
                absl::Seconds(30)));
  EXPECT_GE(worker.stats().reconnects, 1);
  worker.Stop(absl::Seconds(5));
}

TEST_F(WorkerTest, StartReportsABadQueueName) {
  Worker worker(Options());
  worker.Handle("not a queue", [](JobContext&) { return absl::OkStatus(); });
  absl::Status s = worker.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("queues[0]"));
  Worker none(Options());
  EXPECT_EQ(none.Start().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerTest, ListWorkersShowsAConnectedWorkerAndTheJobItRuns) {
  Worker worker(Options(2));
  absl::Notification running, finish;
  worker.Handle("emails", [&](JobContext& job) {
    job.SetProgress(R"({"percent": 10})");
    running.Notify();
    finish.WaitForNotification();
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  client::Client admin({.address = process().address()});
  ASSERT_TRUE(WaitFor([&] {
    absl::StatusOr<std::vector<v1::WorkerInfo>> w = admin.ListWorkers();
    return w.ok() && w->size() == 1;
  })) << "the worker's stream is listed once it subscribed";
  const std::string id = client().MustEnqueue("emails", "ada@example.com");
  ASSERT_TRUE(running.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = admin.ListWorkers("emails");
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  const v1::WorkerInfo& w = workers->front();
  EXPECT_EQ(w.worker_id(), "test-worker");
  EXPECT_THAT(w.queues(), ::testing::ElementsAre("emails"));
  EXPECT_EQ(w.streams(), 1);
  EXPECT_EQ(w.max_in_flight(), 2);
  EXPECT_TRUE(w.has_connected_at());
  EXPECT_TRUE(w.has_last_seen());
  EXPECT_THAT(w.peer(), ::testing::StartsWith("ipv"));  // ipv4:127.0.0.1:port or ipv6:[::1]:port
  EXPECT_THAT(w.client(), ::testing::HasSubstr(client::kClientName));  // in the user agent
  EXPECT_EQ(w.node_id(), "local");
  EXPECT_THAT(w.in_flight(), ::testing::ElementsAre(id));
  ASSERT_EQ(w.running_size(), 1);
  EXPECT_EQ(w.running(0).job_id(), id);
  EXPECT_EQ(w.running(0).queue(), "emails");
  EXPECT_EQ(w.running(0).attempt(), 1);
  EXPECT_TRUE(w.running(0).has_started_at());
  EXPECT_TRUE(w.running(0).has_lease_deadline());
  EXPECT_FALSE(w.running(0).has_timeout_at());
  absl::StatusOr<std::vector<v1::WorkerInfo>> other = admin.ListWorkers("bills");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->empty()) << "it neither takes nor runs jobs of bills";

  finish.Notify();
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  worker.Stop();
  ASSERT_TRUE(WaitFor([&] {
    absl::StatusOr<std::vector<v1::WorkerInfo>> w = admin.ListWorkers();
    return w.ok() && w->empty();
  })) << "a stopped worker that holds nothing is listed no more";
}

}  // namespace
}  // namespace jobbroker::testing
