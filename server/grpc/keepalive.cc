#include "server/grpc/keepalive.h"

namespace jobbroker::server {
namespace {

// The most often a client may ping with no call data between: once a second leaves room for any
// keepalive a client would choose (gRPC's Go and Java clients allow 10 s at the least) and still
// turns away a client that floods pings.
constexpr int kMinClientPingIntervalMs = 1000;

int Millis(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

}  // namespace

void ApplyServerKeepalive(const Keepalive& keepalive, grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(keepalive.time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(keepalive.timeout));
  // Pings on connections without calls too (a producer between calls): a dead one is closed
  // rather than kept until the next call finds it.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Without this, gRPC stops pinging after two pings with no data sent between: an idle Work
  // stream would be checked twice, then never.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinClientPingIntervalMs);
}

void ApplyChannelKeepalive(const Keepalive& keepalive, grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(keepalive.time));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(keepalive.timeout));
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

}  // namespace jobbroker::server
