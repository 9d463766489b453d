#include "cluster/etcd/grpc_etcd.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "core/status_macros.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"

namespace jobbroker::cluster {

namespace pb = ::etcdserverpb;

struct GrpcEtcd::Endpoint {
  std::string url;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::unique_ptr<pb::Auth::Stub> auth;
};

struct GrpcEtcd::WatchState {
  WatchId id = 0;
  std::string prefix;
  WatchCallback callback;
  // Touched by the watch's thread only: the first revision not yet delivered.
  int64_t next_revision = 0;
  std::thread thread;

  absl::Mutex mu;
  // The context of the stream being read, so that CancelWatch can end it.
  grpc::ClientContext* context ABSL_GUARDED_BY(mu) = nullptr;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  absl::CondVar wake;
  // Held while joining `thread`, which two threads must not do at once.
  absl::Mutex join_mu;
};

namespace {

// etcd's codes (etcdserver/api/v3rpc/rpctypes) carry over: kNotFound for a missing lease,
// kOutOfRange for a compacted or future revision, kInvalidArgument for a refused request. An
// etcd that cannot be reached, has no leader or did not answer in time is kUnavailable.
absl::Status FromGrpc(const grpc::Status& status, absl::string_view what, absl::string_view url) {
  if (status.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", status.error_message(), " (etcd ", url, ")");
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED:
      return absl::UnavailableError(message);
    default:
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()), message);
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read ", what, " ", path));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  return KeyValue{kv.key(),          kv.value(),   kv.create_revision(),
                  kv.mod_revision(), kv.version(), kv.lease()};
}

std::vector<KeyValue> FromProto(const google::protobuf::RepeatedPtrField<mvccpb::KeyValue>& kvs) {
  std::vector<KeyValue> out;
  out.reserve(kvs.size());
  for (const mvccpb::KeyValue& kv : kvs) out.push_back(FromProto(kv));
  return out;
}

// etcd's range for "every key starting with `prefix`": [prefix, PrefixRangeEnd(prefix)), or
// ["\0", "\0") (every key) for an empty prefix.
std::pair<std::string, std::string> PrefixRange(const std::string& prefix) {
  if (prefix.empty()) return {std::string(1, '\0'), std::string(1, '\0')};
  return {prefix, PrefixRangeEnd(prefix)};
}

pb::Compare ToProto(const Compare& c) {
  pb::Compare out;
  out.set_key(c.key);
  switch (c.op) {
    case Compare::Op::kEqual:
      out.set_result(pb::Compare::EQUAL);
      break;
    case Compare::Op::kNotEqual:
      out.set_result(pb::Compare::NOT_EQUAL);
      break;
    case Compare::Op::kLess:
      out.set_result(pb::Compare::LESS);
      break;
    case Compare::Op::kGreater:
      out.set_result(pb::Compare::GREATER);
      break;
  }
  switch (c.target) {
    case Compare::Target::kCreateRevision:
      out.set_target(pb::Compare::CREATE);
      out.set_create_revision(c.number);
      break;
    case Compare::Target::kModRevision:
      out.set_target(pb::Compare::MOD);
      out.set_mod_revision(c.number);
      break;
    case Compare::Target::kVersion:
      out.set_target(pb::Compare::VERSION);
      out.set_version(c.number);
      break;
    case Compare::Target::kValue:
      out.set_target(pb::Compare::VALUE);
      out.set_value(c.value);
      break;
  }
  return out;
}

pb::RequestOp ToProto(const TxnOp& op) {
  pb::RequestOp out;
  switch (op.type) {
    case TxnOp::Type::kPut: {
      pb::PutRequest* put = out.mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case TxnOp::Type::kGet: {
      pb::RangeRequest* range = out.mutable_request_range();
      if (op.prefix) {
        auto [key, end] = PrefixRange(op.key);
        range->set_key(key);
        range->set_range_end(end);
      } else {
        range->set_key(op.key);
      }
      break;
    }
    case TxnOp::Type::kDelete: {
      pb::DeleteRangeRequest* del = out.mutable_request_delete_range();
      if (op.prefix) {
        auto [key, end] = PrefixRange(op.key);
        del->set_key(key);
        del->set_range_end(end);
      } else {
        del->set_key(op.key);
      }
      break;
    }
  }
  return out;
}

}  // namespace

GrpcEtcd::GrpcEtcd(GrpcEtcdOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<GrpcEtcd>> GrpcEtcd::Create(GrpcEtcdOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd endpoints: none given");
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd TLS: a client certificate needs both the cert and the key file");
  }
  grpc::SslCredentialsOptions ssl;
  bool need_tls = false;
  for (const std::string& url : options.endpoints) {
    need_tls = need_tls || absl::StartsWith(url, "https://");
  }
  if (need_tls) {
    if (!options.ca_file.empty()) {
      BROKER_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(options.ca_file, "etcd CA file"));
    }
    if (!options.cert_file.empty()) {
      BROKER_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                              ReadFile(options.cert_file, "etcd certificate file"));
      BROKER_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFile(options.key_file, "etcd key file"));
    }
  }
  grpc::ChannelArguments args;
  const int backoff_ms = static_cast<int>(absl::ToInt64Milliseconds(options.max_reconnect_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(backoff_ms, 100));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, backoff_ms);
  // A watch stream is idle for long: pings find a dead connection (etcd allows one every 5 s).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);

  auto etcd = std::unique_ptr<GrpcEtcd>(new GrpcEtcd(options));
  for (const std::string& url : options.endpoints) {
    std::string target = url;
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    if (absl::StartsWith(url, "https://")) {
      target = url.substr(8);
      credentials = grpc::SslCredentials(ssl);
    } else {
      if (absl::StartsWith(url, "http://")) target = url.substr(7);
      credentials = grpc::InsecureChannelCredentials();
    }
    if (absl::EndsWith(target, "/")) target.pop_back();
    if (target.empty() || absl::StrContains(target, "/") || !absl::StrContains(target, ":")) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", url, "\": want http(s)://host:port"));
    }
    auto endpoint = std::make_unique<Endpoint>();
    endpoint->url = url;
    endpoint->channel = grpc::CreateCustomChannel(target, credentials, args);
    endpoint->kv = pb::KV::NewStub(endpoint->channel);
    endpoint->lease = pb::Lease::NewStub(endpoint->channel);
    endpoint->watch = pb::Watch::NewStub(endpoint->channel);
    endpoint->auth = pb::Auth::NewStub(endpoint->channel);
    etcd->endpoints_.push_back(std::move(endpoint));
  }
  return etcd;
}

GrpcEtcd::~GrpcEtcd() {
  std::vector<WatchId> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, watch] : watches_) ids.push_back(id);
  }
  for (WatchId id : ids) CancelWatch(id).IgnoreError();
  // Watches cancelled from their own callback are joined here; nothing else runs any more.
  std::vector<WatchState*> left;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, watch] : watches_) left.push_back(watch.get());
  }
  for (WatchState* watch : left) {
    absl::MutexLock lock(&watch->join_mu);
    if (watch->thread.joinable()) watch->thread.join();
  }
}

void GrpcEtcd::NextEndpoint(size_t failed) {
  size_t expected = current_.load();
  if (expected % endpoints_.size() == failed)
    current_.compare_exchange_strong(expected, failed + 1);
}

absl::Status GrpcEtcd::Connect(Endpoint& endpoint, absl::Time start) {
  // Waiting here (rather than failing fast) also drives the connection: with no call waiting on
  // it, gRPC notices a finished connect only at its backup poll, every 5 s.
  const absl::Duration wait = std::min(options_.connect_timeout, options_.call_timeout);
  if (endpoint.channel->WaitForConnected(absl::ToChronoTime(start + wait))) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("etcd ", endpoint.url, ": not connected within ", absl::FormatDuration(wait)));
}

absl::Status GrpcEtcd::Authenticate(Endpoint& endpoint) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  pb::AuthenticateRequest request;
  request.set_name(options_.user);
  request.set_password(options_.password);
  pb::AuthenticateResponse response;
  BROKER_RETURN_IF_ERROR(FromGrpc(endpoint.auth->Authenticate(&context, request, &response),
                                  absl::StrCat("authenticate as etcd user ", options_.user),
                                  endpoint.url));
  absl::MutexLock lock(&mu_);
  token_ = response.token();
  return absl::OkStatus();
}

absl::Status GrpcEtcd::Authorize(Endpoint& endpoint, grpc::ClientContext& context) {
  if (options_.user.empty()) return absl::OkStatus();
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  if (token.empty()) {
    BROKER_RETURN_IF_ERROR(Authenticate(endpoint));
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  context.AddMetadata("token", token);
  return absl::OkStatus();
}

template <typename CallFn>
absl::Status GrpcEtcd::Call(const std::string& what, bool retry, CallFn call) {
  const size_t attempts = retry ? endpoints_.size() : 1;
  absl::Status status;
  bool reauthenticated = false;
  for (size_t attempt = 0; attempt < attempts; ++attempt) {
    const size_t index = current_endpoint();
    Endpoint& endpoint = *endpoints_[index];
    grpc::ClientContext context;
    const absl::Time start = absl::Now();
    context.set_deadline(absl::ToChronoTime(start + options_.call_timeout));
    context.set_wait_for_ready(true);
    status = Connect(endpoint, start);
    if (status.ok()) status = Authorize(endpoint, context);
    if (status.ok()) {
      const grpc::Status result = call(endpoint, context);
      if (result.error_code() == grpc::StatusCode::UNAUTHENTICATED && !options_.user.empty() &&
          !reauthenticated) {
        // The token expired (etcd's simple tokens live 5 minutes): once more with a new one.
        reauthenticated = true;
        {
          absl::MutexLock lock(&mu_);
          token_.clear();
        }
        --attempt;
        continue;
      }
      status = FromGrpc(result, what, endpoint.url);
    }
    if (!absl::IsUnavailable(status)) return status;
    NextEndpoint(index);
  }
  return status;
}

absl::StatusOr<LeaseId> GrpcEtcd::GrantLease(absl::Duration ttl) {
  pb::LeaseGrantRequest request;
  request.set_ttl(
      absl::ToInt64Seconds(absl::Ceil(std::max(ttl, absl::Seconds(1)), absl::Seconds(1))));
  pb::LeaseGrantResponse response;
  BROKER_RETURN_IF_ERROR(
      Call("grant lease", /*retry=*/true, [&](Endpoint& e, grpc::ClientContext& context) {
        return e.lease->LeaseGrant(&context, request, &response);
      }));
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat("grant lease: ", response.error()));
  }
  return response.id();
}

absl::StatusOr<absl::Duration> GrpcEtcd::KeepAliveOnce(LeaseId lease) {
  pb::LeaseKeepAliveResponse response;
  bool answered = false;
  const std::string what = absl::StrCat("keep lease ", lease, " alive");
  BROKER_RETURN_IF_ERROR(Call(what, /*retry=*/true, [&](Endpoint& e, grpc::ClientContext& context) {
    auto stream = e.lease->LeaseKeepAlive(&context);
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    answered = stream->Write(request) && stream->Read(&response);
    context.TryCancel();  // one answer is all this call wants
    const grpc::Status status = stream->Finish();
    if (answered) return grpc::Status::OK;
    return status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed") : status;
  }));
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("lease ", lease, " not found (expired or revoked)"));
  }
  return absl::Seconds(response.ttl());
}

absl::Status GrpcEtcd::RevokeLease(LeaseId lease) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  pb::LeaseRevokeResponse response;
  return Call(absl::StrCat("revoke lease ", lease), /*retry=*/false,
              [&](Endpoint& e, grpc::ClientContext& context) {
                return e.lease->LeaseRevoke(&context, request, &response);
              });
}

absl::StatusOr<GetResult> GrpcEtcd::Range(const std::string& what, const std::string& key,
                                          const std::string& range_end) {
  pb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  pb::RangeResponse response;
  BROKER_RETURN_IF_ERROR(Call(what, /*retry=*/true, [&](Endpoint& e, grpc::ClientContext& context) {
    return e.kv->Range(&context, request, &response);
  }));
  return GetResult{response.header().revision(), FromProto(response.kvs())};
}

absl::StatusOr<GetResult> GrpcEtcd::Get(const std::string& key) {
  return Range(absl::StrCat("get key ", key), key, "");
}

absl::StatusOr<GetResult> GrpcEtcd::GetPrefix(const std::string& prefix) {
  auto [key, end] = PrefixRange(prefix);
  return Range(absl::StrCat("get prefix ", prefix), key, end);
}

absl::StatusOr<int64_t> GrpcEtcd::Put(const std::string& key, const std::string& value,
                                      LeaseId lease) {
  pb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  pb::PutResponse response;
  BROKER_RETURN_IF_ERROR(Call(absl::StrCat("put key ", key, lease != 0 ? " with lease " : "",
                                           lease != 0 ? absl::StrCat(lease) : ""),
                              /*retry=*/false, [&](Endpoint& e, grpc::ClientContext& context) {
                                return e.kv->Put(&context, request, &response);
                              }));
  return response.header().revision();
}

absl::StatusOr<int64_t> GrpcEtcd::Delete(const std::string& key) {
  pb::DeleteRangeRequest request;
  request.set_key(key);
  pb::DeleteRangeResponse response;
  BROKER_RETURN_IF_ERROR(Call(absl::StrCat("delete key ", key), /*retry=*/false,
                              [&](Endpoint& e, grpc::ClientContext& context) {
                                return e.kv->DeleteRange(&context, request, &response);
                              }));
  return response.header().revision();
}

absl::StatusOr<TxnResult> GrpcEtcd::Txn(const std::vector<Compare>& compares,
                                        const std::vector<TxnOp>& then_ops,
                                        const std::vector<TxnOp>& else_ops) {
  pb::TxnRequest request;
  for (const Compare& c : compares) *request.add_compare() = ToProto(c);
  for (const TxnOp& op : then_ops) *request.add_success() = ToProto(op);
  for (const TxnOp& op : else_ops) *request.add_failure() = ToProto(op);
  std::string what = "txn";
  for (const TxnOp& op : then_ops) absl::StrAppend(&what, what == "txn" ? " on " : ", ", op.key);
  pb::TxnResponse response;
  BROKER_RETURN_IF_ERROR(
      Call(what, /*retry=*/false, [&](Endpoint& e, grpc::ClientContext& context) {
        return e.kv->Txn(&context, request, &response);
      }));
  TxnResult result;
  result.succeeded = response.succeeded();
  result.revision = response.header().revision();
  for (const pb::ResponseOp& op : response.responses()) {
    TxnOpResult& r = result.results.emplace_back();
    switch (op.response_case()) {
      case pb::ResponseOp::kResponseRange:
        r.type = TxnOp::Type::kGet;
        r.kvs = FromProto(op.response_range().kvs());
        break;
      case pb::ResponseOp::kResponsePut:
        r.type = TxnOp::Type::kPut;
        break;
      case pb::ResponseOp::kResponseDeleteRange:
        r.type = TxnOp::Type::kDelete;
        r.deleted = op.response_delete_range().deleted();
        break;
      default:
        return absl::InternalError(absl::StrCat(what, ": unexpected response op"));
    }
  }
  return result;
}

absl::Status GrpcEtcd::Compact(int64_t revision) {
  pb::CompactionRequest request;
  request.set_revision(revision);
  request.set_physical(true);
  pb::CompactionResponse response;
  return Call(absl::StrCat("compact at revision ", revision), /*retry=*/false,
              [&](Endpoint& e, grpc::ClientContext& context) {
                return e.kv->Compact(&context, request, &response);
              });
}

absl::StatusOr<WatchId> GrpcEtcd::Watch(const std::string& prefix, int64_t start_revision,
                                        WatchCallback callback) {
  if (start_revision <= 0) {
    auto [key, end] = PrefixRange(prefix);
    BROKER_ASSIGN_OR_RETURN(GetResult now, Range(absl::StrCat("watch prefix ", prefix), key, end));
    start_revision = now.revision + 1;
  }
  auto watch = std::make_unique<WatchState>();
  watch->prefix = prefix;
  watch->callback = std::move(callback);
  watch->next_revision = start_revision;
  WatchState* state = watch.get();
  absl::MutexLock lock(&mu_);
  watch->id = next_watch_++;
  const WatchId id = watch->id;
  watches_[id] = std::move(watch);
  state->thread = std::thread([this, state] { RunWatch(*state); });
  return id;
}

absl::Status GrpcEtcd::CancelWatch(WatchId id) {
  WatchState* watch;
  {
    absl::MutexLock lock(&mu_);
    auto it = watches_.find(id);
    if (it == watches_.end()) return absl::NotFoundError(absl::StrCat("watch ", id));
    watch = it->second.get();
  }
  {
    absl::MutexLock lock(&watch->mu);
    watch->cancelled = true;
    if (watch->context != nullptr) watch->context->TryCancel();
    watch->wake.SignalAll();
  }
  // From the watch's own callback: the thread ends when the callback returns; ~GrpcEtcd joins it.
  if (watch->thread.get_id() == std::this_thread::get_id()) return absl::OkStatus();
  absl::MutexLock lock(&watch->join_mu);  // one joiner at a time
  if (watch->thread.joinable()) watch->thread.join();
  return absl::OkStatus();
}

void GrpcEtcd::RunWatch(WatchState& watch) {
  auto [key, end] = PrefixRange(watch.prefix);
  const std::string what = absl::StrCat("watch prefix ", watch.prefix);
  for (;;) {
    const size_t index = current_endpoint();
    Endpoint& endpoint = *endpoints_[index];
    grpc::ClientContext context;
    // The stream waits for the channel to connect (and so drives it) instead of failing at once.
    context.set_wait_for_ready(true);
    bool ended = false;  // by compaction: the watch is over
    // Connect first: a stream that waits for ready would wait on a dead endpoint for ever.
    if (Connect(endpoint, absl::Now()).ok() && Authorize(endpoint, context).ok()) {
      {
        absl::MutexLock lock(&watch.mu);
        if (watch.cancelled) return;
        watch.context = &context;
      }
      auto stream = endpoint.watch->Watch(&context);
      pb::WatchRequest request;
      pb::WatchCreateRequest* create = request.mutable_create_request();
      create->set_key(key);
      create->set_range_end(end);
      create->set_start_revision(watch.next_revision);
      create->set_prev_kv(true);
      create->set_progress_notify(true);
      pb::WatchResponse response;
      if (stream->Write(request)) {
        while (!ended && stream->Read(&response)) {
          absl::StatusOr<std::vector<WatchEvent>> batch = std::vector<WatchEvent>();
          if (response.compact_revision() > 0) {
            batch = absl::OutOfRangeError(absl::StrCat(what, " from revision ", watch.next_revision,
                                                       ": compacted at revision ",
                                                       response.compact_revision()));
            ended = true;
          } else if (response.canceled()) {
            break;  // etcd ended it (a lost auth token, say): reconnect
          } else if (response.events_size() == 0) {
            // Created, or a progress notice: every event up to the header's revision was sent.
            if (!response.created()) {
              watch.next_revision = std::max(watch.next_revision, response.header().revision() + 1);
            }
            continue;
          } else {
            for (const mvccpb::Event& e : response.events()) {
              if (e.kv().mod_revision() < watch.next_revision) continue;  // had it already
              WatchEvent& event = batch->emplace_back();
              event.type = e.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                             : WatchEvent::Type::kPut;
              event.kv = FromProto(e.kv());
              if (e.has_prev_kv()) event.prev_kv = FromProto(e.prev_kv());
            }
            if (batch->empty()) continue;
            watch.next_revision = batch->back().kv.mod_revision + 1;
          }
          {
            absl::MutexLock lock(&watch.mu);
            if (watch.cancelled) break;
          }
          watch.callback(std::move(batch));
        }
      }
      {
        absl::MutexLock lock(&watch.mu);
        watch.context = nullptr;
      }
      context.TryCancel();
      (void)stream->Finish();
    }
    if (ended) return;
    absl::MutexLock lock(&watch.mu);
    if (watch.cancelled) return;
    NextEndpoint(index);
    watch.wake.WaitWithTimeout(&watch.mu, options_.watch_retry_delay);
    if (watch.cancelled) return;
  }
}

}  // namespace jobbroker::cluster
