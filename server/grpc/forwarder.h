#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "server/grpc/keepalive.h"
#include "server/grpc/rpc_metrics.h"
#include "server/routing/router.h"

namespace jobbroker::server {

// Sends calls for partitions this node does not lead to the node that does (Router), over one
// channel per node address, and relays the answer as is: the client cannot tell a forwarded call
// from a direct one except by its latency. The forwarded call keeps the caller's deadline,
// cancellation and `authorization` metadata (the leader checks the token again: it knows the
// job's queue), and carries Router::kForwardedHeader so it is not forwarded on.
//
// Thread-safe.
class Forwarder {
 public:
  // `node_id` goes in kForwardedHeader. `credentials` dial the other nodes (null: plaintext).
  // `keepalive`: how soon a node that stopped answering fails the calls open to it.
  Forwarder(std::string node_id, std::shared_ptr<grpc::ChannelCredentials> credentials,
            Keepalive keepalive = {});

  v1::Broker::Stub& BrokerAt(const std::string& address);
  v1::Admin::Stub& AdminAt(const std::string& address);

  // A client context for a call forwarded on behalf of `server`'s caller. With
  // `propagate_cancellation` false the call outlives the caller's cancellation, and the caller
  // ends it itself (a relayed Work stream drains its upstream first).
  std::unique_ptr<grpc::ClientContext> ContextFor(const grpc::CallbackServerContext& server,
                                                  bool propagate_cancellation = true) const;

  // Where a call this node makes for a caller whose own call may have ended goes (a lease given
  // back after the client of a relayed Work stream went away), kept by value: such a call may
  // come as the node exits, after the Forwarder is gone; the channel is shared and outlives it.
  struct Detached {
    std::shared_ptr<grpc::Channel> channel;
    std::string node_id;                     // for kForwardedHeader
    std::vector<std::string> authorization;  // the caller's values (AuthorizationOf)
    // A context with the caller's `authorization`, kForwardedHeader and a deadline `timeout`
    // from now. Unlike ContextFor's, not cancelled with the caller's call.
    std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout) const;
  };
  Detached DetachedAt(const std::string& address, std::vector<std::string> authorization);

  // Answers a unary call that does not go to this node's broker: UNAVAILABLE for a route
  // nowhere, else `start(stub, client_context, done)` sends it (e.g. stub.async()->Enqueue(ctx,
  // req, resp, done)) into the server's own response, which gRPC then sends. `route` must not be
  // kLocal.
  template <typename Stub>
  using StartCall =
      std::function<void(Stub& stub, grpc::ClientContext* ctx, std::function<void(grpc::Status)>)>;
  grpc::ServerUnaryReactor* ForwardBroker(grpc::CallbackServerContext* ctx, const Route& route,
                                          RpcTiming timing, StartCall<v1::Broker::Stub> start);
  grpc::ServerUnaryReactor* ForwardAdmin(grpc::CallbackServerContext* ctx, const Route& route,
                                         RpcTiming timing, StartCall<v1::Admin::Stub> start);

 private:
  struct Peer {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Broker::Stub> broker;
    std::unique_ptr<v1::Admin::Stub> admin;
  };
  Peer& PeerAt(const std::string& address);
  template <typename Stub>
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* ctx, RpcTiming timing, Stub& stub,
                                    const StartCall<Stub>& start);

  const std::string node_id_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const Keepalive keepalive_;
  absl::Mutex mu_;
  // Peers are never removed: a node's address set is small, and a stub must outlive its calls.
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
};

// What a unary handler calls before it answers a call for `partition` itself: null when this
// node's broker answers it (always on a single node), else the reactor that answers it from the
// partition's leader (`start` sends it there on a Stub, v1::Broker::Stub or v1::Admin::Stub) or
// refuses it (UNAVAILABLE naming the partition).
template <typename Stub, typename Start>
grpc::ServerUnaryReactor* AnswerElsewhere(const Router& router, Forwarder* forwarder,
                                          grpc::CallbackServerContext* ctx, uint32_t partition,
                                          RpcTiming timing, Start start) {
  if (!router.cluster_mode()) return nullptr;
  const Route route = router.RouteOf(partition, *ctx);
  if (route.kind == Route::Kind::kLocal) return nullptr;
  if constexpr (std::is_same_v<Stub, v1::Broker::Stub>) {
    return forwarder->ForwardBroker(ctx, route, timing, std::move(start));
  } else {
    return forwarder->ForwardAdmin(ctx, route, timing, std::move(start));
  }
}

}  // namespace jobbroker::server
