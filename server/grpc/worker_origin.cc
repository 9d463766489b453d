#include "server/grpc/worker_origin.h"

#include "server/routing/router.h"

namespace jobbroker::server {
namespace {

std::string Metadata(const grpc::ServerContextBase& ctx, const char* key) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(key);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

std::string ClientOf(const grpc::ServerContextBase& ctx) {
  std::string client = Metadata(ctx, kClientHeader);
  if (client.empty()) client = Metadata(ctx, "user-agent");
  return client;
}

core::WorkerOrigin OriginOf(const grpc::ServerContextBase& ctx, const std::string& node_id) {
  core::WorkerOrigin origin;
  origin.client = ClientOf(ctx);
  const std::string forwarded_by = Metadata(ctx, Router::kForwardedHeader);
  if (forwarded_by.empty()) {
    origin.peer = ctx.peer();
    origin.node_id = node_id;
  } else {
    origin.peer = Metadata(ctx, kPeerHeader);
    origin.node_id = forwarded_by;
  }
  return origin;
}

}  // namespace jobbroker::server
