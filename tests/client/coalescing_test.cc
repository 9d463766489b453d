// Producer coalescing (docs/worker-contract.md §10) in the C++ client: the Coalescer's send
// rules against a stubbed transport (batch sizes and order, bytes, the in-flight limit, linger,
// Close, the answers of a refused batch), the options' validation, and Client against the real
// broker, counting its Enqueue and EnqueueBatch calls on /metrics.
#include <algorithm>
#include <deque>
#include <functional>
#include <latch>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "jobbroker/coalescer.h"
#include "jobbroker/partition.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/http_client.h"

namespace jobbroker::client {
namespace {

using ::jobbroker::testing::BrokerProcess;
using ::jobbroker::testing::BrokerProcessOptions;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

// A liveness bound for polling, never an assertion on speed.
constexpr absl::Duration kPatience = absl::Seconds(60);

// Polls `done` until it holds or kPatience has passed; whether it held.
bool Eventually(const std::function<bool()>& done) {
  const absl::Time give_up = absl::Now() + kPatience;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

v1::EnqueueRequest Job(const std::string& queue, const std::string& payload) {
  v1::EnqueueRequest job;
  job.set_queue(queue);
  job.set_payload(payload);
  return job;
}

// A transport that records every call and answers it from the payloads: "id-<payload>" for a
// good job; a job whose payload starts with "bad" is refused INVALID_ARGUMENT, alone as
// "headers: ..." and in a batch as the broker does, "jobs[i].headers: ...". While held, calls
// wait (so batches stay in flight) until Release().
class StubTransport {
 public:
  struct Call {
    bool batch = false;  // EnqueueBatch, else the unary Enqueue
    std::vector<std::string> payloads;
    int64_t bytes = 0;
    absl::Time deadline;
  };

  Coalescer::Transport transport(uint32_t partitions = 0) {
    return Coalescer::Transport{
        .send_one =
            [this](const v1::EnqueueRequest& job, absl::Time deadline) {
              v1::EnqueueBatchRequest one;
              *one.add_jobs() = job;
              Enter(one, /*batch=*/false, deadline);
              absl::StatusOr<Enqueued> answer = Answer(job.payload());
              Leave();
              return answer;
            },
        .send_batch =
            [this](const v1::EnqueueBatchRequest& jobs, absl::Time deadline) {
              Enter(jobs, /*batch=*/true, deadline);
              absl::StatusOr<std::vector<Enqueued>> answer = AnswerBatch(jobs);
              Leave();
              return answer;
            },
        .partition_count = [partitions] { return partitions; }};
  }

  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }
  // The error every EnqueueBatch answers instead of its results (OK: none).
  void FailBatches(absl::Status status) {
    absl::MutexLock lock(&mu_);
    batch_error_ = std::move(status);
  }
  std::vector<Call> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  int active() {
    absl::MutexLock lock(&mu_);
    return active_;
  }
  int max_active() {
    absl::MutexLock lock(&mu_);
    return max_active_;
  }

 private:
  void Enter(const v1::EnqueueBatchRequest& jobs, bool batch, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    Call call{.batch = batch, .deadline = deadline};
    for (const v1::EnqueueRequest& job : jobs.jobs()) {
      call.payloads.push_back(job.payload());
      call.bytes += Coalescer::JobBytes(job);
    }
    calls_.push_back(std::move(call));
    ++active_;
    max_active_ = std::max(max_active_, active_);
    mu_.Await(absl::Condition(
        +[](bool* held) { return !*held; }, &held_));
  }
  void Leave() {
    absl::MutexLock lock(&mu_);
    --active_;
  }
  static absl::StatusOr<Enqueued> Answer(const std::string& payload) {
    if (absl::StartsWith(payload, "bad")) {
      return absl::InvalidArgumentError("headers: must not have an empty name");
    }
    return Enqueued{.job_id = "id-" + payload};
  }
  absl::StatusOr<std::vector<Enqueued>> AnswerBatch(const v1::EnqueueBatchRequest& jobs) {
    {
      absl::MutexLock lock(&mu_);
      if (!batch_error_.ok()) return batch_error_;
    }
    std::vector<Enqueued> results;
    for (int i = 0; i < jobs.jobs_size(); ++i) {
      absl::StatusOr<Enqueued> one = Answer(jobs.jobs(i).payload());
      if (!one.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("jobs[", i, "].", one.status().message()));
      }
      results.push_back(*one);
    }
    return results;
  }

  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status batch_error_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  int max_active_ ABSL_GUARDED_BY(mu_) = 0;
};

// Callers of one Coalescer, each on a thread of its own, started one at a time.
class Callers {
 public:
  explicit Callers(Coalescer& coalescer) : coalescer_(coalescer) {}
  ~Callers() { Join(); }

  // Starts a caller of `job`; its answer is answer(i), i counting from 0.
  void Start(v1::EnqueueRequest job, absl::Time deadline = absl::InfiniteFuture()) {
    const size_t i = threads_.size();
    {
      absl::MutexLock lock(&mu_);
      answers_.emplace_back(absl::UnknownError("not answered"));
    }
    threads_.emplace_back([this, i, job = std::move(job), deadline] {
      absl::StatusOr<Enqueued> answer = coalescer_.Enqueue(job, deadline);
      absl::MutexLock lock(&mu_);
      answers_[i] = std::move(answer);
    });
  }
  void Join() {
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  absl::StatusOr<Enqueued> answer(size_t i) {
    absl::MutexLock lock(&mu_);
    return answers_[i];
  }

 private:
  Coalescer& coalescer_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  // Grown before each thread starts; each thread writes its own element.
  std::deque<absl::StatusOr<Enqueued>> answers_ ABSL_GUARDED_BY(mu_);
};

// The payloads of `calls`, in the order they were sent, one after another.
std::vector<std::string> AllPayloads(const std::vector<StubTransport::Call>& calls) {
  std::vector<std::string> all;
  for (const auto& call : calls) all.insert(all.end(), call.payloads.begin(), call.payloads.end());
  return all;
}

std::vector<size_t> Sizes(const std::vector<StubTransport::Call>& calls) {
  std::vector<size_t> sizes;
  for (const auto& call : calls) sizes.push_back(call.payloads.size());
  return sizes;
}

TEST(CoalescerTest, FullBatchesGoInCallOrderAndNeverPassTheJobLimit) {
  StubTransport stub;
  Coalescer coalescer({.max_jobs = 10, .max_in_flight = 1}, stub.transport());
  Callers callers(coalescer);
  stub.Hold();
  // The first job finds nothing in flight: a batch of one, sent at once as unary Enqueue.
  callers.Start(Job("q", "p0"));
  ASSERT_TRUE(Eventually([&] { return stub.active() == 1; }));
  // The other 34 wait behind it, one caller at a time so that the order is the test's.
  for (int i = 1; i < 35; ++i) {
    callers.Start(Job("q", absl::StrCat("p", i)));
    ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == i; })) << i;
  }
  EXPECT_EQ(stub.calls().size(), 1u);
  stub.Release();
  callers.Join();

  const std::vector<StubTransport::Call> calls = stub.calls();
  EXPECT_THAT(Sizes(calls), ElementsAre(1, 10, 10, 10, 4));
  EXPECT_FALSE(calls[0].batch);
  for (size_t c = 1; c < calls.size(); ++c) EXPECT_TRUE(calls[c].batch) << c;
  std::vector<std::string> expected;
  for (int i = 0; i < 35; ++i) expected.push_back(absl::StrCat("p", i));
  EXPECT_THAT(AllPayloads(calls), ElementsAreArray(expected));
  EXPECT_EQ(stub.max_active(), 1);
  for (int i = 0; i < 35; ++i) {
    absl::StatusOr<Enqueued> answer = callers.answer(i);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->job_id, absl::StrCat("id-p", i));
  }
  EXPECT_EQ(coalescer.counts().in_flight_batches, 0);
}

TEST(CoalescerTest, AJobThatWouldPassTheByteLimitStartsTheNextBatch) {
  StubTransport stub;
  Coalescer coalescer({.max_bytes = 100, .max_in_flight = 1}, stub.transport());
  Callers callers(coalescer);
  stub.Hold();
  callers.Start(Job("q", "first"));
  ASSERT_TRUE(Eventually([&] { return stub.active() == 1; }));
  // 40 bytes each: a 30-byte payload and a header of 4 + 6 bytes.
  for (int i = 1; i <= 5; ++i) {
    v1::EnqueueRequest job = Job("q", absl::StrCat("job-", i, std::string(25, 'x')));
    (*job.mutable_headers())["name"] = "value!";
    ASSERT_EQ(Coalescer::JobBytes(job), 40);
    callers.Start(job);
    ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == i; })) << i;
  }
  // A job that reaches the limit on its own goes as soon as its key has room.
  callers.Start(Job("q", std::string(100, 'b') + "ig"));
  ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == 6; }));
  stub.Release();
  callers.Join();

  const std::vector<StubTransport::Call> calls = stub.calls();
  EXPECT_THAT(Sizes(calls), ElementsAre(1, 2, 2, 1, 1));
  for (const auto& call : calls) {
    if (call.payloads.size() > 1) {
      EXPECT_LE(call.bytes, 100);
    }
  }
  EXPECT_EQ(calls.back().bytes, 102);
  EXPECT_FALSE(calls.back().batch);
  for (int i = 0; i < 7; ++i) EXPECT_TRUE(callers.answer(i).ok()) << i;
}

TEST(CoalescerTest, NoMoreThanMaxInFlightBatchesOfAKeyAreOutstanding) {
  StubTransport stub;
  Coalescer coalescer({.max_in_flight = 3}, stub.transport());
  Callers callers(coalescer);
  stub.Hold();
  for (int i = 0; i < 3; ++i) {
    callers.Start(Job("q", absl::StrCat("p", i)));
    ASSERT_TRUE(Eventually([&] { return stub.active() == i + 1; })) << i;
  }
  for (int i = 3; i < 23; ++i) callers.Start(Job("q", absl::StrCat("p", i)));
  ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == 20; }));
  EXPECT_EQ(stub.active(), 3);
  EXPECT_EQ(coalescer.counts().in_flight_batches, 3);
  // Another key is not held up by this one's limit.
  callers.Start(Job("other", "o"));
  ASSERT_TRUE(Eventually([&] { return stub.active() == 4; }));
  stub.Release();
  callers.Join();
  // The 20 that waited went together when the first batch ended.
  EXPECT_THAT(Sizes(stub.calls()), ElementsAre(1, 1, 1, 1, 20));
  for (int i = 0; i < 24; ++i) EXPECT_TRUE(callers.answer(i).ok()) << i;
}

TEST(CoalescerTest, ManyCallersAtOnceStayUnderTheInFlightLimit) {
  StubTransport stub;
  Coalescer coalescer({.max_jobs = 7, .max_in_flight = 2}, stub.transport());
  {
    Callers callers(coalescer);
    for (int i = 0; i < 200; ++i) callers.Start(Job("q", absl::StrCat("p", i)));
    callers.Join();
    for (int i = 0; i < 200; ++i) {
      absl::StatusOr<Enqueued> answer = callers.answer(i);
      ASSERT_TRUE(answer.ok()) << answer.status();
      EXPECT_EQ(answer->job_id, absl::StrCat("id-p", i));
    }
  }
  // Each key's batches: at most 2 at once; all 200 jobs sent once each.
  EXPECT_LE(stub.max_active(), 2);
  std::vector<std::string> all = AllPayloads(stub.calls());
  EXPECT_EQ(all.size(), 200u);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), 200u);
  for (size_t size : Sizes(stub.calls())) EXPECT_LE(size, 7u);
}

TEST(CoalescerTest, CloseSendsTheOpenBatchesAndLaterJobsGoAlone) {
  StubTransport stub;
  // A linger nothing in the test waits for: only Close() sends the batch.
  Coalescer coalescer({.linger = absl::Hours(1)}, stub.transport());
  Callers callers(coalescer);
  for (int i = 0; i < 5; ++i) callers.Start(Job("q", absl::StrCat("p", i)));
  ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == 5; }));
  EXPECT_TRUE(stub.calls().empty());
  coalescer.Close();
  // Close returned: every batch was answered.
  const std::vector<StubTransport::Call> calls = stub.calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(calls[0].batch);
  EXPECT_EQ(calls[0].payloads.size(), 5u);
  EXPECT_EQ(coalescer.counts().in_flight_batches, 0);
  callers.Join();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(callers.answer(i).ok()) << i;

  absl::StatusOr<Enqueued> after = coalescer.Enqueue(Job("q", "late"), absl::InfiniteFuture());
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(stub.calls().size(), 2u);
  EXPECT_FALSE(stub.calls()[1].batch);
}

TEST(CoalescerTest, ALingerTimerSendsTheBatch) {
  StubTransport stub;
  Coalescer coalescer({.linger = absl::Milliseconds(20)}, stub.transport());
  absl::StatusOr<Enqueued> answer = coalescer.Enqueue(Job("q", "p"), absl::InfiniteFuture());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->job_id, "id-p");
}

TEST(CoalescerTest, ARefusedBatchIsSentAgainOneJobPerCall) {
  StubTransport stub;
  Coalescer coalescer({.max_in_flight = 1}, stub.transport());
  Callers callers(coalescer);
  stub.Hold();
  callers.Start(Job("q", "p0"));
  ASSERT_TRUE(Eventually([&] { return stub.active() == 1; }));
  const std::vector<std::string> payloads = {"p1", "p2", "bad3", "p4", "p5"};
  for (size_t i = 0; i < payloads.size(); ++i) {
    callers.Start(Job("q", payloads[i]));
    ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == int(i) + 1; }));
  }
  stub.Release();
  callers.Join();

  const std::vector<StubTransport::Call> calls = stub.calls();
  // p0 alone, the batch of 5 (refused), then each of the 5 alone.
  ASSERT_EQ(calls.size(), 7u);
  EXPECT_TRUE(calls[1].batch);
  for (size_t c = 2; c < calls.size(); ++c) EXPECT_FALSE(calls[c].batch) << c;
  for (size_t i = 0; i < payloads.size(); ++i) {
    absl::StatusOr<Enqueued> answer = callers.answer(i + 1);
    if (payloads[i] == "bad3") {
      EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(answer.status().message(), "headers: must not have an empty name");
    } else {
      ASSERT_TRUE(answer.ok()) << payloads[i] << ": " << answer.status();
      EXPECT_EQ(answer->job_id, "id-" + payloads[i]);
    }
  }
}

TEST(CoalescerTest, OtherBatchErrorsAreEveryCallersAndNotSentAgain) {
  StubTransport stub;
  stub.FailBatches(absl::UnavailableError("broker draining"));
  Coalescer coalescer({.max_in_flight = 1}, stub.transport());
  Callers callers(coalescer);
  stub.Hold();
  callers.Start(Job("q", "p0"));
  ASSERT_TRUE(Eventually([&] { return stub.active() == 1; }));
  for (int i = 1; i <= 4; ++i) {
    callers.Start(Job("q", absl::StrCat("p", i)));
    ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == i; }));
  }
  stub.Release();
  callers.Join();
  EXPECT_THAT(Sizes(stub.calls()), ElementsAre(1, 4));
  EXPECT_TRUE(callers.answer(0).ok());
  for (int i = 1; i <= 4; ++i) {
    EXPECT_EQ(callers.answer(i).status(), absl::UnavailableError("broker draining")) << i;
  }
}

TEST(CoalescerTest, BatchesAreKeyedByPartitionAndDedupKey) {
  constexpr uint32_t kPartitions = 4;
  // Two queues of one partition, and one of another.
  std::string a = "a", a_too, b;
  for (int i = 0; a_too.empty() || b.empty(); ++i) {
    const std::string q = absl::StrCat("queue-", i);
    const bool same = PartitionOfQueue(q, kPartitions) == PartitionOfQueue(a, kPartitions);
    if (same && a_too.empty()) a_too = q;
    if (!same && b.empty()) b = q;
  }
  StubTransport stub;
  Coalescer coalescer({.linger = absl::Hours(1)}, stub.transport(kPartitions));
  Callers callers(coalescer);
  v1::EnqueueRequest keyed = Job(a, "a-keyed");
  keyed.set_dedup_key("k");
  const std::vector<v1::EnqueueRequest> jobs = {Job(a, "a1"), Job(b, "b1"), keyed,
                                                Job(a_too, "a_too1"), Job(a, "a2")};
  for (size_t i = 0; i < jobs.size(); ++i) {
    callers.Start(jobs[i]);
    ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == int(i) + 1; }));
  }
  coalescer.Close();
  callers.Join();
  std::set<std::vector<std::string>> batches;
  for (const auto& call : stub.calls()) batches.insert(call.payloads);
  EXPECT_EQ(batches,
            (std::set<std::vector<std::string>>{{"a1", "a_too1", "a2"}, {"b1"}, {"a-keyed"}}));
}

TEST(CoalescerTest, WithoutAPartitionCountBatchesAreKeyedByQueue) {
  StubTransport stub;
  Coalescer coalescer({.linger = absl::Hours(1)}, stub.transport(/*partitions=*/0));
  Callers callers(coalescer);
  const std::vector<v1::EnqueueRequest> jobs = {Job("x", "x1"), Job("y", "y1"), Job("x", "x2")};
  for (size_t i = 0; i < jobs.size(); ++i) {
    callers.Start(jobs[i]);
    ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == int(i) + 1; }));
  }
  coalescer.Close();
  callers.Join();
  std::set<std::vector<std::string>> batches;
  for (const auto& call : stub.calls()) batches.insert(call.payloads);
  EXPECT_EQ(batches, (std::set<std::vector<std::string>>{{"x1", "x2"}, {"y1"}}));
}

TEST(CoalescerTest, ABatchHasItsCallersEarliestDeadline) {
  StubTransport stub;
  Coalescer coalescer({.linger = absl::Hours(1)}, stub.transport());
  Callers callers(coalescer);
  const absl::Time now = absl::Now();
  const absl::Time deadlines[] = {now + absl::Seconds(30), now + absl::Seconds(5),
                                  now + absl::Seconds(20)};
  for (int i = 0; i < 3; ++i) {
    callers.Start(Job("q", absl::StrCat("p", i)), deadlines[i]);
    ASSERT_TRUE(Eventually([&] { return coalescer.counts().waiting_jobs == i + 1; }));
  }
  coalescer.Close();
  callers.Join();
  ASSERT_EQ(stub.calls().size(), 1u);
  EXPECT_EQ(stub.calls()[0].deadline, deadlines[1]);
}

TEST(ClientOptionsTest, TheBatchingDefaults) {
  const ClientOptions options;
  EXPECT_TRUE(options.batching);
  EXPECT_EQ(options.batch_max_jobs, 100);
  EXPECT_EQ(options.batch_max_bytes, 1 << 20);
  EXPECT_EQ(options.batch_linger, absl::ZeroDuration());
  EXPECT_EQ(options.batch_max_in_flight, 4);
  EXPECT_TRUE(ValidateClientOptions(options).ok());
  EXPECT_TRUE(EnqueueOptions{}.batch);
}

TEST(ClientOptionsTest, OutOfRangeBatchOptionsAreRefusedByName) {
  const auto refusal = [](ClientOptions options) -> std::string {
    absl::Status valid = ValidateClientOptions(options);
    EXPECT_EQ(valid.code(), absl::StatusCode::kInvalidArgument);
    try {
      Client client(options);
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(e.what(), std::string(valid.message()));
      return e.what();
    }
    ADD_FAILURE() << "the constructor took " << valid;
    return "";
  };
  EXPECT_THAT(refusal({.batch_max_jobs = 0}), HasSubstr("batch_max_jobs"));
  EXPECT_THAT(refusal({.batch_max_jobs = 1001}), HasSubstr("batch_max_jobs"));
  EXPECT_THAT(refusal({.batch_max_bytes = 0}), HasSubstr("batch_max_bytes"));
  EXPECT_THAT(refusal({.batch_max_bytes = int64_t{65} << 20}), HasSubstr("batch_max_bytes"));
  EXPECT_THAT(refusal({.batch_linger = absl::Milliseconds(-1)}), HasSubstr("batch_linger"));
  EXPECT_THAT(refusal({.batch_linger = absl::InfiniteDuration()}), HasSubstr("batch_linger"));
  EXPECT_THAT(refusal({.batch_max_in_flight = 0}), HasSubstr("batch_max_in_flight"));
  // The edges of the ranges are taken.
  EXPECT_TRUE(ValidateClientOptions({.batch_max_jobs = 1}).ok());
  EXPECT_TRUE(ValidateClientOptions({.batch_max_jobs = 1000}).ok());
  EXPECT_TRUE(ValidateClientOptions({.batching = false}).ok());
}

// The broker's count of `method`'s calls ("Enqueue", "EnqueueBatch"), summed over their codes or
// only those of `code`, from its /metrics.
class BrokerCalls {
 public:
  explicit BrokerCalls(const BrokerProcess& broker) : address_(broker.http_address()) {}

  int64_t Count(const std::string& method, const std::string& code = "") const {
    absl::StatusOr<testing::HttpResponse> metrics = testing::HttpGetResponse(address_, "/metrics");
    EXPECT_TRUE(metrics.ok() && metrics->status == 200) << metrics.status();
    if (!metrics.ok()) return -1;
    const std::string series = absl::StrCat("method=\"/jobbroker.v1.Broker/", method, "\"");
    int64_t sum = 0;
    for (absl::string_view line : absl::StrSplit(metrics->body, '\n')) {
      if (!absl::StartsWith(line, "jobbroker_rpc_duration_seconds_count{")) continue;
      if (!absl::StrContains(line, series)) continue;
      if (!code.empty() && !absl::StrContains(line, absl::StrCat("code=\"", code, "\""))) continue;
      double value = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) << line;
      sum += static_cast<int64_t>(value);
    }
    return sum;
  }
  int64_t Unary() const { return Count("Enqueue"); }
  int64_t Batches() const { return Count("EnqueueBatch"); }

 private:
  std::string address_;
};

// Runs `call(i)` for i in [0, n) on n threads released together.
std::vector<absl::StatusOr<Enqueued>> AllAtOnce(
    int n, const std::function<absl::StatusOr<Enqueued>(int)>& call) {
  std::vector<absl::StatusOr<Enqueued>> answers(n, absl::UnknownError("not answered"));
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      answers[i] = call(i);
    });
  }
  for (std::thread& t : threads) t.join();
  return answers;
}

class CoalescingBrokerTest : public ::testing::Test {
 protected:
  void StartBroker(std::vector<std::string> extra_args = {}) {
    absl::StatusOr<std::unique_ptr<BrokerProcess>> broker =
        BrokerProcess::Start(BrokerProcessOptions{.extra_args = std::move(extra_args)});
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
    calls_ = std::make_unique<BrokerCalls>(*broker_);
  }
  void SetUp() override { StartBroker(); }

  ClientOptions Options() const { return ClientOptions{.address = broker_->address()}; }

  // Every answer OK, with distinct ids, each a job of the broker.
  void ExpectAllCreated(Client& client, const std::vector<absl::StatusOr<Enqueued>>& answers) {
    std::set<std::string> ids;
    for (const absl::StatusOr<Enqueued>& answer : answers) {
      ASSERT_TRUE(answer.ok()) << answer.status();
      ids.insert(answer->job_id);
      absl::StatusOr<v1::Job> job = client.GetJob(answer->job_id);
      EXPECT_TRUE(job.ok()) << answer->job_id << ": " << job.status();
    }
    EXPECT_EQ(ids.size(), answers.size());
  }

  std::unique_ptr<BrokerProcess> broker_;
  std::unique_ptr<BrokerCalls> calls_;
};

TEST_F(CoalescingBrokerTest, ConcurrentEnqueuesWithALingerShareBatches) {
  ClientOptions options = Options();
  options.batch_linger = absl::Milliseconds(50);
  Client client(options);
  const int64_t unary = calls_->Unary(), batches = calls_->Batches();
  std::vector<absl::StatusOr<Enqueued>> answers =
      AllAtOnce(200, [&](int i) { return client.Enqueue("coalesced", absl::StrCat("job ", i)); });
  ExpectAllCreated(client, answers);
  const int64_t new_batches = calls_->Batches() - batches;
  EXPECT_LE(calls_->Unary() - unary + new_batches, 100);
  EXPECT_GE(new_batches, 1);
  absl::StatusOr<v1::QueueInfo> queue = client.GetQueue("coalesced");
  ASSERT_TRUE(queue.ok()) << queue.status();
}

TEST_F(CoalescingBrokerTest, ByDefaultConcurrentEnqueuesTakeFewerCallsThanJobs) {
  Client client(Options());
  const int64_t before = calls_->Unary() + calls_->Batches();
  std::vector<absl::StatusOr<Enqueued>> answers =
      AllAtOnce(200, [&](int i) { return client.Enqueue("defaults", absl::StrCat("job ", i)); });
  ExpectAllCreated(client, answers);
  EXPECT_LT(calls_->Unary() + calls_->Batches() - before, 200);
}

TEST_F(CoalescingBrokerTest, ABadJobFailsOnlyItsOwnCall) {
  ClientOptions options = Options();
  options.batch_linger = absl::Milliseconds(50);
  Client client(options);
  const int64_t refused = calls_->Count("EnqueueBatch", "INVALID_ARGUMENT");
  constexpr int kBad = 17;
  std::vector<absl::StatusOr<Enqueued>> answers = AllAtOnce(50, [&](int i) {
    EnqueueOptions job;
    if (i == kBad) job.headers = {{"", "no name"}};
    return client.Enqueue("one-bad", absl::StrCat("job ", i), job);
  });
  EXPECT_EQ(answers[kBad].status().code(), absl::StatusCode::kInvalidArgument)
      << answers[kBad].status();
  EXPECT_THAT(answers[kBad].status().message(), HasSubstr("headers"));
  EXPECT_THAT(answers[kBad].status().message(), Not(HasSubstr("jobs[")));
  answers.erase(answers.begin() + kBad);
  ExpectAllCreated(client, answers);
  // The bad job's batch was refused whole, then its jobs went one by one.
  EXPECT_GE(calls_->Count("EnqueueBatch", "INVALID_ARGUMENT") - refused, 1);
}

TEST_F(CoalescingBrokerTest, OptingOutSendsUnaryCalls) {
  {
    // With a linger these would share a batch, but each call opts out.
    ClientOptions options = Options();
    options.batch_linger = absl::Milliseconds(200);
    Client client(options);
    int64_t unary = calls_->Unary(), batches = calls_->Batches();
    absl::StatusOr<Enqueued> one = client.Enqueue("opt-out", "alone", {.batch = false});
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(calls_->Unary() - unary, 1);
    EXPECT_EQ(calls_->Batches() - batches, 0);

    unary = calls_->Unary();
    std::vector<absl::StatusOr<Enqueued>> answers = AllAtOnce(10, [&](int i) {
      return client.Enqueue("opt-out", absl::StrCat("job ", i), {.batch = false});
    });
    ExpectAllCreated(client, answers);
    EXPECT_EQ(calls_->Unary() - unary, 10);
    EXPECT_EQ(calls_->Batches() - batches, 0);
  }
  ClientOptions options = Options();
  options.batching = false;
  Client client(options);
  const int64_t unary = calls_->Unary(), batches = calls_->Batches();
  std::vector<absl::StatusOr<Enqueued>> answers =
      AllAtOnce(20, [&](int i) { return client.Enqueue("no-batching", absl::StrCat("job ", i)); });
  ExpectAllCreated(client, answers);
  EXPECT_EQ(calls_->Unary() - unary, 20);
  EXPECT_EQ(calls_->Batches() - batches, 0);
}

TEST_F(CoalescingBrokerTest, OneDedupKeyGivesEveryCallerTheSameJob) {
  Client client(Options());
  std::vector<absl::StatusOr<Enqueued>> answers = AllAtOnce(
      20, [&](int) { return client.Enqueue("dedup", "the same job", {.dedup_key = "only-once"}); });
  std::set<std::string> ids;
  int created = 0;
  for (const absl::StatusOr<Enqueued>& answer : answers) {
    ASSERT_TRUE(answer.ok()) << answer.status();
    ids.insert(answer->job_id);
    if (!answer->deduplicated) ++created;
  }
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_EQ(created, 1);
}

TEST_F(CoalescingBrokerTest, MiddlewaresRunPerCallAboveTheCoalescer) {
  ClientOptions options = Options();
  options.batch_linger = absl::Milliseconds(50);
  Client client(options);
  absl::Mutex mu;
  int wrapped = 0;
  client.Use([&](v1::EnqueueBatchRequest& jobs, const EnqueueHandler& next) {
    {
      absl::MutexLock lock(&mu);
      ++wrapped;
    }
    EXPECT_EQ(jobs.jobs_size(), 1);
    (*jobs.mutable_jobs(0)->mutable_headers())["call"] = jobs.jobs(0).payload();
    return next(jobs);
  });
  const int64_t batches = calls_->Batches();
  std::vector<absl::StatusOr<Enqueued>> answers =
      AllAtOnce(20, [&](int i) { return client.Enqueue("wrapped", absl::StrCat("job ", i)); });
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(wrapped, 20);
  }
  EXPECT_GE(calls_->Batches() - batches, 1);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(answers[i].ok()) << answers[i].status();
    absl::StatusOr<v1::Job> job = client.GetJob(answers[i]->job_id);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->payload(), absl::StrCat("job ", i));
    EXPECT_EQ(job->headers().at("call"), absl::StrCat("job ", i));
  }
}

TEST_F(CoalescingBrokerTest, BatchesNeverSpanPartitions) {
  constexpr uint32_t kPartitions = 4;
  StartBroker({"--partitions", absl::StrCat(kPartitions)});
  // Two queues in each partition.
  std::vector<std::string> queues;
  std::vector<int> per_partition(kPartitions, 0);
  for (int i = 0; queues.size() < 2 * kPartitions; ++i) {
    const std::string q = absl::StrCat("part-", i);
    int& n = per_partition[PartitionOfQueue(q, kPartitions)];
    if (n < 2) {
      ++n;
      queues.push_back(q);
    }
  }
  ClientOptions options = Options();
  options.batch_linger = absl::Milliseconds(20);
  Client client(options);
  // Any call fetches the table, so that the jobs are keyed by partition rather than by queue.
  ASSERT_TRUE(client.ListQueues().ok());
  const int64_t batches = calls_->Batches();
  std::vector<absl::StatusOr<Enqueued>> answers = AllAtOnce(200, [&](int i) {
    return client.Enqueue(queues[i % queues.size()], absl::StrCat("job ", i));
  });
  for (const absl::StatusOr<Enqueued>& answer : answers) {
    EXPECT_THAT(answer.status().message(), Not(HasSubstr("spans partitions")));
  }
  ExpectAllCreated(client, answers);
  EXPECT_GE(calls_->Batches() - batches, 1);
  EXPECT_EQ(calls_->Count("EnqueueBatch", "INVALID_ARGUMENT"), 0);
  for (const std::string& q : queues) {
    absl::StatusOr<v1::QueueInfo> queue = client.GetQueue(q);
    ASSERT_TRUE(queue.ok()) << queue.status();
  }
}

TEST_F(CoalescingBrokerTest, CloseWaitsForTheBatches) {
  ClientOptions options = Options();
  options.batch_linger = absl::Seconds(30);
  Client client(options);
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<Enqueued>> answers(10, absl::UnknownError("not answered"));
  for (int i = 0; i < 10; ++i) {
    threads.emplace_back([&, i] { answers[i] = client.Enqueue("closing", absl::StrCat(i)); });
  }
  // Close cuts the linger short; the callers are answered, not left waiting 30 s.
  absl::SleepFor(absl::Milliseconds(50));
  client.Close();
  for (std::thread& t : threads) t.join();
  ExpectAllCreated(client, answers);
}

}  // namespace
}  // namespace jobbroker::client
