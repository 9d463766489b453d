// Arbitrary bytes as API requests. The first byte picks a request message (request_kinds.h), the
// rest is parsed as its wire form (or as the JSON text of a --config file) and goes down the path
// the gRPC services take: wire -> core conversion (server/convert/convert.h,
// server/config/config.h), the core checks (core/validation.h), then the Broker itself, over a
// MemoryStore with a FakeClock. The services' own glue (which function for which field) is repeated
// here, since it sits inside gRPC reactors.
//
// Besides "no crash, no undefined behaviour, no leak" (the sanitizers), each input checks:
// - a refusal before the broker (conversion or validation) is INVALID_ARGUMENT or
//   RESOURCE_EXHAUSTED, and its message starts with the name of a request field;
// - the broker refuses exactly what validation refused, with the same code;
// - the broker answers only with the codes DESIGN.md lists for bad input and missing or stale
//   things, never INTERNAL, UNKNOWN, UNAVAILABLE or DATA_LOSS, and never without a message;
// - a refused request changes nothing (queues, policies and jobs are the same before and after);
// - an accepted request is within the documented limits (queue names 1-128 of [A-Za-z0-9._:-],
//   keys and ids at most 256 bytes, lease lengths 100ms-12h, policy ranges...), rechecked here
//   independently of core/validation.cc.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/broker.h"
#include "core/clock.h"
#include "core/validation.h"
#include "google/protobuf/stubs/logging.h"
#include "jobbroker/v1/admin.pb.h"
#include "jobbroker/v1/broker.pb.h"
#include "jobbroker/v1/policy.pb.h"
#include "server/config/config.h"
#include "server/convert/convert.h"
#include "storage/memory_store.h"
#include "tests/fuzz/request_kinds.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"

namespace jobbroker::fuzz {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;

namespace {

using Code = absl::StatusCode;
using ::jobbroker::server::FromProto;
using ::jobbroker::server::ParseServerConfig;
using ::jobbroker::server::ServerPolicies;

constexpr absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

[[noreturn]] void Bug(const std::string& what) {
  std::fprintf(stderr, "\n==== request_fuzzer: %s ====\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// `why` is only built when the check fails.
#define REQUEST_EXPECT(ok, why) \
  do {                          \
    if (!(ok)) Bug(why);        \
  } while (0)

// Names a refusal's message may start with: the request fields (and the config file's).
bool StartsWithField(absl::string_view message) {
  static const auto* const kFields = new absl::flat_hash_set<absl::string_view>{"queue",
                                                                                "payload",
                                                                                "headers",
                                                                                "delay",
                                                                                "run_at",
                                                                                "dedup_key",
                                                                                "dedup_ttl",
                                                                                "max_attempts",
                                                                                "lease_duration",
                                                                                "concurrency_key",
                                                                                "worker_id",
                                                                                "max_jobs",
                                                                                "wait",
                                                                                "job_id",
                                                                                "lease_id",
                                                                                "checkpoint",
                                                                                "extend_by",
                                                                                "result",
                                                                                "retry_after",
                                                                                "error",
                                                                                "jobs",
                                                                                "policy",
                                                                                "default_policy",
                                                                                "queues",
                                                                                "config",
                                                                                "state",
                                                                                "states",
                                                                                "page_size",
                                                                                "page_token",
                                                                                "limit",
                                                                                "max_in_flight",
                                                                                "priority",
                                                                                "request",
                                                                                "acks",
                                                                                "timeout",
                                                                                "expire_at",
                                                                                "progress",
                                                                                "depends_on",
                                                                                "depends_on_index"};
  size_t n = 0;
  while (n < message.size() && (absl::ascii_islower(message[n]) || message[n] == '_')) ++n;
  return kFields->contains(message.substr(0, n));
}

// A refusal of the request's shape: before the broker, or the broker's INVALID_ARGUMENT.
void CheckShapeRefusal(const absl::Status& s, absl::string_view stage) {
  REQUEST_EXPECT(s.code() == Code::kInvalidArgument || s.code() == Code::kResourceExhausted,
                 absl::StrCat(stage, " refused with ", s.ToString(),
                              "; bad input must be INVALID_ARGUMENT or RESOURCE_EXHAUSTED"));
  REQUEST_EXPECT(StartsWithField(s.message()),
                 absl::StrCat(stage, " refused with \"", s.message(),
                              "\", which does not start with the field's name"));
}

// Any answer of the broker: one of `allowed`, and a refusal says why.
void CheckAnswer(const absl::Status& s, absl::Span<const Code> allowed, absl::string_view stage) {
  bool known = false;
  for (Code c : allowed) known = known || s.code() == c;
  REQUEST_EXPECT(known, absl::StrCat(stage, " answered ", s.ToString(), ", not a code it may use"));
  REQUEST_EXPECT(s.ok() || !s.message().empty(),
                 absl::StrCat(stage, " refused without a message: ", s.ToString()));
  if (s.code() == Code::kInvalidArgument) CheckShapeRefusal(s, stage);
}

// The documented limits, checked again here so that a slip in core/validation.cc shows.
bool ValidQueueName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}
bool ValidKey(absl::string_view key, bool required) {
  return key.size() <= 256 && (!required || !key.empty());
}
bool ValidLeaseLength(absl::Duration d) {
  return d == absl::ZeroDuration() || (d >= absl::Milliseconds(100) && d <= absl::Hours(12));
}

void CheckAccepted(const core::EnqueueSpec& s) {
  size_t header_bytes = 0;
  bool empty_header = false;
  for (const auto& [k, v] : s.headers) {
    header_bytes += k.size() + v.size();
    empty_header = empty_header || k.empty();
  }
  REQUEST_EXPECT(ValidQueueName(s.queue), absl::StrCat("accepted queue name \"", s.queue, "\""));
  REQUEST_EXPECT(s.payload.size() <= core::kMaxPayloadBytes, "accepted an oversized payload");
  REQUEST_EXPECT(!empty_header && header_bytes <= 64 << 10, "accepted bad headers");
  REQUEST_EXPECT(!(s.delay.has_value() && s.run_at.has_value()), "accepted delay with run_at");
  REQUEST_EXPECT(!s.delay.has_value() || *s.delay >= absl::ZeroDuration(),
                 "accepted a negative delay");
  REQUEST_EXPECT(ValidKey(s.dedup_key, false) && ValidKey(s.concurrency_key, false),
                 "accepted an over-long dedup_key or concurrency_key");
  REQUEST_EXPECT(
      !s.dedup_ttl.has_value() || (*s.dedup_ttl >= absl::ZeroDuration() && !s.dedup_key.empty()),
      "accepted a negative dedup_ttl, or one without a dedup_key");
  REQUEST_EXPECT(s.max_attempts >= 0 && s.max_attempts <= 1000,
                 absl::StrCat("accepted max_attempts ", s.max_attempts));
  REQUEST_EXPECT(ValidLeaseLength(s.lease_duration),
                 absl::StrCat("accepted lease_duration ", absl::FormatDuration(s.lease_duration)));
}

void CheckAccepted(const core::LeaseSpec& s) {
  REQUEST_EXPECT(ValidQueueName(s.queue), absl::StrCat("accepted queue name \"", s.queue, "\""));
  REQUEST_EXPECT(ValidKey(s.worker_id, true), "accepted a missing or over-long worker_id");
  REQUEST_EXPECT(s.max_jobs >= 0 && s.max_jobs <= 1000,
                 absl::StrCat("accepted max_jobs ", s.max_jobs));
  REQUEST_EXPECT(ValidLeaseLength(s.lease_duration),
                 absl::StrCat("accepted lease_duration ", absl::FormatDuration(s.lease_duration)));
}

void CheckAcceptedRef(const std::string& job_id, const std::string& lease_id) {
  REQUEST_EXPECT(ValidKey(job_id, true) && ValidKey(lease_id, true),
                 "accepted a missing or over-long job_id or lease_id");
}

void CheckAccepted(const core::QueuePolicy& p, absl::string_view where) {
  std::string why = absl::StrCat(where, ": accepted a policy out of range");
  REQUEST_EXPECT(p.max_concurrency >= 0 && p.max_concurrency_per_key >= 0, why);
  REQUEST_EXPECT(p.retry.max_attempts >= 1 && p.retry.max_attempts <= 1000, why);
  REQUEST_EXPECT(p.retry.initial_backoff >= absl::ZeroDuration() &&
                     p.retry.max_backoff >= p.retry.initial_backoff,
                 why);
  REQUEST_EXPECT(std::isfinite(p.retry.backoff_multiplier) && p.retry.backoff_multiplier >= 1.0,
                 why);
  REQUEST_EXPECT(p.retry.jitter == core::Jitter::kNone || p.retry.jitter == core::Jitter::kFull ||
                     p.retry.jitter == core::Jitter::kEqual,
                 why);
  REQUEST_EXPECT(p.lease_duration >= absl::Milliseconds(100) && p.lease_duration <= absl::Hours(12),
                 why);
  REQUEST_EXPECT(p.dedup_ttl >= absl::ZeroDuration(), why);
  REQUEST_EXPECT(p.completed_retention.max_count >= 0 && p.failed_retention.max_count >= 0, why);
  REQUEST_EXPECT(p.completed_retention.max_age >= absl::ZeroDuration() &&
                     p.failed_retention.max_age >= absl::ZeroDuration(),
                 why);
  REQUEST_EXPECT(p.max_length >= 0, why);
  REQUEST_EXPECT(std::isfinite(p.rate_limit.per_second) && p.rate_limit.per_second >= 0 &&
                     p.rate_limit.burst >= 0,
                 why);
}

// Everything an operator can see: queues with their policies and counts, and every job.
struct QueueView {
  std::string name;
  core::QueuePolicy policy;
  std::map<core::JobState, int64_t> counts;
  int64_t waiting_leases = 0;
  std::vector<core::Job> jobs;
  bool operator==(const QueueView&) const = default;
};

class Harness {
 public:
  Harness() : clock_(kStart) {}

  // A broker holding two jobs of kSeedQueue, the first leased (the "J"/"L" of requests).
  void Start() {
    core::BrokerOptions options;
    options.commit_mode = core::CommitPipeline::Mode::kInline;
    options.uniform = [] { return 0.5; };
    absl::StatusOr<std::unique_ptr<BlockingBroker>> opened =
        BlockingBroker::Open(store_, clock_, options);
    REQUEST_EXPECT(opened.ok(), absl::StrCat("Broker::Open: ", opened.status().ToString()));
    broker_ = std::move(*opened);
    core::EnqueueSpec first;
    first.queue = kSeedQueue;
    first.payload = "p";
    first.dedup_key = kSeedDedupKey;
    core::EnqueueSpec second = first;
    second.dedup_key.clear();
    REQUEST_EXPECT(broker_->EnqueueBatch({first, second}).ok(), "seed enqueue failed");
    absl::StatusOr<std::vector<core::LeasedJob>> leased =
        broker_->Lease(core::LeaseSpec{kSeedQueue, "seed", 1, absl::ZeroDuration()});
    REQUEST_EXPECT(leased.ok() && leased->size() == 1, "seed lease failed");
    job_id_ = leased->front().job_id;
    lease_id_ = leased->front().lease_id;
  }

  void Handle(RequestKind kind, const uint8_t* data, size_t size) {
    switch (kind) {
      case RequestKind::kEnqueue: {
        v1::EnqueueRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) Enqueue(req);
        return;
      }
      case RequestKind::kEnqueueBatch: {
        v1::EnqueueBatchRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) EnqueueBatch(req);
        return;
      }
      case RequestKind::kLease: {
        v1::LeaseRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) Lease(req);
        return;
      }
      case RequestKind::kHeartbeat: {
        v1::HeartbeatRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) Heartbeat(req);
        return;
      }
      case RequestKind::kAck: {
        v1::AckRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) Ack(req);
        return;
      }
      case RequestKind::kFail: {
        v1::FailRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) Fail(req);
        return;
      }
      case RequestKind::kRelease: {
        v1::ReleaseRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) Release(req);
        return;
      }
      case RequestKind::kWork: {
        v1::WorkRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) Work(req);
        return;
      }
      case RequestKind::kGetJob: {
        v1::GetJobRequest req;
        if (!req.ParseFromArray(data, static_cast<int>(size))) return;
        absl::StatusOr<core::Job> job = broker_->GetJob(JobId(req.job_id()));
        CheckAnswer(job.status(), {Code::kOk, Code::kInvalidArgument, Code::kNotFound}, "GetJob");
        return;
      }
      case RequestKind::kListJobs: {
        v1::ListJobsRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) ListJobs(req);
        return;
      }
      case RequestKind::kCancelJob: {
        v1::CancelJobRequest req;
        if (!req.ParseFromArray(data, static_cast<int>(size))) return;
        Change("CancelJob",
               {Code::kOk, Code::kInvalidArgument, Code::kNotFound, Code::kFailedPrecondition},
               [&] { return broker_->CancelJob(JobId(req.job_id())).status(); });
        return;
      }
      case RequestKind::kRetryJob: {
        v1::RetryJobRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) RetryJob(req);
        return;
      }
      case RequestKind::kDeleteJob: {
        v1::DeleteJobRequest req;
        if (!req.ParseFromArray(data, static_cast<int>(size))) return;
        Change("DeleteJob",
               {Code::kOk, Code::kInvalidArgument, Code::kNotFound, Code::kFailedPrecondition},
               [&] { return broker_->DeleteJob(JobId(req.job_id())); });
        return;
      }
      case RequestKind::kGetQueue: {
        v1::GetQueueRequest req;
        if (!req.ParseFromArray(data, static_cast<int>(size))) return;
        absl::StatusOr<core::QueueInfo> info = broker_->GetQueue(req.queue());
        CheckAnswer(info.status(), {Code::kOk, Code::kInvalidArgument, Code::kNotFound},
                    "GetQueue");
        if (info.ok()) CheckAccepted(info->policy, "GetQueue");
        return;
      }
      case RequestKind::kUpdateQueuePolicy: {
        v1::UpdateQueuePolicyRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) UpdateQueuePolicy(req);
        return;
      }
      case RequestKind::kPauseQueue:
      case RequestKind::kResumeQueue: {
        v1::PauseQueueRequest req;  // ResumeQueueRequest has the same single field
        if (!req.ParseFromArray(data, static_cast<int>(size))) return;
        const bool pause = kind == RequestKind::kPauseQueue;
        Change(pause ? "PauseQueue" : "ResumeQueue",
               {Code::kOk, Code::kInvalidArgument, Code::kNotFound},
               [&] { return broker_->SetQueuePaused(req.queue(), pause).status(); });
        return;
      }
      case RequestKind::kPurgeQueue: {
        v1::PurgeQueueRequest req;
        if (req.ParseFromArray(data, static_cast<int>(size))) PurgeQueue(req);
        return;
      }
      case RequestKind::kServerConfigJson:
        return ServerConfig(std::string(reinterpret_cast<const char*>(data), size));
      case RequestKind::kCount:
        return;
    }
  }

 private:
  // "J" and "L" name the leased seed job and its lease.
  std::string JobId(const std::string& id) const { return id == kSeedJobRef ? job_id_ : id; }
  std::string LeaseId(const std::string& id) const { return id == kSeedLeaseRef ? lease_id_ : id; }

  std::vector<QueueView> Snapshot() {
    std::vector<QueueView> out;
    for (const core::QueueInfo& q : broker_->ListQueues()) {
      QueueView v{q.name, q.policy, q.counts, q.waiting_leases, {}};
      core::ListJobsSpec spec;
      spec.queue = q.name;
      spec.page_size = core::kMaxLeaseBatch;
      absl::StatusOr<core::ListJobsResult> page = broker_->ListJobs(spec);
      REQUEST_EXPECT(page.ok(), absl::StrCat("ListJobs ", q.name, ": ", page.status().ToString()));
      v.jobs = std::move(page->jobs);
      out.push_back(std::move(v));
    }
    return out;
  }

  // Runs a changing call; a refusal must leave everything as it was.
  template <typename Call>
  absl::Status Changing(absl::string_view stage, absl::Span<const Code> allowed, Call call) {
    std::vector<QueueView> before = Snapshot();
    absl::Status s = call();
    CheckAnswer(s, allowed, stage);
    if (!s.ok())
      REQUEST_EXPECT(Snapshot() == before,
                     absl::StrCat(stage, " was refused (", s.ToString(), ") yet changed state"));
    return s;
  }
  template <typename Call>
  void Change(absl::string_view stage, absl::Span<const Code> allowed, Call call) {
    Changing(stage, allowed, std::move(call)).IgnoreError();  // Changing checked it
  }

  // A request the core checks refused must be refused by the broker too, with the same code.
  void SameRefusal(const absl::Status& validation, const absl::Status& broker,
                   absl::string_view stage) {
    REQUEST_EXPECT(broker.code() == validation.code(),
                   absl::StrCat(stage, ": validation said ", validation.ToString(), ", the broker ",
                                broker.ToString()));
  }

  void Enqueue(const v1::EnqueueRequest& req) {
    absl::StatusOr<core::EnqueueSpec> spec = FromProto(req);
    if (!spec.ok()) return CheckShapeRefusal(spec.status(), "FromProto(EnqueueRequest)");
    absl::Status valid = core::ValidateEnqueueSpec(*spec);
    if (!valid.ok()) CheckShapeRefusal(valid, "ValidateEnqueueSpec");
    if (valid.ok()) CheckAccepted(*spec);
    std::string job_id;
    absl::Status s = Changing(
        "Enqueue",
        {Code::kOk, Code::kInvalidArgument, Code::kResourceExhausted, Code::kAlreadyExists}, [&] {
          absl::StatusOr<core::EnqueueResult> r = broker_->Enqueue(*spec);
          if (r.ok()) job_id = r->job_id;
          return r.status();
        });
    if (!valid.ok()) return SameRefusal(valid, s, "Enqueue");
    const bool has_dependencies = !spec->depends_on.empty() || !spec->depends_on_index.empty();
    if (NeverStarts(*spec)) {
      // The one refusal that depends on the clock, so the broker makes it, not validation. A job
      // with dependencies too may be refused for those first: they are the broker's to check as
      // well, and either refusal names a field that is wrong.
      REQUEST_EXPECT(
          s.code() == Code::kInvalidArgument &&
              (absl::StartsWith(s.message(), "expire_at") ||
               (has_dependencies && absl::StartsWith(s.message(), "depends_on"))),
          absl::StrCat("Enqueue: a job that expires before it can start got ", s.ToString()));
      return;
    }
    if (has_dependencies && s.code() == Code::kInvalidArgument) {
      // Whether a dependency is a job here is the broker's to know (an index outside a batch is
      // EnqueueBatch's validation, which a single Enqueue goes through in the broker).
      REQUEST_EXPECT(absl::StartsWith(s.message(), "depends_on"),
                     absl::StrCat("Enqueue with dependencies refused with ", s.ToString()));
      return;
    }
    REQUEST_EXPECT(s.code() != Code::kInvalidArgument,
                   absl::StrCat("Enqueue: validation passed, the broker said ", s.ToString()));
    if (!s.ok()) return;
    absl::StatusOr<core::Job> job = broker_->GetJob(job_id);
    REQUEST_EXPECT(job.ok() && job->queue == spec->queue,
                   absl::StrCat("Enqueue answered job ", job_id, " which GetJob does not show"));
  }

  // Whether `spec` expires no later than it could first run (the broker refuses such a job).
  bool NeverStarts(const core::EnqueueSpec& spec) {
    if (!spec.expire_at.has_value()) return false;
    const absl::Time now = clock_.Now();
    const absl::Time first_run =
        spec.delay.has_value() ? now + *spec.delay : spec.run_at.value_or(now);
    return *spec.expire_at <= std::max(first_run, now);
  }

  void EnqueueBatch(const v1::EnqueueBatchRequest& req) {
    std::vector<core::EnqueueSpec> specs;
    for (int i = 0; i < req.jobs_size(); ++i) {
      absl::StatusOr<core::EnqueueSpec> spec = FromProto(req.jobs(i));
      if (!spec.ok()) return CheckShapeRefusal(spec.status(), "FromProto(EnqueueBatchRequest)");
      specs.push_back(std::move(*spec));
    }
    absl::Status valid;
    for (const core::EnqueueSpec& s : specs) {
      absl::Status v = core::ValidateEnqueueSpec(s);
      if (!v.ok()) CheckShapeRefusal(v, "ValidateEnqueueSpec");
      if (v.ok()) CheckAccepted(s);
      if (valid.ok()) valid = v;
    }
    size_t results = 0;
    absl::Status s = Changing(
        "EnqueueBatch",
        {Code::kOk, Code::kInvalidArgument, Code::kResourceExhausted, Code::kAlreadyExists}, [&] {
          absl::StatusOr<std::vector<core::EnqueueResult>> r = broker_->EnqueueBatch(specs);
          if (r.ok()) results = r->size();
          return r.status();
        });
    if (!valid.ok()) return SameRefusal(valid, s, "EnqueueBatch");
    REQUEST_EXPECT(!s.ok() || results == specs.size(), "EnqueueBatch: one result per job");
  }

  void Lease(const v1::LeaseRequest& req) {
    absl::StatusOr<core::LeaseSpec> spec = FromProto(req);
    if (!spec.ok()) return CheckShapeRefusal(spec.status(), "FromProto(LeaseRequest)");
    absl::Duration wait = absl::ZeroDuration();
    if (req.has_wait()) {
      absl::StatusOr<absl::Duration> w = FromProto(req.wait(), "wait");
      if (!w.ok()) return CheckShapeRefusal(w.status(), "FromProto(LeaseRequest.wait)");
      wait = *w;
    }
    absl::Status valid = core::ValidateLeaseSpec(*spec);
    if (!valid.ok()) CheckShapeRefusal(valid, "ValidateLeaseSpec");
    if (valid.ok()) CheckAccepted(*spec);
    const int max_jobs = std::max(spec->max_jobs, 1);
    absl::Status s = Changing("Lease", {Code::kOk, Code::kInvalidArgument}, [&] {
      // A long poll answers when a job comes or the wait ends; the clock has to get there.
      int answers = 0;
      absl::StatusOr<std::vector<core::LeasedJob>> got;
      broker_->Lease(*spec, wait, [&](absl::StatusOr<std::vector<core::LeasedJob>> r) {
        ++answers;
        got = std::move(r);
      });
      if (answers == 0) {
        clock_.Advance(wait + absl::Seconds(1));
        broker_->Tick();
      }
      REQUEST_EXPECT(answers == 1, absl::StrCat("Lease answered ", answers, " times"));
      REQUEST_EXPECT(!got.ok() || static_cast<int>(got->size()) <= max_jobs,
                     "Lease handed out more jobs than max_jobs");
      return got.status();
    });
    if (!valid.ok()) return SameRefusal(valid, s, "Lease");
    bool wait_ok = wait >= absl::ZeroDuration() && wait <= absl::Seconds(60);
    REQUEST_EXPECT(s.ok() == wait_ok, absl::StrCat("Lease with wait ", absl::FormatDuration(wait),
                                                   " answered ", s.ToString()));
  }

  // The lease calls share their answers: the job's and lease's checks, then the state's.
  static constexpr std::array<Code, 5> kLeaseCodes = {Code::kOk, Code::kInvalidArgument,
                                                      Code::kResourceExhausted, Code::kNotFound,
                                                      Code::kFailedPrecondition};

  void Heartbeat(const v1::HeartbeatRequest& req) {
    absl::StatusOr<core::HeartbeatSpec> spec = FromProto(req);
    if (!spec.ok()) return CheckShapeRefusal(spec.status(), "FromProto(HeartbeatRequest)");
    spec->job_id = JobId(spec->job_id);
    spec->lease_id = LeaseId(spec->lease_id);
    absl::Status valid = core::ValidateHeartbeatSpec(*spec);
    if (!valid.ok()) CheckShapeRefusal(valid, "ValidateHeartbeatSpec");
    if (valid.ok()) {
      CheckAcceptedRef(spec->job_id, spec->lease_id);
      REQUEST_EXPECT(ValidLeaseLength(spec->extend_by), "accepted a bad extend_by");
    }
    absl::Status s =
        Changing("Heartbeat", kLeaseCodes, [&] { return broker_->Heartbeat(*spec).status(); });
    if (!valid.ok()) SameRefusal(valid, s, "Heartbeat");
  }

  void Ack(const v1::AckRequest& req) {
    core::AckSpec spec = FromProto(req);
    spec.job_id = JobId(spec.job_id);
    spec.lease_id = LeaseId(spec.lease_id);
    absl::Status valid = core::ValidateAckSpec(spec);
    if (!valid.ok()) CheckShapeRefusal(valid, "ValidateAckSpec");
    if (valid.ok()) CheckAcceptedRef(spec.job_id, spec.lease_id);
    absl::Status s = Changing("Ack", kLeaseCodes, [&] { return broker_->Ack(spec); });
    if (!valid.ok()) SameRefusal(valid, s, "Ack");
  }

  // An ack_batch: every item checked as an Ack is, all applied by one call; a malformed item (or
  // an empty or oversized batch) refuses the whole batch and changes nothing.
  void AckBatch(const v1::AckBatchRequest& req) {
    std::vector<core::AckSpec> specs;
    absl::Status valid;
    if (req.acks_size() == 0 || req.acks_size() > core::kMaxLeaseBatch)
      valid = absl::InvalidArgumentError("acks: 1 to 1000");
    for (const v1::AckRequest& ack : req.acks()) {
      core::AckSpec spec = FromProto(ack);
      spec.job_id = JobId(spec.job_id);
      spec.lease_id = LeaseId(spec.lease_id);
      if (valid.ok()) {
        valid = core::ValidateAckSpec(spec);
        if (!valid.ok()) CheckShapeRefusal(valid, "ValidateAckSpec (ack_batch)");
      }
      specs.push_back(std::move(spec));
    }
    absl::StatusOr<std::vector<absl::Status>> items;
    absl::Status s = Changing("AckBatch", kLeaseCodes, [&] {
      items = broker_->AckBatch(specs);
      return items.status();
    });
    if (!valid.ok()) return SameRefusal(valid, s, "AckBatch");
    if (!items.ok()) return;
    REQUEST_EXPECT(items->size() == specs.size(), "AckBatch answered a different number of items");
    for (size_t i = 0; i < items->size() && i < specs.size(); ++i) {
      CheckAnswer((*items)[i], kLeaseCodes, "AckBatch item");
      if ((*items)[i].ok()) CheckAcceptedRef(specs[i].job_id, specs[i].lease_id);
    }
  }

  void Fail(const v1::FailRequest& req) {
    absl::StatusOr<core::FailSpec> spec = FromProto(req);
    if (!spec.ok()) return CheckShapeRefusal(spec.status(), "FromProto(FailRequest)");
    spec->job_id = JobId(spec->job_id);
    spec->lease_id = LeaseId(spec->lease_id);
    absl::Status valid = core::ValidateFailSpec(*spec);
    if (!valid.ok()) CheckShapeRefusal(valid, "ValidateFailSpec");
    if (valid.ok()) {
      CheckAcceptedRef(spec->job_id, spec->lease_id);
      REQUEST_EXPECT(!spec->retry_after.has_value() || *spec->retry_after >= absl::ZeroDuration(),
                     "accepted a negative retry_after");
    }
    absl::Status s = Changing("Fail", kLeaseCodes, [&] { return broker_->Fail(*spec).status(); });
    if (!valid.ok()) SameRefusal(valid, s, "Fail");
  }

  void Release(const v1::ReleaseRequest& req) {
    absl::StatusOr<core::ReleaseSpec> spec = FromProto(req);
    if (!spec.ok()) return CheckShapeRefusal(spec.status(), "FromProto(ReleaseRequest)");
    spec->job_id = JobId(spec->job_id);
    spec->lease_id = LeaseId(spec->lease_id);
    absl::Status valid = core::ValidateReleaseSpec(*spec);
    if (!valid.ok()) CheckShapeRefusal(valid, "ValidateReleaseSpec");
    if (valid.ok()) {
      CheckAcceptedRef(spec->job_id, spec->lease_id);
      REQUEST_EXPECT(!spec->delay.has_value() || *spec->delay >= absl::ZeroDuration(),
                     "accepted a negative release delay");
    }
    absl::Status s = Changing("Release", kLeaseCodes, [&] { return broker_->Release(*spec); });
    if (!valid.ok()) SameRefusal(valid, s, "Release");
  }

  // Pushes to a Work stream; only counted.
  class Sink final : public core::StreamSink {
   public:
    void PushJob(core::LeasedJob) override { ++pushed; }
    void LeaseLost(std::string, core::AttemptOutcome) override {}
    void CancelRequested(std::string) override {}
    void End(absl::Status) override {}
    int pushed = 0;
  };

  // What server/grpc/work_stream.cc does with each message of a Work stream.
  void Work(const v1::WorkRequest& req) {
    switch (req.request_case()) {
      case v1::WorkRequest::kSubscribe: {
        absl::StatusOr<core::SubscribeSpec> parsed = FromProto(req.subscribe());
        if (!parsed.ok()) return CheckShapeRefusal(parsed.status(), "FromProto(SubscribeRequest)");
        const core::SubscribeSpec& spec = *parsed;
        auto sink = std::make_shared<Sink>();
        std::optional<uint64_t> stream;
        absl::Status s = Changing("Subscribe", {Code::kOk, Code::kInvalidArgument}, [&] {
          absl::StatusOr<uint64_t> id = broker_->Subscribe(spec, sink);
          if (id.ok()) stream = *id;
          return id.status();
        });
        if (!s.ok()) return;
        for (const std::string& q : spec.queues)
          REQUEST_EXPECT(ValidQueueName(q), absl::StrCat("Subscribe accepted queue \"", q, "\""));
        REQUEST_EXPECT(ValidKey(spec.worker_id, true) && ValidLeaseLength(spec.lease_duration) &&
                           sink->pushed <= std::max(spec.max_in_flight, 1),
                       "Subscribe accepted a bad worker_id or lease_duration, or overfilled");
        broker_->Unsubscribe(*stream);
        return;
      }
      case v1::WorkRequest::kHeartbeat:
        return Heartbeat(req.heartbeat());
      case v1::WorkRequest::kAck:
        return Ack(req.ack());
      case v1::WorkRequest::kAckBatch:
        return AckBatch(req.ack_batch());
      case v1::WorkRequest::kFail:
        return Fail(req.fail());
      case v1::WorkRequest::kRelease:
        return Release(req.release());
      case v1::WorkRequest::kFlow: {
        auto sink = std::make_shared<Sink>();
        absl::StatusOr<uint64_t> stream = broker_->Subscribe(
            core::SubscribeSpec{{kSeedQueue}, "w", 1, absl::ZeroDuration()}, sink);
        REQUEST_EXPECT(stream.ok(), absl::StrCat("Subscribe: ", stream.status().ToString()));
        absl::Status s = broker_->SetFlow(*stream, req.flow().max_in_flight());
        CheckAnswer(s, {Code::kOk, Code::kInvalidArgument}, "SetFlow");
        REQUEST_EXPECT(s.ok() == (req.flow().max_in_flight() >= 0 &&
                                  req.flow().max_in_flight() <= core::kMaxInFlight),
                       absl::StrCat("SetFlow ", req.flow().max_in_flight(), ": ", s.ToString()));
        broker_->Unsubscribe(*stream);
        return;
      }
      case v1::WorkRequest::REQUEST_NOT_SET:
        return;
    }
  }

  void ListJobs(const v1::ListJobsRequest& req) {
    absl::StatusOr<core::ListJobsSpec> spec = FromProto(req);
    if (!spec.ok()) return CheckShapeRefusal(spec.status(), "FromProto(ListJobsRequest)");
    absl::StatusOr<core::ListJobsResult> page = broker_->ListJobs(*spec);
    CheckAnswer(page.status(), {Code::kOk, Code::kInvalidArgument, Code::kNotFound}, "ListJobs");
    if (!page.ok()) return;
    const size_t limit = spec->page_size == 0 ? 100 : spec->page_size;
    REQUEST_EXPECT(page->jobs.size() <= limit, "ListJobs: a page over page_size");
    for (const core::Job& j : page->jobs) {
      REQUEST_EXPECT(
          j.queue == spec->queue && (!spec->state.has_value() || j.state == *spec->state),
          "ListJobs: a job of another queue or state");
    }
  }

  // AdminService::RetryJob: exactly one of job_id and queue.
  void RetryJob(const v1::RetryJobRequest& req) {
    const bool one = !req.job_id().empty();
    if (one == !req.queue().empty()) return;  // the service refuses both and neither itself
    if (one) {
      if (req.state() != v1::JOB_STATE_UNSPECIFIED || req.dry_run() || req.limit() != 0) return;
      Change("RetryJob", {Code::kOk, Code::kNotFound, Code::kFailedPrecondition},
             [&] { return broker_->RetryJob(JobId(req.job_id())).status(); });
      return;
    }
    absl::StatusOr<core::RetryJobsSpec> spec = FromProto(req);
    if (!spec.ok()) return CheckShapeRefusal(spec.status(), "FromProto(RetryJobRequest)");
    Change("RetryJobs", {Code::kOk, Code::kInvalidArgument, Code::kNotFound},
           [&] { return broker_->RetryJobs(*spec).status(); });
  }

  void UpdateQueuePolicy(const v1::UpdateQueuePolicyRequest& req) {
    absl::StatusOr<core::PolicyOverride> policy = FromProto(req.policy(), "policy");
    if (!policy.ok()) return CheckShapeRefusal(policy.status(), "FromProto(QueuePolicy)");
    std::optional<core::QueuePolicy> effective;
    absl::Status s = Changing("UpdateQueuePolicy", {Code::kOk, Code::kInvalidArgument}, [&] {
      absl::StatusOr<core::QueueInfo> info =
          broker_->UpdateQueuePolicy(req.queue(), *policy, req.reset());
      if (info.ok()) effective = info->policy;
      return info.status();
    });
    if (!s.ok()) return;
    REQUEST_EXPECT(ValidQueueName(req.queue()),
                   absl::StrCat("UpdateQueuePolicy accepted queue \"", req.queue(), "\""));
    CheckAccepted(*effective, "UpdateQueuePolicy");
  }

  void PurgeQueue(const v1::PurgeQueueRequest& req) {
    absl::StatusOr<std::vector<core::JobState>> states = FromProto(req);
    if (!states.ok()) return CheckShapeRefusal(states.status(), "FromProto(PurgeQueueRequest)");
    Change("PurgeQueue", {Code::kOk, Code::kInvalidArgument, Code::kNotFound},
           [&] { return broker_->PurgeQueue(req.queue(), *states).status(); });
  }

  // A --config file: parsed (server/config/config.cc), checked (what --check-config and the start
  // run), then a broker must open with it, and every queue it names must hold a valid policy.
  void ServerConfig(const std::string& json) {
    absl::StatusOr<ServerPolicies> parsed = ParseServerConfig(json);
    if (!parsed.ok()) return CheckShapeRefusal(parsed.status(), "ParseServerConfig");
    absl::Status valid = core::ValidateStartPolicies(parsed->default_policy, parsed->queues);
    core::BrokerOptions options;
    options.commit_mode = core::CommitPipeline::Mode::kInline;
    options.default_policy = parsed->default_policy;
    options.queue_policies = parsed->queues;
    storage::MemoryStore store;
    absl::StatusOr<std::unique_ptr<BlockingBroker>> broker =
        BlockingBroker::Open(store, clock_, options);
    if (!valid.ok()) {
      CheckShapeRefusal(valid, "ValidateStartPolicies");
      return SameRefusal(valid, broker.status(), "Broker::Open");
    }
    REQUEST_EXPECT(broker.ok(), absl::StrCat("a config that passed ValidateStartPolicies: "
                                             "Broker::Open said ",
                                             broker.status().ToString()));
    for (const auto& [name, unused] : parsed->queues) {
      REQUEST_EXPECT(ValidQueueName(name), absl::StrCat("config accepted queue \"", name, "\""));
      absl::StatusOr<core::QueueInfo> info = (*broker)->GetQueue(name);
      REQUEST_EXPECT(info.ok(),
                     absl::StrCat("config queue ", name, ": ", info.status().ToString()));
      CheckAccepted(info->policy, absl::StrCat("config queue ", name));
    }
    // Any other queue gets the default policy.
    absl::StatusOr<core::QueueInfo> other = (*broker)->UpdateQueuePolicy("zz-not-in-config", {});
    REQUEST_EXPECT(other.ok(), absl::StrCat("default policy: ", other.status().ToString()));
    CheckAccepted(other->policy, "config default_policy");
  }

  FakeClock clock_;
  storage::MemoryStore store_;
  std::unique_ptr<BlockingBroker> broker_;
  std::string job_id_, lease_id_;
};

}  // namespace
}  // namespace jobbroker::fuzz

// Protobuf logs every string field that is not UTF-8; fuzzing makes thousands of them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using jobbroker::fuzz::RequestKind;
  if (size == 0) return 0;
  auto kind = static_cast<RequestKind>(data[0] % static_cast<int>(RequestKind::kCount));
  jobbroker::fuzz::Harness harness;
  harness.Start();
  harness.Handle(kind, data + 1, size - 1);
  return 0;
}
