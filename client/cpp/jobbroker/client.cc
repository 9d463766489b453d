#include "jobbroker/client.h"

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "jobbroker/coalescer.h"
#include "jobbroker/health.h"
#include "jobbroker/proto_time.h"
#include "jobbroker/router.h"

namespace jobbroker::client {
namespace {

constexpr char kFallbackAddress[] = "127.0.0.1:7070";
// The absl::Status payload of JobEndedError: the job, serialized.
constexpr char kEndedJobUrl[] = "type.jobbroker.dev/jobbroker.v1.Job";
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(5);
// The broker accepts messages this large; payloads themselves are limited to 4 MiB, but a batch
// or a page of jobs can be bigger.
constexpr int kMaxMessageBytes = 64 << 20;

absl::Status FromGrpc(const grpc::Status& s) {
  // grpc::StatusCode and absl::StatusCode share the canonical numbering.
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// UNAVAILABLE: the broker is down, restarting or draining. DEADLINE_EXCEEDED: this attempt ran
// out of time, perhaps after the broker acted on it, which is why only calls that are safe to
// repeat get here.
bool IsTransient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

// Runs `call` (a function of the Router::Node to call and a fresh grpc::ClientContext* that
// returns grpc::Status) on the node `route` names, with the per-attempt deadline, retrying
// transient failures when `retryable`. A transient failure also makes the router ask for the
// cluster's layout again before the next call, retried or not: the node may no longer lead.
// `timeout` replaces ClientOptions::timeout as each attempt's deadline when given (Lease's
// long poll). `first_deadline`, when earlier, ends the first attempt: a coalesced batch's
// callers' earliest deadline, which may have run while the batch waited.
template <typename Call>
absl::Status Run(const ClientOptions& options, Router& router, const Router::Route& route,
                 bool retryable, Call call, std::optional<absl::Duration> timeout = std::nullopt,
                 absl::Time first_deadline = absl::InfiniteFuture()) {
  const int attempts = retryable ? std::max(1, options.max_attempts) : 1;
  const absl::Duration attempt_timeout = timeout.value_or(options.timeout);
  absl::Duration wait = kFirstBackoff;
  for (int attempt = 1;; ++attempt) {
    const std::shared_ptr<const Router::Node> node = router.NodeFor(route);
    grpc::ClientContext ctx;
    absl::Time deadline = attempt_timeout == absl::InfiniteDuration()
                              ? absl::InfiniteFuture()
                              : absl::Now() + attempt_timeout;
    if (attempt == 1) deadline = std::min(deadline, first_deadline);
    if (deadline != absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(deadline));
    if (absl::Status s = AddCallMetadata(options.token, &ctx); !s.ok()) return s;
    absl::Status status = FromGrpc(call(*node, &ctx));
    if (IsTransient(status.code())) router.MarkStale();
    if (status.ok() || attempt >= attempts || !IsTransient(status.code())) return status;
    if (options.on_retry) options.on_retry(attempt, status, wait);
    absl::SleepFor(wait);
    wait = std::min(wait * 2, kMaxBackoff);
  }
}

// A batch is all or nothing within one partition: it goes to the leader of its first job's
// queue. One whose jobs span partitions is refused there (INVALID_ARGUMENT naming them).
Router::Route BatchRoute(const v1::EnqueueBatchRequest& request) {
  if (request.jobs().empty()) return Router::Route::Any();
  return Router::Route::Queue(request.jobs(0).queue());
}

Enqueued FromProto(const v1::EnqueueResponse& resp) {
  return Enqueued{.job_id = resp.job_id(), .deduplicated = resp.deduplicated()};
}

// The unary Enqueue, retried only with a dedup key. Free functions of the options and the
// router (not Client members) because the coalescer calls them and outlives a move of the
// Client.
absl::StatusOr<Enqueued> SendEnqueueCall(const ClientOptions& options, Router& router,
                                         const v1::EnqueueRequest& request,
                                         absl::Time first_deadline = absl::InfiniteFuture()) {
  v1::EnqueueResponse resp;
  absl::Status s = Run(
      options, router, Router::Route::Queue(request.queue()), !request.dedup_key().empty(),
      [&](const Router::Node& node, grpc::ClientContext* ctx) {
        resp.Clear();
        return node.broker->Enqueue(ctx, request, &resp);
      },
      std::nullopt, first_deadline);
  if (!s.ok()) return s;
  return FromProto(resp);
}

absl::StatusOr<std::vector<Enqueued>> SendEnqueueBatchCall(
    const ClientOptions& options, Router& router, const v1::EnqueueBatchRequest& request,
    absl::Time first_deadline = absl::InfiniteFuture()) {
  // A retry repeats the whole batch; only dedup keys make that harmless, and only if every job
  // has one.
  const bool retryable =
      !request.jobs().empty() &&
      std::all_of(request.jobs().begin(), request.jobs().end(),
                  [](const v1::EnqueueRequest& job) { return !job.dedup_key().empty(); });
  v1::EnqueueBatchResponse resp;
  absl::Status s = Run(
      options, router, BatchRoute(request), retryable,
      [&](const Router::Node& node, grpc::ClientContext* ctx) {
        resp.Clear();
        return node.broker->EnqueueBatch(ctx, request, &resp);
      },
      std::nullopt, first_deadline);
  if (!s.ok()) return s;
  std::vector<Enqueued> results;
  results.reserve(resp.results_size());
  for (const v1::EnqueueResponse& r : resp.results()) results.push_back(FromProto(r));
  return results;
}

// The broker's message limit (kMaxMessageBytes) bounds a batch.
constexpr int64_t kMaxBatchBytes = kMaxMessageBytes;

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN "))
    return absl::InvalidArgumentError(absl::StrCat(path, ": holds no PEM block"));
  return text.str();
}

absl::StatusOr<TlsOptions> ReadTlsFiles(const std::string& ca_file, const std::string& cert_file,
                                        const std::string& key_file) {
  if (cert_file.empty() != key_file.empty())
    return absl::InvalidArgumentError(
        "the client certificate and its key go together: give both or neither");
  TlsOptions tls;
  std::pair<const std::string*, std::string*> files[] = {
      {&ca_file, &tls.ca_pem}, {&cert_file, &tls.cert_pem}, {&key_file, &tls.key_pem}};
  const char* const names[] = {"CA file", "certificate file", "key file"};
  for (size_t i = 0; i < std::size(files); ++i) {
    if (files[i].first->empty()) continue;
    absl::StatusOr<std::string> pem = ReadPemFile(*files[i].first);
    if (!pem.ok())
      return absl::InvalidArgumentError(absl::StrCat(names[i], " ", pem.status().message()));
    *files[i].second = *std::move(pem);
  }
  return tls;
}

std::string DefaultAddress() {
  const char* env = std::getenv("JOBBROKER_ADDRESS");
  return env != nullptr && *env != '\0' ? env : kFallbackAddress;
}

std::vector<std::string> SplitAddresses(std::string_view text) {
  std::vector<std::string> addresses;
  for (absl::string_view item :
       absl::StrSplit(absl::string_view(text.data(), text.size()), ',', absl::SkipWhitespace())) {
    addresses.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return addresses;
}

std::string DefaultToken() {
  const char* env = std::getenv("JOBBROKER_TOKEN");
  return env != nullptr ? env : "";
}

absl::Status AddBearerToken(const std::string& token, grpc::ClientContext* ctx) {
  if (token.empty()) return absl::OkStatus();
  for (char c : token) {
    if (c < 0x21 || c > 0x7e)
      return absl::InvalidArgumentError(
          "token must be printable ASCII without spaces (a token file's trailing newline?)");
  }
  ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  return absl::OkStatus();
}

absl::Status AddCallMetadata(const std::string& token, grpc::ClientContext* ctx) {
  ctx->AddMetadata("jobbroker-client", kClientName);
  return AddBearerToken(token, ctx);
}

std::shared_ptr<grpc::Channel> DialBroker(const std::string& address,
                                          const std::optional<TlsOptions>& tls,
                                          const KeepaliveOptions& keepalive) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // gRPC's reconnect backoff starts at 1 s (up to 120 s), and a call made while it runs fails at
  // once with UNAVAILABLE. Keep it in step with our own retry waits, so that a retry after a
  // broker restart finds the channel reconnecting rather than still backing off. Not
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: despite its name it is the connect timeout (20 s), and a
  // short one would fail connects to a slow or distant broker.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Names this library in the user agent, which the broker shows in ListWorkers.
  args.SetString(GRPC_ARG_PRIMARY_USER_AGENT_STRING, kClientName);
  if (keepalive.time > absl::ZeroDuration()) {
    args.SetInt(
        GRPC_ARG_KEEPALIVE_TIME_MS,
        static_cast<int>(absl::ToInt64Milliseconds(std::min(keepalive.time, absl::Hours(24)))));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                static_cast<int>(absl::ToInt64Milliseconds(keepalive.timeout)));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    // gRPC otherwise stops after two pings with nothing sent between: an idle Work stream would
    // be checked twice, then never again.
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls.has_value()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls->ca_pem;
    ssl.pem_cert_chain = tls->cert_pem;
    ssl.pem_private_key = tls->key_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!tls->server_name.empty()) args.SetSslTargetNameOverride(tls->server_name);
  }
  return grpc::CreateCustomChannel(address.empty() ? DefaultAddress() : address, credentials, args);
}

v1::EnqueueRequest MakeEnqueueRequest(const std::string& queue, const std::string& payload,
                                      const EnqueueOptions& options) {
  v1::EnqueueRequest req;
  req.set_queue(queue);
  req.set_payload(payload);
  req.mutable_headers()->insert(options.headers.begin(), options.headers.end());
  req.set_priority(options.priority);
  if (options.delay.has_value()) *req.mutable_delay() = ToProtoDuration(*options.delay);
  if (options.run_at.has_value()) *req.mutable_run_at() = ToProtoTimestamp(*options.run_at);
  req.set_dedup_key(options.dedup_key);
  if (options.dedup_ttl.has_value()) {
    *req.mutable_dedup_ttl() = ToProtoDuration(*options.dedup_ttl);
  }
  req.set_max_attempts(options.max_attempts);
  if (options.lease_duration.has_value()) {
    *req.mutable_lease_duration() = ToProtoDuration(*options.lease_duration);
  }
  req.set_concurrency_key(options.concurrency_key);
  if (options.timeout.has_value()) *req.mutable_timeout() = ToProtoDuration(*options.timeout);
  if (options.expire_at.has_value())
    *req.mutable_expire_at() = ToProtoTimestamp(*options.expire_at);
  for (const std::string& id : options.depends_on) req.add_depends_on(id);
  return req;
}

absl::Status ValidateClientOptions(const ClientOptions& options) {
  if (options.batch_max_jobs < 1 || options.batch_max_jobs > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_max_jobs must be 1 to 1000, not ", options.batch_max_jobs));
  }
  if (options.batch_max_bytes < 1 || options.batch_max_bytes > kMaxBatchBytes) {
    return absl::InvalidArgumentError(absl::StrCat("batch_max_bytes must be 1 to ", kMaxBatchBytes,
                                                   " (64 MiB), not ", options.batch_max_bytes));
  }
  if (options.batch_linger < absl::ZeroDuration() ||
      options.batch_linger == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_linger must be finite and not negative, not ",
                     absl::FormatDuration(options.batch_linger)));
  }
  if (options.batch_max_in_flight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_max_in_flight must be at least 1, not ", options.batch_max_in_flight));
  }
  return ValidateKeepalive(options.keepalive);
}

absl::Status ValidateKeepalive(const KeepaliveOptions& keepalive) {
  if (keepalive.time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("keepalive.time must not be negative, not ",
                                                   absl::FormatDuration(keepalive.time)));
  }
  if (keepalive.time > absl::ZeroDuration() &&
      (keepalive.timeout < absl::Milliseconds(1) || keepalive.timeout > absl::Hours(1))) {
    return absl::InvalidArgumentError(absl::StrCat("keepalive.timeout must be 1ms to 1h, not ",
                                                   absl::FormatDuration(keepalive.timeout)));
  }
  return absl::OkStatus();
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  // A constructor has no other way to refuse; ValidateClientOptions offers the check without.
  if (absl::Status valid = ValidateClientOptions(options_); !valid.ok()) {
    throw std::invalid_argument(std::string(valid.message()));
  }
  if (options_.address.empty() && options_.addresses.empty()) options_.address = DefaultAddress();
  if (options_.token.empty()) options_.token = DefaultToken();
  router_ = std::make_unique<Router>(
      Router::Options::From(options_.address, options_.addresses, options_.tls, options_.token,
                            options_.timeout, options_.channel, options_.keepalive));
  if (options_.batching) {
    // The router lives on the heap, so the pointer survives a move of this Client.
    auto options = std::make_shared<const ClientOptions>(options_);
    Router* router = router_.get();
    coalescer_ = std::make_unique<Coalescer>(
        Coalescer::Options{.max_jobs = options_.batch_max_jobs,
                           .max_bytes = options_.batch_max_bytes,
                           .linger = options_.batch_linger,
                           .max_in_flight = options_.batch_max_in_flight},
        Coalescer::Transport{
            .send_one =
                [options, router](const v1::EnqueueRequest& job, absl::Time deadline) {
                  return SendEnqueueCall(*options, *router, job, deadline);
                },
            .send_batch =
                [options, router](const v1::EnqueueBatchRequest& jobs, absl::Time deadline) {
                  return SendEnqueueBatchCall(*options, *router, jobs, deadline);
                },
            .partition_count = [router] { return router->HeldPartitionCount(); }});
  }
}

Client::~Client() { Close(); }
Client::Client(Client&&) noexcept = default;

Client& Client::operator=(Client&& other) noexcept {
  if (this == &other) return *this;
  // This client's batches use its router: drain them before the router goes.
  Close();
  coalescer_.reset();
  options_ = std::move(other.options_);
  router_ = std::move(other.router_);
  coalescer_ = std::move(other.coalescer_);
  enqueue_middlewares_ = std::move(other.enqueue_middlewares_);
  return *this;
}

void Client::Close() {
  if (coalescer_ != nullptr) coalescer_->Close();
}

const std::shared_ptr<grpc::Channel>& Client::channel() const { return router_->first()->channel; }

absl::StatusOr<Enqueued> Client::Enqueue(const std::string& queue, const std::string& payload,
                                         const EnqueueOptions& options) {
  return Enqueue(MakeEnqueueRequest(queue, payload, options), options.batch);
}

void Client::Use(EnqueueMiddleware middleware) {
  enqueue_middlewares_.push_back(std::move(middleware));
}

absl::StatusOr<Enqueued> Client::Enqueue(const v1::EnqueueRequest& request, bool batch) {
  if (enqueue_middlewares_.empty()) return SendOne(request, batch);
  v1::EnqueueBatchRequest one;
  *one.add_jobs() = request;
  // The middlewares run per call, above the coalescer: each job keeps its own producer span.
  absl::StatusOr<std::vector<Enqueued>> results =
      ThroughMiddlewares(one, [this, batch](v1::EnqueueBatchRequest& jobs) {
        absl::StatusOr<Enqueued> enqueued = SendOne(jobs.jobs(0), batch);
        if (!enqueued.ok()) return absl::StatusOr<std::vector<Enqueued>>(enqueued.status());
        return absl::StatusOr<std::vector<Enqueued>>(std::vector<Enqueued>{*std::move(enqueued)});
      });
  if (!results.ok()) return results.status();
  if (results->size() != 1) {
    return absl::InternalError(
        absl::StrCat("a producer middleware answered ", results->size(), " results for one job"));
  }
  return (*results)[0];
}

absl::StatusOr<std::vector<Enqueued>> Client::EnqueueBatch(const v1::EnqueueBatchRequest& request) {
  if (enqueue_middlewares_.empty()) return SendEnqueueBatch(request);
  return ThroughMiddlewares(
      request, [this](v1::EnqueueBatchRequest& jobs) { return SendEnqueueBatch(jobs); });
}

absl::StatusOr<std::vector<Enqueued>> Client::ThroughMiddlewares(
    const v1::EnqueueBatchRequest& jobs, const EnqueueHandler& send) {
  const int count = jobs.jobs_size();
  // The middlewares may change jobs, not their number: the results answer them in order.
  EnqueueHandler chain = [&send, count](v1::EnqueueBatchRequest& changed) {
    if (changed.jobs_size() != count) {
      return absl::StatusOr<std::vector<Enqueued>>(absl::InvalidArgumentError(absl::StrCat(
          "a producer middleware turned ", count, " jobs into ", changed.jobs_size())));
    }
    return send(changed);
  };
  // Built per call: a few allocations beside a network round trip.
  for (auto m = enqueue_middlewares_.rbegin(); m != enqueue_middlewares_.rend(); ++m) {
    chain = [middleware = &*m, next = std::move(chain)](v1::EnqueueBatchRequest& changed) {
      return (*middleware)(changed, next);
    };
  }
  v1::EnqueueBatchRequest changeable = jobs;
  return chain(changeable);
}

absl::StatusOr<Enqueued> Client::SendOne(const v1::EnqueueRequest& request, bool batch) {
  if (!batch || coalescer_ == nullptr) return SendEnqueueCall(options_, *router_, request);
  // This call's deadline, counted from now as a unary call's would be; the batch it joins ends
  // its first attempt by the earliest of its callers'.
  const absl::Time deadline = options_.timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + options_.timeout;
  return coalescer_->Enqueue(request, deadline);
}

absl::StatusOr<std::vector<Enqueued>> Client::SendEnqueueBatch(
    const v1::EnqueueBatchRequest& request) {
  return SendEnqueueBatchCall(options_, *router_, request);
}

absl::StatusOr<v1::Job> Client::GetJob(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::Job job;
  absl::Status s = Run(options_, *router_, Router::Route::Job(job_id), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         job.Clear();
                         return node.admin->GetJob(ctx, req, &job);
                       });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> Client::WatchJob(const std::string& job_id, absl::Duration timeout,
                                         const std::function<void(const v1::Job&)>& on_change) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  absl::Duration wait = kFirstBackoff;
  while (true) {
    const std::shared_ptr<const Router::Node> node = router_->NodeFor(Router::Route::Job(job_id));
    grpc::ClientContext ctx;
    if (deadline != absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(deadline));
    if (absl::Status s = AddCallMetadata(options_.token, &ctx); !s.ok()) return s;
    std::unique_ptr<grpc::ClientReader<v1::Job>> reader = node->admin->WatchJob(&ctx, req);
    v1::Job job;
    std::optional<v1::Job> last;
    while (reader->Read(&job)) {
      if (on_change) on_change(job);
      last = job;
    }
    absl::Status status = FromGrpc(reader->Finish());
    // The call ends OK right after the message that shows the job ended.
    if (status.ok() && last.has_value()) return *std::move(last);
    if (status.ok()) status = absl::UnavailableError("the watch ended without the job's end");
    if (!IsTransient(status.code()) || absl::Now() >= deadline) return status;
    router_->MarkStale();
    absl::SleepFor(std::min(wait, deadline - absl::Now()));
    wait = std::min(wait * 2, kMaxBackoff);
  }
}

absl::StatusOr<v1::Job> Client::EnqueueAndWait(const std::string& queue, const std::string& payload,
                                               const EnqueueOptions& options,
                                               absl::Duration timeout) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  absl::StatusOr<Enqueued> enqueued = Enqueue(queue, payload, options);
  if (!enqueued.ok()) return enqueued.status();
  absl::StatusOr<v1::Job> ended =
      WatchJob(enqueued->job_id, deadline == absl::InfiniteFuture() ? absl::InfiniteDuration()
                                                                    : deadline - absl::Now());
  if (!ended.ok()) return ended.status();
  if (ended->state() != v1::JOB_STATE_COMPLETED) return JobEndedError(*ended);
  return ended;
}

absl::Status JobEndedError(const v1::Job& job) {
  std::string message = absl::StrCat("job ", job.id(), " ended ", v1::JobState_Name(job.state()));
  if (job.state() == v1::JOB_STATE_FAILED)
    absl::StrAppend(&message, " (", v1::FailReason_Name(job.fail_reason()), ")");
  if (!job.last_error().empty()) absl::StrAppend(&message, ": ", job.last_error());
  absl::Status status = absl::AbortedError(message);
  status.SetPayload(kEndedJobUrl, absl::Cord(job.SerializeAsString()));
  return status;
}

std::optional<v1::Job> EndedJob(const absl::Status& status) {
  const auto payload = status.GetPayload(kEndedJobUrl);
  if (!payload.has_value()) return std::nullopt;
  v1::Job job;
  if (!job.ParseFromString(std::string(*payload))) return std::nullopt;
  return job;
}

absl::StatusOr<std::vector<v1::LeasedJob>> Client::Lease(const v1::LeaseRequest& request) {
  v1::LeaseResponse resp;
  // The broker holds the call open for up to `wait` before it answers with no job.
  const absl::Duration timeout = options_.timeout + FromProtoDuration(request.wait());
  // Not retried: a repeat after a lost reply would lease more jobs, and those the first one
  // leased would sit until their leases expire.
  absl::Status s = Run(
      options_, *router_, Router::Route::Queue(request.queue()),
      /*retryable=*/false,
      [&](const Router::Node& node, grpc::ClientContext* ctx) {
        return node.broker->Lease(ctx, request, &resp);
      },
      timeout);
  if (!s.ok()) return s;
  return std::vector<v1::LeasedJob>(resp.jobs().begin(), resp.jobs().end());
}

absl::StatusOr<v1::HeartbeatResponse> Client::Heartbeat(const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse resp;
  absl::Status s = Run(options_, *router_, Router::Route::Job(request.job_id()),
                       /*retryable=*/true, [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.broker->Heartbeat(ctx, request, &resp);
                       });
  if (!s.ok()) return s;
  return resp;
}

absl::Status Client::Ack(const std::string& job_id, const std::string& lease_id,
                         const std::string& result) {
  v1::AckRequest req;
  req.set_job_id(job_id);
  req.set_lease_id(lease_id);
  req.set_result(result);
  v1::AckResponse resp;
  // Retried: the broker answers a repeated ack of the same lease OK.
  return Run(options_, *router_, Router::Route::Job(job_id), /*retryable=*/true,
             [&](const Router::Node& node, grpc::ClientContext* ctx) {
               return node.broker->Ack(ctx, req, &resp);
             });
}

absl::StatusOr<v1::FailResponse> Client::Fail(const v1::FailRequest& request) {
  v1::FailResponse resp;
  absl::Status s = Run(options_, *router_, Router::Route::Job(request.job_id()),
                       /*retryable=*/true, [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.broker->Fail(ctx, request, &resp);
                       });
  if (!s.ok()) return s;
  return resp;
}

absl::Status Client::Release(const std::string& job_id, const std::string& lease_id,
                             absl::Duration delay) {
  v1::ReleaseRequest req;
  req.set_job_id(job_id);
  req.set_lease_id(lease_id);
  if (delay > absl::ZeroDuration()) *req.mutable_delay() = ToProtoDuration(delay);
  v1::ReleaseResponse resp;
  return Run(options_, *router_, Router::Route::Job(job_id), /*retryable=*/true,
             [&](const Router::Node& node, grpc::ClientContext* ctx) {
               return node.broker->Release(ctx, req, &resp);
             });
}

absl::StatusOr<v1::ListJobsResponse> Client::ListJobs(const v1::ListJobsRequest& request) {
  v1::ListJobsResponse resp;
  absl::Status s = Run(options_, *router_, Router::Route::Queue(request.queue()),
                       /*retryable=*/true, [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.admin->ListJobs(ctx, request, &resp);
                       });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::Job> Client::CancelJob(const std::string& job_id) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::Job job;
  // Not retried: after a lost reply the repeat would answer FAILED_PRECONDITION (the job has
  // already ended), hiding that the cancel worked.
  absl::Status s = Run(options_, *router_, Router::Route::Job(job_id), /*retryable=*/false,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         return node.admin->CancelJob(ctx, req, &job);
                       });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> Client::RetryJob(const std::string& job_id) {
  v1::RetryJobRequest req;
  req.set_job_id(job_id);
  absl::StatusOr<v1::RetryJobResponse> resp = RetryJob(req);
  if (!resp.ok()) return resp.status();
  return resp->job();
}

absl::StatusOr<v1::RetryJobResponse> Client::RetryJob(const v1::RetryJobRequest& request) {
  v1::RetryJobResponse resp;
  const Router::Route route = request.queue().empty() ? Router::Route::Job(request.job_id())
                                                      : Router::Route::Queue(request.queue());
  // Not retried: after a lost reply the repeat would answer FAILED_PRECONDITION (the job is
  // READY now) or, in bulk, find nothing left and answer retried = 0.
  absl::Status s = Run(options_, *router_, route, /*retryable=*/false,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         return node.admin->RetryJob(ctx, request, &resp);
                       });
  if (!s.ok()) return s;
  return resp;
}

absl::Status Client::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest req;
  req.set_job_id(job_id);
  v1::DeleteJobResponse resp;
  // Not retried: after a lost reply the repeat would answer NOT_FOUND.
  return Run(options_, *router_, Router::Route::Job(job_id), /*retryable=*/false,
             [&](const Router::Node& node, grpc::ClientContext* ctx) {
               return node.admin->DeleteJob(ctx, req, &resp);
             });
}

absl::StatusOr<std::vector<v1::QueueInfo>> Client::ListQueues() {
  v1::ListQueuesRequest req;
  v1::ListQueuesResponse resp;
  absl::Status s = Run(options_, *router_, Router::Route::Any(), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.admin->ListQueues(ctx, req, &resp);
                       });
  if (!s.ok()) return s;
  return std::vector<v1::QueueInfo>(resp.queues().begin(), resp.queues().end());
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Client::ListWorkers(const std::string& queue) {
  v1::ListWorkersRequest req;
  req.set_queue(queue);
  v1::ListWorkersResponse resp;
  absl::Status s = Run(options_, *router_, Router::Route::Any(), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.admin->ListWorkers(ctx, req, &resp);
                       });
  if (!s.ok()) return s;
  return std::vector<v1::WorkerInfo>(resp.workers().begin(), resp.workers().end());
}

absl::StatusOr<v1::Schedule> Client::PutSchedule(const v1::Schedule& schedule) {
  v1::PutScheduleRequest req;
  *req.mutable_schedule() = schedule;
  v1::Schedule resp;
  // Retried: putting the same schedule twice leaves it as once.
  absl::Status s = Run(options_, *router_, Router::Route::Queue(schedule.template_().queue()),
                       /*retryable=*/true, [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.admin->PutSchedule(ctx, req, &resp);
                       });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::Schedule> Client::GetSchedule(const std::string& schedule_id) {
  v1::GetScheduleRequest req;
  req.set_schedule_id(schedule_id);
  v1::Schedule resp;
  absl::Status s = Run(options_, *router_, Router::Route::Any(), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.admin->GetSchedule(ctx, req, &resp);
                       });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<v1::Schedule>> Client::ListSchedules(const std::string& queue) {
  v1::ListSchedulesRequest req;
  req.set_queue(queue);
  v1::ListSchedulesResponse resp;
  const Router::Route route = queue.empty() ? Router::Route::Any() : Router::Route::Queue(queue);
  absl::Status s = Run(options_, *router_, route, /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.admin->ListSchedules(ctx, req, &resp);
                       });
  if (!s.ok()) return s;
  return std::vector<v1::Schedule>(resp.schedules().begin(), resp.schedules().end());
}

absl::Status Client::DeleteSchedule(const std::string& schedule_id) {
  v1::DeleteScheduleRequest req;
  req.set_schedule_id(schedule_id);
  v1::DeleteScheduleResponse resp;
  // Not retried: after a lost reply the repeat would answer NOT_FOUND.
  return Run(options_, *router_, Router::Route::Any(), /*retryable=*/false,
             [&](const Router::Node& node, grpc::ClientContext* ctx) {
               return node.admin->DeleteSchedule(ctx, req, &resp);
             });
}

absl::StatusOr<v1::TriggerScheduleResponse> Client::TriggerSchedule(
    const std::string& schedule_id) {
  v1::TriggerScheduleRequest req;
  req.set_schedule_id(schedule_id);
  v1::TriggerScheduleResponse resp;
  // Not retried: a repeat in a later second would be a second run.
  absl::Status s = Run(options_, *router_, Router::Route::Any(), /*retryable=*/false,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         return node.admin->TriggerSchedule(ctx, req, &resp);
                       });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::QueueInfo> Client::GetQueue(const std::string& queue) {
  v1::GetQueueRequest req;
  req.set_queue(queue);
  v1::QueueInfo info;
  absl::Status s = Run(options_, *router_, Router::Route::Queue(queue), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         info.Clear();
                         return node.admin->GetQueue(ctx, req, &info);
                       });
  if (!s.ok()) return s;
  return info;
}

absl::StatusOr<v1::QueueInfo> Client::UpdateQueuePolicy(
    const v1::UpdateQueuePolicyRequest& request) {
  v1::QueueInfo info;
  // Safe to repeat: the same fields set to the same values (after the same reset) end in the
  // same policy.
  absl::Status s = Run(options_, *router_, Router::Route::Queue(request.queue()),
                       /*retryable=*/true, [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         info.Clear();
                         return node.admin->UpdateQueuePolicy(ctx, request, &info);
                       });
  if (!s.ok()) return s;
  return info;
}

absl::StatusOr<v1::QueueInfo> Client::PauseQueue(const std::string& queue) {
  v1::PauseQueueRequest req;
  req.set_queue(queue);
  v1::QueueInfo info;
  // Safe to repeat: pausing a paused queue leaves it paused.
  absl::Status s = Run(options_, *router_, Router::Route::Queue(queue), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         info.Clear();
                         return node.admin->PauseQueue(ctx, req, &info);
                       });
  if (!s.ok()) return s;
  return info;
}

absl::StatusOr<v1::QueueInfo> Client::ResumeQueue(const std::string& queue) {
  v1::ResumeQueueRequest req;
  req.set_queue(queue);
  v1::QueueInfo info;
  absl::Status s = Run(options_, *router_, Router::Route::Queue(queue), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         info.Clear();
                         return node.admin->ResumeQueue(ctx, req, &info);
                       });
  if (!s.ok()) return s;
  return info;
}

absl::StatusOr<int64_t> Client::PurgeQueue(const std::string& queue,
                                           const std::vector<v1::JobState>& states) {
  v1::PurgeQueueRequest req;
  req.set_queue(queue);
  for (v1::JobState state : states) req.add_states(state);
  v1::PurgeQueueResponse resp;
  // Safe to repeat: a second purge removes what the first did not get to.
  absl::Status s = Run(options_, *router_, Router::Route::Queue(queue), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         resp.Clear();
                         return node.admin->PurgeQueue(ctx, req, &resp);
                       });
  if (!s.ok()) return s;
  return resp.purged();
}

absl::Status Client::Health() {
  int serving = kHealthUnknown;
  absl::Status s = Run(options_, *router_, Router::Route::Any(), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         return CheckHealth(ctx, node.channel, "", &serving);
                       });
  if (!s.ok()) return s;
  if (serving != kHealthServing) {
    // It answered, but is not taking work (e.g. shutting down): as good as unavailable.
    return absl::UnavailableError(
        absl::StrCat("health check answered ", HealthStatusName(serving)));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ClusterInfo> Client::GetCluster() {
  v1::GetClusterRequest req;
  v1::ClusterInfo info;
  absl::Status s = Run(options_, *router_, Router::Route::Any(), /*retryable=*/true,
                       [&](const Router::Node& node, grpc::ClientContext* ctx) {
                         info.Clear();
                         return node.admin->GetCluster(ctx, req, &info);
                       });
  if (!s.ok()) return s;
  return info;
}

}  // namespace jobbroker::client
