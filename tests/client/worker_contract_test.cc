// The C++ Worker (client/cpp/jobbroker/worker.h) against the real broker binary, for the parts of
// docs/worker-contract.md that tests/interop/conformance.py does not reach: durable steps' format
// and rules, the cancellation signal's reasons and what the worker answers after each, progress
// going out at once, and the client metadata. And, before a stand-in broker in this process,
// the answers the real one gives only in a cluster handing a partition to a new leader.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "jobbroker/v1/steps.pb.h"
#include "jobbroker/worker.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"

namespace jobbroker::testing {
namespace {

using client::JobContext;
using client::Worker;
using client::WorkerOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Retries at once (100 ms, no jitter), so a test's second attempt follows its first.
constexpr char kConfig[] = R"({
  "defaultPolicy": {
    "retry": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s",
              "jitter": "JITTER_NONE"}
  }
})";

class WorkerContractTest : public BrokerFixture {
 protected:
  WorkerContractTest() : BrokerFixture({.config_json = kConfig}) {}

  WorkerOptions Options() {
    WorkerOptions o;
    o.address = process().address();
    o.worker_id = "contract-worker";
    return o;
  }

  bool AwaitState(const std::string& id, v1::JobState state) {
    return WaitFor([&] { return client().MustGetJob(id).state() == state; });
  }

  std::string EnqueueWithTimeout(const std::string& queue, absl::Duration timeout) {
    v1::EnqueueRequest req;
    req.set_queue(queue);
    req.set_payload("{}");
    *req.mutable_timeout() = ToProto(timeout);
    return client().MustEnqueue(req);
  }
};

// Counts how often each step body ran, across attempts.
struct StepRuns {
  absl::Mutex mu;
  std::map<std::string, int> runs ABSL_GUARDED_BY(mu);

  absl::StatusOr<std::string> Run(const std::string& name, std::string result) {
    absl::MutexLock lock(&mu);
    ++runs[name];
    return result;
  }
  std::map<std::string, int> Runs() {
    absl::MutexLock lock(&mu);
    return runs;
  }
};

TEST_F(WorkerContractTest, AStepRunsOnceAcrossAttemptsAndItsResultIsReplayed) {
  Worker worker(Options());
  StepRuns steps;
  worker.Handle("steps", [&](JobContext& job) -> absl::Status {
    absl::StatusOr<std::string> a = job.Step("a", [&] { return steps.Run("a", R"({"n":1})"); });
    if (!a.ok()) return a.status();
    if (job.attempt() == 1) return absl::UnavailableError("the first attempt fails after step a");
    absl::StatusOr<std::string> b = job.Step("b", [&] { return steps.Run("b", "\"two\""); });
    if (!b.ok()) return b.status();
    job.SetResult(absl::StrCat(*a, " ", *b));
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  const std::string id = client().MustEnqueue("steps", "{}");
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  worker.Stop();

  const v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.result(), R"({"n":1} "two")");
  EXPECT_THAT(steps.Runs(), ElementsAre(std::pair<const std::string, int>("a", 1),
                                        std::pair<const std::string, int>("b", 1)));
  // The checkpoint is the cross-language StepCheckpoint, results as JSON.
  v1::StepCheckpoint checkpoint;
  ASSERT_TRUE(checkpoint.ParseFromString(job.checkpoint()));
  ASSERT_EQ(checkpoint.steps_size(), 2);
  EXPECT_EQ(checkpoint.steps(0).name(), "a");
  EXPECT_EQ(checkpoint.steps(0).result(), R"({"n":1})");
  EXPECT_EQ(checkpoint.steps(1).name(), "b");
  EXPECT_EQ(checkpoint.steps(1).result(), "\"two\"");
}

TEST_F(WorkerContractTest, AStepResumesACheckpointAnotherLanguageWrote) {
  const std::string id = client().MustEnqueue("resume", "{}");
  // Attempt 1 by "another language": step a saved the way any helper saves it, then a crash.
  std::optional<v1::LeasedJob> first = client().LeaseOne("resume", "other-language");
  ASSERT_TRUE(first.has_value());
  v1::StepCheckpoint theirs;
  v1::CompletedStep* a = theirs.add_steps();
  a->set_name("a");
  a->set_result(R"({"by": "python", "text": "h\u00e9llo"})");
  v1::HeartbeatRequest beat;
  beat.set_job_id(id);
  beat.set_lease_id(first->lease_id());
  beat.set_checkpoint(theirs.SerializeAsString());
  v1::HeartbeatResponse beat_answer;
  ASSERT_TRUE(client().Heartbeat(beat, &beat_answer).ok());
  v1::FailRequest fail;
  fail.set_job_id(id);
  fail.set_lease_id(first->lease_id());
  fail.set_error("crashed after step a");
  v1::FailResponse fail_answer;
  ASSERT_TRUE(client().Fail(fail, &fail_answer).ok());

  Worker worker(Options());
  StepRuns steps;
  worker.Handle("resume", [&](JobContext& job) -> absl::Status {
    absl::StatusOr<std::string> a = job.Step("a", [&] { return steps.Run("a", "null"); });
    if (!a.ok()) return a.status();
    absl::StatusOr<std::string> b = job.Step("b", [&] { return steps.Run("b", "[1,2]"); });
    if (!b.ok()) return b.status();
    job.SetResult(*a);
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  worker.Stop();
  EXPECT_EQ(client().MustGetJob(id).result(), R"({"by": "python", "text": "h\u00e9llo"})");
  EXPECT_THAT(steps.Runs(), ElementsAre(std::pair<const std::string, int>("b", 1)));
}

TEST_F(WorkerContractTest, StepsRefuseACheckpointTheyDidNotWriteAndARepeatedName) {
  Worker worker(Options());
  absl::Mutex mu;
  std::vector<absl::Status> step_errors;
  worker.Handle("raw", [&](JobContext& job) -> absl::Status {
    if (job.attempt() == 1) {
      job.SaveCheckpoint("a checkpoint of the handler's own");
      return absl::UnavailableError("retry");
    }
    absl::StatusOr<std::string> s = job.Step("a", [] { return std::string("1"); });
    absl::MutexLock lock(&mu);
    step_errors.push_back(s.status());
    return absl::OkStatus();
  });
  worker.Handle("twice", [&](JobContext& job) -> absl::Status {
    absl::StatusOr<std::string> first = job.Step("a", [] { return std::string("1"); });
    absl::StatusOr<std::string> again = job.Step("a", [] { return std::string("2"); });
    absl::StatusOr<std::string> not_json = job.Step("b", [] { return std::string("{oops"); });
    absl::MutexLock lock(&mu);
    step_errors.push_back(first.status());
    step_errors.push_back(again.status());
    step_errors.push_back(not_json.status());
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  const std::string raw = client().MustEnqueue("raw", "{}");
  ASSERT_TRUE(AwaitState(raw, v1::JOB_STATE_COMPLETED));
  const std::string twice = client().MustEnqueue("twice", "{}");
  ASSERT_TRUE(AwaitState(twice, v1::JOB_STATE_COMPLETED));
  worker.Stop();

  absl::MutexLock lock(&mu);
  ASSERT_EQ(step_errors.size(), 4u);
  EXPECT_EQ(step_errors[0].code(), absl::StatusCode::kFailedPrecondition) << step_errors[0];
  EXPECT_THAT(step_errors[0].message(), HasSubstr("not written by durable steps"));
  EXPECT_TRUE(step_errors[1].ok()) << step_errors[1];
  EXPECT_EQ(step_errors[2].code(), absl::StatusCode::kInvalidArgument) << step_errors[2];
  EXPECT_EQ(step_errors[3].code(), absl::StatusCode::kInvalidArgument) << step_errors[3];
}

TEST_F(WorkerContractTest, AnOperatorCancelFiresTheStopTokenAndTheWorkerGoesOn) {
  Worker worker(Options());
  absl::Notification started;
  std::atomic<bool> stop_token_fired{false};
  worker.Handle("cancel", [&](JobContext& job) -> absl::Status {
    if (job.payload() == "next") return absl::OkStatus();
    started.Notify();
    while (!job.WaitCancelled(absl::Hours(1))) {
    }
    stop_token_fired = job.stop_token().stop_requested();
    return absl::CancelledError("cancelled");
  });
  ASSERT_TRUE(worker.Start().ok());
  const std::string id = client().MustEnqueue("cancel", "wait");
  started.WaitForNotification();
  v1::Job cancelled;
  ASSERT_TRUE(client().CancelJob(id, &cancelled).ok());
  const std::string next = client().MustEnqueue("cancel", "next");
  ASSERT_TRUE(AwaitState(next, v1::JOB_STATE_COMPLETED));
  worker.Stop();
  EXPECT_TRUE(stop_token_fired);
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(WorkerContractTest, TheTimeOutFiresTheSignalAndTheBrokersOutcomeStands) {
  Worker worker(Options());
  worker.Handle("slow", [&](JobContext& job) -> absl::Status {
    if (job.attempt() > 1) return absl::OkStatus();
    while (!job.WaitCancelled(absl::Hours(1))) {
    }
    return absl::CancelledError("timed out");
  });
  ASSERT_TRUE(worker.Start().ok());
  const std::string id = EnqueueWithTimeout("slow", absl::Seconds(1));
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  worker.Stop();
  const v1::Job job = client().MustGetJob(id);
  ASSERT_EQ(job.attempts_size(), 2);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_TIMED_OUT);
  EXPECT_EQ(worker.stats().failed, 0);  // nothing was sent for the timed-out attempt
}

TEST_F(WorkerContractTest, AHandlerStillRunningAtTheEndOfGraceIsCancelledAndItsJobReleased) {
  Worker worker(Options());
  absl::Notification started;
  worker.Handle("stuck", [&](JobContext& job) -> absl::Status {
    started.Notify();
    while (!job.WaitCancelled(absl::Hours(1))) {
    }
    return absl::OkStatus();  // even a success is released: the stop cut the job short
  });
  ASSERT_TRUE(worker.Start().ok());
  const std::string id = client().MustEnqueue("stuck", "{}");
  started.WaitForNotification();
  worker.Stop(absl::Milliseconds(200));
  const v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_READY);
  EXPECT_EQ(worker.stats().released, 1);
  EXPECT_EQ(worker.stats().acked, 0);
}

TEST_F(WorkerContractTest, AHandlerThatReturnsNormallyAfterAnOperatorCancelCompletesTheJob) {
  Worker worker(Options());
  absl::Notification started;
  worker.Handle("finish", [&](JobContext& job) -> absl::Status {
    started.Notify();
    while (!job.WaitCancelled(absl::Hours(1))) {
    }
    job.SetResult("done anyway");
    return absl::OkStatus();  // the work was done: the ack still completes the job
  });
  ASSERT_TRUE(worker.Start().ok());
  const std::string id = client().MustEnqueue("finish", "{}");
  started.WaitForNotification();
  v1::Job cancelled;
  ASSERT_TRUE(client().CancelJob(id, &cancelled).ok());
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  worker.Stop();
  EXPECT_EQ(client().MustGetJob(id).result(), "done anyway");
}

TEST_F(WorkerContractTest, StopDoesNotWaitForAHandlerThatIgnoresItsCancellation) {
  // Shared with the handler, which outlives Stop (and this test's worker) on its own thread.
  auto started = std::make_shared<absl::Notification>();
  auto unblock = std::make_shared<absl::Notification>();
  auto returned = std::make_shared<absl::Notification>();
  std::string id;
  {
    Worker worker(Options());
    worker.Handle("blocked", [started, unblock, returned](JobContext&) {
      started->Notify();
      unblock->WaitForNotification();  // a blocking call that knows nothing of cancellation
      returned->Notify();
      return absl::OkStatus();
    });
    ASSERT_TRUE(worker.Start().ok());
    id = client().MustEnqueue("blocked", "{}");
    started->WaitForNotification();
    worker.Stop(absl::Milliseconds(100));
    EXPECT_EQ(worker.stats().released, 1);
  }
  // Released while its handler still runs: no attempt spent, READY for another worker.
  v1::Job job = client().MustGetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_READY);
  unblock->Notify();
  returned->WaitForNotification();
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_READY);
}

TEST_F(WorkerContractTest, ProgressGoesOutAtOnceNotAtTheNextHeartbeat) {
  WorkerOptions options = Options();
  options.lease_duration = absl::Hours(1);  // the next regular heartbeat is 20 minutes away
  Worker worker(options);
  absl::Notification finish;
  worker.Handle("progress", [&](JobContext& job) -> absl::Status {
    job.SetProgress(R"({"percent":10})");
    job.SetProgress(R"({"percent":50})");
    finish.WaitForNotification();
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  const std::string id = client().MustEnqueue("progress", "{}");
  EXPECT_TRUE(WaitFor([&] { return client().MustGetJob(id).progress() == R"({"percent":50})"; }));
  finish.Notify();
  ASSERT_TRUE(AwaitState(id, v1::JOB_STATE_COMPLETED));
  worker.Stop();
}

TEST_F(WorkerContractTest, ListWorkersShowsTheLibraryFromTheClientMetadata) {
  Worker worker(Options());
  worker.Handle("any", [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());
  std::string seen;
  EXPECT_TRUE(WaitFor([&] {
    grpc::ClientContext ctx;
    v1::ListWorkersRequest req;
    v1::ListWorkersResponse resp;
    if (!admin().ListWorkers(&ctx, req, &resp).ok()) return false;
    for (const v1::WorkerInfo& w : resp.workers())
      if (w.worker_id() == "contract-worker") seen = w.client();
    return !seen.empty();
  }));
  worker.Stop();
  EXPECT_EQ(seen, client::kClientName);
}

TEST_F(WorkerContractTest, MiddlewaresWrapEveryHandlerTheFirstAddedOutermost) {
  Worker worker(Options());
  absl::Mutex mu;
  std::vector<std::string> calls;
  auto record = [&](std::string call) {
    absl::MutexLock lock(&mu);
    calls.push_back(std::move(call));
  };
  worker.Use([&](JobContext& job, const client::Handler& next) {
    record("outer in");
    absl::Status s = next(job);
    record("outer out");
    return s;
  });
  worker.Use([&](JobContext& job, const client::Handler& next) {
    record("inner in");
    if (job.payload() == "refuse") return client::PermanentError("refused by the middleware");
    return next(job);
  });
  worker.Handle("mw", [&](JobContext&) {
    record("handler");
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  const std::string ran = client().MustEnqueue("mw", "run");
  ASSERT_TRUE(AwaitState(ran, v1::JOB_STATE_COMPLETED));
  const std::string refused = client().MustEnqueue("mw", "refuse");
  ASSERT_TRUE(AwaitState(refused, v1::JOB_STATE_FAILED));
  worker.Stop();
  absl::MutexLock lock(&mu);
  EXPECT_THAT(calls, ElementsAre("outer in", "inner in", "handler", "outer out", "outer in",
                                 "inner in", "outer out"));
}

TEST_F(WorkerContractTest, RunReturnsARefusedSubscriptionInsteadOfRetryingIt) {
  Worker worker(Options());
  worker.Handle("not a queue name!", [](JobContext&) { return absl::OkStatus(); });
  EXPECT_EQ(worker.Run().code(), absl::StatusCode::kInvalidArgument);
}

// A stand-in Broker service for answers the real broker gives only in a 3-node cluster whose
// queue's leader was just killed (conformance.py's cluster_leader_kill), which a test cannot
// make it give on demand: "retry" (UNAVAILABLE) to an ack or a checkpoint save while the
// partition is between leaders, and to a subscription while a queue's partition has no leader
// (the stream then stays open and pushes nothing). It pushes one job, job-1 with lease-1, to
// the first stream it accepts, and records what it receives.
class StandInBroker final : public v1::Broker::Service {
 public:
  struct Script {
    int refuse_subscriptions = 0;  // the first n subscriptions are answered UNAVAILABLE
    bool refuse_first_ack = false;
    bool refuse_first_checkpoint = false;
  };
  explicit StandInBroker(Script script) : script_(script) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~StandInBroker() override { server_->Shutdown(absl::ToChronoTime(absl::Now())); }

  const std::string& address() const { return address_; }

  // What it received, in order: "stream <n>" when stream n (from 1) opened, "subscribe",
  // "ack <lease>", "checkpoint <lease>", "fail <lease>", "release <lease>".
  std::vector<std::string> Calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // Waits up to `timeout` until `call` was received `times` times.
  bool AwaitCall(const std::string& call, int times, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto received = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::count(calls_.begin(), calls_.end(), call) >= times;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&received), timeout);
  }
  // When `call` was received for the n-th time (from 1); InfinitePast() if it was not.
  absl::Time TimeOf(const std::string& call, int n) const {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < calls_.size(); ++i)
      if (calls_[i] == call && --n == 0) return times_[i];
    return absl::InfinitePast();
  }

  grpc::Status Work(grpc::ServerContext*,
                    grpc::ServerReaderWriter<v1::WorkResponse, v1::WorkRequest>* stream) override {
    {
      absl::MutexLock lock(&mu_);
      RecordLocked(absl::StrCat("stream ", ++streams_));
    }
    v1::WorkRequest req;
    while (stream->Read(&req)) {
      std::vector<v1::WorkResponse> out;
      v1::WorkResult& result = *out.emplace_back().mutable_result();
      result.set_request_id(req.request_id());
      auto refuse = [&result] {
        result.set_code(grpc::StatusCode::UNAVAILABLE);
        result.set_message("partition 0: node-2 leads it but does not serve it yet; retry");
      };
      {
        absl::MutexLock lock(&mu_);
        switch (req.request_case()) {
          case v1::WorkRequest::kSubscribe:
            RecordLocked("subscribe");
            if (subscriptions_++ < script_.refuse_subscriptions) {
              refuse();  // and the stream stays open, as the broker leaves it
            } else if (!pushed_) {
              pushed_ = true;
              v1::LeasedJob& job = *out.emplace_back().mutable_job();
              job.set_job_id("job-1");
              job.set_lease_id("lease-1");
              job.set_queue("q");
              job.set_attempt(1);
              job.set_max_attempts(3);
              job.mutable_lease_deadline()->set_seconds(
                  absl::ToUnixSeconds(absl::Now() + absl::Minutes(1)));
            }
            break;
          case v1::WorkRequest::kAck:
            RecordLocked(absl::StrCat("ack ", req.ack().lease_id()));
            if (script_.refuse_first_ack && acks_++ == 0) refuse();
            break;
          case v1::WorkRequest::kAckBatch:
            for (const v1::AckRequest& ack : req.ack_batch().acks())
              RecordLocked(absl::StrCat("ack ", ack.lease_id()));
            break;
          case v1::WorkRequest::kHeartbeat:
            if (!req.heartbeat().has_checkpoint()) break;
            RecordLocked(absl::StrCat("checkpoint ", req.heartbeat().lease_id()));
            if (script_.refuse_first_checkpoint && checkpoints_++ == 0) refuse();
            break;
          case v1::WorkRequest::kFail:
            RecordLocked(absl::StrCat("fail ", req.fail().lease_id()));
            break;
          case v1::WorkRequest::kRelease:
            RecordLocked(absl::StrCat("release ", req.release().lease_id()));
            break;
          default:
            out.clear();  // flow: no answer
            break;
        }
      }
      for (const v1::WorkResponse& m : out) stream->Write(m);
    }
    return grpc::Status::OK;
  }

 private:
  void RecordLocked(std::string call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    calls_.push_back(std::move(call));
    times_.push_back(absl::Now());
  }

  const Script script_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> times_ ABSL_GUARDED_BY(mu_);
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  int subscriptions_ ABSL_GUARDED_BY(mu_) = 0;
  int acks_ ABSL_GUARDED_BY(mu_) = 0;
  int checkpoints_ ABSL_GUARDED_BY(mu_) = 0;
  bool pushed_ ABSL_GUARDED_BY(mu_) = false;
};

WorkerOptions StandInOptions(const StandInBroker& broker) {
  WorkerOptions o;
  o.channel = grpc::CreateChannel(broker.address(), grpc::InsecureChannelCredentials());
  o.worker_id = "stand-in-worker";
  return o;
}

// Contract §4: an ack answered UNAVAILABLE is not final. Without the resend the job would run
// again when its lease ran out.
TEST(WorkerAnswerRetryTest, AnAckAnsweredUnavailableIsSentAgainOnTheSameStream) {
  StandInBroker broker({.refuse_first_ack = true});
  Worker worker(StandInOptions(broker));
  worker.Handle("q", [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());
  const bool resent = broker.AwaitCall("ack lease-1", 2, absl::Seconds(10));
  worker.Stop(absl::Seconds(1));
  ASSERT_TRUE(resent) << "the refused ack was not sent again";
  // After the retry delay (250 ms), on the stream that refused it.
  EXPECT_GE(broker.TimeOf("ack lease-1", 2) - broker.TimeOf("ack lease-1", 1),
            absl::Milliseconds(200));
  EXPECT_THAT(broker.Calls(), ElementsAre("stream 1", "subscribe", "ack lease-1", "ack lease-1"));
}

// Contract §4, for a durable step: its checkpoint save answered UNAVAILABLE goes out again, and
// Step returns once the broker took it, instead of failing the attempt.
TEST(WorkerAnswerRetryTest, AStepSaveAnsweredUnavailableIsSentAgain) {
  StandInBroker broker({.refuse_first_checkpoint = true});
  Worker worker(StandInOptions(broker));
  absl::Mutex mu;
  absl::Status step_status = absl::UnknownError("the handler did not run");
  worker.Handle("q", [&](JobContext& job) -> absl::Status {
    absl::StatusOr<std::string> a = job.Step("a", [] { return std::string("1"); });
    absl::MutexLock lock(&mu);
    step_status = a.status();
    return a.status();
  });
  ASSERT_TRUE(worker.Start().ok());
  const bool acked = broker.AwaitCall("ack lease-1", 1, absl::Seconds(10));
  worker.Stop(absl::Seconds(1));
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(step_status.ok()) << step_status;
  }
  ASSERT_TRUE(acked) << "the job was not acked";
  EXPECT_GE(broker.TimeOf("checkpoint lease-1", 2) - broker.TimeOf("checkpoint lease-1", 1),
            absl::Milliseconds(200));
  EXPECT_THAT(broker.Calls(), ElementsAre("stream 1", "subscribe", "checkpoint lease-1",
                                          "checkpoint lease-1", "ack lease-1"));
}

// Contract §5: a subscription answered UNAVAILABLE on a stream the broker leaves open is a
// stream that ended UNAVAILABLE: the worker ends it and subscribes again on a new one.
TEST(WorkerAnswerRetryTest, ASubscriptionAnsweredUnavailableReconnects) {
  StandInBroker broker({.refuse_subscriptions = 2});
  WorkerOptions options = StandInOptions(broker);
  options.reconnect_initial = absl::Milliseconds(50);
  Worker worker(options);
  worker.Handle("q", [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());  // UNAVAILABLE is not the caller's mistake
  const bool acked = broker.AwaitCall("ack lease-1", 1, absl::Seconds(10));
  worker.Stop(absl::Seconds(1));
  ASSERT_TRUE(acked) << "the worker did not subscribe again: "
                     << ::testing::PrintToString(broker.Calls());
  EXPECT_THAT(broker.Calls(), ElementsAre("stream 1", "subscribe", "stream 2", "subscribe",
                                          "stream 3", "subscribe", "ack lease-1"));
  EXPECT_EQ(worker.stats().reconnects, 2);
}

}  // namespace
}  // namespace jobbroker::testing
