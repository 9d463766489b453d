#include "server/grpc/rpc_metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/grpc/grpc_status.h"

namespace jobbroker::server {
namespace {

const prometheus::Histogram::BucketBoundaries kRpcSeconds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 60};

const char* const kCodeNames[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "jobbroker: %s\n", message.c_str());
  std::abort();
}

}  // namespace

RpcMethodTimer::RpcMethodTimer(prometheus::Family<prometheus::Histogram>& family,
                               std::string method)
    : family_(family), method_(std::move(method)) {}

void RpcMethodTimer::Observe(grpc::StatusCode code, absl::Duration took) {
  int i = static_cast<int>(code);
  if (i < 0 || i >= kCodes) i = static_cast<int>(grpc::StatusCode::UNKNOWN);
  prometheus::Histogram* h = by_code_[i].load(std::memory_order_acquire);
  if (h == nullptr) {
    // Family::Add returns the same histogram for the same labels, so racing callers agree.
    h = &family_.Add({{"method", method_}, {"code", kCodeNames[i]}}, kRpcSeconds);
    by_code_[i].store(h, std::memory_order_release);
  }
  h->Observe(absl::ToDoubleSeconds(took));
}

void RpcTiming::Record(const grpc::Status& status) const {
  if (timer_ != nullptr) timer_->Observe(status.error_code(), absl::Now() - start_);
}

grpc::ServerUnaryReactor* UnaryCall::Finish(const grpc::Status& status) const {
  // Recorded first: once finished, the call may be gone at any moment.
  timing_.Record(status);
  reactor_->Finish(status);
  return reactor_;
}

grpc::ServerUnaryReactor* UnaryCall::Finish(const absl::Status& status) const {
  return Finish(ToGrpcStatus(status));
}

RpcServiceTimers::RpcServiceTimers(prometheus::Family<prometheus::Histogram>* family,
                                   const google::protobuf::ServiceDescriptor& service,
                                   const std::vector<std::string>& per_message)
    : service_(service.full_name()), on_(family != nullptr) {
  for (int i = 0; i < service.method_count(); ++i) {
    const google::protobuf::MethodDescriptor& m = *service.method(i);
    std::unique_ptr<RpcMethodTimer> timer;
    const bool stream = m.client_streaming() || m.server_streaming();
    const bool timed_per_message =
        std::find(per_message.begin(), per_message.end(), m.name()) != per_message.end();
    if (family != nullptr && (!stream || timed_per_message))
      timer = std::make_unique<RpcMethodTimer>(*family, absl::StrCat("/", service_, "/", m.name()));
    methods_.emplace(m.name(), std::move(timer));
  }
}

RpcTiming RpcServiceTimers::Start(absl::string_view method) const {
  auto it = methods_.find(method);
  if (it == methods_.end()) Die(absl::StrCat(service_, " has no method ", method));
  return RpcTiming(it->second.get(), on_ ? absl::Now() : absl::InfinitePast());
}

RpcMetrics::RpcMetrics(prometheus::Registry* registry)
    : durations_(registry == nullptr
                     ? nullptr
                     : &prometheus::BuildHistogram()
                            .Name("jobbroker_rpc_duration_seconds")
                            .Help("Time from a unary RPC's handler start to its status, by method "
                                  "and code.")
                            .Register(*registry)) {}

RpcServiceTimers RpcMetrics::For(const google::protobuf::FileDescriptor& file,
                                 absl::string_view name,
                                 const std::vector<std::string>& per_message) const {
  const google::protobuf::ServiceDescriptor* service = file.FindServiceByName(std::string(name));
  if (service == nullptr) Die(absl::StrCat(file.name(), " declares no service ", name));
  for (const std::string& method : per_message) {
    const google::protobuf::MethodDescriptor* m = service->FindMethodByName(method);
    if (m == nullptr || !m->client_streaming() || !m->server_streaming())
      Die(absl::StrCat(service->full_name(), " has no bidirectional stream ", method));
  }
  return RpcServiceTimers(durations_, *service, per_message);
}

}  // namespace jobbroker::server
