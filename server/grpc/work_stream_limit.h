#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace jobbroker::server {

// A count held by pointer, for what may add to it after its owner is gone.
using SharedCount = std::shared_ptr<std::atomic<uint64_t>>;

// Counts the open Work streams against --max-work-streams. Each stream holds memory (its
// outbox, its subscription) and a gRPC thread's attention, so their number is bounded like
// everything else a caller can make the broker hold. In cluster mode it also counts the streams
// this node relays to other leaders: a worker that is not connected to its queues' leaders pays
// a hop per message, and the gauge of them tells an operator which deployments to fix.
// And it counts the jobs pushed on a stream that its worker never received (it went away
// first), which the stream gave back: workers that drop their connections mid-push, told apart
// from the graceful releases of jobbroker_released_total. Thread-safe.
class WorkStreamLimit {
 public:
  explicit WorkStreamLimit(int max_streams) : max_(max_streams) {}

  // Takes a slot; false when all `max` are taken.
  bool TryAcquire() {
    if (open_.fetch_add(1) < max_) return true;
    open_.fetch_sub(1);
    return false;
  }
  void Release() { open_.fetch_sub(1); }

  // A stream that took a slot starts or stops relaying to another node.
  void AddRelaying() { relaying_.fetch_add(1); }
  void RemoveRelaying() { relaying_.fetch_sub(1); }

  int max() const { return max_; }
  int open() const { return open_.load(); }
  int relaying() const { return relaying_.load(); }

  // The count of pushes given back, shared: a give-back can come after its stream is gone, and
  // while the node exits, after this limit.
  const SharedCount& given_back_count() const { return given_back_; }
  uint64_t given_back() const { return given_back_->load(std::memory_order_relaxed); }

 private:
  const int max_;
  std::atomic<int> open_{0};
  std::atomic<int> relaying_{0};
  const SharedCount given_back_ = std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace jobbroker::server
