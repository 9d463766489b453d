#pragma once

#include <grpcpp/channel.h>

#include <memory>

#include "jobbroker/v1/admin.grpc.pb.h"
#include "server/http/http_handler.h"

namespace jobbroker::server {

// The dashboard's JSON API under /api/v1/ (docs/operations.md lists the routes). Each route is
// one call of the Admin gRPC service through `channel`, the broker's own server reached in
// process: validation, auth (the Authorization header is passed on as gRPC metadata), roles and
// RPC timing are the service's, so the two APIs cannot drift apart. Bodies are the proto3 JSON
// form of the Admin messages; errors are {"code": "NOT_FOUND", "message": ...} with the HTTP
// status of the gRPC code. Thread-safe.
class AdminHttpApi final : public HttpHandler {
 public:
  explicit AdminHttpApi(std::shared_ptr<grpc::ChannelInterface> channel);

  HttpReply Handle(const HttpRequest& request) const override;

 private:
  std::unique_ptr<v1::Admin::Stub> admin_;
};

}  // namespace jobbroker::server
