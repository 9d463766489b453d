#include "jobbroker/health.h"

#include <google/protobuf/wrappers.pb.h>
#include <grpcpp/generic/generic_stub.h>
// SerializationTraits for protobuf messages, which the generic stub needs.
#include <grpcpp/impl/codegen/proto_utils.h>

#include <future>
#include <utility>

#include "absl/strings/str_cat.h"

namespace jobbroker::client {

std::string HealthStatusName(int serving_status) {
  switch (serving_status) {
    case kHealthUnknown:
      return "UNKNOWN";
    case kHealthServing:
      return "SERVING";
    case kHealthNotServing:
      return "NOT_SERVING";
    case kHealthServiceUnknown:
      return "SERVICE_UNKNOWN";
    default:
      return absl::StrCat("status ", serving_status);
  }
}

grpc::Status CheckHealth(grpc::ClientContext* ctx, const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& service, int* serving_status) {
  // Debian's gRPC installs no grpc.health.v1 headers, but the two messages are wire-compatible
  // with well-known types: HealthCheckRequest{string service = 1} is a StringValue, and
  // HealthCheckResponse{ServingStatus status = 1} (a varint) is an Int32Value.
  grpc::TemplatedGenericStub<google::protobuf::StringValue, google::protobuf::Int32Value> stub(
      channel);
  google::protobuf::StringValue request;
  request.set_value(service);
  google::protobuf::Int32Value response;
  // The generic stub has only the callback form of a unary call; wait for it here.
  std::promise<grpc::Status> done;
  stub.UnaryCall(ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  if (status.ok() && serving_status != nullptr) *serving_status = response.value();
  return status;
}

}  // namespace jobbroker::client
