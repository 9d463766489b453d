// Every field of every request message, with each kind of bad value it can hold: the exact status
// code, a message that starts with (or, where noted, mentions) the field's name, and no change to
// anything. Rows for the values at the edge of each bound are accepted, so every bound is pinned
// from both sides. A coverage check walks the generated descriptors, so a field added to the API
// later fails here until it has a row, or a reason why no value of it is invalid.
//
// One broker serves all the rows of an RPC (one test per RPC): a refused row changes nothing by
// definition, and each row checks that against a snapshot of every queue and
// the fixture's jobs; accepted rows work on queues of their own (`edge-...`) and leave no state
// that changes with time (leases of 12 h, no short backoff), so no row can disturb another. A
// row that fails anyway gets the next row a fresh broker.

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/matchers.h"
#include "tests/testing/work_stream_client.h"

namespace jobbroker::testing {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;
using Code = ::grpc::StatusCode;

constexpr char kQueue[] = "matrix";           // one ACTIVE and one READY job
constexpr char kDoneQueue[] = "matrix-done";  // one COMPLETED job, one dedup key held
constexpr char kIdleQueue[] = "matrix-idle";  // empty: what a stream subscribes to first
constexpr char kHeldKey[] = "held-key";
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kKiB = size_t{1} << 10;
// Beyond google.protobuf.Timestamp's range (0001-01-01 to 9999-12-31) and Duration's (±10000 y).
constexpr int64_t kTimestampMaxSeconds = 253402300799;
constexpr int64_t kTimestampMinSeconds = -62135596800;
constexpr int64_t kDurationMaxSeconds = 315576000000;

std::string Bytes(size_t n, char c = 'x') { return std::string(n, c); }

// `n` headers h0, h1, ... Out of line: inlined, GCC 12 warns falsely (-Wrestrict) on the keys.
[[gnu::noinline]] void AddHeaders(google::protobuf::Map<std::string, std::string>& headers, int n,
                                  const std::string& value) {
  for (int i = 0; i < n; ++i) headers[absl::StrCat("h", i)] = value;
}

google::protobuf::Duration Dur(absl::Duration d) { return ToProto(d); }

// A Duration whose nanos have the other sign than its seconds: not a valid Duration.
google::protobuf::Duration MixedSignDuration() {
  google::protobuf::Duration d;
  d.set_seconds(1);
  d.set_nanos(-1);
  return d;
}

google::protobuf::Duration Seconds(int64_t s) {
  google::protobuf::Duration d;
  d.set_seconds(s);
  return d;
}

google::protobuf::Timestamp UnixSeconds(int64_t s, int32_t nanos = 0) {
  google::protobuf::Timestamp t;
  t.set_seconds(s);
  t.set_nanos(nanos);
  return t;
}

// The client to the fixture's broker, and the jobs that every row's valid request starts from.
struct Env {
  BrokerClient* client = nullptr;
  v1::LeasedJob active;  // of kQueue, leased for 12 h
  std::string ready_id;  // of kQueue
  std::string done_id;   // of kDoneQueue, holds kHeldKey

  // A job of `queue` leased for 12 h: one an accepted row may change.
  v1::LeasedJob Fresh(const std::string& queue) {
    client->MustEnqueue(queue, "fresh");
    std::vector<v1::LeasedJob> jobs =
        client->MustLease(queue, "fresh-worker", 1, absl::ZeroDuration(), absl::Hours(12));
    EXPECT_EQ(jobs.size(), 1u) << queue;
    return jobs.empty() ? v1::LeasedJob() : jobs.front();
  }
};

// What a row expects: refused with `code` and a message that starts with `names` (or contains
// it, when `at_start` is false), or accepted when `code` is unset. A refusal whose message must
// also point somewhere else (the policy to change, the job in the way) says so in `mentions`.
struct Expect {
  std::optional<Code> code;
  std::string names;
  bool at_start = true;
  std::function<std::string(const Env&)> mentions;
};

Expect Refused(Code code, std::string names) { return {code, std::move(names), true}; }
Expect Invalid(std::string names) { return Refused(Code::INVALID_ARGUMENT, std::move(names)); }
Expect TooBig(std::string names) { return Refused(Code::RESOURCE_EXHAUSTED, std::move(names)); }
// For the few messages that name the field later in the sentence.
Expect RefusedMentioning(Code code, std::string names) { return {code, std::move(names), false}; }
Expect Accepted() { return {}; }
// `e`, whose message must also contain what `mentions` returns for the fixture.
Expect AlsoMentioning(Expect e, std::function<std::string(const Env&)> mentions) {
  e.mentions = std::move(mentions);
  return e;
}

struct Row {
  std::string rpc;      // Enqueue, Work, GetJob, ...
  std::string name;     // Rpc_field_what: what a failure is reported as
  std::string message;  // the message holding the field, e.g. jobbroker.v1.EnqueueRequest
  std::string field;    // its field (or oneof) name
  Expect expect;
  std::function<grpc::Status(Env&)> call;  // builds the request and sends it
};

std::string TestName(absl::string_view rpc, absl::string_view path, absl::string_view what) {
  std::string name = absl::StrCat(rpc, "_", path, "_", what);
  for (char& c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

template <typename Req>
using Change = std::function<void(Env&, Req&)>;

// How each RPC's valid request looks and how it is sent. The valid requests would change the
// fixture if the broker did not refuse the row's change (enqueue onto its queue, lease its ready
// job, heartbeat its active job...), so a check that is missing shows as a changed snapshot.
template <typename Req>
struct Api;

template <>
struct Api<v1::EnqueueRequest> {
  static constexpr char kRpc[] = "Enqueue";
  static v1::EnqueueRequest Valid(const Env&) {
    v1::EnqueueRequest req;
    req.set_queue(kQueue);
    req.set_payload("must-not-be-enqueued");
    return req;
  }
  static grpc::Status Send(Env& env, const v1::EnqueueRequest& req) {
    v1::EnqueueResponse resp;
    return env.client->Enqueue(req, &resp);
  }
};

template <>
struct Api<v1::EnqueueBatchRequest> {
  static constexpr char kRpc[] = "EnqueueBatch";
  static v1::EnqueueBatchRequest Valid(const Env& env) {
    v1::EnqueueBatchRequest req;
    *req.add_jobs() = Api<v1::EnqueueRequest>::Valid(env);
    *req.add_jobs() = Api<v1::EnqueueRequest>::Valid(env);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::EnqueueBatchRequest& req) {
    v1::EnqueueBatchResponse resp;
    return env.client->EnqueueBatch(req, &resp);
  }
};

template <>
struct Api<v1::LeaseRequest> {
  static constexpr char kRpc[] = "Lease";
  static v1::LeaseRequest Valid(const Env&) {
    v1::LeaseRequest req;
    req.set_queue(kQueue);
    req.set_worker_id("matrix-worker");
    return req;
  }
  static grpc::Status Send(Env& env, const v1::LeaseRequest& req) {
    v1::LeaseResponse resp;
    grpc::Status s = env.client->Lease(req, &resp);
    if (!s.ok()) {
      EXPECT_EQ(resp.jobs_size(), 0);
    }
    return s;
  }
};

template <>
struct Api<v1::HeartbeatRequest> {
  static constexpr char kRpc[] = "Heartbeat";
  static v1::HeartbeatRequest Valid(const Env& env) {
    v1::HeartbeatRequest req;
    req.set_job_id(env.active.job_id());
    req.set_lease_id(env.active.lease_id());
    req.set_checkpoint("must-not-stick");
    return req;
  }
  static grpc::Status Send(Env& env, const v1::HeartbeatRequest& req) {
    v1::HeartbeatResponse resp;
    return env.client->Heartbeat(req, &resp);
  }
};

template <>
struct Api<v1::AckRequest> {
  static constexpr char kRpc[] = "Ack";
  static v1::AckRequest Valid(const Env& env) {
    v1::AckRequest req;
    req.set_job_id(env.active.job_id());
    req.set_lease_id(env.active.lease_id());
    req.set_result("must-not-stick");
    return req;
  }
  static grpc::Status Send(Env& env, const v1::AckRequest& req) { return env.client->Ack(req); }
};

template <>
struct Api<v1::FailRequest> {
  static constexpr char kRpc[] = "Fail";
  static v1::FailRequest Valid(const Env& env) {
    v1::FailRequest req;
    req.set_job_id(env.active.job_id());
    req.set_lease_id(env.active.lease_id());
    req.set_error("must-not-stick");
    return req;
  }
  static grpc::Status Send(Env& env, const v1::FailRequest& req) {
    v1::FailResponse resp;
    return env.client->Fail(req, &resp);
  }
};

template <>
struct Api<v1::ReleaseRequest> {
  static constexpr char kRpc[] = "Release";
  static v1::ReleaseRequest Valid(const Env& env) {
    v1::ReleaseRequest req;
    req.set_job_id(env.active.job_id());
    req.set_lease_id(env.active.lease_id());
    return req;
  }
  static grpc::Status Send(Env& env, const v1::ReleaseRequest& req) {
    return env.client->Release(req);
  }
};

// One batch on a fresh EnqueueStream; the answer to it is the row's status.
struct StreamBatch {
  v1::EnqueueStreamRequest request;
};

template <>
struct Api<StreamBatch> {
  static constexpr char kRpc[] = "EnqueueStream";
  static StreamBatch Valid(const Env& env) {
    StreamBatch b;
    b.request.set_request_id(1);
    *b.request.mutable_batch() = Api<v1::EnqueueBatchRequest>::Valid(env);
    return b;
  }
  static grpc::Status Send(Env& env, const StreamBatch& b) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto stream = env.client->broker().EnqueueStream(&ctx);
    stream->Write(b.request);
    stream->WritesDone();
    v1::EnqueueStreamResponse answer;
    const bool answered = stream->Read(&answer);
    grpc::Status end = stream->Finish();
    if (!answered)
      return grpc::Status(Code::UNKNOWN, absl::StrCat("no answer: ", end.error_message()));
    EXPECT_THAT(end, IsOk());  // a refused batch does not end the stream
    EXPECT_EQ(answer.request_id(), 1u);
    if (answer.code() != 0) {
      EXPECT_EQ(answer.results_size(), 0);
    }
    return grpc::Status(static_cast<Code>(answer.code()), answer.message());
  }
};

// One request on a fresh Work stream, after a subscribe to the idle queue when
// `subscribe_first`; the WorkResult answering `request` is the row's status.
struct WorkCall {
  bool subscribe_first = false;
  v1::WorkRequest request;
};

v1::WorkRequest IdleSubscribe() {
  v1::WorkRequest r;
  r.mutable_subscribe()->add_queues(kIdleQueue);
  r.mutable_subscribe()->set_worker_id("matrix-stream");
  return r;
}

template <>
struct Api<WorkCall> {
  static constexpr char kRpc[] = "Work";
  static WorkCall Valid(const Env&) {
    WorkCall call;
    v1::SubscribeRequest* s = call.request.mutable_subscribe();
    s->add_queues(kQueue);
    s->set_worker_id("matrix-stream");
    s->set_max_in_flight(1);
    return call;
  }
  static grpc::Status Send(Env& env, const WorkCall& call) {
    WorkStreamClient stream(env.client->broker());
    if (call.subscribe_first) {
      v1::WorkResult first = stream.Call(IdleSubscribe());
      if (first.code() != 0)
        return grpc::Status(Code::UNKNOWN,
                            absl::StrCat("the first, valid subscribe failed: ", first.message()));
    }
    v1::WorkResult result = stream.Call(call.request);
    EXPECT_THAT(stream.Close(), IsOk());
    return grpc::Status(static_cast<Code>(result.code()), result.message());
  }
};

// Admin calls whose request is one id or one queue name.
template <>
struct Api<v1::GetJobRequest> {
  static constexpr char kRpc[] = "GetJob";
  static v1::GetJobRequest Valid(const Env& env) {
    v1::GetJobRequest req;
    req.set_job_id(env.active.job_id());
    return req;
  }
  static grpc::Status Send(Env& env, const v1::GetJobRequest& req) {
    v1::Job job;
    return env.client->GetJob(req.job_id(), &job);
  }
};

// A server stream: read to its end (a completed job's watch ends after one message).
template <>
struct Api<v1::WatchJobRequest> {
  static constexpr char kRpc[] = "WatchJob";
  static v1::WatchJobRequest Valid(const Env& env) {
    v1::WatchJobRequest req;
    req.set_job_id(env.done_id);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::WatchJobRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    std::unique_ptr<grpc::ClientReader<v1::Job>> reader = env.client->admin().WatchJob(&ctx, req);
    v1::Job job;
    while (reader->Read(&job)) {
    }
    return reader->Finish();
  }
};

template <>
struct Api<v1::CancelJobRequest> {
  static constexpr char kRpc[] = "CancelJob";
  static v1::CancelJobRequest Valid(const Env& env) {
    v1::CancelJobRequest req;
    req.set_job_id(env.ready_id);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::CancelJobRequest& req) {
    v1::Job job;
    return env.client->CancelJob(req.job_id(), &job);
  }
};

template <>
struct Api<v1::DeleteJobRequest> {
  static constexpr char kRpc[] = "DeleteJob";
  static v1::DeleteJobRequest Valid(const Env& env) {
    v1::DeleteJobRequest req;
    req.set_job_id(env.ready_id);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::DeleteJobRequest& req) {
    return env.client->DeleteJob(req.job_id());
  }
};

template <>
struct Api<v1::RetryJobRequest> {
  static constexpr char kRpc[] = "RetryJob";
  static v1::RetryJobRequest Valid(const Env&) {
    v1::RetryJobRequest req;
    req.set_queue(kQueue);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::RetryJobRequest& req) {
    v1::RetryJobResponse resp;
    return env.client->RetryJob(req, &resp);
  }
};

template <>
struct Api<v1::ListJobsRequest> {
  static constexpr char kRpc[] = "ListJobs";
  static v1::ListJobsRequest Valid(const Env&) {
    v1::ListJobsRequest req;
    req.set_queue(kQueue);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::ListJobsRequest& req) {
    v1::ListJobsResponse resp;
    return env.client->ListJobs(req, &resp);
  }
};

template <>
struct Api<v1::GetQueueRequest> {
  static constexpr char kRpc[] = "GetQueue";
  static v1::GetQueueRequest Valid(const Env&) {
    v1::GetQueueRequest req;
    req.set_queue(kQueue);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::GetQueueRequest& req) {
    v1::QueueInfo info;
    return env.client->GetQueue(req.queue(), &info);
  }
};

template <>
struct Api<v1::ListWorkersRequest> {
  static constexpr char kRpc[] = "ListWorkers";
  static v1::ListWorkersRequest Valid(const Env&) {
    v1::ListWorkersRequest req;
    req.set_queue(kQueue);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::ListWorkersRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ListWorkersResponse resp;
    return env.client->admin().ListWorkers(&ctx, req, &resp);
  }
};

// A valid schedule: hourly, so that no run comes due while the matrix runs.
v1::Schedule ValidSchedule() {
  v1::Schedule s;
  s.set_schedule_id("matrix-schedule");
  s.mutable_every()->set_seconds(3600);
  s.mutable_template_()->set_queue(kQueue);
  s.mutable_template_()->set_payload("scheduled");
  return s;
}

// A unary Admin call with a 30 s deadline.
template <typename Req, typename Resp>
grpc::Status AdminCall(Env& env,
                       grpc::Status (v1::Admin::Stub::*method)(grpc::ClientContext*, const Req&,
                                                               Resp*),
                       const Req& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  Resp resp;
  return (env.client->admin().*method)(&ctx, req, &resp);
}

template <>
struct Api<v1::PutScheduleRequest> {
  static constexpr char kRpc[] = "PutSchedule";
  static v1::PutScheduleRequest Valid(const Env&) {
    v1::PutScheduleRequest req;
    *req.mutable_schedule() = ValidSchedule();
    return req;
  }
  static grpc::Status Send(Env& env, const v1::PutScheduleRequest& req) {
    return AdminCall(env, &v1::Admin::Stub::PutSchedule, req);
  }
};

// The calls by id: their valid request names the schedule PutSchedule's valid request makes.
#define JOBBROKER_SCHEDULE_BY_ID(Request, Response, Method)      \
  template <>                                                    \
  struct Api<v1::Request> {                                      \
    static constexpr char kRpc[] = #Method;                      \
    static v1::Request Valid(const Env&) {                       \
      v1::Request req;                                           \
      req.set_schedule_id("matrix-schedule");                    \
      return req;                                                \
    }                                                            \
    static grpc::Status Send(Env& env, const v1::Request& req) { \
      return AdminCall(env, &v1::Admin::Stub::Method, req);      \
    }                                                            \
  };
JOBBROKER_SCHEDULE_BY_ID(GetScheduleRequest, Schedule, GetSchedule)
JOBBROKER_SCHEDULE_BY_ID(DeleteScheduleRequest, DeleteScheduleResponse, DeleteSchedule)
JOBBROKER_SCHEDULE_BY_ID(TriggerScheduleRequest, TriggerScheduleResponse, TriggerSchedule)
#undef JOBBROKER_SCHEDULE_BY_ID

template <>
struct Api<v1::ListSchedulesRequest> {
  static constexpr char kRpc[] = "ListSchedules";
  static v1::ListSchedulesRequest Valid(const Env&) {
    v1::ListSchedulesRequest req;
    req.set_queue(kQueue);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::ListSchedulesRequest& req) {
    return AdminCall(env, &v1::Admin::Stub::ListSchedules, req);
  }
};

template <>
struct Api<v1::PauseQueueRequest> {
  static constexpr char kRpc[] = "PauseQueue";
  static v1::PauseQueueRequest Valid(const Env&) {
    v1::PauseQueueRequest req;
    req.set_queue(kQueue);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::PauseQueueRequest& req) {
    v1::QueueInfo info;
    return env.client->PauseQueue(req.queue(), &info);
  }
};

template <>
struct Api<v1::ResumeQueueRequest> {
  static constexpr char kRpc[] = "ResumeQueue";
  static v1::ResumeQueueRequest Valid(const Env&) {
    v1::ResumeQueueRequest req;
    req.set_queue(kQueue);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::ResumeQueueRequest& req) {
    v1::QueueInfo info;
    return env.client->ResumeQueue(req.queue(), &info);
  }
};

template <>
struct Api<v1::PurgeQueueRequest> {
  static constexpr char kRpc[] = "PurgeQueue";
  static v1::PurgeQueueRequest Valid(const Env&) {
    v1::PurgeQueueRequest req;
    req.set_queue(kQueue);
    req.add_states(v1::JOB_STATE_READY);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::PurgeQueueRequest& req) {
    v1::PurgeQueueResponse resp;
    return env.client->PurgeQueue(req, &resp);
  }
};

template <>
struct Api<v1::UpdateQueuePolicyRequest> {
  static constexpr char kRpc[] = "UpdateQueuePolicy";
  static v1::UpdateQueuePolicyRequest Valid(const Env&) {
    v1::UpdateQueuePolicyRequest req;
    req.set_queue(kQueue);
    req.mutable_policy()->set_paused(true);
    return req;
  }
  static grpc::Status Send(Env& env, const v1::UpdateQueuePolicyRequest& req) {
    v1::QueueInfo info;
    return env.client->UpdateQueuePolicy(req, &info);
  }
};

// A row for `field` of `message`, reached from Req through `path` (for the test's name).
template <typename Req>
Row Nested(const Descriptor* message, std::string field, absl::string_view path,
           absl::string_view what, Expect expect, Change<Req> change) {
  Row row;
  row.rpc = Api<Req>::kRpc;
  row.name = TestName(Api<Req>::kRpc, path, what);
  row.message = message->full_name();
  row.field = std::move(field);
  row.expect = std::move(expect);
  row.call = [change = std::move(change)](Env& env) {
    Req req = Api<Req>::Valid(env);
    change(env, req);
    return Api<Req>::Send(env, req);
  };
  return row;
}

// A row for `field` of Req itself.
template <typename Req>
Row Case(std::string field, absl::string_view what, Expect expect, Change<Req> change) {
  return Nested<Req>(Req::descriptor(), field, field, what, std::move(expect), std::move(change));
}

// A Work-stream row whose request sets the oneof member `member` (a subscribe, flow, ...).
Row Work(const Descriptor* message, std::string field, absl::string_view path,
         absl::string_view what, Expect expect, Change<WorkCall> change) {
  return Nested<WorkCall>(message, std::move(field), path, what, std::move(expect),
                          std::move(change));
}

void AddEnqueueRows(std::vector<Row>& rows) {
  using R = v1::EnqueueRequest;
  auto row = [&](std::string field, absl::string_view what, Expect e, Change<R> c) {
    rows.push_back(Case<R>(std::move(field), what, std::move(e), std::move(c)));
  };
  row("queue", "empty", Invalid("queue"), [](Env&, R& r) { r.set_queue(""); });
  row("queue", "of_129_chars", Invalid("queue"), [](Env&, R& r) { r.set_queue(Bytes(129, 'q')); });
  row("queue", "with_a_space", Invalid("queue"), [](Env&, R& r) { r.set_queue("bad queue"); });
  row("queue", "with_a_slash", Invalid("queue"), [](Env&, R& r) { r.set_queue("a/b"); });
  row("queue", "non_ascii", Invalid("queue"), [](Env&, R& r) { r.set_queue("caf\xc3\xa9"); });
  row("queue", "of_exactly_128_chars_ok", Accepted(),
      [](Env&, R& r) { r.set_queue(Bytes(128, 'e')); });
  row("queue", "of_every_allowed_char_ok", Accepted(),
      [](Env&, R& r) { r.set_queue("edge-AZaz09._:-"); });

  row("payload", "over_the_queues_1_MiB",
      AlsoMentioning(TooBig("payload"), [](const Env&) { return "max_payload_bytes"; }),
      [](Env&, R& r) { r.set_payload(Bytes(kMiB + 1)); });
  row("payload", "over_the_16_MiB_ceiling_on_a_new_queue", TooBig("payload"), [](Env&, R& r) {
    r.set_queue("matrix-never-created");
    r.set_payload(Bytes(16 * kMiB + 1));
  });
  row("payload", "of_exactly_1_MiB_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-payload");
    r.set_payload(Bytes(kMiB));
  });

  row("headers", "of_65_entries", TooBig("headers"),
      [](Env&, R& r) { AddHeaders(*r.mutable_headers(), 65, "v"); });
  row("headers", "over_64_KiB_in_all", TooBig("headers"),
      [](Env&, R& r) { (*r.mutable_headers())["big"] = Bytes(64 * kKiB - 2); });
  row("headers", "with_an_empty_name", Invalid("headers"),
      [](Env&, R& r) { (*r.mutable_headers())[""] = "v"; });
  row("headers", "of_64_entries_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-headers");
    AddHeaders(*r.mutable_headers(), 64, "v");
  });
  row("headers", "of_exactly_64_KiB_in_all_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-headers");
    (*r.mutable_headers())["big"] = Bytes(64 * kKiB - 3);  // + the 3-byte name
  });

  row("delay", "negative", Invalid("delay"),
      [](Env&, R& r) { *r.mutable_delay() = Dur(absl::Seconds(-1)); });
  row("delay", "with_nanos_of_the_other_sign", Invalid("delay"),
      [](Env&, R& r) { *r.mutable_delay() = MixedSignDuration(); });
  row("delay", "beyond_the_Duration_range", Invalid("delay"),
      [](Env&, R& r) { *r.mutable_delay() = Seconds(kDurationMaxSeconds + 1); });
  row("delay", "together_with_run_at", Invalid("delay and run_at"), [](Env&, R& r) {
    *r.mutable_delay() = Dur(absl::Seconds(5));
    *r.mutable_run_at() = ToProtoTime(absl::Now() + absl::Seconds(5));
  });
  row("delay", "of_an_hour_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-delay");
    *r.mutable_delay() = Dur(absl::Hours(1));
  });

  row("run_at", "with_negative_nanos", Invalid("run_at"),
      [](Env&, R& r) { *r.mutable_run_at() = UnixSeconds(1000, -1); });
  row("run_at", "with_nanos_of_a_whole_second", Invalid("run_at"),
      [](Env&, R& r) { *r.mutable_run_at() = UnixSeconds(1000, 1'000'000'000); });
  row("run_at", "after_year_9999", Invalid("run_at"),
      [](Env&, R& r) { *r.mutable_run_at() = UnixSeconds(kTimestampMaxSeconds + 1); });
  row("run_at", "before_year_1", Invalid("run_at"),
      [](Env&, R& r) { *r.mutable_run_at() = UnixSeconds(kTimestampMinSeconds - 1); });
  row("run_at", "on_the_first_day_of_year_1_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-run-at");
    *r.mutable_run_at() = UnixSeconds(kTimestampMinSeconds);
  });
  row("run_at", "on_the_last_second_of_year_9999_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-run-at");
    *r.mutable_run_at() = UnixSeconds(kTimestampMaxSeconds, 999'999'999);
  });

  row("dedup_key", "over_256_bytes", Invalid("dedup_key"),
      [](Env&, R& r) { r.set_dedup_key(Bytes(257, 'k')); });
  row("dedup_key", "held_by_a_job_with_another_payload",
      AlsoMentioning(Refused(Code::ALREADY_EXISTS, "dedup_key"),
                     [](const Env& env) { return env.done_id; }),
      [](Env&, R& r) {
        r.set_queue(kDoneQueue);
        r.set_dedup_key(kHeldKey);
        r.set_payload("another payload");
      });
  row("dedup_key", "of_exactly_256_bytes_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-dedup");
    r.set_dedup_key(Bytes(256, 'k'));
  });

  row("dedup_ttl", "negative", Invalid("dedup_ttl"), [](Env&, R& r) {
    r.set_dedup_key("k");
    *r.mutable_dedup_ttl() = Dur(absl::Seconds(-1));
  });
  row("dedup_ttl", "without_a_dedup_key", Invalid("dedup_ttl"),
      [](Env&, R& r) { *r.mutable_dedup_ttl() = Dur(absl::Hours(1)); });
  row("dedup_ttl", "with_nanos_of_the_other_sign", Invalid("dedup_ttl"), [](Env&, R& r) {
    r.set_dedup_key("k");
    *r.mutable_dedup_ttl() = MixedSignDuration();
  });
  row("dedup_ttl", "of_zero_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-dedup-ttl");
    r.set_dedup_key("k");
    *r.mutable_dedup_ttl() = Dur(absl::ZeroDuration());
  });

  row("max_attempts", "negative", Invalid("max_attempts"),
      [](Env&, R& r) { r.set_max_attempts(-1); });
  row("max_attempts", "of_1001", Invalid("max_attempts"),
      [](Env&, R& r) { r.set_max_attempts(1001); });
  row("max_attempts", "of_1000_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-max-attempts");
    r.set_max_attempts(1000);
  });

  row("lease_duration", "negative", Invalid("lease_duration"),
      [](Env&, R& r) { *r.mutable_lease_duration() = Dur(absl::Seconds(-30)); });
  row("lease_duration", "of_99ms", Invalid("lease_duration"),
      [](Env&, R& r) { *r.mutable_lease_duration() = Dur(absl::Milliseconds(99)); });
  row("lease_duration", "over_12h", Invalid("lease_duration"), [](Env&, R& r) {
    *r.mutable_lease_duration() = Dur(absl::Hours(12) + absl::Nanoseconds(1));
  });
  row("lease_duration", "of_100ms_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-lease-duration");
    *r.mutable_lease_duration() = Dur(absl::Milliseconds(100));
  });
  row("lease_duration", "of_12h_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-lease-duration");
    *r.mutable_lease_duration() = Dur(absl::Hours(12));
  });

  row("timeout", "negative", Invalid("timeout"),
      [](Env&, R& r) { *r.mutable_timeout() = Dur(absl::Seconds(-1)); });
  row("timeout", "of_99ms", Invalid("timeout"),
      [](Env&, R& r) { *r.mutable_timeout() = Dur(absl::Milliseconds(99)); });
  row("timeout", "over_720h", Invalid("timeout"),
      [](Env&, R& r) { *r.mutable_timeout() = Dur(absl::Hours(720) + absl::Nanoseconds(1)); });
  row("timeout", "with_nanos_of_the_other_sign", Invalid("timeout"),
      [](Env&, R& r) { *r.mutable_timeout() = MixedSignDuration(); });
  // Accepted jobs are never leased here, so their limits never start to run.
  row("timeout", "of_100ms_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-timeout");
    *r.mutable_timeout() = Dur(absl::Milliseconds(100));
  });
  row("timeout", "of_720h_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-timeout");
    *r.mutable_timeout() = Dur(absl::Hours(720));
  });

  row("expire_at", "in_the_past", Invalid("expire_at"),
      [](Env&, R& r) { r.mutable_expire_at()->set_seconds(1'000'000'000); });
  row("expire_at", "before_run_at", Invalid("expire_at"), [](Env&, R& r) {
    r.mutable_run_at()->set_seconds(kTimestampMaxSeconds);
    r.mutable_expire_at()->set_seconds(kTimestampMaxSeconds - 1);
  });
  row("expire_at", "before_the_delay_ends", Invalid("expire_at"), [](Env&, R& r) {
    *r.mutable_delay() = Dur(absl::Hours(24 * 365 * 100));
    r.mutable_expire_at()->set_seconds(absl::ToUnixSeconds(absl::Now()) + 3600);
  });
  row("expire_at", "with_nanos_out_of_range", Invalid("expire_at"),
      [](Env&, R& r) { r.mutable_expire_at()->set_nanos(-1); });
  row("depends_on", "an_unknown_job", Invalid("depends_on[0]"),
      [](Env&, R& r) { r.add_depends_on("01ARZ3NDEKTSV4RRFFQ69G5FAV"); });
  row("depends_on", "1_empty", Invalid("depends_on[1]"), [](Env& env, R& r) {
    r.add_depends_on(env.done_id);
    r.add_depends_on("");
  });
  row("depends_on", "10001_jobs", Invalid("depends_on"), [](Env& env, R& r) {
    for (int i = 0; i < 10'001; ++i) r.add_depends_on(env.done_id);
  });
  row("depends_on_index", "outside_a_batch", Invalid("depends_on_index"),
      [](Env&, R& r) { r.add_depends_on_index(0); });
  row("expire_at", "beyond_the_Timestamp_range", Invalid("expire_at"),
      [](Env&, R& r) { r.mutable_expire_at()->set_seconds(kTimestampMaxSeconds + 1); });
  row("expire_at", "of_9999_12_31_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-expire-at");
    r.mutable_expire_at()->set_seconds(kTimestampMaxSeconds);
  });

  row("concurrency_key", "over_256_bytes", Invalid("concurrency_key"),
      [](Env&, R& r) { r.set_concurrency_key(Bytes(257, 'c')); });
  row("concurrency_key", "of_exactly_256_bytes_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-concurrency-key");
    r.set_concurrency_key(Bytes(256, 'c'));
  });

  row("priority", "of_int32_min_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-priority");
    r.set_priority(std::numeric_limits<int32_t>::min());
  });
  row("priority", "of_int32_max_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-priority");
    r.set_priority(std::numeric_limits<int32_t>::max());
  });
}

void AddEnqueueBatchRows(std::vector<Row>& rows) {
  using R = v1::EnqueueBatchRequest;
  auto row = [&](absl::string_view what, Expect e, Change<R> c) {
    rows.push_back(Case<R>("jobs", what, std::move(e), std::move(c)));
  };
  row("empty", Invalid("jobs"), [](Env&, R& r) { r.clear_jobs(); });
  row("of_1001_jobs", Invalid("jobs"), [](Env&, R& r) {
    while (r.jobs_size() < 1001) *r.add_jobs() = r.jobs(0);
  });
  row("1_with_a_bad_queue", Invalid("jobs[1].queue"),
      [](Env&, R& r) { r.mutable_jobs(1)->set_queue("no spaces allowed"); });
  row("1_with_a_payload_over_1_MiB", TooBig("jobs[1].payload"),
      [](Env&, R& r) { r.mutable_jobs(1)->set_payload(Bytes(kMiB + 1)); });
  // A batch of one names its job too: the caller sent a list.
  row("of_1_job_with_a_payload_over_1_MiB", TooBig("jobs[0].payload"), [](Env&, R& r) {
    r.mutable_jobs()->RemoveLast();
    r.mutable_jobs(0)->set_payload(Bytes(kMiB + 1));
  });
  row("1_with_65_headers", TooBig("jobs[1].headers"),
      [](Env&, R& r) { AddHeaders(*r.mutable_jobs(1)->mutable_headers(), 65, ""); });
  row("1_with_an_invalid_delay", Invalid("jobs[1].delay"),
      [](Env&, R& r) { *r.mutable_jobs(1)->mutable_delay() = MixedSignDuration(); });
  row("1_with_a_negative_max_attempts", Invalid("jobs[1].max_attempts"),
      [](Env&, R& r) { r.mutable_jobs(1)->set_max_attempts(-1); });
  row("1_depending_on_itself", Invalid("jobs[1].depends_on_index[0]"),
      [](Env&, R& r) { r.mutable_jobs(1)->add_depends_on_index(1); });
  row("0_depending_on_a_later_job", Invalid("jobs[0].depends_on_index[0]"),
      [](Env&, R& r) { r.mutable_jobs(0)->add_depends_on_index(1); });
  row("1_depending_on_an_unknown_job", Invalid("jobs[1].depends_on[0]"),
      [](Env&, R& r) { r.mutable_jobs(1)->add_depends_on("01ARZ3NDEKTSV4RRFFQ69G5FAV"); });
  row("1_with_the_dedup_key_of_0_and_another_payload",
      Refused(Code::ALREADY_EXISTS, "jobs[1].dedup_key"), [](Env&, R& r) {
        r.mutable_jobs(0)->set_dedup_key("twice");
        r.mutable_jobs(1)->set_dedup_key("twice");
        r.mutable_jobs(1)->set_payload("another payload");
      });
  row("of_1000_jobs_ok", Accepted(), [](Env&, R& r) {
    r.mutable_jobs(0)->set_queue("edge-batch");
    r.mutable_jobs()->DeleteSubrange(1, r.jobs_size() - 1);
    while (r.jobs_size() < 1000) *r.add_jobs() = r.jobs(0);
  });
}

// The stream's batch is an EnqueueBatchRequest: one bad value of each kind shows the stream
// checks it as the call does (the EnqueueBatch rows cover every field).
void AddEnqueueStreamRows(std::vector<Row>& rows) {
  using B = v1::EnqueueBatchRequest;
  auto row = [&](absl::string_view what, Expect e, std::function<void(B&)> c) {
    rows.push_back(Nested<StreamBatch>(
        v1::EnqueueStreamRequest::descriptor(), "batch", "batch", what, std::move(e),
        [c = std::move(c)](Env&, StreamBatch& b) { c(*b.request.mutable_batch()); }));
  };
  row("unset", Invalid("jobs"), [](B& b) { b.Clear(); });
  row("of_1001_jobs", Invalid("jobs"), [](B& b) {
    while (b.jobs_size() < 1001) *b.add_jobs() = b.jobs(0);
  });
  row("with_job_1_of_a_bad_queue", Invalid("jobs[1].queue"),
      [](B& b) { b.mutable_jobs(1)->set_queue("no spaces allowed"); });
  row("with_job_1_of_a_payload_over_1_MiB", TooBig("jobs[1].payload"),
      [](B& b) { b.mutable_jobs(1)->set_payload(Bytes(kMiB + 1)); });
  row("with_job_1_of_an_invalid_delay", Invalid("jobs[1].delay"),
      [](B& b) { *b.mutable_jobs(1)->mutable_delay() = MixedSignDuration(); });
}

void AddLeaseRows(std::vector<Row>& rows) {
  using R = v1::LeaseRequest;
  auto row = [&](std::string field, absl::string_view what, Expect e, Change<R> c) {
    rows.push_back(Case<R>(std::move(field), what, std::move(e), std::move(c)));
  };
  row("queue", "empty", Invalid("queue"), [](Env&, R& r) { r.set_queue(""); });
  row("queue", "of_129_chars", Invalid("queue"), [](Env&, R& r) { r.set_queue(Bytes(129, 'q')); });
  row("queue", "with_a_space", Invalid("queue"), [](Env&, R& r) { r.set_queue("bad queue"); });
  row("queue", "of_exactly_128_chars_ok", Accepted(),
      [](Env&, R& r) { r.set_queue(Bytes(128, 'l')); });

  row("worker_id", "empty", Invalid("worker_id"), [](Env&, R& r) { r.set_worker_id(""); });
  row("worker_id", "over_256_bytes", Invalid("worker_id"),
      [](Env&, R& r) { r.set_worker_id(Bytes(257, 'w')); });
  row("worker_id", "of_exactly_256_bytes_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-lease");
    r.set_worker_id(Bytes(256, 'w'));
  });

  row("max_jobs", "negative", Invalid("max_jobs"), [](Env&, R& r) { r.set_max_jobs(-1); });
  row("max_jobs", "of_1001", Invalid("max_jobs"), [](Env&, R& r) { r.set_max_jobs(1001); });
  row("max_jobs", "of_1000_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-lease");
    r.set_max_jobs(1000);
  });
  row("max_jobs", "of_0_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-lease");
    r.set_max_jobs(0);
  });

  row("lease_duration", "negative", Invalid("lease_duration"),
      [](Env&, R& r) { *r.mutable_lease_duration() = Dur(absl::Seconds(-1)); });
  row("lease_duration", "of_99ms", Invalid("lease_duration"),
      [](Env&, R& r) { *r.mutable_lease_duration() = Dur(absl::Milliseconds(99)); });
  row("lease_duration", "over_12h", Invalid("lease_duration"),
      [](Env&, R& r) { *r.mutable_lease_duration() = Dur(absl::Hours(12) + absl::Seconds(1)); });
  row("lease_duration", "with_nanos_of_the_other_sign", Invalid("lease_duration"),
      [](Env&, R& r) { *r.mutable_lease_duration() = MixedSignDuration(); });
  row("lease_duration", "of_100ms_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-lease");  // empty: nothing is leased, so nothing expires later
    *r.mutable_lease_duration() = Dur(absl::Milliseconds(100));
  });
  row("lease_duration", "of_12h_ok", Accepted(), [](Env&, R& r) {
    r.set_queue("edge-lease");
    *r.mutable_lease_duration() = Dur(absl::Hours(12));
  });

  row("wait", "negative", Invalid("wait"),
      [](Env&, R& r) { *r.mutable_wait() = Dur(absl::Seconds(-1)); });
  row("wait", "over_60s", Invalid("wait"),
      [](Env&, R& r) { *r.mutable_wait() = Dur(absl::Seconds(60) + absl::Milliseconds(1)); });
  row("wait", "with_nanos_out_of_range", Invalid("wait"), [](Env&, R& r) {
    r.mutable_wait()->set_seconds(0);
    r.mutable_wait()->set_nanos(1'000'000'000);
  });
  row("wait", "of_60s_ok", Accepted(), [](Env& env, R& r) {
    // A ready job answers at once, so the row does not wait the minute out.
    env.client->MustEnqueue("edge-lease-wait", "ready");
    r.set_queue("edge-lease-wait");
    *r.mutable_wait() = Dur(absl::Seconds(60));
    *r.mutable_lease_duration() = Dur(absl::Hours(12));
  });
}

// Rows for the (job_id, lease_id) pair that Heartbeat, Ack, Fail and Release share.
template <typename R>
void AddLeaseRefRows(std::vector<Row>& rows) {
  auto row = [&](std::string field, absl::string_view what, Expect e, Change<R> c) {
    rows.push_back(Case<R>(std::move(field), what, std::move(e), std::move(c)));
  };
  row("job_id", "empty", Invalid("job_id"), [](Env&, R& r) { r.set_job_id(""); });
  row("job_id", "over_256_bytes", Invalid("job_id"),
      [](Env&, R& r) { r.set_job_id(Bytes(257, 'j')); });
  row("job_id", "unknown", Refused(Code::NOT_FOUND, "job "),
      [](Env& env, R& r) { r.set_job_id(absl::StrCat("no-such-", env.active.job_id())); });
  row("job_id", "of_a_job_leased_by_nobody", Refused(Code::FAILED_PRECONDITION, "lease "),
      [](Env& env, R& r) { r.set_job_id(env.ready_id); });
  row("lease_id", "empty", Invalid("lease_id"), [](Env&, R& r) { r.set_lease_id(""); });
  row("lease_id", "over_256_bytes", Invalid("lease_id"),
      [](Env&, R& r) { r.set_lease_id(Bytes(257, 'l')); });
  row("lease_id", "not_the_jobs", Refused(Code::FAILED_PRECONDITION, "lease "),
      [](Env& env, R& r) { r.set_lease_id(absl::StrCat("not-", env.active.lease_id())); });
}

void AddAttemptRows(std::vector<Row>& rows) {
  AddLeaseRefRows<v1::HeartbeatRequest>(rows);
  AddLeaseRefRows<v1::AckRequest>(rows);
  AddLeaseRefRows<v1::FailRequest>(rows);
  AddLeaseRefRows<v1::ReleaseRequest>(rows);

  using H = v1::HeartbeatRequest;
  rows.push_back(Case<H>("extend_by", "negative", Invalid("extend_by"),
                         [](Env&, H& r) { *r.mutable_extend_by() = Dur(absl::Seconds(-5)); }));
  rows.push_back(Case<H>("extend_by", "of_99ms", Invalid("extend_by"),
                         [](Env&, H& r) { *r.mutable_extend_by() = Dur(absl::Milliseconds(99)); }));
  rows.push_back(Case<H>("extend_by", "over_12h", Invalid("extend_by"), [](Env&, H& r) {
    *r.mutable_extend_by() = Dur(absl::Hours(12) + absl::Seconds(1));
  }));
  rows.push_back(Case<H>("extend_by", "with_nanos_of_the_other_sign", Invalid("extend_by"),
                         [](Env&, H& r) { *r.mutable_extend_by() = MixedSignDuration(); }));
  rows.push_back(Case<H>("extend_by", "of_12h_ok", Accepted(), [](Env& env, H& r) {
    v1::LeasedJob job = env.Fresh("edge-heartbeat");
    r.set_job_id(job.job_id());
    r.set_lease_id(job.lease_id());
    *r.mutable_extend_by() = Dur(absl::Hours(12));
  }));
  rows.push_back(Case<H>("checkpoint", "over_4_MiB", TooBig("checkpoint"),
                         [](Env&, H& r) { r.set_checkpoint(Bytes(4 * kMiB + 1)); }));
  rows.push_back(Case<H>("checkpoint", "of_exactly_4_MiB_ok", Accepted(), [](Env& env, H& r) {
    v1::LeasedJob job = env.Fresh("edge-heartbeat");
    r.set_job_id(job.job_id());
    r.set_lease_id(job.lease_id());
    r.set_checkpoint(Bytes(4 * kMiB));
  }));
  rows.push_back(Case<H>("progress", "over_64_KiB", TooBig("progress"),
                         [](Env&, H& r) { r.set_progress(Bytes(64 * kKiB + 1)); }));
  rows.push_back(Case<H>("progress", "of_exactly_64_KiB_ok", Accepted(), [](Env& env, H& r) {
    v1::LeasedJob job = env.Fresh("edge-heartbeat");
    r.set_job_id(job.job_id());
    r.set_lease_id(job.lease_id());
    r.set_progress(Bytes(64 * kKiB));
  }));

  using A = v1::AckRequest;
  rows.push_back(Case<A>("result", "over_4_MiB", TooBig("result"),
                         [](Env&, A& r) { r.set_result(Bytes(4 * kMiB + 1)); }));
  rows.push_back(Case<A>("result", "of_exactly_4_MiB_ok", Accepted(), [](Env& env, A& r) {
    v1::LeasedJob job = env.Fresh("edge-ack");
    r.set_job_id(job.job_id());
    r.set_lease_id(job.lease_id());
    r.set_result(Bytes(4 * kMiB));
  }));

  using F = v1::FailRequest;
  rows.push_back(Case<F>("retry_after", "negative", Invalid("retry_after"),
                         [](Env&, F& r) { *r.mutable_retry_after() = Dur(absl::Seconds(-5)); }));
  rows.push_back(Case<F>("retry_after", "with_nanos_of_the_other_sign", Invalid("retry_after"),
                         [](Env&, F& r) { *r.mutable_retry_after() = MixedSignDuration(); }));
  rows.push_back(
      Case<F>("retry_after", "beyond_the_Duration_range", Invalid("retry_after"),
              [](Env&, F& r) { *r.mutable_retry_after() = Seconds(kDurationMaxSeconds + 1); }));
  rows.push_back(Case<F>("retry_after", "of_an_hour_ok", Accepted(), [](Env& env, F& r) {
    v1::LeasedJob job = env.Fresh("edge-fail");
    r.set_job_id(job.job_id());
    r.set_lease_id(job.lease_id());
    *r.mutable_retry_after() = Dur(absl::Hours(1));  // SCHEDULED for the rest of the suite
  }));
  rows.push_back(Case<F>("error", "of_64_KiB_ok_and_kept_cut", Accepted(), [](Env& env, F& r) {
    v1::LeasedJob job = env.Fresh("edge-fail");
    r.set_job_id(job.job_id());
    r.set_lease_id(job.lease_id());
    r.set_error(Bytes(64 * kKiB, 'e'));
    r.set_permanent(true);  // FAILED, not a retry that would change the counts later
  }));

  using L = v1::ReleaseRequest;
  rows.push_back(Case<L>("lease_id", "of_a_fresh_job_ok", Accepted(), [](Env& env, L& r) {
    v1::LeasedJob job = env.Fresh("edge-release");
    r.set_job_id(job.job_id());
    r.set_lease_id(job.lease_id());
  }));
  rows.push_back(Case<L>("delay", "negative", Invalid("delay"),
                         [](Env&, L& r) { *r.mutable_delay() = Dur(absl::Seconds(-1)); }));
  rows.push_back(Case<L>("delay", "with_nanos_of_the_other_sign", Invalid("delay"),
                         [](Env&, L& r) { *r.mutable_delay() = MixedSignDuration(); }));
  rows.push_back(Case<L>("delay", "over_720h", Invalid("delay"), [](Env&, L& r) {
    *r.mutable_delay() = Dur(absl::Hours(720) + absl::Seconds(1));
  }));
  rows.push_back(Case<L>("delay", "of_720h_ok", Accepted(), [](Env& env, L& r) {
    v1::LeasedJob job = env.Fresh("edge-release");
    r.set_job_id(job.job_id());
    r.set_lease_id(job.lease_id());
    *r.mutable_delay() = Dur(absl::Hours(720));  // SCHEDULED for the rest of the suite
  }));
}

void AddWorkRows(std::vector<Row>& rows) {
  const Descriptor* sub = v1::SubscribeRequest::descriptor();
  const Descriptor* flow = v1::FlowRequest::descriptor();
  const Descriptor* work = v1::WorkRequest::descriptor();
  using W = WorkCall;
  auto subscribe = [&](std::string field, absl::string_view what, Expect e,
                       std::function<void(v1::SubscribeRequest&)> c) {
    std::string path = absl::StrCat("subscribe.", field);
    rows.push_back(Work(sub, std::move(field), path, what, std::move(e),
                        [c = std::move(c)](Env&, W& w) { c(*w.request.mutable_subscribe()); }));
  };
  using S = v1::SubscribeRequest;
  subscribe("queues", "none", Invalid("queues"), [](S& s) { s.clear_queues(); });
  subscribe("queues", "101", Invalid("queues"), [](S& s) {
    s.clear_queues();
    for (int i = 0; i < 101; ++i) s.add_queues(absl::StrCat("matrix-sub-", i));
  });
  subscribe("queues", "1_empty", Invalid("queues[1]"), [](S& s) { s.add_queues(""); });
  subscribe("queues", "1_with_a_space", Invalid("queues[1]"),
            [](S& s) { s.add_queues("bad queue"); });
  subscribe("queues", "1_of_129_chars", Invalid("queues[1]"),
            [](S& s) { s.add_queues(Bytes(129, 'q')); });
  subscribe("queues", "1_repeating_0", Invalid("queues[1]"), [](S& s) { s.add_queues(kQueue); });
  subscribe("queues", "100_ok", Accepted(), [](S& s) {
    s.clear_queues();
    for (int i = 0; i < 100; ++i) s.add_queues(absl::StrCat("edge-sub-", i));
  });
  subscribe("worker_id", "empty", Invalid("worker_id"), [](S& s) { s.set_worker_id(""); });
  subscribe("worker_id", "over_256_bytes", Invalid("worker_id"),
            [](S& s) { s.set_worker_id(Bytes(257, 'w')); });
  subscribe("worker_id", "of_exactly_256_bytes_ok", Accepted(), [](S& s) {
    s.set_queues(0, "edge-sub");
    s.set_worker_id(Bytes(256, 'w'));
  });
  subscribe("max_in_flight", "negative", Invalid("max_in_flight"),
            [](S& s) { s.set_max_in_flight(-1); });
  subscribe("max_in_flight", "of_1001", Invalid("max_in_flight"),
            [](S& s) { s.set_max_in_flight(1001); });
  subscribe("max_in_flight", "of_1000_ok", Accepted(), [](S& s) {
    s.set_queues(0, "edge-sub");
    s.set_max_in_flight(1000);
  });
  subscribe("lease_duration", "negative", Invalid("lease_duration"),
            [](S& s) { *s.mutable_lease_duration() = Dur(absl::Seconds(-1)); });
  subscribe("lease_duration", "of_99ms", Invalid("lease_duration"),
            [](S& s) { *s.mutable_lease_duration() = Dur(absl::Milliseconds(99)); });
  subscribe("lease_duration", "over_12h", Invalid("lease_duration"),
            [](S& s) { *s.mutable_lease_duration() = Dur(absl::Hours(13)); });
  subscribe("lease_duration", "with_nanos_of_the_other_sign", Invalid("lease_duration"),
            [](S& s) { *s.mutable_lease_duration() = MixedSignDuration(); });
  subscribe("lease_duration", "of_12h_ok", Accepted(), [](S& s) {
    s.set_queues(0, "edge-sub");
    *s.mutable_lease_duration() = Dur(absl::Hours(12));
  });

  auto after_subscribe = [&](const Descriptor* m, std::string field, absl::string_view path,
                             absl::string_view what, Expect e,
                             std::function<void(v1::WorkRequest&)> c) {
    rows.push_back(
        Work(m, std::move(field), path, what, std::move(e), [c = std::move(c)](Env&, W& w) {
          w.subscribe_first = true;
          w.request.Clear();
          c(w.request);
        }));
  };
  after_subscribe(flow, "max_in_flight", "flow.max_in_flight", "negative", Invalid("max_in_flight"),
                  [](v1::WorkRequest& r) { r.mutable_flow()->set_max_in_flight(-1); });
  after_subscribe(flow, "max_in_flight", "flow.max_in_flight", "of_1001", Invalid("max_in_flight"),
                  [](v1::WorkRequest& r) { r.mutable_flow()->set_max_in_flight(1001); });
  after_subscribe(flow, "max_in_flight", "flow.max_in_flight", "of_0_ok", Accepted(),
                  [](v1::WorkRequest& r) { r.mutable_flow()->set_max_in_flight(0); });
  after_subscribe(flow, "max_in_flight", "flow.max_in_flight", "of_1000_ok", Accepted(),
                  [](v1::WorkRequest& r) { r.mutable_flow()->set_max_in_flight(1000); });
  after_subscribe(work, "subscribe", "subscribe", "a_second_time",
                  RefusedMentioning(Code::FAILED_PRECONDITION, "subscribe"),
                  [](v1::WorkRequest& r) { r = IdleSubscribe(); });

  // The members that reuse the unary messages: one bad value each shows the stream checks them
  // as the unary RPC does (the unary rows above cover every field).
  auto member = [&](std::string field, absl::string_view what, Expect e,
                    std::function<void(const Env&, v1::WorkRequest&)> c) {
    std::string path = field;
    rows.push_back(
        Work(work, std::move(field), path, what, std::move(e), [c = std::move(c)](Env& env, W& w) {
          w.request.Clear();
          c(env, w.request);
        }));
  };
  member("flow", "before_subscribe", Refused(Code::FAILED_PRECONDITION, "flow"),
         [](const Env&, v1::WorkRequest& r) { r.mutable_flow()->set_max_in_flight(1); });
  member("heartbeat", "with_a_negative_extend_by", Invalid("extend_by"),
         [](const Env& env, v1::WorkRequest& r) {
           *r.mutable_heartbeat() = Api<v1::HeartbeatRequest>::Valid(env);
           *r.mutable_heartbeat()->mutable_extend_by() = Dur(absl::Seconds(-1));
         });
  member("heartbeat", "with_a_checkpoint_over_4_MiB", TooBig("checkpoint"),
         [](const Env& env, v1::WorkRequest& r) {
           *r.mutable_heartbeat() = Api<v1::HeartbeatRequest>::Valid(env);
           r.mutable_heartbeat()->set_checkpoint(Bytes(4 * kMiB + 1));
         });
  member("ack", "with_an_empty_lease_id", Invalid("lease_id"),
         [](const Env& env, v1::WorkRequest& r) {
           *r.mutable_ack() = Api<v1::AckRequest>::Valid(env);
           r.mutable_ack()->clear_lease_id();
         });
  member("ack", "with_a_result_over_4_MiB", TooBig("result"),
         [](const Env& env, v1::WorkRequest& r) {
           *r.mutable_ack() = Api<v1::AckRequest>::Valid(env);
           r.mutable_ack()->set_result(Bytes(4 * kMiB + 1));
         });
  member("ack_batch", "with_no_acks", Invalid("acks"),
         [](const Env&, v1::WorkRequest& r) { r.mutable_ack_batch(); });
  // acks[0] is the fixture's valid ack: a batch with one bad item must apply none of them.
  auto ack_batch = [&](absl::string_view what, Expect e,
                       std::function<void(const Env&, v1::AckBatchRequest&)> c) {
    rows.push_back(Work(v1::AckBatchRequest::descriptor(), "acks", "ack_batch.acks", what,
                        std::move(e), [c = std::move(c)](Env& env, W& w) {
                          w.request.Clear();
                          v1::AckBatchRequest* batch = w.request.mutable_ack_batch();
                          *batch->add_acks() = Api<v1::AckRequest>::Valid(env);
                          c(env, *batch);
                        }));
  };
  ack_batch("1_with_an_empty_lease_id", Invalid("acks[1].lease_id"),
            [](const Env& env, v1::AckBatchRequest& b) {
              v1::AckRequest* a = b.add_acks();
              *a = Api<v1::AckRequest>::Valid(env);
              a->clear_lease_id();
            });
  ack_batch("1_with_a_result_over_4_MiB", TooBig("acks[1].result"),
            [](const Env& env, v1::AckBatchRequest& b) {
              v1::AckRequest* a = b.add_acks();
              *a = Api<v1::AckRequest>::Valid(env);
              a->set_result(Bytes(4 * kMiB + 1));
            });
  ack_batch("of_1001", Invalid("acks"), [](const Env& env, v1::AckBatchRequest& b) {
    for (int i = 0; i < 1000; ++i) *b.add_acks() = Api<v1::AckRequest>::Valid(env);
  });
  member("fail", "with_a_negative_retry_after", Invalid("retry_after"),
         [](const Env& env, v1::WorkRequest& r) {
           *r.mutable_fail() = Api<v1::FailRequest>::Valid(env);
           *r.mutable_fail()->mutable_retry_after() = Dur(absl::Seconds(-1));
         });
  member("release", "with_an_empty_job_id", Invalid("job_id"),
         [](const Env& env, v1::WorkRequest& r) {
           *r.mutable_release() = Api<v1::ReleaseRequest>::Valid(env);
           r.mutable_release()->clear_job_id();
         });
  member("release", "with_a_stale_lease_id", Refused(Code::FAILED_PRECONDITION, "lease "),
         [](const Env& env, v1::WorkRequest& r) {
           *r.mutable_release() = Api<v1::ReleaseRequest>::Valid(env);
           r.mutable_release()->set_lease_id("stale");
         });
  member("request", "unset", Invalid("request"), [](const Env&, v1::WorkRequest&) {});
}

void AddJobAdminRows(std::vector<Row>& rows) {
  // The id-only requests.
  auto ids = [&](auto tag, bool active_is_refused) {
    using R = decltype(tag);
    rows.push_back(
        Case<R>("job_id", "empty", Invalid("job_id"), [](Env&, R& r) { r.set_job_id(""); }));
    rows.push_back(Case<R>("job_id", "over_256_bytes", Invalid("job_id"),
                           [](Env&, R& r) { r.set_job_id(Bytes(257, 'j')); }));
    rows.push_back(Case<R>("job_id", "of_256_bytes_unknown", Refused(Code::NOT_FOUND, "job "),
                           [](Env&, R& r) { r.set_job_id(Bytes(256, 'j')); }));
    if (active_is_refused) {
      rows.push_back(Case<R>("job_id", "of_an_active_job",
                             Refused(Code::FAILED_PRECONDITION, "job "),
                             [](Env& env, R& r) { r.set_job_id(env.active.job_id()); }));
    }
  };
  ids(v1::GetJobRequest(), false);
  ids(v1::WatchJobRequest(), false);
  ids(v1::CancelJobRequest(), false);
  ids(v1::DeleteJobRequest(), true);
  rows.push_back(Case<v1::CancelJobRequest>(
      "job_id", "of_a_completed_job", Refused(Code::FAILED_PRECONDITION, "job "),
      [](Env& env, v1::CancelJobRequest& r) { r.set_job_id(env.done_id); }));
  rows.push_back(
      Case<v1::GetJobRequest>("job_id", "of_a_completed_job_ok", Accepted(),
                              [](Env& env, v1::GetJobRequest& r) { r.set_job_id(env.done_id); }));
  rows.push_back(Case<v1::WatchJobRequest>(
      "job_id", "of_a_completed_job_ok", Accepted(),
      [](Env& env, v1::WatchJobRequest& r) { r.set_job_id(env.done_id); }));

  using T = v1::RetryJobRequest;
  auto retry = [&](std::string field, absl::string_view what, Expect e, Change<T> c) {
    rows.push_back(Case<T>(std::move(field), what, std::move(e), std::move(c)));
  };
  retry("job_id", "empty_without_a_queue", Invalid("job_id"), [](Env&, T& r) { r.clear_queue(); });
  retry("job_id", "over_256_bytes", Invalid("job_id"), [](Env&, T& r) {
    r.clear_queue();
    r.set_job_id(Bytes(257, 'j'));
  });
  retry("job_id", "unknown", Refused(Code::NOT_FOUND, "job "), [](Env&, T& r) {
    r.clear_queue();
    r.set_job_id("no-such-job");
  });
  retry("job_id", "of_a_ready_job", Refused(Code::FAILED_PRECONDITION, "job "), [](Env& env, T& r) {
    r.clear_queue();
    r.set_job_id(env.ready_id);
  });
  retry("queue", "together_with_a_job_id", Invalid("job_id and queue"),
        [](Env& env, T& r) { r.set_job_id(env.done_id); });
  retry("queue", "with_a_space", Invalid("queue"), [](Env&, T& r) { r.set_queue("bad queue"); });
  retry("queue", "of_129_chars", Invalid("queue"),
        [](Env&, T& r) { r.set_queue(Bytes(129, 'q')); });
  retry("queue", "unknown", Refused(Code::NOT_FOUND, "queue "),
        [](Env&, T& r) { r.set_queue("matrix-never-created"); });
  retry("state", "ready", Invalid("state"), [](Env&, T& r) { r.set_state(v1::JOB_STATE_READY); });
  retry("state", "active", Invalid("state"), [](Env&, T& r) { r.set_state(v1::JOB_STATE_ACTIVE); });
  retry("state", "not_a_JobState", Invalid("state"),
        [](Env&, T& r) { r.set_state(static_cast<v1::JobState>(99)); });
  retry("state", "with_a_job_id", Invalid("state"), [](Env& env, T& r) {
    r.clear_queue();
    r.set_job_id(env.done_id);
    r.set_state(v1::JOB_STATE_FAILED);
  });
  retry("state", "cancelled_ok", Accepted(),
        [](Env&, T& r) { r.set_state(v1::JOB_STATE_CANCELLED); });
  retry("dry_run", "with_a_job_id", RefusedMentioning(Code::INVALID_ARGUMENT, "dry_run"),
        [](Env& env, T& r) {
          r.clear_queue();
          r.set_job_id(env.done_id);
          r.set_dry_run(true);
        });
  retry("dry_run", "with_a_queue_ok", Accepted(), [](Env&, T& r) { r.set_dry_run(true); });
  retry("limit", "negative", Invalid("limit"), [](Env&, T& r) { r.set_limit(-1); });
  retry("limit", "of_100001", Invalid("limit"), [](Env&, T& r) { r.set_limit(100001); });
  retry("limit", "with_a_job_id", RefusedMentioning(Code::INVALID_ARGUMENT, "limit"),
        [](Env& env, T& r) {
          r.clear_queue();
          r.set_job_id(env.done_id);
          r.set_limit(1);
        });
  retry("limit", "of_100000_ok", Accepted(), [](Env&, T& r) { r.set_limit(100000); });

  using J = v1::ListJobsRequest;
  auto list = [&](std::string field, absl::string_view what, Expect e, Change<J> c) {
    rows.push_back(Case<J>(std::move(field), what, std::move(e), std::move(c)));
  };
  list("queue", "empty", Invalid("queue"), [](Env&, J& r) { r.set_queue(""); });
  list("queue", "with_a_space", Invalid("queue"), [](Env&, J& r) { r.set_queue("bad queue"); });
  list("queue", "of_129_chars", Invalid("queue"), [](Env&, J& r) { r.set_queue(Bytes(129, 'q')); });
  list("queue", "unknown", Refused(Code::NOT_FOUND, "queue "),
       [](Env&, J& r) { r.set_queue("matrix-never-created"); });
  list("state", "not_a_JobState", Invalid("state"),
       [](Env&, J& r) { r.set_state(static_cast<v1::JobState>(99)); });
  list("state", "negative", Invalid("state"),
       [](Env&, J& r) { r.set_state(static_cast<v1::JobState>(-1)); });
  list("state", "cancelled_ok", Accepted(),
       [](Env&, J& r) { r.set_state(v1::JOB_STATE_CANCELLED); });
  list("page_size", "negative", Invalid("page_size"), [](Env&, J& r) { r.set_page_size(-1); });
  list("page_size", "of_1001", Invalid("page_size"), [](Env&, J& r) { r.set_page_size(1001); });
  list("page_size", "of_1000_ok", Accepted(), [](Env&, J& r) { r.set_page_size(1000); });
  list("page_token", "not_a_number", Invalid("page_token"),
       [](Env&, J& r) { r.set_page_token("abc"); });
  list("page_token", "negative", Invalid("page_token"), [](Env&, J& r) { r.set_page_token("-1"); });
  list("page_token", "over_uint64", Invalid("page_token"),
       [](Env&, J& r) { r.set_page_token("18446744073709551616"); });
  list("page_token", "with_trailing_junk", Invalid("page_token"),
       [](Env&, J& r) { r.set_page_token("1x"); });
  list("dedup_key", "over_256_bytes", Invalid("dedup_key"),
       [](Env&, J& r) { r.set_dedup_key(Bytes(257, 'k')); });
  list("dedup_key", "of_exactly_256_bytes_ok", Accepted(),
       [](Env&, J& r) { r.set_dedup_key(Bytes(256, 'k')); });
  list("page_token", "of_uint64_max_newest_first_ok", Accepted(), [](Env&, J& r) {
    r.set_page_token("18446744073709551615");
    r.set_newest_first(true);
  });
}

void AddQueueAdminRows(std::vector<Row>& rows) {
  auto names = [&](auto tag, bool unknown_is_not_found) {
    using R = decltype(tag);
    rows.push_back(
        Case<R>("queue", "empty", Invalid("queue"), [](Env&, R& r) { r.set_queue(""); }));
    rows.push_back(Case<R>("queue", "of_129_chars", Invalid("queue"),
                           [](Env&, R& r) { r.set_queue(Bytes(129, 'q')); }));
    rows.push_back(Case<R>("queue", "with_a_space", Invalid("queue"),
                           [](Env&, R& r) { r.set_queue("bad queue"); }));
    if (unknown_is_not_found) {
      rows.push_back(Case<R>("queue", "unknown_of_128_chars", Refused(Code::NOT_FOUND, "queue "),
                             [](Env&, R& r) { r.set_queue(Bytes(128, 'u')); }));
    }
  };
  names(v1::GetQueueRequest(), true);
  names(v1::PauseQueueRequest(), true);
  names(v1::ResumeQueueRequest(), true);
  names(v1::PurgeQueueRequest(), true);
  names(v1::UpdateQueuePolicyRequest(), false);
  using W = v1::ListWorkersRequest;
  rows.push_back(Case<W>("queue", "of_129_chars", Invalid("queue"),
                         [](Env&, W& r) { r.set_queue(Bytes(129, 'q')); }));
  rows.push_back(
      Case<W>("queue", "with_a_space", Invalid("queue"), [](Env&, W& r) { r.set_queue("a b"); }));
  rows.push_back(Case<W>("queue", "empty_ok", Accepted(), [](Env&, W& r) { r.clear_queue(); }));
  rows.push_back(
      Case<W>("queue", "unknown_ok", Accepted(), [](Env&, W& r) { r.set_queue("no-such-queue"); }));
  rows.push_back(Case<v1::ResumeQueueRequest>("queue", "not_paused_ok", Accepted(),
                                              [](Env&, v1::ResumeQueueRequest&) {}));

  using P = v1::PurgeQueueRequest;
  rows.push_back(Case<P>("states", "active", Invalid("states"),
                         [](Env&, P& r) { r.set_states(0, v1::JOB_STATE_ACTIVE); }));
  rows.push_back(Case<P>("states", "1_unspecified", Invalid("states[1]"),
                         [](Env&, P& r) { r.add_states(v1::JOB_STATE_UNSPECIFIED); }));
  rows.push_back(Case<P>("states", "0_not_a_JobState", Invalid("states[0]"),
                         [](Env&, P& r) { r.set_states(0, static_cast<v1::JobState>(99)); }));
  rows.push_back(Case<P>("states", "completed_ok", Accepted(), [](Env&, P& r) {
    r.set_states(0, v1::JOB_STATE_COMPLETED);  // the fixture's queue has none
  }));

  using U = v1::UpdateQueuePolicyRequest;
  rows.push_back(Case<U>("queue", "of_exactly_128_chars_ok", Accepted(),
                         [](Env&, U& r) { r.set_queue(Bytes(128, 'p')); }));
  rows.push_back(Case<U>(
      "policy", "with_a_mixed_sign_lease_duration", Invalid("policy.lease_duration"),
      [](Env&, U& r) { *r.mutable_policy()->mutable_lease_duration() = MixedSignDuration(); }));
  rows.push_back(
      Case<U>("policy", "out_of_range_for_a_new_queue", Invalid("policy.retry"), [](Env&, U& r) {
        r.set_queue("matrix-never-created");
        r.mutable_policy()->mutable_retry()->set_max_attempts(0);
      }));
  // Values policy_test.cc does not try (it covers every field's range).
  rows.push_back(Nested<U>(v1::RetryPolicy::descriptor(), "jitter", "policy.retry.jitter",
                           "not_a_Jitter", Invalid("policy.retry.jitter"), [](Env&, U& r) {
                             r.mutable_policy()->mutable_retry()->set_jitter(
                                 static_cast<v1::Jitter>(99));
                           }));
  rows.push_back(Nested<U>(
      v1::RetryPolicy::descriptor(), "backoff_multiplier", "policy.retry.backoff_multiplier", "nan",
      Invalid("policy.retry.backoff_multiplier"), [](Env&, U& r) {
        r.mutable_policy()->mutable_retry()->set_backoff_multiplier(std::nan(""));
      }));
  rows.push_back(Nested<U>(v1::RateLimit::descriptor(), "per_second",
                           "policy.rate_limit.per_second", "infinite",
                           Invalid("policy.rate_limit.per_second"), [](Env&, U& r) {
                             r.mutable_policy()->mutable_rate_limit()->set_per_second(
                                 std::numeric_limits<double>::infinity());
                           }));
  rows.push_back(Nested<U>(v1::Retention::descriptor(), "max_age",
                           "policy.completed_retention.max_age", "beyond_the_Duration_range",
                           Invalid("policy.completed_retention.max_age"), [](Env&, U& r) {
                             *r.mutable_policy()->mutable_completed_retention()->mutable_max_age() =
                                 Seconds(kDurationMaxSeconds + 1);
                           }));
  auto payload_limit = [&](absl::string_view what, Expect e, int64_t bytes) {
    const bool accepted = !e.code.has_value();
    rows.push_back(Nested<U>(v1::QueuePolicy::descriptor(), "max_payload_bytes",
                             "policy.max_payload_bytes", what, std::move(e), [=](Env&, U& r) {
                               if (accepted) r.set_queue("edge-policy");
                               r.mutable_policy()->set_max_payload_bytes(bytes);
                             }));
  };
  payload_limit("zero", Invalid("policy.max_payload_bytes"), 0);
  payload_limit("negative", Invalid("policy.max_payload_bytes"), -1);
  payload_limit("over_16_MiB", Invalid("policy.max_payload_bytes"), 16 * kMiB + 1);
  payload_limit("of_1_ok", Accepted(), 1);
  payload_limit("of_16_MiB_ok", Accepted(), 16 * kMiB);
  rows.push_back(Case<U>("reset", "with_no_policy_ok", Accepted(), [](Env&, U& r) {
    r.set_queue("edge-policy");
    r.clear_policy();
    r.set_reset(true);
  }));
}

void AddScheduleRows(std::vector<Row>& rows) {
  using P = v1::PutScheduleRequest;
  const Descriptor* schedule = v1::Schedule::descriptor();
  auto row = [&](std::string field, absl::string_view what, Expect e, Change<P> c) {
    rows.push_back(Nested<P>(schedule, field, absl::StrCat("schedule.", field), what, std::move(e),
                             std::move(c)));
  };
  rows.push_back(Case<P>("schedule", "unset", Invalid("schedule.schedule_id"),
                         [](Env&, P& r) { r.clear_schedule(); }));
  row("schedule_id", "empty", Invalid("schedule.schedule_id"),
      [](Env&, P& r) { r.mutable_schedule()->clear_schedule_id(); });
  row("schedule_id", "with_a_space", Invalid("schedule.schedule_id"),
      [](Env&, P& r) { r.mutable_schedule()->set_schedule_id("a b"); });
  row("cron", "and_every", Invalid("schedule.cron"),
      [](Env&, P& r) { r.mutable_schedule()->set_cron("* * * * *"); });
  row("cron", "minute_61", Invalid("schedule.cron"), [](Env&, P& r) {
    r.mutable_schedule()->clear_every();
    r.mutable_schedule()->set_cron("61 * * * *");
  });
  row("cron", "weekdays_ok", Accepted(), [](Env&, P& r) {
    r.mutable_schedule()->clear_every();
    r.mutable_schedule()->set_cron("0 9 * * MON-FRI");
  });
  row("every", "half_a_second", Invalid("schedule.every"), [](Env&, P& r) {
    r.mutable_schedule()->mutable_every()->set_seconds(0);
    r.mutable_schedule()->mutable_every()->set_nanos(500'000'000);
  });
  row("every", "mixed_sign", Invalid("schedule.every"),
      [](Env&, P& r) { *r.mutable_schedule()->mutable_every() = MixedSignDuration(); });
  row("time_zone", "unknown", Invalid("schedule.time_zone"),
      [](Env&, P& r) { r.mutable_schedule()->set_time_zone("Mars/Olympus_Mons"); });
  row("time_zone", "berlin_ok", Accepted(),
      [](Env&, P& r) { r.mutable_schedule()->set_time_zone("Europe/Berlin"); });
  row("template", "unset", Invalid("schedule.template.queue"),
      [](Env&, P& r) { r.mutable_schedule()->clear_template_(); });
  row("template", "with_a_dedup_key", Invalid("schedule.template.dedup_key"),
      [](Env&, P& r) { r.mutable_schedule()->mutable_template_()->set_dedup_key("k"); });
  row("template", "with_a_delay", Invalid("schedule.template.delay"), [](Env&, P& r) {
    r.mutable_schedule()->mutable_template_()->mutable_delay()->set_seconds(1);
  });
  row("template", "with_a_mixed_sign_timeout", Invalid("schedule.template.timeout"),
      [](Env&, P& r) {
        *r.mutable_schedule()->mutable_template_()->mutable_timeout() = MixedSignDuration();
      });
  row("start_at", "out_of_range", Invalid("schedule.start_at"), [](Env&, P& r) {
    r.mutable_schedule()->mutable_start_at()->set_seconds(-1'000'000'000'000);
  });
  row("end_at", "before_start_at", Invalid("schedule.end_at"), [](Env&, P& r) {
    r.mutable_schedule()->mutable_start_at()->set_seconds(2'000'000'000);
    r.mutable_schedule()->mutable_end_at()->set_seconds(1'900'000'000);
  });
  row("catch_up", "not_a_ScheduleCatchUp", Invalid("schedule.catch_up"),
      [](Env&, P& r) { r.mutable_schedule()->set_catch_up(static_cast<v1::ScheduleCatchUp>(99)); });
  row("catch_up", "none_ok", Accepted(),
      [](Env&, P& r) { r.mutable_schedule()->set_catch_up(v1::SCHEDULE_CATCH_UP_NONE); });

  auto ids = [&rows](auto request) {
    using R = decltype(request);
    rows.push_back(Case<R>("schedule_id", "empty", Invalid("schedule_id"),
                           [](Env&, R& r) { r.clear_schedule_id(); }));
    rows.push_back(Case<R>("schedule_id", "of_129_chars", Invalid("schedule_id"),
                           [](Env&, R& r) { r.set_schedule_id(Bytes(129, 's')); }));
    rows.push_back(Case<R>("schedule_id", "unknown", Refused(Code::NOT_FOUND, "schedule "),
                           [](Env&, R& r) { r.set_schedule_id("no-such-schedule"); }));
  };
  ids(v1::GetScheduleRequest());
  ids(v1::DeleteScheduleRequest());
  ids(v1::TriggerScheduleRequest());
  using L = v1::ListSchedulesRequest;
  rows.push_back(
      Case<L>("queue", "with_a_space", Invalid("queue"), [](Env&, L& r) { r.set_queue("a b"); }));
  rows.push_back(Case<L>("queue", "empty_ok", Accepted(), [](Env&, L& r) { r.clear_queue(); }));
}

std::vector<Row> AllRows() {
  std::vector<Row> rows;
  AddEnqueueRows(rows);
  AddEnqueueBatchRows(rows);
  AddEnqueueStreamRows(rows);
  AddLeaseRows(rows);
  AddAttemptRows(rows);
  AddWorkRows(rows);
  AddJobAdminRows(rows);
  AddQueueAdminRows(rows);
  AddScheduleRows(rows);
  return rows;
}

// Fields for which no value is invalid, each with the reason; and the QueuePolicy fields whose
// bounds policy_test.cc (OutOfRangeValuesAreRefusedNamingTheFieldAndChangeNothing) pins.
const std::map<std::pair<std::string, std::string>, std::string>& Allowlist() {
  constexpr char kPolicyTest[] =
      "its range is pinned by policy_test.cc "
      "OutOfRangeValuesAreRefusedNamingTheFieldAndChangeNothing";
  static const auto* list = new std::map<std::pair<std::string, std::string>, std::string>{
      {{"jobbroker.v1.EnqueueRequest", "priority"}, "any int32 is a priority"},
      {{"jobbroker.v1.FailRequest", "error"}, "any text; the broker keeps it cut at 4 KiB"},
      {{"jobbroker.v1.FailRequest", "permanent"}, "a bool"},
      {{"jobbroker.v1.WorkRequest", "request_id"}, "any uint64; only echoed back"},
      {{"jobbroker.v1.EnqueueStreamRequest", "request_id"}, "any uint64; only echoed back"},
      {{"jobbroker.v1.SubscribeRequest", "batch_pushes"}, "a bool"},
      {{"jobbroker.v1.ListJobsRequest", "newest_first"}, "a bool"},
      {{"jobbroker.v1.UpdateQueuePolicyRequest", "reset"}, "a bool"},
      {{"jobbroker.v1.QueuePolicy", "paused"}, "a bool"},
      {{"jobbroker.v1.Schedule", "paused"}, "a bool"},
      {{"jobbroker.v1.Schedule", "next_run_at"}, "output only: ignored in PutSchedule"},
      {{"jobbroker.v1.Schedule", "last_run_at"}, "output only: ignored in PutSchedule"},
      {{"jobbroker.v1.Schedule", "last_job_id"}, "output only: ignored in PutSchedule"},
      {{"jobbroker.v1.Schedule", "created_at"}, "output only: ignored in PutSchedule"},
      {{"jobbroker.v1.Schedule", "partition"}, "output only: ignored in PutSchedule"},
      {{"jobbroker.v1.Schedule", "error"}, "output only: ignored in PutSchedule"},
      {{"jobbroker.v1.QueuePolicy", "max_concurrency"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "max_concurrency_per_key"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "retry"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "lease_duration"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "dedup_ttl"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "completed_retention"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "failed_retention"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "max_length"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "rate_limit"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "durability"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "group_commit_delay"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "timeout"}, kPolicyTest},
      {{"jobbroker.v1.QueuePolicy", "max_snoozes"}, kPolicyTest},
      {{"jobbroker.v1.RetryPolicy", "max_attempts"}, kPolicyTest},
      {{"jobbroker.v1.RetryPolicy", "initial_backoff"}, kPolicyTest},
      {{"jobbroker.v1.RetryPolicy", "max_backoff"}, kPolicyTest},
      {{"jobbroker.v1.Retention", "max_count"}, kPolicyTest},
      {{"jobbroker.v1.RateLimit", "burst"}, kPolicyTest},
  };
  return *list;
}

// Every (message, field) a client can send: the fields of every Broker and Admin method's
// request, and of the jobbroker.v1 messages they hold, however deep.
std::set<std::pair<std::string, std::string>> RequestFields() {
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  std::vector<const Descriptor*> todo;
  for (const char* service : {"jobbroker.v1.Broker", "jobbroker.v1.Admin"}) {
    const google::protobuf::ServiceDescriptor* s = pool->FindServiceByName(service);
    EXPECT_NE(s, nullptr) << service;
    if (s == nullptr) continue;
    for (int i = 0; i < s->method_count(); ++i) todo.push_back(s->method(i)->input_type());
  }
  std::set<const Descriptor*> seen;
  std::set<std::pair<std::string, std::string>> out;
  while (!todo.empty()) {
    const Descriptor* d = todo.back();
    todo.pop_back();
    if (!seen.insert(d).second) continue;
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      out.emplace(d->full_name(), f->name());
      if (f->message_type() != nullptr && !f->is_map() &&
          f->message_type()->file()->package() == "jobbroker.v1") {
        todo.push_back(f->message_type());
      }
    }
  }
  return out;
}

TEST(BadInputMatrixCoverageTest, EveryRequestFieldHasARefusedRowOrAReasonWhyNoValueIsBad) {
  const std::vector<Row> rows = AllRows();
  const std::set<std::pair<std::string, std::string>> fields = RequestFields();
  ASSERT_GT(fields.size(), 60u) << "the descriptor walk found too little";

  std::set<std::pair<std::string, std::string>> refused;
  std::set<std::string> names;
  for (const Row& row : rows) {
    EXPECT_TRUE(names.insert(row.name).second) << "two rows are named " << row.name;
    const Descriptor* d =
        google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(row.message);
    ASSERT_NE(d, nullptr) << row.name;
    if (d->FindFieldByName(row.field) == nullptr) {
      // An unset oneof is a bad value of the oneof itself.
      EXPECT_NE(d->FindOneofByName(row.field), nullptr)
          << row.name << ": " << row.message << " has no field " << row.field;
      continue;
    }
    if (row.expect.code.has_value()) refused.emplace(row.message, row.field);
  }
  for (const auto& field : fields) {
    const bool allowed = Allowlist().contains(field);
    EXPECT_TRUE(refused.contains(field) || allowed)
        << field.first << "." << field.second
        << " has no row with a bad value; add one to bad_input_matrix_test.cc, or add it to "
           "Allowlist() with the reason no value of it is bad";
    EXPECT_FALSE(refused.contains(field) && allowed)
        << field.first << "." << field.second
        << " is allowlisted as having no bad value, yet a row refuses one";
  }
  for (const auto& [field, reason] : Allowlist()) {
    EXPECT_TRUE(fields.contains(field))
        << "Allowlist() names " << field.first << "." << field.second
        << ", which is not a request field (any longer)";
  }
}

// The state a refused row must leave as it was: every queue's counts and policy, and the
// fixture's jobs.
struct Snapshot {
  std::map<std::string, std::map<std::string, int64_t>> counts;
  std::map<std::string, v1::QueuePolicy> policies;
  std::vector<v1::Job> jobs;
};

// Every RPC that has rows, in the order of AllRows().
std::vector<std::string> RpcsWithRows() {
  std::vector<std::string> rpcs;
  for (const Row& row : AllRows()) {
    if (std::find(rpcs.begin(), rpcs.end(), row.rpc) == rpcs.end()) rpcs.push_back(row.rpc);
  }
  return rpcs;
}

// One test per RPC, running each of its rows in turn. (One test per row reads a little better,
// but ctest runs each test in a process of its own, and starting ~230 brokers took 77 s.)
class BadInputMatrixTest : public BrokerFixtureWithParam<std::string> {
 protected:
  void SetUp() override {
    BrokerFixture::SetUp();
    ASSERT_NO_FATAL_FAILURE(MakeJobs());
  }

  // Builds the rows' jobs on the broker just started into env_.
  void MakeJobs() {
    env_ = Env{.client = &client()};
    BrokerClient& c = client();

    const std::string active_id = c.MustEnqueue(kQueue, "active");
    env_.ready_id = c.MustEnqueue(kQueue, "ready");
    std::vector<v1::LeasedJob> leased =
        c.MustLease(kQueue, "matrix-worker", 1, absl::ZeroDuration(), absl::Hours(12));
    ASSERT_EQ(leased.size(), 1u);
    ASSERT_EQ(leased[0].job_id(), active_id);
    env_.active = leased[0];

    v1::EnqueueRequest held;
    held.set_queue(kDoneQueue);
    held.set_payload("done");
    held.set_dedup_key(kHeldKey);
    env_.done_id = c.MustEnqueue(held);
    std::optional<v1::LeasedJob> done = c.LeaseOne(kDoneQueue, "matrix-worker");
    ASSERT_TRUE(done.has_value());
    c.MustAck(*done);

    v1::UpdateQueuePolicyRequest idle;
    idle.set_queue(kIdleQueue);
    v1::QueueInfo info;
    ASSERT_THAT(c.UpdateQueuePolicy(idle, &info), IsOk());
  }

  // Runs `row` against the fixture; false if any of its checks failed.
  bool Check(const Row& row) {
    const int failures_before = FailureCount();
    const Snapshot before = Take();
    const grpc::Status status = row.call(env_);
    const Expect& e = row.expect;
    EXPECT_EQ(CodeName(status.error_code()), CodeName(e.code.value_or(Code::OK)))
        << "message: \"" << status.error_message() << "\"";
    if (e.code.has_value() && e.at_start) {
      EXPECT_THAT(status.error_message(), StartsWith(e.names));
    } else if (e.code.has_value()) {
      EXPECT_THAT(status.error_message(), HasSubstr(e.names));
    }
    if (e.code.has_value() && e.mentions) {
      EXPECT_THAT(status.error_message(), HasSubstr(e.mentions(env_)));
    }
    ExpectUnchanged(before, Take(), /*all_queues=*/e.code.has_value());
    return FailureCount() == failures_before;
  }

  static int FailureCount() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
  }

  Snapshot Take() {
    Snapshot s;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(Deadline()));
    v1::ListQueuesResponse resp;
    grpc::Status status = admin().ListQueues(&ctx, v1::ListQueuesRequest(), &resp);
    EXPECT_THAT(status, IsOk());
    for (const v1::QueueInfo& q : resp.queues()) {
      s.counts[q.name()] = std::map<std::string, int64_t>(q.counts().begin(), q.counts().end());
      s.policies[q.name()] = q.policy();
    }
    for (const std::string& id : {env_.active.job_id(), env_.ready_id, env_.done_id}) {
      s.jobs.push_back(client().MustGetJob(id));
    }
    return s;
  }

  // `before` and `after` agree on the fixture's jobs and queue, and on every queue when
  // `all_queues`.
  static void ExpectUnchanged(const Snapshot& before, const Snapshot& after, bool all_queues) {
    for (size_t i = 0; i < before.jobs.size() && i < after.jobs.size(); ++i) {
      std::string diff;
      google::protobuf::util::MessageDifferencer d;
      d.ReportDifferencesToString(&diff);
      EXPECT_TRUE(d.Compare(before.jobs[i], after.jobs[i]))
          << "job " << before.jobs[i].id() << " changed: " << diff;
    }
    std::vector<std::string> queues = {kQueue, kDoneQueue, kIdleQueue};
    if (all_queues) {
      queues.clear();
      for (const auto& [name, counts] : before.counts) queues.push_back(name);
      std::vector<std::string> now;
      for (const auto& [name, counts] : after.counts) now.push_back(name);
      EXPECT_EQ(now, queues) << "the set of queues changed";
    }
    for (const std::string& q : queues) {
      auto b = before.counts.find(q);
      auto a = after.counts.find(q);
      if (b == before.counts.end() || a == after.counts.end()) continue;
      EXPECT_EQ(a->second, b->second) << "the counts of queue " << q << " changed";
      std::string diff;
      google::protobuf::util::MessageDifferencer d;
      d.ReportDifferencesToString(&diff);
      EXPECT_TRUE(d.Compare(before.policies.at(q), after.policies.at(q)))
          << "the policy of queue " << q << " changed: " << diff;
    }
  }

  Env env_;
};

TEST_P(BadInputMatrixTest, EveryRow) {
  std::vector<std::string> failed;
  int rows = 0;
  for (const Row& row : AllRows()) {
    if (row.rpc != GetParam()) continue;
    ++rows;
    SCOPED_TRACE(absl::StrCat("row ", row.name));
    if (!Check(row)) {
      failed.push_back(row.name);
      // The row may have changed the fixture: the next row gets a fresh broker, so that one bug
      // fails one row rather than every row after it.
      ASSERT_NO_FATAL_FAILURE(Start());
      ASSERT_NO_FATAL_FAILURE(MakeJobs());
    }
  }
  EXPECT_GT(rows, 0);
  EXPECT_THAT(failed, IsEmpty()) << "these rows failed";
}

INSTANTIATE_TEST_SUITE_P(Matrix, BadInputMatrixTest, ::testing::ValuesIn(RpcsWithRows()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace jobbroker::testing
