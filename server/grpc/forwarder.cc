#include "server/grpc/forwarder.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "server/grpc/rpc_auth.h"
#include "server/grpc/worker_origin.h"

namespace jobbroker::server {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;  // as the server's own limit (main.cc)

// One forwarded unary call: answers the caller with whatever the leader answered.
class ForwardedUnary final : public grpc::ServerUnaryReactor {
 public:
  ForwardedUnary(std::unique_ptr<grpc::ClientContext> client, RpcTiming timing)
      : client_(std::move(client)), timing_(timing) {}

  grpc::ClientContext* client() { return client_.get(); }
  void Answer(const grpc::Status& status) {
    timing_.Record(status);
    Finish(status);
  }
  // The context propagates the caller's cancellation; this only makes it prompt.
  void OnCancel() override { client_->TryCancel(); }
  void OnDone() override { delete this; }

 private:
  std::unique_ptr<grpc::ClientContext> client_;
  const RpcTiming timing_;
};

}  // namespace

Forwarder::Forwarder(std::string node_id, std::shared_ptr<grpc::ChannelCredentials> credentials,
                     Keepalive keepalive)
    : node_id_(std::move(node_id)),
      credentials_(credentials != nullptr ? std::move(credentials)
                                          : grpc::InsecureChannelCredentials()),
      keepalive_(keepalive) {}

Forwarder::Peer& Forwarder::PeerAt(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Peer>& peer = peers_[address];
  if (peer == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    // A restarted node is found again within a second, not after gRPC's default of up to 120 s.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A forwarded call has the caller's deadline, which may be none (a Work stream, a watch):
    // without pings, a leader that froze would hold it until the caller gave up.
    ApplyChannelKeepalive(keepalive_, args);
    peer = std::make_unique<Peer>();
    peer->channel = grpc::CreateCustomChannel(address, credentials_, args);
    peer->broker = v1::Broker::NewStub(peer->channel);
    peer->admin = v1::Admin::NewStub(peer->channel);
  }
  return *peer;
}

v1::Broker::Stub& Forwarder::BrokerAt(const std::string& address) {
  return *PeerAt(address).broker;
}

v1::Admin::Stub& Forwarder::AdminAt(const std::string& address) { return *PeerAt(address).admin; }

std::unique_ptr<grpc::ClientContext> Forwarder::ContextFor(
    const grpc::CallbackServerContext& server, bool propagate_cancellation) const {
  grpc::PropagationOptions propagation;
  if (!propagate_cancellation) propagation.disable_cancellation_propagation();
  std::unique_ptr<grpc::ClientContext> ctx =
      grpc::ClientContext::FromCallbackServerContext(server, propagation);
  for (absl::string_view value : AuthorizationOf(server))
    ctx->AddMetadata("authorization", std::string(value));
  ctx->AddMetadata(Router::kForwardedHeader, node_id_);
  // Who the caller is, for the leader's ListWorkers (it sees this node as the peer).
  ctx->AddMetadata(kPeerHeader, server.peer());
  if (std::string client = ClientOf(server); !client.empty())
    ctx->AddMetadata(kClientHeader, client);
  return ctx;
}

Forwarder::Detached Forwarder::DetachedAt(const std::string& address,
                                          std::vector<std::string> authorization) {
  return Detached{.channel = PeerAt(address).channel,
                  .node_id = node_id_,
                  .authorization = std::move(authorization)};
}

std::unique_ptr<grpc::ClientContext> Forwarder::Detached::NewContext(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  for (const std::string& value : authorization) ctx->AddMetadata("authorization", value);
  ctx->AddMetadata(Router::kForwardedHeader, node_id);
  return ctx;
}

template <typename Stub>
grpc::ServerUnaryReactor* Forwarder::Forward(grpc::CallbackServerContext* ctx, RpcTiming timing,
                                             Stub& stub, const StartCall<Stub>& start) {
  auto* call = new ForwardedUnary(ContextFor(*ctx), timing);
  start(stub, call->client(), [call](grpc::Status status) { call->Answer(status); });
  return call;
}

grpc::ServerUnaryReactor* Forwarder::ForwardBroker(grpc::CallbackServerContext* ctx,
                                                   const Route& route, RpcTiming timing,
                                                   StartCall<v1::Broker::Stub> start) {
  if (route.kind != Route::Kind::kForward) return UnaryCall(ctx, timing).Finish(route.why);
  return Forward(ctx, timing, BrokerAt(route.address), start);
}

grpc::ServerUnaryReactor* Forwarder::ForwardAdmin(grpc::CallbackServerContext* ctx,
                                                  const Route& route, RpcTiming timing,
                                                  StartCall<v1::Admin::Stub> start) {
  if (route.kind != Route::Kind::kForward) return UnaryCall(ctx, timing).Finish(route.why);
  return Forward(ctx, timing, AdminAt(route.address), start);
}

}  // namespace jobbroker::server
