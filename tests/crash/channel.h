#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace jobbroker::crash {

// A channel to the broker that finds a restarted broker within half a second: the harness
// restarts it every few seconds, and gRPC's default reconnect backoff (up to 2 minutes) would
// leave producers and workers idle for most of the run.
std::shared_ptr<grpc::Channel> DialBroker(const std::string& address);

}  // namespace jobbroker::crash
