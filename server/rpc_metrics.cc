#include "server/rpc_metrics.h"

#include <string>

#include "absl/time/clock.h"

namespace jobbroker {
namespace {

const prometheus::Histogram::BucketBoundaries kRpcSeconds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 60};

const char* CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

class RpcTimer final : public grpc::experimental::Interceptor {
 public:
  RpcTimer(prometheus::Family<prometheus::Histogram>& durations, std::string method)
      : durations_(durations), method_(std::move(method)), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      durations_
          .Add({{"method", method_}, {"code", CodeName(methods->GetSendStatus().error_code())}},
               kRpcSeconds)
          .Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  prometheus::Family<prometheus::Histogram>& durations_;
  const std::string method_;
  const absl::Time start_;
};

// Does nothing: for streams.
class Passthrough final : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }
};

}  // namespace

RpcMetricsFactory::RpcMetricsFactory(prometheus::Registry& registry)
    : durations_(prometheus::BuildHistogram()
                     .Name("jobbroker_rpc_duration_seconds")
                     .Help("Time from a unary RPC's arrival to its status, by method and code.")
                     .Register(registry)) {}

grpc::experimental::Interceptor* RpcMetricsFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) return new Passthrough();
  return new RpcTimer(durations_, info->method());
}

}  // namespace jobbroker
