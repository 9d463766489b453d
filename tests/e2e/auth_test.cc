// Bearer tokens with roles and queue patterns (--auth-tokens) against the real binary: every
// Broker and Admin RPC against every kind of caller, refusals that change nothing, the Work
// stream's checks, the probes that stay open, and TLS + token through the C++ client, its worker
// runner and jobbroker-cli.
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "jobbroker/client.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "jobbroker/worker.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/child_process.h"
#include "tests/testing/http_client.h"
#include "tests/testing/matchers.h"
#include "tests/testing/test_pki.h"

namespace jobbroker::testing {
namespace {

constexpr char kProducerToken[] = "jb-producer-4a7c91";
constexpr char kWorkerToken[] = "jb-worker-b83e02";
constexpr char kAdminToken[] = "jb-admin-5d19f7";
constexpr char kBillingToken[] = "jb-billing-e60d2c";
constexpr char kWrongToken[] = "jb-wrong-0000aa";
constexpr const char* kAllTokens[] = {kProducerToken, kWorkerToken, kAdminToken, kBillingToken,
                                      kWrongToken};

// The sha256 values are `printf %s TOKEN | sha256sum`; billing-all uses the plaintext form.
constexpr char kTokensJson[] = R"({"tokens": [
  {"name": "orders-producer", "roles": ["producer"], "queues": ["orders.*"],
   "sha256": "0a12fda5455fa91e11d6ea7fcdbbf6ed45bc92c5163192a2473d80e4a5b258a0"},
  {"name": "orders-worker", "roles": ["worker"], "queues": ["orders.*"],
   "sha256": "e8e87e92bbd378e2103d7b49ded5ad8fd3fd58652ec29c816096400eb6a5bf1d"},
  {"name": "ops", "roles": ["admin"], "queues": ["*"],
   "sha256": "E820D1C20E40C2B257C622AECD8F7B13530CA686B4F6E18848F048D4079A6285"},
  {"name": "billing-all", "roles": ["producer", "worker", "admin"], "queues": ["billing"],
   "token": "jb-billing-e60d2c"}
]})";

// Who calls. kOtherQueue holds every role, but on another queue (billing) only.
enum class Who { kNoToken, kWrongToken, kProducer, kWorker, kAdmin, kOtherQueue };
constexpr Who kEveryone[] = {Who::kNoToken, Who::kWrongToken, Who::kProducer,
                             Who::kWorker,  Who::kAdmin,      Who::kOtherQueue};

std::string WhoName(Who who) {
  switch (who) {
    case Who::kNoToken:
      return "no token";
    case Who::kWrongToken:
      return "a wrong token";
    case Who::kProducer:
      return "producer";
    case Who::kWorker:
      return "worker";
    case Who::kAdmin:
      return "admin";
    case Who::kOtherQueue:
      return "a token for another queue";
  }
  return "?";
}

const char* TokenOf(Who who) {
  switch (who) {
    case Who::kNoToken:
      return nullptr;
    case Who::kWrongToken:
      return kWrongToken;
    case Who::kProducer:
      return kProducerToken;
    case Who::kWorker:
      return kWorkerToken;
    case Who::kAdmin:
      return kAdminToken;
    case Who::kOtherQueue:
      return kBillingToken;
  }
  return nullptr;
}

// The entry name a refusal must quote.
std::string EntryOf(Who who) {
  switch (who) {
    case Who::kProducer:
      return "orders-producer";
    case Who::kWorker:
      return "orders-worker";
    case Who::kAdmin:
      return "ops";
    case Who::kOtherQueue:
      return "billing-all";
    default:
      return "";
  }
}

// A context with a deadline and `who`'s token in the metadata.
std::unique_ptr<grpc::ClientContext> Ctx(Who who) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (const char* token = TokenOf(who))
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  return ctx;
}

// One queue's jobs in each state a call can act on.
struct Targets {
  std::string queue;
  std::string ready;
  v1::LeasedJob active;  // its lease is held (10 minutes: never runs out during the test)
  std::string done;
  std::string dead;  // FAILED, permanent
};

// What a refused call must leave as it was: the queue (less the oldest ready job's age, which
// grows with the clock) and every job in it.
struct Snapshot {
  grpc::Status queue_status;
  v1::QueueInfo queue;
  std::vector<v1::Job> jobs;
};

class AuthTest : public BrokerFixture {
 protected:
  AuthTest() : BrokerFixture(kStartInTest) {}

  void SetUp() override {
    BrokerFixture::SetUp();
    absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
    absl::StatusOr<std::string> tokens = dir_->WriteFile("tokens.json", kTokensJson);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    tokens_path_ = *tokens;
  }

  // A broker that checks the tokens of kTokensJson, with `more_args`.
  void StartBroker(std::vector<std::string> more_args = {}) {
    BrokerProcessOptions options;
    options.extra_args = {"--auth-tokens", tokens_path_, "--log-level", "debug"};
    options.extra_args.insert(options.extra_args.end(), more_args.begin(), more_args.end());
    Start(std::move(options));
  }

  std::string Enqueue(Who who, const std::string& queue, int priority = 0) {
    v1::EnqueueRequest req;
    req.set_queue(queue);
    req.set_payload("p");
    req.set_priority(priority);
    v1::EnqueueResponse resp;
    grpc::Status s = broker().Enqueue(Ctx(who).get(), req, &resp);
    EXPECT_THAT(s, IsOk());
    return resp.job_id();
  }

  Targets MakeTargets(const std::string& queue) {
    Targets t{.queue = queue};
    const std::string active = Enqueue(Who::kProducer, queue, 30);
    t.done = Enqueue(Who::kProducer, queue, 20);
    t.dead = Enqueue(Who::kProducer, queue, 10);
    t.ready = Enqueue(Who::kProducer, queue, 0);
    v1::LeaseRequest lease;
    lease.set_queue(queue);
    lease.set_worker_id("setup");
    lease.set_max_jobs(3);
    *lease.mutable_lease_duration() = ToProto(absl::Minutes(10));
    v1::LeaseResponse leased;
    EXPECT_THAT(broker().Lease(Ctx(Who::kWorker).get(), lease, &leased), IsOk());
    EXPECT_EQ(leased.jobs_size(), 3);
    if (leased.jobs_size() != 3) return t;
    t.active = leased.jobs(0);
    EXPECT_EQ(t.active.job_id(), active);
    v1::AckRequest ack;
    ack.set_job_id(leased.jobs(1).job_id());
    ack.set_lease_id(leased.jobs(1).lease_id());
    v1::AckResponse acked;
    EXPECT_THAT(broker().Ack(Ctx(Who::kWorker).get(), ack, &acked), IsOk());
    v1::FailRequest fail;
    fail.set_job_id(leased.jobs(2).job_id());
    fail.set_lease_id(leased.jobs(2).lease_id());
    fail.set_error("bad input");
    fail.set_permanent(true);
    v1::FailResponse failed;
    EXPECT_THAT(broker().Fail(Ctx(Who::kWorker).get(), fail, &failed), IsOk());
    EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
    return t;
  }

  Snapshot Take(const std::string& queue) {
    Snapshot snap;
    v1::GetQueueRequest get;
    get.set_queue(queue);
    snap.queue_status = admin().GetQueue(Ctx(Who::kAdmin).get(), get, &snap.queue);
    snap.queue.clear_oldest_ready_age();
    v1::ListJobsRequest list;
    list.set_queue(queue);
    list.set_page_size(100);
    while (true) {
      v1::ListJobsResponse page;
      grpc::Status s = admin().ListJobs(Ctx(Who::kAdmin).get(), list, &page);
      if (!s.ok()) break;
      snap.jobs.insert(snap.jobs.end(), page.jobs().begin(), page.jobs().end());
      if (page.next_page_token().empty()) break;
      list.set_page_token(page.next_page_token());
    }
    return snap;
  }

  static void ExpectUnchanged(const Snapshot& before, const Snapshot& after) {
    using google::protobuf::util::MessageDifferencer;
    EXPECT_EQ(before.queue_status.error_code(), after.queue_status.error_code());
    EXPECT_TRUE(MessageDifferencer::Equals(before.queue, after.queue))
        << "before: " << before.queue.ShortDebugString()
        << "\nafter: " << after.queue.ShortDebugString();
    ASSERT_EQ(before.jobs.size(), after.jobs.size());
    for (size_t i = 0; i < before.jobs.size(); ++i) {
      EXPECT_TRUE(MessageDifferencer::Equals(before.jobs[i], after.jobs[i]))
          << "before: " << before.jobs[i].ShortDebugString()
          << "\nafter: " << after.jobs[i].ShortDebugString();
    }
  }

  // Opens a Work stream as `who` and subscribes to `queues`. The subscribe's answer if the
  // stream got that far, else the stream's own status (a stream refused at its start).
  grpc::Status Subscribe(Who who, const std::vector<std::string>& queues) {
    std::unique_ptr<grpc::ClientContext> ctx = Ctx(who);
    auto stream = broker().Work(ctx.get());
    v1::WorkRequest req;
    req.set_request_id(1);
    for (const std::string& q : queues) req.mutable_subscribe()->add_queues(q);
    req.mutable_subscribe()->set_worker_id("auth-test");
    req.mutable_subscribe()->set_max_in_flight(1);
    stream->Write(req);
    v1::WorkResponse resp;
    while (stream->Read(&resp)) {
      if (resp.has_result() && resp.result().request_id() == 1) {
        ctx->TryCancel();
        stream->Finish();
        return grpc::Status(static_cast<grpc::StatusCode>(resp.result().code()),
                            resp.result().message());
      }
    }
    return stream->Finish();
  }

  std::unique_ptr<TempDir> dir_;
  std::string tokens_path_;
};

// One RPC of the table: how to call it on a queue's targets, and who gets through.
struct Rpc {
  std::string name;
  // The callers it lets through, with the exact code each gets. Every other caller is refused:
  // UNAUTHENTICATED without a known token, PERMISSION_DENIED with one.
  std::map<Who, grpc::StatusCode> allowed;
  std::function<grpc::Status(AuthTest&, Who, const Targets&)> call;
  // Run on the fresh targets first (ResumeQueue wants a paused queue to resume).
  std::function<void(AuthTest&, const Targets&)> setup;
};

class AuthTableTest : public AuthTest {
 protected:
  // The protected members, for the table's lambdas.
  static v1::Broker::Stub& BrokerOf(AuthTest& t) { return static_cast<AuthTableTest&>(t).broker(); }
  static v1::Admin::Stub& AdminOf(AuthTest& t) { return static_cast<AuthTableTest&>(t).admin(); }
  static grpc::Status SubscribeOf(AuthTest& t, Who who, const std::string& queue) {
    return static_cast<AuthTableTest&>(t).Subscribe(who, {queue});
  }

  static std::vector<Rpc> Table() {
    const std::map<Who, grpc::StatusCode> producer = {{Who::kProducer, grpc::OK}};
    const std::map<Who, grpc::StatusCode> worker = {{Who::kWorker, grpc::OK}};
    const std::map<Who, grpc::StatusCode> admin = {{Who::kAdmin, grpc::OK}};
    return {
        {"Broker.Enqueue", producer,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::EnqueueRequest req;
           req.set_queue(x.queue);
           req.set_payload("new");
           v1::EnqueueResponse resp;
           return BrokerOf(t).Enqueue(Ctx(who).get(), req, &resp);
         }},
        {"Broker.EnqueueBatch", producer,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::EnqueueBatchRequest req;
           for (int i = 0; i < 2; ++i) {
             req.add_jobs()->set_queue(x.queue);
             req.mutable_jobs(i)->set_payload("new");
           }
           v1::EnqueueBatchResponse resp;
           return BrokerOf(t).EnqueueBatch(Ctx(who).get(), req, &resp);
         }},
        // A stream refused as a whole ends with the refusal; a batch refused on an open stream
        // is answered with it (and the stream goes on): either is this cell's status.
        {"Broker.EnqueueStream", producer,
         [](AuthTest& t, Who who, const Targets& x) {
           std::unique_ptr<grpc::ClientContext> ctx = Ctx(who);
           auto stream = BrokerOf(t).EnqueueStream(ctx.get());
           v1::EnqueueStreamRequest req;
           req.set_request_id(1);
           for (int i = 0; i < 2; ++i) {
             req.mutable_batch()->add_jobs()->set_queue(x.queue);
             req.mutable_batch()->mutable_jobs(i)->set_payload("new");
           }
           stream->Write(req);
           stream->WritesDone();
           v1::EnqueueStreamResponse resp;
           const bool answered = stream->Read(&resp);
           grpc::Status end = stream->Finish();
           if (!answered) return end;
           if (resp.request_id() != 1) return grpc::Status(grpc::INTERNAL, "wrong request_id");
           return grpc::Status(static_cast<grpc::StatusCode>(resp.code()), resp.message());
         }},
        {"Broker.Lease", worker,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::LeaseRequest req;
           req.set_queue(x.queue);
           req.set_worker_id("w");
           v1::LeaseResponse resp;
           grpc::Status s = BrokerOf(t).Lease(Ctx(who).get(), req, &resp);
           if (s.ok() && resp.jobs_size() != 1) return grpc::Status(grpc::INTERNAL, "no job");
           return s;
         }},
        {"Broker.Heartbeat", worker,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::HeartbeatRequest req;
           req.set_job_id(x.active.job_id());
           req.set_lease_id(x.active.lease_id());
           *req.mutable_extend_by() = ToProto(absl::Minutes(20));
           req.set_checkpoint("progress");
           v1::HeartbeatResponse resp;
           return BrokerOf(t).Heartbeat(Ctx(who).get(), req, &resp);
         }},
        {"Broker.Ack", worker,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::AckRequest req;
           req.set_job_id(x.active.job_id());
           req.set_lease_id(x.active.lease_id());
           v1::AckResponse resp;
           return BrokerOf(t).Ack(Ctx(who).get(), req, &resp);
         }},
        {"Broker.Fail", worker,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::FailRequest req;
           req.set_job_id(x.active.job_id());
           req.set_lease_id(x.active.lease_id());
           req.set_error("boom");
           v1::FailResponse resp;
           return BrokerOf(t).Fail(Ctx(who).get(), req, &resp);
         }},
        {"Broker.Release", worker,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::ReleaseRequest req;
           req.set_job_id(x.active.job_id());
           req.set_lease_id(x.active.lease_id());
           v1::ReleaseResponse resp;
           return BrokerOf(t).Release(Ctx(who).get(), req, &resp);
         }},
        {"Broker.Work (subscribe)", worker,
         [](AuthTest& t, Who who, const Targets& x) { return SubscribeOf(t, who, x.queue); }},
        {"Admin.GetJob", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::GetJobRequest req;
           req.set_job_id(x.ready);
           v1::Job resp;
           return AdminOf(t).GetJob(Ctx(who).get(), req, &resp);
         }},
        {"Admin.ListJobs", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::ListJobsRequest req;
           req.set_queue(x.queue);
           v1::ListJobsResponse resp;
           return AdminOf(t).ListJobs(Ctx(who).get(), req, &resp);
         }},
        {"Admin.CancelJob", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::CancelJobRequest req;
           req.set_job_id(x.ready);
           v1::Job resp;
           return AdminOf(t).CancelJob(Ctx(who).get(), req, &resp);
         }},
        {"Admin.RetryJob (job_id)", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::RetryJobRequest req;
           req.set_job_id(x.dead);
           v1::RetryJobResponse resp;
           return AdminOf(t).RetryJob(Ctx(who).get(), req, &resp);
         }},
        {"Admin.RetryJob (queue)", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::RetryJobRequest req;
           req.set_queue(x.queue);
           v1::RetryJobResponse resp;
           grpc::Status s = AdminOf(t).RetryJob(Ctx(who).get(), req, &resp);
           if (s.ok() && resp.retried() != 1) return grpc::Status(grpc::INTERNAL, "not retried");
           return s;
         }},
        {"Admin.DeleteJob", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::DeleteJobRequest req;
           req.set_job_id(x.done);
           v1::DeleteJobResponse resp;
           return AdminOf(t).DeleteJob(Ctx(who).get(), req, &resp);
         }},
        {"Admin.ListQueues",
         {{Who::kAdmin, grpc::OK}, {Who::kOtherQueue, grpc::OK}},
         [](AuthTest& t, Who who, const Targets&) {
           v1::ListQueuesRequest req;
           v1::ListQueuesResponse resp;
           return AdminOf(t).ListQueues(Ctx(who).get(), req, &resp);
         }},
        {"Admin.GetQueue", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::GetQueueRequest req;
           req.set_queue(x.queue);
           v1::QueueInfo resp;
           return AdminOf(t).GetQueue(Ctx(who).get(), req, &resp);
         }},
        {"Admin.UpdateQueuePolicy", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::UpdateQueuePolicyRequest req;
           req.set_queue(x.queue);
           req.mutable_policy()->set_max_concurrency(7);
           v1::QueueInfo resp;
           return AdminOf(t).UpdateQueuePolicy(Ctx(who).get(), req, &resp);
         }},
        {"Admin.PauseQueue", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::PauseQueueRequest req;
           req.set_queue(x.queue);
           v1::QueueInfo resp;
           return AdminOf(t).PauseQueue(Ctx(who).get(), req, &resp);
         }},
        {"Admin.ResumeQueue", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::ResumeQueueRequest req;
           req.set_queue(x.queue);
           v1::QueueInfo resp;
           return AdminOf(t).ResumeQueue(Ctx(who).get(), req, &resp);
         },
         [](AuthTest& t, const Targets& x) {
           v1::PauseQueueRequest req;
           req.set_queue(x.queue);
           v1::QueueInfo resp;
           EXPECT_THAT(AdminOf(t).PauseQueue(Ctx(Who::kAdmin).get(), req, &resp), IsOk());
         }},
        {"Admin.PurgeQueue", admin,
         [](AuthTest& t, Who who, const Targets& x) {
           v1::PurgeQueueRequest req;
           req.set_queue(x.queue);
           v1::PurgeQueueResponse resp;
           grpc::Status s = AdminOf(t).PurgeQueue(Ctx(who).get(), req, &resp);
           if (s.ok() && resp.purged() != 2) return grpc::Status(grpc::INTERNAL, "not purged");
           return s;
         }},
    };
  }
};

TEST_F(AuthTableTest, EveryRpcAgainstEveryCaller) {
  ASSERT_NO_FATAL_FAILURE(StartBroker());
  int cells = 0;
  int n = 0;
  for (const Rpc& rpc : Table()) {
    const Targets targets = MakeTargets(absl::StrCat("orders.", n++));
    if (rpc.setup) rpc.setup(*this, targets);
    // Refusals first, so each is tried on the untouched targets; the callers let through last.
    std::vector<Who> order;
    for (Who who : kEveryone)
      if (!rpc.allowed.contains(who)) order.push_back(who);
    for (Who who : kEveryone)
      if (rpc.allowed.contains(who)) order.push_back(who);
    for (Who who : order) {
      SCOPED_TRACE(absl::StrCat(rpc.name, " as ", WhoName(who)));
      ++cells;
      const Snapshot before = Take(targets.queue);
      const grpc::Status status = rpc.call(*this, who, targets);
      if (auto it = rpc.allowed.find(who); it != rpc.allowed.end()) {
        EXPECT_THAT(status, StatusIs(it->second));
        continue;
      }
      const bool known = who != Who::kNoToken && who != Who::kWrongToken;
      EXPECT_THAT(status, StatusIs(known ? grpc::PERMISSION_DENIED : grpc::UNAUTHENTICATED));
      EXPECT_THAT(status.error_message(), HasSubstr("authorization"));
      if (known) {
        EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat("\"", EntryOf(who), "\"")));
      }
      for (const char* token : kAllTokens)
        EXPECT_THAT(status.error_message(), Not(HasSubstr(token)));
      ExpectUnchanged(before, Take(targets.queue));
    }
  }
  EXPECT_EQ(cells, 21 * 6);

  // Nothing the broker wrote, at the most verbose log level, or serves as metrics holds a token.
  const std::string metrics = HttpGet(process().http_address(), "/metrics");
  ASSERT_THAT(metrics, HasSubstr("jobbroker_rpc_duration_seconds"));
  EXPECT_THAT(metrics, HasSubstr("PERMISSION_DENIED"));
  const std::string stderr_text = process().ReadStderr();
  ASSERT_THAT(stderr_text, HasSubstr("\"event\":\"serving\""));
  for (const char* token : kAllTokens) {
    EXPECT_THAT(stderr_text, Not(HasSubstr(token)));
    EXPECT_THAT(metrics, Not(HasSubstr(token)));
  }
}

TEST_F(AuthTest, RefusalsNameTheTokenTheRoleAndTheQueue) {
  ASSERT_NO_FATAL_FAILURE(StartBroker());
  v1::EnqueueRequest req;
  req.set_queue("billing");
  req.set_payload("x");
  v1::EnqueueResponse resp;
  grpc::Status wrong_queue = broker().Enqueue(Ctx(Who::kProducer).get(), req, &resp);
  EXPECT_THAT(wrong_queue, StatusIs(grpc::PERMISSION_DENIED,
                                    AllOf(HasSubstr("\"orders-producer\""), HasSubstr("producer"),
                                          HasSubstr("\"billing\""))));
  req.set_queue("orders.x");
  grpc::Status wrong_role = broker().Enqueue(Ctx(Who::kWorker).get(), req, &resp);
  EXPECT_THAT(wrong_role,
              StatusIs(grpc::PERMISSION_DENIED,
                       AllOf(HasSubstr("\"orders-worker\""), HasSubstr("lacks the role producer"),
                             HasSubstr("\"orders.x\""))));
  grpc::Status unknown = broker().Enqueue(Ctx(Who::kWrongToken).get(), req, &resp);
  EXPECT_THAT(unknown, StatusIs(grpc::UNAUTHENTICATED, HasSubstr("unknown bearer token")));
  grpc::Status missing = broker().Enqueue(Ctx(Who::kNoToken).get(), req, &resp);
  EXPECT_THAT(missing, StatusIs(grpc::UNAUTHENTICATED, HasSubstr("missing")));
  // The scheme is not case-sensitive; anything but Bearer is refused.
  grpc::ClientContext lower;
  lower.AddMetadata("authorization", absl::StrCat("bearer ", kProducerToken));
  EXPECT_THAT(broker().Enqueue(&lower, req, &resp), IsOk());
  grpc::ClientContext basic;
  basic.AddMetadata("authorization", absl::StrCat("Basic ", kProducerToken));
  EXPECT_THAT(broker().Enqueue(&basic, req, &resp), StatusIs(grpc::UNAUTHENTICATED));
}

TEST_F(AuthTest, ABatchWithOneForbiddenQueueIsRefusedWhole) {
  ASSERT_NO_FATAL_FAILURE(StartBroker());
  v1::EnqueueBatchRequest req;
  req.add_jobs()->set_queue("orders.batch");
  req.add_jobs()->set_queue("billing");
  v1::EnqueueBatchResponse resp;
  EXPECT_THAT(broker().EnqueueBatch(Ctx(Who::kProducer).get(), req, &resp),
              StatusIs(grpc::PERMISSION_DENIED, HasSubstr("\"billing\"")));
  // Neither job was written: the allowed queue does not even exist.
  EXPECT_THAT(Take("orders.batch").queue_status, StatusIs(grpc::NOT_FOUND));
  EXPECT_THAT(Take("billing").queue_status, StatusIs(grpc::NOT_FOUND));
}

TEST_F(AuthTest, ListQueuesShowsOnlyTheQueuesTheTokenMatches) {
  ASSERT_NO_FATAL_FAILURE(StartBroker());
  Enqueue(Who::kProducer, "orders.eu");
  Enqueue(Who::kOtherQueue, "billing");
  auto names = [this](Who who) {
    v1::ListQueuesResponse resp;
    EXPECT_THAT(admin().ListQueues(Ctx(who).get(), {}, &resp), IsOk());
    std::vector<std::string> out;
    for (const v1::QueueInfo& q : resp.queues()) out.push_back(q.name());
    return out;
  };
  EXPECT_THAT(names(Who::kAdmin), ElementsAre("billing", "orders.eu"));
  EXPECT_THAT(names(Who::kOtherQueue), ElementsAre("billing"));
}

TEST_F(AuthTest, TheWorkStreamChecksEachQueueAndEachJob) {
  ASSERT_NO_FATAL_FAILURE(StartBroker());
  const std::string order = Enqueue(Who::kProducer, "orders.stream");
  // A subscription naming one queue the token may not use is refused as a whole.
  EXPECT_THAT(Subscribe(Who::kOtherQueue, {"billing", "orders.stream"}),
              StatusIs(grpc::PERMISSION_DENIED,
                       AllOf(HasSubstr("\"billing-all\""), HasSubstr("\"orders.stream\""))));
  EXPECT_EQ(Take("orders.stream").queue.counts().at("JOB_STATE_READY"), 1);

  // On a stream subscribed to its own queue, billing-all may not touch another queue's job.
  v1::LeaseRequest lease;
  lease.set_queue("orders.stream");
  lease.set_worker_id("w");
  *lease.mutable_lease_duration() = ToProto(absl::Minutes(10));
  v1::LeaseResponse leased;
  ASSERT_THAT(broker().Lease(Ctx(Who::kWorker).get(), lease, &leased), IsOk());
  ASSERT_EQ(leased.jobs_size(), 1);
  const v1::LeasedJob& job = leased.jobs(0);
  ASSERT_EQ(job.job_id(), order);
  const Snapshot before = Take("orders.stream");

  std::unique_ptr<grpc::ClientContext> ctx = Ctx(Who::kOtherQueue);
  auto stream = broker().Work(ctx.get());
  auto call = [&stream](v1::WorkRequest req) {
    EXPECT_TRUE(stream->Write(req));
    v1::WorkResponse resp;
    while (stream->Read(&resp)) {
      if (resp.has_result() && resp.result().request_id() == req.request_id()) return resp.result();
    }
    ADD_FAILURE() << "the stream ended before answering " << req.request_id();
    return v1::WorkResult();
  };
  v1::WorkRequest subscribe;
  subscribe.set_request_id(1);
  subscribe.mutable_subscribe()->add_queues("billing");
  subscribe.mutable_subscribe()->set_worker_id("billing-worker");
  subscribe.mutable_subscribe()->set_max_in_flight(1);
  EXPECT_EQ(call(subscribe).code(), grpc::OK);
  int id = 2;
  for (auto set : std::vector<std::function<void(v1::WorkRequest&)>>{
           [&](v1::WorkRequest& r) {
             r.mutable_heartbeat()->set_job_id(job.job_id());
             r.mutable_heartbeat()->set_lease_id(job.lease_id());
           },
           [&](v1::WorkRequest& r) {
             r.mutable_ack()->set_job_id(job.job_id());
             r.mutable_ack()->set_lease_id(job.lease_id());
           },
           [&](v1::WorkRequest& r) {
             v1::AckRequest* ack = r.mutable_ack_batch()->add_acks();
             ack->set_job_id(job.job_id());
             ack->set_lease_id(job.lease_id());
           },
           [&](v1::WorkRequest& r) {
             r.mutable_fail()->set_job_id(job.job_id());
             r.mutable_fail()->set_lease_id(job.lease_id());
           },
           [&](v1::WorkRequest& r) {
             r.mutable_release()->set_job_id(job.job_id());
             r.mutable_release()->set_lease_id(job.lease_id());
           }}) {
    v1::WorkRequest req;
    req.set_request_id(id++);
    set(req);
    v1::WorkResult result = call(req);
    EXPECT_EQ(result.code(), grpc::PERMISSION_DENIED) << req.ShortDebugString();
    EXPECT_THAT(result.message(), AllOf(HasSubstr("\"billing-all\""), HasSubstr("worker"),
                                        HasSubstr("\"orders.stream\"")));
  }
  ctx->TryCancel();
  stream->Finish();
  ExpectUnchanged(before, Take("orders.stream"));
}

TEST_F(AuthTest, HealthAndReflectionNeedNoToken) {
  ASSERT_NO_FATAL_FAILURE(StartBroker());
  int serving = 0;
  EXPECT_THAT(CheckHealth(process().NewChannel(), "", &serving), IsOk());
  EXPECT_EQ(serving, 1);  // SERVING

  // Reflection's ListServices, hand-encoded: ServerReflectionRequest{list_services: ""}.
  grpc::GenericStub generic(process().NewChannel());
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto call = generic.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(reinterpret_cast<void*>(1)));
  const char request[] = {0x3a, 0x00};  // field 7 (list_services), empty string
  grpc::Slice slice(request, sizeof(request));
  call->Write(grpc::ByteBuffer(&slice, 1), reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(reinterpret_cast<void*>(2)));
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(reinterpret_cast<void*>(3)));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(bytes, HasSubstr("jobbroker.v1.Broker"));
  EXPECT_THAT(bytes, HasSubstr("jobbroker.v1.Admin"));
  call->WritesDone(reinterpret_cast<void*>(4));
  step(reinterpret_cast<void*>(4));
  grpc::Status finished;
  call->Finish(&finished, reinterpret_cast<void*>(5));
  step(reinterpret_cast<void*>(5));
  EXPECT_THAT(finished, IsOk());
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(AuthTest, ABadTokensFileStopsTheStartNamingTheEntryAndField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"tokens": [{"name": "a", "token": "plain-secret-1", "roles": ["admin"], "queues": ["*"]},
                      {"name": "b", "token": "plain-secret-2", "roles": ["root"], "queues": ["*"]}]})",
       R"(tokens[1] ("b"): roles[0]: unknown role "root")"},
      {R"({"tokens": [{"name": "a", "sha256": "12ab", "roles": ["admin"], "queues": ["*"]}]})",
       R"(tokens[0] ("a"): sha256 must be 64 hex digits)"},
      {R"({"tokens": [{"name": "a", "token": "plain-secret-1", "roles": ["admin"], "queues": [""]}]})",
       R"(tokens[0] ("a"): queues[0] must not be empty)"},
      {R"({"tokens": [{"name": "a", "token": "plain-secret-1", "roles": ["admin"], "queues": ["*"]},
                      {"name": "a", "token": "plain-secret-2", "roles": ["admin"], "queues": ["*"]}]})",
       R"(tokens[1] ("a"): name is already used by tokens[0])"},
      {R"({"tokens": [{"name": "a", "token": "plain-secret-1", "roles": ["admin"], "queues": ["*"]},
                      {"name": "b", "token": "plain-secret-1", "roles": ["admin"], "queues": ["*"]}]})",
       R"(tokens[1] ("b"): the same token (sha256) is already tokens[0] ("a"))"},
  };
  int n = 0;
  for (const auto& [json, message] : cases) {
    absl::StatusOr<std::string> path = dir_->WriteFile(absl::StrCat("bad-", n++, ".json"), json);
    ASSERT_TRUE(path.ok()) << path.status();
    const std::string data_dir = absl::StrCat(dir_->path(), "/data");
    for (bool check_only : {true, false}) {
      std::vector<std::string> args = {"--auth-tokens", *path,        "--data-dir",
                                       data_dir,        "--listen",   "127.0.0.1:0",
                                       "--http-listen", "127.0.0.1:0"};
      if (check_only) args.push_back("--check-config");
      absl::StatusOr<ExitResult> run = RunBrokerToExit(*dir_, args);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_EQ(run->exit_code, 1) << run->stderr_text;
      EXPECT_THAT(run->stderr_text,
                  HasSubstr(absl::StrCat("--auth-tokens ", *path, ": ", message)));
      EXPECT_THAT(run->stderr_text, Not(HasSubstr("plain-secret")));
    }
  }
  absl::StatusOr<ExitResult> good = RunBrokerToExit(
      *dir_, {"--check-config", "--auth-tokens", tokens_path_, "--data-dir", dir_->path() + "/d"});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->exit_code, 0) << good->stderr_text;
  EXPECT_THAT(good->stdout_text, HasSubstr("with bearer tokens"));
}

// TLS (and mutual TLS) with tokens, through the C++ client library, its worker runner and the
// CLI, with a CA the test makes with openssl.
class AuthTlsTest : public AuthTest {
 protected:
  void SetUp() override {
    AuthTest::SetUp();
    absl::StatusOr<TestPki> pki = MakePki(*dir_);
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
  }

  void StartTlsBroker(bool mutual) {
    std::vector<std::string> args = {"--tls-cert", pki_.server_cert, "--tls-key", pki_.server_key};
    if (mutual) args.insert(args.end(), {"--tls-client-ca", pki_.ca_cert});
    StartBroker(args);
  }

  client::ClientOptions Options(const std::string& token, bool with_cert) {
    client::TlsOptions tls{.ca_pem = pki_.ca_pem};
    if (with_cert) {
      tls.cert_pem = pki_.client_cert_pem;
      tls.key_pem = pki_.client_key_pem;
    }
    return client::ClientOptions{.address = process().address(),
                                 .timeout = absl::Seconds(10),
                                 .max_attempts = 1,
                                 .tls = tls,
                                 .token = token};
  }

  // jobbroker-cli with `args` after --address, and `env` ("NAME=value") added.
  CommandResult Cli(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {"/usr/bin/env", "-u", "JOBBROKER_TOKEN", "-u",
                                     "JOBBROKER_ADDRESS"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), {JOBBROKER_CLI_BINARY, "--address", process().address()});
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<CommandResult> run = RunCommand(dir_->path(), argv);
    EXPECT_TRUE(run.ok()) << run.status();
    return run.value_or(CommandResult{.exit_code = -1});
  }

  std::string TokenFile(const std::string& name, const std::string& token) {
    // A trailing newline, as `echo TOKEN > FILE` leaves: not part of the token.
    absl::StatusOr<std::string> path = dir_->WriteFile(name, token + "\n");
    EXPECT_TRUE(path.ok()) << path.status();
    return path.value_or("");
  }

  TestPki pki_;
};

TEST_F(AuthTlsTest, TheClientLibrarySendsItsTokenOverTls) {
  ASSERT_NO_FATAL_FAILURE(StartTlsBroker(/*mutual=*/false));
  client::Client producer(Options(kProducerToken, false));
  absl::StatusOr<client::Enqueued> job = producer.Enqueue("orders.tls", "x");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(producer.GetJob(job->job_id).status().code(), absl::StatusCode::kPermissionDenied);

  client::Client ops(Options(kAdminToken, false));
  absl::StatusOr<v1::Job> got = ops.GetJob(job->job_id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->queue(), "orders.tls");
  EXPECT_TRUE(ops.Health().ok());

  client::Client anonymous(Options("", false));
  EXPECT_EQ(anonymous.Enqueue("orders.tls", "x").status().code(),
            absl::StatusCode::kUnauthenticated);
  // Health stays open without a token, over TLS too.
  EXPECT_TRUE(anonymous.Health().ok());
  // A token gRPC could not send is refused before anything is sent.
  client::Client newline(Options(absl::StrCat(kProducerToken, "\n"), false));
  absl::Status bad = newline.Enqueue("orders.tls", "x").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), AllOf(HasSubstr("token"), Not(HasSubstr(kProducerToken))));
}

TEST_F(AuthTlsTest, TheWorkerRunnerSendsItsTokenOverMutualTls) {
  ASSERT_NO_FATAL_FAILURE(StartTlsBroker(/*mutual=*/true));
  client::Client producer(Options(kProducerToken, true));
  absl::StatusOr<client::Enqueued> job = producer.Enqueue("orders.worker", "work");
  ASSERT_TRUE(job.ok()) << job.status();

  client::ClientOptions base = Options(kWorkerToken, true);
  absl::Notification ran;
  client::Worker worker({.address = base.address, .tls = base.tls, .token = kWorkerToken});
  worker.Handle("orders.worker", [&ran](client::JobContext& ctx) {
    if (ctx.payload() == "work") ran.Notify();
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  worker.Stop(absl::Seconds(10));
  EXPECT_EQ(worker.stats().acked, 1);
  client::Client ops(Options(kAdminToken, true));
  absl::StatusOr<v1::Job> done = ops.GetJob(job->job_id);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_COMPLETED);

  // The subscription's refusal is what Start() reports.
  for (auto [token, code] : {std::pair{kProducerToken, absl::StatusCode::kPermissionDenied},
                             std::pair{kWrongToken, absl::StatusCode::kUnauthenticated}}) {
    client::Worker refused({.address = base.address, .tls = base.tls, .token = token});
    refused.Handle("orders.worker", [](client::JobContext&) { return absl::OkStatus(); });
    EXPECT_EQ(refused.Start().code(), code) << token;
  }
  client::Worker other_queue({.address = base.address, .tls = base.tls, .token = kWorkerToken});
  other_queue.Handle("billing", [](client::JobContext&) { return absl::OkStatus(); });
  absl::Status s = other_queue.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("\"billing\""));
}

TEST_F(AuthTlsTest, TheCliTakesItsTokenFromAFileOrTheEnvironmentOverTls) {
  ASSERT_NO_FATAL_FAILURE(StartTlsBroker(/*mutual=*/false));
  const std::string producer = TokenFile("producer.token", kProducerToken);
  const std::string admin = TokenFile("admin.token", kAdminToken);
  const std::string wrong = TokenFile("wrong.token", kWrongToken);
  const std::vector<std::string> tls = {"--tls-ca", pki_.ca_cert};
  auto with = [&tls](std::vector<std::string> args) {
    args.insert(args.begin(), tls.begin(), tls.end());
    return args;
  };

  CommandResult enqueued = Cli(with({"--token-file", producer, "enqueue", "orders.cli", "x"}));
  ASSERT_EQ(enqueued.exit_code, 0) << enqueued.output;
  std::string id = enqueued.output;
  while (!id.empty() && id.back() == '\n') id.pop_back();
  CommandResult got =
      Cli(with({"get", id, "--json"}), {absl::StrCat("JOBBROKER_TOKEN=", kAdminToken)});
  EXPECT_EQ(got.exit_code, 0) << got.output;
  EXPECT_THAT(got.output, HasSubstr("orders.cli"));
  // --token-file wins over the environment.
  CommandResult file_wins =
      Cli(with({"--token-file", admin, "queues"}), {absl::StrCat("JOBBROKER_TOKEN=", kWrongToken)});
  EXPECT_EQ(file_wins.exit_code, 0) << file_wins.output;

  CommandResult denied = Cli(with({"--token-file", producer, "get", id}));
  EXPECT_EQ(denied.exit_code, 1) << denied.output;
  EXPECT_THAT(denied.output, HasSubstr("PERMISSION_DENIED"));
  CommandResult unknown = Cli(with({"--token-file", wrong, "enqueue", "orders.cli", "x"}));
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("UNAUTHENTICATED"));
  CommandResult none = Cli(with({"enqueue", "orders.cli", "x"}));
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_THAT(none.output, HasSubstr("UNAUTHENTICATED"));
  CommandResult health = Cli(with({"health"}));
  EXPECT_EQ(health.exit_code, 0) << health.output;
  for (const CommandResult* r : {&enqueued, &got, &file_wins, &denied, &unknown, &none}) {
    for (const char* token : kAllTokens) EXPECT_THAT(r->output, Not(HasSubstr(token)));
  }

  // Command-line mistakes are usage errors (2), sent nowhere.
  CommandResult missing_file = Cli(with({"--token-file", "/nonexistent/token", "health"}));
  EXPECT_EQ(missing_file.exit_code, 2) << missing_file.output;
  EXPECT_THAT(missing_file.output, HasSubstr("--token-file /nonexistent/token: cannot be read"));
  CommandResult empty_file = Cli(with({"--token-file", TokenFile("empty.token", ""), "health"}));
  EXPECT_EQ(empty_file.exit_code, 2) << empty_file.output;
  CommandResult half = Cli(with({"--tls-cert", pki_.client_cert, "health"}));
  EXPECT_EQ(half.exit_code, 2) << half.output;
  EXPECT_THAT(half.output, HasSubstr("--tls-cert and --tls-key go together"));
  CommandResult not_pem = Cli({"--tls-ca", producer, "health"});
  EXPECT_EQ(not_pem.exit_code, 2) << not_pem.output;
  EXPECT_THAT(not_pem.output, HasSubstr("--tls-ca"));
  EXPECT_THAT(not_pem.output, Not(HasSubstr(kProducerToken)));

  // Without trusting the CA, or as plaintext, there is no connection at all (3).
  EXPECT_EQ(Cli({"--tls", "health"}).exit_code, 3);
  EXPECT_EQ(Cli({"health"}).exit_code, 3);
}

TEST_F(AuthTlsTest, TheCliOverMutualTlsAndWithAServerNameOverride) {
  ASSERT_NO_FATAL_FAILURE(StartTlsBroker(/*mutual=*/true));
  const std::string producer = TokenFile("producer.token", kProducerToken);
  const std::vector<std::string> mtls = {"--tls-ca",       pki_.ca_cert, "--tls-cert",
                                         pki_.client_cert, "--tls-key",  pki_.client_key,
                                         "--token-file",   producer};
  std::vector<std::string> args = mtls;
  args.insert(args.end(), {"enqueue", "orders.mtls", "x"});
  CommandResult ok = Cli(args);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  // Without the client certificate the handshake fails: unreachable.
  CommandResult no_cert =
      Cli({"--tls-ca", pki_.ca_cert, "--token-file", producer, "enqueue", "orders.mtls", "x"});
  EXPECT_EQ(no_cert.exit_code, 3) << no_cert.output;

  // The certificate is for 127.0.0.1 only: a name it does not carry fails the handshake, the
  // override makes "localhost" acceptable.
  args = mtls;
  args.insert(args.end(), {"--tls-server-name", "jobs.example.com", "health"});
  EXPECT_EQ(Cli(args).exit_code, 3);
  const std::string port = process().address().substr(process().address().rfind(':') + 1);
  args = mtls;
  args.insert(args.end(), {"--address", "localhost:" + port, "health"});
  EXPECT_EQ(Cli(args).exit_code, 3);
  args = mtls;
  args.insert(args.end(),
              {"--address", "localhost:" + port, "--tls-server-name", "127.0.0.1", "health"});
  CommandResult renamed = Cli(args);
  EXPECT_EQ(renamed.exit_code, 0) << renamed.output;
}

}  // namespace
}  // namespace jobbroker::testing
