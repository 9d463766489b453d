#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "jobbroker/v1/broker.grpc.pb.h"

namespace jobbroker::crash {

// A channel to the broker that finds a restarted broker within half a second: the harness
// restarts it every few seconds, and gRPC's default reconnect backoff (up to 2 minutes) would
// leave producers and workers idle for most of the run.
std::shared_ptr<grpc::Channel> DialBroker(const std::string& address);

// Broker stubs for a comma-separated list of addresses (one broker, or the nodes of a cluster,
// any of which answers every call): calls go to the current one until the caller, after a call
// that found no broker, moves on to the next. Thread-safe.
class BrokerRing {
 public:
  explicit BrokerRing(const std::string& addresses);
  v1::Broker::Stub& Current() { return *stubs_[current_.load() % stubs_.size()]; }
  void Next() { current_.fetch_add(1); }

 private:
  std::vector<std::unique_ptr<v1::Broker::Stub>> stubs_;
  std::atomic<size_t> current_{0};
};

}  // namespace jobbroker::crash
