#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"

namespace jobbroker::server {

// How soon a connection whose other end stopped answering is given up: after `time` with no
// frame from it, a ping; `timeout` later without the ping's answer, the connection is closed and
// its calls end UNAVAILABLE. TCP alone does not notice a peer that froze, lost power or was cut
// off behind a firewall that drops packets: a stream on such a connection waits forever, and a
// worker's entry, a relayed watch or a forwarded call with it.
struct Keepalive {
  absl::Duration time = absl::Seconds(10);
  absl::Duration timeout = absl::Seconds(5);
};

// The broker's server: it pings every client connection, idle or not (a dead worker's stream
// and its entry in ListWorkers end), and accepts its clients' own pings as often as once a
// second with nothing else on the connection (gRPC's default refuses more than one every 5
// minutes, closing a client that pings an idle Work stream every 10 s with "too_many_pings").
void ApplyServerKeepalive(const Keepalive& keepalive, grpc::ServerBuilder& builder);

// A channel to another node: pings while a call is open on it (a forwarded call, a relayed Work
// stream or watch), however long nothing else comes.
void ApplyChannelKeepalive(const Keepalive& keepalive, grpc::ChannelArguments& args);

}  // namespace jobbroker::server
