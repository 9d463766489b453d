#include "server/ticker.h"

namespace jobbroker::server {

void Ticker::Start(node::Partitions& broker) {
  thread_ = std::thread([this, &broker] { Loop(broker); });
}

void Ticker::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void Ticker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Ticker::Loop(node::Partitions& broker) {
  while (true) {
    absl::Time next = broker.Tick();
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return woken_ || stopping_; };
    // The broker runs on the wall clock here, so its deadline is a wall-clock deadline.
    mu_.AwaitWithDeadline(absl::Condition(&ready), next);
    if (stopping_) return;
    woken_ = false;
  }
}

}  // namespace jobbroker::server
