// The server around the broker: reflection, HTTP /healthz and /metrics, long polls that hold no
// thread, and group commit as seen from outside.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/http_client.h"
#include "tests/testing/matchers.h"
#include "tests/testing/queue_names.h"

namespace jobbroker::testing {
namespace {

using ServerTest = BrokerFixture;

TEST_F(ServerTest, ReflectionListsTheServices) {
  // Debian ships no client for the reflection protocol, so this speaks it on raw bytes: a
  // ServerReflectionRequest with list_services (field 7) set to "", and in the response
  // list_services_response (field 6) -> repeated service (field 1) -> name (field 1).
  auto channel = process().NewChannel();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::internal::RpcMethod method("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &ctx));
  const char request_bytes[] = {0x3A, 0x00};
  grpc::Slice slice(request_bytes, sizeof request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  grpc::ByteBuffer reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(stream->Finish().ok());

  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  google::protobuf::UnknownFieldSet response;
  ASSERT_TRUE(response.ParseFromString(bytes));
  std::set<std::string> services;
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    ASSERT_TRUE(list.ParseFromString(response.field(i).length_delimited()));
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      ASSERT_TRUE(service.ParseFromString(list.field(j).length_delimited()));
      services.insert(service.field(0).length_delimited());
    }
  }
  EXPECT_TRUE(services.count("jobbroker.v1.Broker")) << ::testing::PrintToString(services);
  EXPECT_TRUE(services.count("jobbroker.v1.Admin"));
  EXPECT_TRUE(services.count("grpc.health.v1.Health"));
}

TEST_F(ServerTest, HttpServesHealthAndMetrics) {
  EXPECT_THAT(HttpGet(process().http_address(), "/healthz"), HasSubstr("200 OK"));
  client().MustEnqueue("mailer", "a");
  client().MustEnqueue("mailer", "b");
  std::string metrics = HttpGet(process().http_address(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("200 OK"));
  EXPECT_EQ(Sample(metrics, "jobbroker_jobs{queue=\"mailer\",state=\"ready\"}"), 2) << metrics;
  EXPECT_EQ(Sample(metrics, "jobbroker_jobs{queue=\"mailer\",state=\"active\"}"), 0);
  // Far below --max-hot-jobs: both jobs are whole in memory.
  EXPECT_EQ(Sample(metrics, "jobbroker_jobs_in_memory{form=\"whole\"}"), 2);
  EXPECT_EQ(Sample(metrics, "jobbroker_jobs_in_memory{form=\"index_only\"}"), 0);
  // A single node has no cluster to report on.
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("jobbroker_cluster_")));
}

// Every unary call is timed by method and status code, whichever way it ends: answered after
// its write, refused before reaching the broker, a long-poll Lease, an Admin read.
TEST_F(ServerTest, MetricsTimeUnaryCallsByMethodAndCode) {
  client().MustEnqueue("mailer", "a");
  v1::EnqueueRequest nameless;  // no queue: refused with INVALID_ARGUMENT
  v1::EnqueueResponse ignored;
  ASSERT_EQ(client().Enqueue(nameless, &ignored).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  std::vector<v1::LeasedJob> jobs = client().MustLease("mailer", "worker-1", 1);
  ASSERT_EQ(jobs.size(), 1u);
  client().MustAck(jobs[0]);
  client().MustGetJob(jobs[0].job_id());

  std::string metrics = HttpGet(process().http_address(), "/metrics");
  auto count = [&](const std::string& method, const std::string& code) {
    return Sample(metrics, "jobbroker_rpc_duration_seconds_count{code=\"" + code +
                               "\",method=\"/jobbroker.v1." + method + "\"}");
  };
  EXPECT_EQ(count("Broker/Enqueue", "OK"), 1) << metrics;
  EXPECT_EQ(count("Broker/Enqueue", "INVALID_ARGUMENT"), 1);
  EXPECT_EQ(count("Broker/Lease", "OK"), 1);
  EXPECT_EQ(count("Broker/Ack", "OK"), 1);
  EXPECT_EQ(count("Admin/GetJob", "OK"), 1);
  // Codes that never happened are not listed, and neither are streams.
  EXPECT_EQ(count("Broker/Ack", "INVALID_ARGUMENT"), -1);
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("method=\"/jobbroker.v1.Broker/Work\"")));
}

TEST_F(ServerTest, ManyLongPollsWaitWithoutHoldingThreads) {
  // More waiting Leases than a thread-per-call server has threads; each must still get a job.
  constexpr int kWaiters = 300;
  auto stub = process().NewBrokerStub();
  struct Call {
    grpc::ClientContext ctx;
    v1::LeaseRequest req;
    v1::LeaseResponse resp;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  int finished = 0;
  for (int i = 0; i < kWaiters; ++i) {
    auto call = std::make_unique<Call>();
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
    call->req.set_queue("longpoll");
    call->req.set_worker_id(absl::StrCat("w", i));
    call->req.mutable_wait()->set_seconds(60);
    Call* c = call.get();
    stub->async()->Lease(&c->ctx, &c->req, &c->resp, [&, c](grpc::Status s) {
      absl::MutexLock lock(&mu);
      c->status = std::move(s);
      ++finished;
    });
    calls.push_back(std::move(call));
  }
  // Feed one job per waiter (some waits may register only after their job arrived).
  for (int i = 0; i < kWaiters; ++i) client().MustEnqueue("longpoll", absl::StrCat("job", i));

  absl::MutexLock lock(&mu);
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                      +[](int* n) { return *n == kWaiters; }, &finished),
                                  absl::Seconds(90)))
      << finished << " of " << kWaiters << " long polls answered";
  std::set<std::string> jobs;
  int empty = 0;
  for (const auto& c : calls) {
    ASSERT_TRUE(c->status.ok()) << c->status.error_message();
    if (c->resp.jobs().empty()) ++empty;
    for (const v1::LeasedJob& j : c->resp.jobs()) jobs.insert(j.job_id());
  }
  // Only the waiters lease, one job each, and there is one job per waiter: whether a waiter
  // registered before or after its job arrived, every one gets a distinct job.
  EXPECT_EQ(empty, 0);
  EXPECT_EQ(jobs.size(), static_cast<size_t>(kWaiters));
}

TEST_F(ServerTest, AnAbandonedLongPollTakesNoJob) {
  // The client gives up (its deadline) long before the wait would end; the broker must drop the
  // waiter, or the next job would be leased to nobody and sit ACTIVE until its lease ran out.
  auto stub = process().NewBrokerStub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  v1::LeaseRequest req;
  req.set_queue("abandoned");
  req.set_worker_id("gone");
  req.mutable_wait()->set_seconds(60);
  v1::LeaseResponse resp;
  grpc::Status s = stub->Lease(&ctx, req, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server learns of the cancellation a moment after the client; without it the waiter
  // would stay for its whole 60 s wait.
  ASSERT_TRUE(PollUntil(
      [&] {
        v1::QueueInfo info;
        return client().GetQueue("abandoned", &info).ok() && info.waiting_leases() == 0;
      },
      absl::Seconds(30)));

  std::string id = client().MustEnqueue("abandoned", "job");
  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_READY);
  std::vector<v1::LeasedJob> leased = client().MustLease("abandoned", "present", 1);
  ASSERT_EQ(leased.size(), 1u);
  EXPECT_EQ(leased[0].job_id(), id);
}

TEST_F(ServerTest, ConcurrentEnqueuesShareFsyncs) {
  constexpr int kThreads = 64;
  constexpr int kPerThread = 40;
  double writes_before =
      Sample(HttpGet(process().http_address(), "/metrics"), "jobbroker_store_writes_total");
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      BrokerClient producer(process().NewChannel());
      for (int i = 0; i < kPerThread; ++i) {
        v1::EnqueueRequest req;
        req.set_queue("group");
        req.set_payload(absl::StrCat(t, "-", i));
        v1::EnqueueResponse resp;
        if (producer.Enqueue(req, &resp).ok()) ok.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(ok.load(), kThreads * kPerThread);
  double writes =
      Sample(HttpGet(process().http_address(), "/metrics"), "jobbroker_store_writes_total") -
      writes_before;
  // Each acknowledged enqueue was synced; with 64 callers in flight they must have shared fsyncs.
  EXPECT_GT(writes, 0);
  EXPECT_LT(writes, kThreads * kPerThread) << "one fsync per enqueue: no group commit";
  std::cout << "[ metrics  ] " << ok.load() << " enqueues in " << writes << " synced writes\n";
}

// A node of several partitions recovers each on its own (side by side): each one's "recovered"
// line names it, so that an operator can tell which partition was slow or large.
class PartitionedServerTest : public BrokerFixture {
 protected:
  PartitionedServerTest() : BrokerFixture({.extra_args = {"--partitions", "3"}}) {}
};

// The value of a string field of one JSON log line ("" when the line has none).
std::string LogField(absl::string_view line, absl::string_view name) {
  const std::string opening = absl::StrCat("\"", name, "\":\"");
  const size_t at = line.find(opening);
  if (at == absl::string_view::npos) return "";
  absl::string_view value = line.substr(at + opening.size());
  return std::string(value.substr(0, value.find('"')));
}

TEST_F(PartitionedServerTest, EachPartitionsRecoveryIsLoggedWithItsNumberAndJobs) {
  const std::string queue = QueueInPartition(2, 3, "logged");
  client().MustEnqueue(queue, "a");
  client().MustEnqueue(queue, "b");
  ASSERT_NO_FATAL_FAILURE(Kill9AndRestart());
  std::map<std::string, std::string> jobs_by_partition;
  for (absl::string_view line : absl::StrSplit(process().ReadStderr(), '\n')) {
    if (LogField(line, "event") != "recovered") continue;
    jobs_by_partition[LogField(line, "partition")] = LogField(line, "jobs");
  }
  EXPECT_THAT(jobs_by_partition,
              ::testing::ElementsAre(::testing::Pair("0", "0"), ::testing::Pair("1", "0"),
                                     ::testing::Pair("2", "2")));
}

TEST(MaxHotJobsFlagTest, ABadValueIsRefusedAtStartNamingTheFlag) {
  auto dir = TempDir::Create();
  ASSERT_TRUE(dir.ok());
  for (const char* bad : {"-1", "lots", "1000000001", ""}) {
    auto result = RunBrokerToExit(**dir, {"--check-config", "--max-hot-jobs", bad});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 1) << bad;
    EXPECT_THAT(result->stderr_text, HasSubstr("--max-hot-jobs")) << bad;
  }
  auto zero = RunBrokerToExit(**dir, {"--check-config", "--max-hot-jobs", "0"});
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->exit_code, 0) << zero->stderr_text;
}

}  // namespace
}  // namespace jobbroker::testing
