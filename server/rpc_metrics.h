#pragma once

#include <grpcpp/support/server_interceptor.h>

#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace jobbroker {

// Times every unary RPC from its arrival to its status, labelled by method and status code
// (jobbroker_rpc_duration_seconds). Streams are left out: their lifetime is not a latency.
// The registry is borrowed and must outlive the server.
class RpcMetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsFactory(prometheus::Registry& registry);
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  prometheus::Family<prometheus::Histogram>& durations_;
};

}  // namespace jobbroker
