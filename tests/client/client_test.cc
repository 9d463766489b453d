// The C++ client library (client/cpp/jobbroker/client.h) against the real broker binary: options
// reach the broker, errors keep the broker's code and message, and retries happen exactly for
// the calls that are safe to repeat.
#include "jobbroker/client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/proto_time.h"
#include "jobbroker/worker.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/test_pki.h"

namespace jobbroker::client {
namespace {

using ::jobbroker::testing::BrokerClient;
using ::jobbroker::testing::BrokerProcess;
using ::jobbroker::testing::BrokerProcessOptions;
using ::jobbroker::testing::TempDir;
using ::jobbroker::testing::TestPki;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// A TCP port of 127.0.0.1, held for the test so that nothing else takes it. Not listening,
// connects are refused: a broker that is down. Listening but never accepting, TCP connects but
// gRPC's handshake never completes: a hung broker, whose calls run into their deadline.
class Socket {
 public:
  explicit Socket(bool listen) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    if (listen) {
      EXPECT_EQ(::listen(fd_, 16), 0);
    }
  }
  ~Socket() { close(fd_); }

  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Records every on_retry call.
struct RetryLog {
  absl::Mutex mu;
  std::vector<std::pair<int, absl::Duration>> waits ABSL_GUARDED_BY(mu);
  std::vector<absl::StatusCode> codes ABSL_GUARDED_BY(mu);

  void Attach(ClientOptions& options) {
    options.on_retry = [this](int attempt, const absl::Status& status, absl::Duration wait) {
      absl::MutexLock lock(&mu);
      waits.emplace_back(attempt, wait);
      codes.push_back(status.code());
    };
  }
  std::vector<std::pair<int, absl::Duration>> Waits() {
    absl::MutexLock lock(&mu);
    return waits;
  }
  std::vector<absl::StatusCode> Codes() {
    absl::MutexLock lock(&mu);
    return codes;
  }
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<BrokerProcess>> broker = BrokerProcess::Start();
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
    client_ = std::make_unique<Client>(ClientOptions{.address = broker_->address()});
    raw_ = std::make_unique<BrokerClient>(broker_->NewChannel());
  }

  std::unique_ptr<BrokerProcess> broker_;
  std::unique_ptr<Client> client_;
  // The generated stubs, for what the client library does not do (leasing).
  std::unique_ptr<BrokerClient> raw_;
};

TEST_F(ClientTest, EnqueueOptionsRoundTripThroughGetJob) {
  EnqueueOptions options;
  options.headers = {{"trace", "abc"}, {"content-type", "application/json"}};
  options.priority = 7;
  options.delay = absl::Minutes(10);
  options.dedup_key = "order-42";
  options.dedup_ttl = absl::Hours(1);
  options.max_attempts = 3;
  options.lease_duration = absl::Seconds(45);
  options.concurrency_key = "tenant-a";
  absl::StatusOr<Enqueued> enqueued = client_->Enqueue("orders", R"({"id":42})", options);
  ASSERT_TRUE(enqueued.ok()) << enqueued.status();
  EXPECT_FALSE(enqueued->deduplicated);

  absl::StatusOr<v1::Job> job = client_->GetJob(enqueued->job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), enqueued->job_id);
  EXPECT_EQ(job->queue(), "orders");
  EXPECT_EQ(job->payload(), R"({"id":42})");
  EXPECT_THAT(job->headers(),
              UnorderedElementsAre(Pair("trace", "abc"), Pair("content-type", "application/json")));
  EXPECT_EQ(job->priority(), 7);
  EXPECT_EQ(job->state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(FromProtoTimestamp(job->run_at()) - FromProtoTimestamp(job->created_at()),
            absl::Minutes(10));
  EXPECT_EQ(job->dedup_key(), "order-42");
  EXPECT_EQ(job->idempotency_key(), "order-42");
  EXPECT_EQ(job->max_attempts(), 3);
  EXPECT_EQ(job->concurrency_key(), "tenant-a");
}

TEST_F(ClientTest, RunAtAndLeaseDurationReachTheBroker) {
  const absl::Time run_at = absl::FromUnixSeconds(4102444800);  // 2100-01-01
  absl::StatusOr<Enqueued> later = client_->Enqueue("orders", "later", {.run_at = run_at});
  ASSERT_TRUE(later.ok()) << later.status();
  absl::StatusOr<v1::Job> job = client_->GetJob(later->job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(FromProtoTimestamp(job->run_at()), run_at);

  // The job's lease_duration applies when the worker names none.
  absl::StatusOr<Enqueued> now =
      client_->Enqueue("orders", "now", {.lease_duration = absl::Seconds(45)});
  ASSERT_TRUE(now.ok()) << now.status();
  std::optional<v1::LeasedJob> leased = raw_->LeaseOne("orders", "worker-1");
  ASSERT_TRUE(leased.has_value());
  ASSERT_EQ(leased->job_id(), now->job_id);
  job = client_->GetJob(now->job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->attempts_size(), 1);
  EXPECT_EQ(
      FromProtoTimestamp(job->lease_deadline()) - FromProtoTimestamp(job->attempts(0).started_at()),
      absl::Seconds(45));
}

TEST_F(ClientTest, EnqueueWithTheSameDedupKeyReturnsTheFirstJob) {
  absl::StatusOr<Enqueued> first = client_->Enqueue("emails", "hi", {.dedup_key = "welcome-ada"});
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<Enqueued> again = client_->Enqueue("emails", "hi", {.dedup_key = "welcome-ada"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->job_id, first->job_id);
  EXPECT_FALSE(first->deduplicated);
  EXPECT_TRUE(again->deduplicated);

  absl::StatusOr<Enqueued> other =
      client_->Enqueue("emails", "another payload", {.dedup_key = "welcome-ada"});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists) << other.status();
  EXPECT_THAT(other.status().message(), HasSubstr(first->job_id));
}

TEST_F(ClientTest, ErrorsKeepTheBrokersCodeAndMessage) {
  absl::StatusOr<Enqueued> bad = client_->Enqueue("", "x");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_THAT(bad.status().message(), HasSubstr("queue"));
  // Word for word what the stub gets.
  v1::EnqueueRequest req;
  req.set_payload("x");
  v1::EnqueueResponse resp;
  EXPECT_EQ(std::string(bad.status().message()), raw_->Enqueue(req, &resp).error_message());

  absl::StatusOr<v1::Job> missing = client_->GetJob("no-such-job");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("no-such-job"));

  absl::StatusOr<v1::QueueInfo> no_queue = client_->GetQueue("never-used");
  EXPECT_EQ(no_queue.status().code(), absl::StatusCode::kNotFound) << no_queue.status();
}

TEST_F(ClientTest, BatchListQueuesPolicyCancelAndTheOtherAdminCalls) {
  v1::EnqueueBatchRequest batch;
  for (int i = 0; i < 3; ++i) {
    v1::EnqueueRequest* job = batch.add_jobs();
    *job = MakeEnqueueRequest("reports", "report-" + std::to_string(i),
                              {.dedup_key = "report-" + std::to_string(i)});
  }
  absl::StatusOr<std::vector<Enqueued>> ids = client_->EnqueueBatch(batch);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 3u);

  v1::ListJobsRequest list;
  list.set_queue("reports");
  list.set_page_size(2);
  absl::StatusOr<v1::ListJobsResponse> page = client_->ListJobs(list);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs_size(), 2);
  EXPECT_EQ(page->jobs(0).id(), (*ids)[0].job_id);
  EXPECT_FALSE(page->next_page_token().empty());

  absl::StatusOr<std::vector<v1::QueueInfo>> queues = client_->ListQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  ASSERT_EQ(queues->size(), 1u);
  EXPECT_EQ((*queues)[0].name(), "reports");
  EXPECT_EQ((*queues)[0].counts().at("JOB_STATE_READY"), 3);

  v1::UpdateQueuePolicyRequest update;
  update.set_queue("reports");
  update.mutable_policy()->set_max_concurrency(5);
  absl::StatusOr<v1::QueueInfo> updated = client_->UpdateQueuePolicy(update);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->policy().max_concurrency(), 5);
  absl::StatusOr<v1::QueueInfo> info = client_->GetQueue("reports");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->policy().max_concurrency(), 5);

  absl::StatusOr<v1::QueueInfo> paused = client_->PauseQueue("reports");
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_TRUE(paused->policy().paused());
  absl::StatusOr<v1::QueueInfo> resumed = client_->ResumeQueue("reports");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(resumed->policy().paused());

  absl::StatusOr<v1::Job> cancelled = client_->CancelJob((*ids)[2].job_id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  absl::StatusOr<v1::Job> twice = client_->CancelJob((*ids)[2].job_id);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition) << twice.status();

  absl::StatusOr<v1::Job> retried = client_->RetryJob((*ids)[2].job_id);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->state(), v1::JOB_STATE_READY);
  EXPECT_TRUE(client_->DeleteJob((*ids)[2].job_id).ok());
  EXPECT_EQ(client_->DeleteJob((*ids)[2].job_id).code(), absl::StatusCode::kNotFound);
  absl::StatusOr<int64_t> purged = client_->PurgeQueue("reports", {v1::JOB_STATE_READY});
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 2);
}

TEST_F(ClientTest, HealthIsOkWhileServing) {
  EXPECT_TRUE(client_->Health().ok()) << client_->Health();
}

TEST_F(ClientTest, DefaultAddressComesFromTheEnvironment) {
  ASSERT_EQ(setenv("JOBBROKER_ADDRESS", broker_->address().c_str(), 1), 0);
  EXPECT_EQ(DefaultAddress(), broker_->address());
  Client from_env;
  EXPECT_EQ(from_env.options().address, broker_->address());
  EXPECT_TRUE(from_env.Health().ok());
  ASSERT_EQ(unsetenv("JOBBROKER_ADDRESS"), 0);
  EXPECT_EQ(DefaultAddress(), "127.0.0.1:7070");
}

// Retries, on an address that refuses connections: every attempt is UNAVAILABLE.
class ClientRetryTest : public ::testing::Test {
 protected:
  Client NewClient(int max_attempts = 5) {
    ClientOptions options{.address = closed_.address(), .max_attempts = max_attempts};
    log_.Attach(options);
    return Client(std::move(options));
  }

  const Socket closed_{/*listen=*/false};
  RetryLog log_;
};

TEST_F(ClientRetryTest, ReadsRetryUnavailableWithDoublingWaitsThenGiveUp) {
  Client client = NewClient();
  absl::StatusOr<v1::Job> job = client.GetJob("any");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable) << job.status();
  EXPECT_THAT(log_.Waits(),
              ElementsAre(Pair(1, absl::Milliseconds(100)), Pair(2, absl::Milliseconds(200)),
                          Pair(3, absl::Milliseconds(400)), Pair(4, absl::Milliseconds(800))));
  EXPECT_THAT(log_.Codes(), ::testing::Each(absl::StatusCode::kUnavailable));
}

TEST_F(ClientRetryTest, EnqueueIsRetriedOnlyWithADedupKey) {
  Client client = NewClient(3);
  absl::StatusOr<Enqueued> plain = client.Enqueue("q", "p");
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable) << plain.status();
  EXPECT_THAT(log_.Waits(), ::testing::IsEmpty());

  absl::StatusOr<Enqueued> keyed = client.Enqueue("q", "p", {.dedup_key = "k"});
  EXPECT_EQ(keyed.status().code(), absl::StatusCode::kUnavailable) << keyed.status();
  EXPECT_THAT(log_.Waits(),
              ElementsAre(Pair(1, absl::Milliseconds(100)), Pair(2, absl::Milliseconds(200))));
}

TEST_F(ClientRetryTest, BatchIsRetriedOnlyWhenEveryJobHasADedupKey) {
  Client client = NewClient(2);
  v1::EnqueueBatchRequest batch;
  *batch.add_jobs() = MakeEnqueueRequest("q", "a", {.dedup_key = "a"});
  *batch.add_jobs() = MakeEnqueueRequest("q", "b", {});
  EXPECT_EQ(client.EnqueueBatch(batch).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(log_.Waits(), ::testing::IsEmpty());

  batch.mutable_jobs(1)->set_dedup_key("b");
  EXPECT_EQ(client.EnqueueBatch(batch).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(log_.Waits(), ElementsAre(Pair(1, absl::Milliseconds(100))));
}

TEST_F(ClientRetryTest, CancelIsNotRetriedButPolicyChangesAndHealthAre) {
  Client client = NewClient(2);
  EXPECT_EQ(client.CancelJob("any").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(log_.Waits(), ::testing::IsEmpty());

  v1::UpdateQueuePolicyRequest update;
  update.set_queue("q");
  EXPECT_EQ(client.UpdateQueuePolicy(update).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client.Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client.ListQueues().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(log_.Waits().size(), 3u);
}

TEST_F(ClientRetryTest, RetryAndDeleteAreNotRetriedButPauseResumeAndPurgeAre) {
  Client client = NewClient(2);
  // A repeat after a lost reply would be refused and hide that the first one worked.
  EXPECT_EQ(client.RetryJob("any").status().code(), absl::StatusCode::kUnavailable);
  v1::RetryJobRequest bulk;
  bulk.set_queue("q");
  EXPECT_EQ(client.RetryJob(bulk).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client.DeleteJob("any").code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(log_.Waits(), ::testing::IsEmpty());

  EXPECT_EQ(client.PauseQueue("q").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client.ResumeQueue("q").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client.PurgeQueue("q").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(log_.Waits().size(), 3u);
}

TEST_F(ClientRetryTest, MaxAttemptsBelowOneMeansOneAttempt) {
  Client client = NewClient(0);
  EXPECT_EQ(client.GetJob("any").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(log_.Waits(), ::testing::IsEmpty());
}

TEST(ClientDeadlineTest, EachAttemptGetsTheTimeoutAndDeadlineExceededIsRetried) {
  // The port accepts TCP but never speaks HTTP/2, so each attempt waits out its deadline.
  const Socket silent(/*listen=*/true);
  RetryLog log;
  ClientOptions options{
      .address = silent.address(), .timeout = absl::Milliseconds(200), .max_attempts = 2};
  log.Attach(options);
  Client client(std::move(options));
  EXPECT_EQ(client.GetJob("any").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(log.Codes(), ElementsAre(absl::StatusCode::kDeadlineExceeded));
  // Without a dedup key a timed-out enqueue may have happened: not repeated.
  EXPECT_EQ(client.Enqueue("q", "p").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(log.Codes().size(), 1u);
}

TEST(ClientRestartTest, DedupEnqueueIssuedWhileTheBrokerIsDownSucceedsOnceItIsBack) {
  absl::StatusOr<std::unique_ptr<BrokerProcess>> first = BrokerProcess::Start();
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = (*first)->address();

  std::atomic<int> retries{0};
  absl::Notification retrying;
  ClientOptions options{.address = address, .max_attempts = 12};
  options.on_retry = [&](int, const absl::Status&, absl::Duration) {
    if (retries.fetch_add(1) == 0) retrying.Notify();
  };
  Client client(std::move(options));
  absl::StatusOr<Enqueued> original = client.Enqueue("orders", "order 7", {.dedup_key = "order-7"});
  ASSERT_TRUE(original.ok()) << original.status();

  (*first)->Kill9();
  absl::StatusOr<Enqueued> repeated;
  std::thread producer(
      [&] { repeated = client.Enqueue("orders", "order 7", {.dedup_key = "order-7"}); });
  // Restart only once the call has failed at least once, so the retry is what succeeds.
  retrying.WaitForNotification();

  // The same data dir on the same port: the client keeps dialing the address it was given.
  BrokerProcessOptions again{.data_dir = (*first)->data_dir(), .extra_args = {"--listen", address}};
  absl::StatusOr<std::unique_ptr<BrokerProcess>> second = BrokerProcess::Start(again);
  if (!second.ok()) {
    producer.join();
    // Another process took the freed port in between: nothing about the client to learn.
    if (absl::StrContains(second.status().message(), "cannot listen")) {
      GTEST_SKIP() << "port " << address << " was taken: " << second.status();
    }
    FAIL() << second.status();
  }
  producer.join();
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_EQ(repeated->job_id, original->job_id);
  EXPECT_TRUE(repeated->deduplicated);
  EXPECT_GE(retries.load(), 1);
}

// Polls `condition` every 20 ms for up to 30 s (a bound for a hung test, never a measurement).
bool Eventually(const std::function<bool()>& condition) {
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30); absl::Now() < give_up;) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return condition();
}

// A worker on `queue` sharing `options` with the test's client; runs until the test ends.
class RunningWorker {
 public:
  RunningWorker(const ClientOptions& options, const std::string& queue, Handler handler)
      : worker_(options, {.worker_id = "client-test-worker"}) {
    worker_.Handle(queue, std::move(handler));
    const absl::Status started = worker_.Start();
    EXPECT_TRUE(started.ok()) << started;
  }
  ~RunningWorker() { worker_.Stop(absl::Seconds(5)); }

 private:
  Worker worker_;
};

// A worker stopping gracefully with a handler still running, whose stream ends during the grace
// (docs/worker-contract.md §6): the stop goes on reopening it (§5), without taking jobs, so that
// the handler's answer still reaches the broker. The broker is killed (-9) and started again on
// the same data dir and port while the handler runs; the handler returns after that.
class WorkerStopRestartTest : public ::testing::Test {
 protected:
  static constexpr char kQueue[] = "stop-restart";

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<BrokerProcess>> broker = BrokerProcess::Start();
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
    address_ = broker_->address();
    client_ = std::make_unique<Client>(ClientOptions{.address = address_});
    // One handler thread and one job held beside it: the stop gives that one back at once (its
    // step 2), which is how the test sees that the stop has begun.
    worker_ = std::make_unique<Worker>(ClientOptions{.address = address_},
                                       WorkerOptions{.worker_id = "stop-restart-worker",
                                                     .concurrency = 1,
                                                     .prefetch = 1,
                                                     .lease_duration = absl::Seconds(30),
                                                     .reconnect_max = absl::Seconds(1)});
    worker_->Handle(kQueue, [this](JobContext& job) {
      started_.Notify();
      // Until the test lets it return; a cancellation (the grace is over) ends it too.
      while (!finish_.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
        if (job.cancelled()) return absl::CancelledError("stopping");
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(worker_->Start().ok());
    absl::StatusOr<Enqueued> running = client_->Enqueue(kQueue, "runs");
    ASSERT_TRUE(running.ok()) << running.status();
    running_ = running->job_id;
    ASSERT_TRUE(started_.WaitForNotificationWithTimeout(absl::Seconds(30)));
    absl::StatusOr<Enqueued> held = client_->Enqueue(kQueue, "held");
    ASSERT_TRUE(held.ok()) << held.status();
    held_ = held->job_id;
    // Pushed to the worker (prefetch) while the first one runs.
    ASSERT_TRUE(Eventually([&] { return State(held_) == v1::JOB_STATE_ACTIVE; }));
  }

  void TearDown() override {
    if (!finish_.HasBeenNotified()) finish_.Notify();
    if (stopper_.joinable()) stopper_.join();
  }

  v1::JobState State(const std::string& id) {
    absl::StatusOr<v1::Job> job = client_->GetJob(id);
    return job.ok() ? job->state() : v1::JOB_STATE_UNSPECIFIED;
  }

  // Stop(grace) on another thread; returns once the stop has begun (the held job is READY
  // again).
  void StopInTheBackground(absl::Duration grace) {
    stopper_ = std::thread([this, grace] {
      const absl::Time start = absl::Now();
      worker_->Stop(grace);
      stop_took_ = absl::Now() - start;
      stopped_.Notify();
    });
    ASSERT_TRUE(Eventually([&] { return State(held_) == v1::JOB_STATE_READY; }))
        << "the stop did not give the held job back";
  }

  std::unique_ptr<BrokerProcess> broker_;
  std::string address_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Worker> worker_;
  absl::Notification started_, finish_, stopped_;
  std::string running_, held_;
  std::thread stopper_;
  absl::Duration stop_took_;  // written by stopper_ before stopped_
};

TEST_F(WorkerStopRestartTest, AStreamEndedDuringTheStopIsReopenedForTheAckOfTheRunningHandler) {
  constexpr absl::Duration kGrace = absl::Seconds(60);
  StopInTheBackground(kGrace);
  const int64_t reconnects = worker_->stats().reconnects;

  broker_->Kill9();
  BrokerProcessOptions again{.data_dir = broker_->data_dir(), .extra_args = {"--listen", address_}};
  absl::StatusOr<std::unique_ptr<BrokerProcess>> second = BrokerProcess::Start(again);
  if (!second.ok()) {
    // Another process took the freed port in between: nothing about the worker to learn.
    if (absl::StrContains(second.status().message(), "cannot listen")) {
      GTEST_SKIP() << "port " << address_ << " was taken: " << second.status();
    }
    FAIL() << second.status();
  }
  // The handler returns in the grace, after the stream ended: its ack waits for the stream the
  // stop reopens.
  ASSERT_FALSE(stopped_.HasBeenNotified()) << "the stop did not wait for the running handler";
  finish_.Notify();
  EXPECT_TRUE(Eventually([&] { return State(running_) == v1::JOB_STATE_COMPLETED; }))
      << "the ack did not reach the restarted broker; its job is " << State(running_);
  // The stop ends once that ack is answered, long before its grace.
  ASSERT_TRUE(stopped_.WaitForNotificationWithTimeout(absl::Seconds(30))) << "the stop hangs";
  stopper_.join();
  EXPECT_LT(stop_took_, kGrace);
  EXPECT_GT(worker_->stats().reconnects, reconnects);
  EXPECT_EQ(worker_->stats().acked, 1);
  // The reopened stream took no job: the one given back at the stop stays READY.
  EXPECT_EQ(State(held_), v1::JOB_STATE_READY);
}

TEST_F(WorkerStopRestartTest, AStopWhoseStreamCannotBeReopenedStillEndsWithinItsBounds) {
  constexpr absl::Duration kGrace = absl::Seconds(2);
  StopInTheBackground(kGrace);
  broker_->Kill9();  // and not started again
  finish_.Notify();  // its ack has no stream to go on
  // The grace, 1 s for the cancelled handlers, 1 s for the answers, 2 s for the half-close; the
  // rest is slack for a slow machine.
  ASSERT_TRUE(stopped_.WaitForNotificationWithTimeout(kGrace + absl::Seconds(10)))
      << "the stop hangs without a broker";
  stopper_.join();
  EXPECT_LT(stop_took_, kGrace + absl::Seconds(10));
}

TEST_F(ClientTest, UnsafeCallsAgainstAStoppedBrokerAreAttemptedOnceAndSafeOnesThreeTimes) {
  RetryLog log;
  ClientOptions options{.address = broker_->address()};
  log.Attach(options);
  EXPECT_EQ(options.max_attempts, 3);
  Client client(std::move(options));
  ASSERT_TRUE(client.Enqueue("orders", "before the stop").ok());
  broker_->Kill9();

  absl::StatusOr<Enqueued> plain = client.Enqueue("orders", "no key");
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable) << plain.status();
  EXPECT_THAT(log.Waits(), ::testing::IsEmpty());  // one attempt, no retry

  absl::StatusOr<Enqueued> keyed = client.Enqueue("orders", "keyed", {.dedup_key = "order-1"});
  EXPECT_EQ(keyed.status().code(), absl::StatusCode::kUnavailable) << keyed.status();
  EXPECT_THAT(log.Waits(),
              ElementsAre(Pair(1, absl::Milliseconds(100)), Pair(2, absl::Milliseconds(200))));

  // A repeated ack of the same lease is answered alike, so acks are retried too.
  EXPECT_EQ(client.Ack("job", "lease").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(log.Waits().size(), 4u);
  v1::LeaseRequest lease;
  lease.set_queue("orders");
  EXPECT_EQ(client.Lease(lease).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(log.Waits().size(), 4u);  // a repeated lease would lease more jobs
}

TEST_F(ClientTest, EnqueueAndWaitReturnsTheCompletedJobWithItsResult) {
  RunningWorker worker(client_->options(), "reports", [](JobContext& job) {
    job.SetResult("report for " + job.payload());
    return absl::OkStatus();
  });
  absl::StatusOr<v1::Job> done = client_->EnqueueAndWait("reports", "march", {.priority = 3});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(done->result(), "report for march");
  EXPECT_EQ(done->priority(), 3);
}

TEST_F(ClientTest, EnqueueAndWaitNamesTheStateOfAFailedOrCancelledJob) {
  RunningWorker failing(client_->options(), "invalid",
                        [](JobContext&) { return PermanentError("no such address"); });
  absl::StatusOr<v1::Job> failed = client_->EnqueueAndWait("invalid", "x");
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("JOB_STATE_FAILED"));
  EXPECT_THAT(failed.status().message(), HasSubstr("FAIL_REASON_PERMANENT"));
  EXPECT_THAT(failed.status().message(), HasSubstr("no such address"));
  std::optional<v1::Job> job = EndedJob(failed.status());
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.status().message(), HasSubstr(job->id()));

  // The handler cancels its own job, as an operator would, and waits for the signal.
  Client* client = client_.get();
  RunningWorker cancelling(client_->options(), "cancelled", [client](JobContext& job) {
    EXPECT_TRUE(client->CancelJob(job.job_id()).ok());
    job.WaitCancelled(absl::Seconds(30));
    return absl::CancelledError("cancelled");
  });
  absl::StatusOr<v1::Job> cancelled = client_->EnqueueAndWait("cancelled", "y");
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kAborted) << cancelled.status();
  EXPECT_THAT(cancelled.status().message(), HasSubstr("JOB_STATE_CANCELLED"));
  ASSERT_TRUE(EndedJob(cancelled.status()).has_value());
  EXPECT_FALSE(EndedJob(absl::AbortedError("another")).has_value());
}

TEST_F(ClientTest, EnqueueAndWaitTimesOutAndLeavesTheJobAlone) {
  absl::StatusOr<v1::Job> waited = client_->EnqueueAndWait(
      "nobody-works-this", "z", {.dedup_key = "z"}, absl::Milliseconds(200));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded) << waited.status();
  absl::StatusOr<Enqueued> again = client_->Enqueue("nobody-works-this", "z", {.dedup_key = "z"});
  ASSERT_TRUE(again.ok()) << again.status();
  absl::StatusOr<v1::Job> job = client_->GetJob(again->job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_READY);
}

TEST_F(ClientTest, EveryEnqueueOptionReachesTheBroker) {
  absl::StatusOr<Enqueued> first = client_->Enqueue("pipeline", "first");
  ASSERT_TRUE(first.ok()) << first.status();
  const absl::Time expire_at = absl::FromUnixSeconds(4102444800);  // 2100-01-01
  absl::StatusOr<Enqueued> second = client_->Enqueue(
      "pipeline", "second",
      {.timeout = absl::Minutes(3), .expire_at = expire_at, .depends_on = {first->job_id}});
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<v1::Job> job = client_->GetJob(second->job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(FromProtoDuration(job->timeout()), absl::Minutes(3));
  EXPECT_EQ(FromProtoTimestamp(job->expire_at()), expire_at);
  EXPECT_THAT(job->depends_on(), ElementsAre(first->job_id));
}

TEST_F(ClientTest, ASchedulePutIsReadListedTriggeredAndDeleted) {
  v1::Schedule schedule;
  schedule.set_schedule_id("nightly-report");
  schedule.set_cron("0 3 * * *");
  schedule.set_time_zone("UTC");
  *schedule.mutable_template_() = MakeEnqueueRequest("reports", "nightly", {.priority = 2});
  absl::StatusOr<v1::Schedule> put = client_->PutSchedule(schedule);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(IsSet(put->next_run_at()));

  absl::StatusOr<v1::Schedule> got = client_->GetSchedule("nightly-report");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->cron(), "0 3 * * *");
  EXPECT_EQ(got->template_().payload(), "nightly");
  absl::StatusOr<std::vector<v1::Schedule>> listed = client_->ListSchedules("reports");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].schedule_id(), "nightly-report");

  absl::StatusOr<v1::TriggerScheduleResponse> run = client_->TriggerSchedule("nightly-report");
  ASSERT_TRUE(run.ok()) << run.status();
  absl::StatusOr<v1::Job> job = client_->GetJob(run->job_id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->queue(), "reports");
  EXPECT_EQ(job->payload(), "nightly");
  EXPECT_EQ(job->priority(), 2);

  EXPECT_TRUE(client_->DeleteSchedule("nightly-report").ok());
  EXPECT_EQ(client_->GetSchedule("nightly-report").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, ListWorkersShowsAWorkerThatSharesTheClientsOptions) {
  RunningWorker worker(client_->options(), "thumbnails",
                       [](JobContext&) { return absl::OkStatus(); });
  std::vector<v1::WorkerInfo> seen;
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers("thumbnails");
    if (workers.ok()) seen = *workers;
    return !seen.empty();
  }));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].worker_id(), "client-test-worker");
  EXPECT_THAT(seen[0].queues(), ElementsAre("thumbnails"));
  EXPECT_EQ(seen[0].client(), kClientName);
  absl::StatusOr<std::vector<v1::WorkerInfo>> others = client_->ListWorkers("other-queue");
  ASSERT_TRUE(others.ok()) << others.status();
  EXPECT_TRUE(others->empty()) << others->size() << " workers";
}

TEST_F(ClientTest, TheUnaryWorkerCallsLeaseHeartbeatAckFailAndRelease) {
  ASSERT_TRUE(client_->Enqueue("polled", "one").ok());
  ASSERT_TRUE(client_->Enqueue("polled", "two").ok());
  v1::LeaseRequest lease;
  lease.set_queue("polled");
  lease.set_worker_id("poller");
  lease.set_max_jobs(2);
  absl::StatusOr<std::vector<v1::LeasedJob>> leased = client_->Lease(lease);
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_EQ(leased->size(), 2u);
  const v1::LeasedJob& one = (*leased)[0];
  const v1::LeasedJob& two = (*leased)[1];

  v1::HeartbeatRequest heartbeat;
  heartbeat.set_job_id(one.job_id());
  heartbeat.set_lease_id(one.lease_id());
  absl::StatusOr<v1::HeartbeatResponse> beat = client_->Heartbeat(heartbeat);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_FALSE(beat->cancel_requested());

  EXPECT_TRUE(client_->Ack(one.job_id(), one.lease_id(), "done").ok());
  // What a retry after a lost reply sends: answered OK, nothing changes.
  EXPECT_TRUE(client_->Ack(one.job_id(), one.lease_id(), "done").ok());
  absl::StatusOr<v1::Job> acked = client_->GetJob(one.job_id());
  ASSERT_TRUE(acked.ok()) << acked.status();
  EXPECT_EQ(acked->state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(acked->result(), "done");

  EXPECT_TRUE(client_->Release(two.job_id(), two.lease_id()).ok());
  leased = client_->Lease(lease);
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_EQ(leased->size(), 1u);
  v1::FailRequest fail;
  fail.set_job_id((*leased)[0].job_id());
  fail.set_lease_id((*leased)[0].lease_id());
  fail.set_error("out of paper");
  fail.set_permanent(true);
  absl::StatusOr<v1::FailResponse> failed = client_->Fail(fail);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
}

TEST_F(ClientTest, ProducerMiddlewaresWrapEnqueueTheFirstAddedOutermost) {
  std::vector<std::string> calls;
  client_->Use([&](v1::EnqueueBatchRequest& jobs, const EnqueueHandler& next) {
    calls.push_back("outer");
    for (v1::EnqueueRequest& job : *jobs.mutable_jobs())
      (*job.mutable_headers())["tenant"] = "acme";
    absl::StatusOr<std::vector<Enqueued>> enqueued = next(jobs);
    calls.push_back("outer done");
    return enqueued;
  });
  client_->Use([&](v1::EnqueueBatchRequest& jobs, const EnqueueHandler& next) {
    calls.push_back(absl::StrCat("inner sees tenant ", jobs.jobs(0).headers().at("tenant")));
    if (jobs.jobs(0).payload() == "refuse") {
      return absl::StatusOr<std::vector<Enqueued>>(absl::InternalError("no"));
    }
    return next(jobs);
  });

  absl::StatusOr<Enqueued> enqueued = client_->Enqueue("billing", "invoice");
  ASSERT_TRUE(enqueued.ok()) << enqueued.status();
  EXPECT_THAT(calls, ElementsAre("outer", "inner sees tenant acme", "outer done"));
  absl::StatusOr<v1::Job> job = client_->GetJob(enqueued->job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->headers(), UnorderedElementsAre(Pair("tenant", "acme")));

  // A batch passes through once, with all its jobs.
  calls.clear();
  v1::EnqueueBatchRequest batch;
  *batch.add_jobs() = MakeEnqueueRequest("billing", "one", {});
  *batch.add_jobs() = MakeEnqueueRequest("billing", "two", {});
  absl::StatusOr<std::vector<Enqueued>> both = client_->EnqueueBatch(batch);
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->size(), 2u);
  EXPECT_EQ(calls.size(), 3u);
  job = client_->GetJob((*both)[1].job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->headers(), UnorderedElementsAre(Pair("tenant", "acme")));

  // A middleware that does not call `next` sends nothing; its result stands.
  EXPECT_EQ(client_->Enqueue("billing", "refuse").status().code(), absl::StatusCode::kInternal);
  absl::StatusOr<std::vector<v1::QueueInfo>> queues = client_->ListQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  ASSERT_EQ(queues->size(), 1u);
  EXPECT_EQ((*queues)[0].counts().at("JOB_STATE_READY"), 3);
}

// A broker with TLS, mutual TLS and bearer tokens, its certificates from a throwaway CA made
// with openssl for this test.
class SecuredClientTest : public ::testing::Test {
 protected:
  static constexpr char kToken[] = "client-test-token-1f4b";

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
    absl::StatusOr<TestPki> pki = testing::MakePki(*dir_);
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
    // A plaintext "token" entry (accepted for development) keeps the test free of hashing.
    absl::StatusOr<std::string> tokens = dir_->WriteFile(
        "tokens.json",
        absl::StrCat(R"({"tokens": [{"name": "client-test", "token": ")", kToken,
                     R"(", "roles": ["producer", "worker", "admin"],)", R"( "queues": ["*"]}]})"));
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    absl::StatusOr<std::unique_ptr<BrokerProcess>> broker = BrokerProcess::Start(
        {.extra_args = {"--tls-cert", pki_.server_cert, "--tls-key", pki_.server_key,
                        "--tls-client-ca", pki_.ca_cert, "--auth-tokens", *tokens}});
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
  }

  ClientOptions Secured(std::string token) {
    absl::StatusOr<TlsOptions> tls = ReadTlsFiles(pki_.ca_cert, pki_.client_cert, pki_.client_key);
    EXPECT_TRUE(tls.ok()) << tls.status();
    return ClientOptions{
        .address = broker_->address(), .tls = tls.value_or(TlsOptions{}), .token = token};
  }

  std::unique_ptr<TempDir> dir_;
  TestPki pki_;
  std::unique_ptr<BrokerProcess> broker_;
};

TEST_F(SecuredClientTest, AClientAndAWorkerWithTheSameOptionsWorkAJobOverMutualTls) {
  const ClientOptions options = Secured(kToken);
  Client client(options);
  RunningWorker worker(options, "secure", [](JobContext& job) {
    job.SetResult("seen over TLS");
    return absl::OkStatus();
  });
  absl::StatusOr<v1::Job> done = client.EnqueueAndWait("secure", "x", {}, absl::Seconds(30));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->result(), "seen over TLS");
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers("secure");
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].client(), kClientName);
}

TEST_F(SecuredClientTest, AWrongOrMissingTokenIsRefusedAndTheEnvironmentSuppliesOne) {
  Client wrong(Secured("not-the-token"));
  EXPECT_EQ(wrong.Enqueue("secure", "x").status().code(), absl::StatusCode::kUnauthenticated);

  ASSERT_EQ(setenv("JOBBROKER_TOKEN", kToken, 1), 0);
  Client from_env(Secured(""));
  EXPECT_EQ(from_env.options().token, kToken);
  ASSERT_EQ(unsetenv("JOBBROKER_TOKEN"), 0);
  EXPECT_TRUE(from_env.Enqueue("secure", "x").ok());

  Client none(Secured(""));
  EXPECT_EQ(none.GetCluster().status().code(), absl::StatusCode::kUnauthenticated);

  // A worker with a refused token stops with the refusal instead of reconnecting forever.
  Worker worker(Secured("not-the-token"), {});
  worker.Handle("secure", [](JobContext&) { return absl::OkStatus(); });
  EXPECT_EQ(worker.Run().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(SecuredClientTest, PlaintextOrNoClientCertificateCannotGetThrough) {
  ClientOptions plaintext = Secured(kToken);
  plaintext.tls.reset();
  plaintext.max_attempts = 1;
  EXPECT_EQ(Client(plaintext).Health().code(), absl::StatusCode::kUnavailable);

  ClientOptions without_certificate = Secured(kToken);
  without_certificate.tls->cert_pem.clear();
  without_certificate.tls->key_pem.clear();
  without_certificate.max_attempts = 1;
  EXPECT_EQ(Client(without_certificate).Health().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace jobbroker::client
