#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace jobbroker::crash {

struct WorkerOptions {
  std::string address;   // the broker, "127.0.0.1:PORT", or a cluster's nodes, comma-separated
  std::string log_path;  // one line per receipt and per answer heard (checker.h)
  std::string instance;  // worker_id, unique per process: "w<slot>.<incarnation>"
  uint64_t seed = 0;
  std::vector<std::string> queues;
  int max_in_flight = 4;
  // A quarter of the lease, so that a worker slowed by a busy machine keeps its leases.
  absl::Duration heartbeat_interval = absl::Milliseconds(250);
};

// Works jobs pushed over one Broker.Work stream until SIGTERM, then drains and exits 0.
//
// Does what the payload's kind says (checker.h), heartbeats every held lease,
// reconnects with a short backoff when the stream breaks, and keeps every ack and fail until the
// broker answers it: one sent on a stream that broke is sent again on the next (acks and fails
// are idempotent per lease), so an ack the broker committed but could not answer is still heard.
int RunWorker(const WorkerOptions& options);

}  // namespace jobbroker::crash
