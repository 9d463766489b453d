#pragma once

#include <grpcpp/server_context.h>

#include <string>

#include "core/workers.h"

namespace jobbroker::server {

// The metadata a client library sends to name itself ("jobbroker-go/0.4.0"); without it the
// origin falls back to gRPC's user agent.
inline constexpr char kClientHeader[] = "jobbroker-client";
// Set by a node that forwards a call: the caller's own address (the forwarded call's peer is the
// forwarding node).
inline constexpr char kPeerHeader[] = "jobbroker-peer";

// Where the call `ctx` comes from, for ListWorkers: the caller's address, its library, and the
// node it is connected to (`node_id` if it called this node, else the node that forwarded it).
core::WorkerOrigin OriginOf(const grpc::ServerContextBase& ctx, const std::string& node_id);

// The client library `ctx` names (jobbroker-client, else the user agent); empty if neither.
std::string ClientOf(const grpc::ServerContextBase& ctx);

}  // namespace jobbroker::server
