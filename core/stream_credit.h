#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace jobbroker::core {

// The in-flight budget of one Work stream whose queues live in several partitions, shared by the
// brokers of those partitions (node::Partitions makes one per such stream; a stream on one
// partition needs none). Each broker holds the stream as a consumer of its own, a "member", and
// takes a unit of credit before it leases the stream a job, and gives it back when that job
// leaves ACTIVE: so the stream never holds more than max_in_flight jobs over all partitions,
// as it would on one broker. A member that found no credit is starved: out of its queues'
// lines. When credit comes back, Refill() runs the starved members' refill callbacks, which
// enlist the stream again in their broker.
//
// Why no member stays starved while credit is free: a member marks itself starved before it
// tries to take, and a giver reads the marks after it gave, both sequentially consistent; so
// either the take sees the unit given back, or the giver sees the mark and refills.
//
// Thread-safe; TryTake and Give are lock-free, since brokers call them under their own mutex.
// Refill must be called without any broker's mutex held (Broker::Finish does).
class StreamCredit {
 public:
  // `members`: how many brokers share the stream; `max_in_flight` >= 1.
  StreamCredit(int max_in_flight, int members);
  StreamCredit(const StreamCredit&) = delete;
  StreamCredit& operator=(const StreamCredit&) = delete;

  // Takes one unit for `member` if the stream holds fewer than max_in_flight jobs; else marks
  // the member starved and returns false.
  bool TryTake(int member);
  // Gives a unit back; true if some member is starved (the caller then calls Refill, without
  // its lock).
  bool Give();
  // A new budget (Work stream flow control). Jobs held beyond it stay; no new ones until the
  // stream is under it again.
  void SetMax(int max_in_flight) { max_.store(max_in_flight); }
  // What Refill runs for `member`: typically Broker::RefillStream of its handle.
  void SetRefill(int member, std::function<void()> refill);
  // Runs the refill of every starved member (clearing its mark).
  void Refill();

  int used() const { return used_.load(); }
  int max() const { return max_.load(); }

 private:
  std::atomic<int> max_;
  std::atomic<int> used_{0};
  const std::unique_ptr<std::atomic<bool>[]> starved_;
  const int members_;
  absl::Mutex mu_;
  std::vector<std::function<void()>> refill_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::core
