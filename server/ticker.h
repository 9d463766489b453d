#pragma once

#include <thread>

#include "absl/synchronization/mutex.h"
#include "node/partitions.h"

namespace jobbroker::server {

// Runs Broker::Tick on its own thread at the times the broker asks for: lease expiry, jobs
// coming due and long-poll time-outs happen on time without any polling interval. Wake() makes
// it tick now (the broker calls it when an earlier deadline appears).
class Ticker {
 public:
  Ticker() = default;
  ~Ticker() { Stop(); }
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  // Starts ticking `broker`, which must outlive Stop().
  void Start(node::Partitions& broker);
  void Wake();
  void Stop();

 private:
  void Loop(node::Partitions& broker);

  absl::Mutex mu_;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace jobbroker::server
