#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/done.h"
#include "core/requests.h"
#include "core/stream_credit.h"
#include "core/stream_sink.h"

namespace jobbroker::core {

using LeaseDone = Done<absl::StatusOr<std::vector<LeasedJob>>>;

// A long-poll Lease (waits once, for up to spec.max_jobs jobs of spec.queue) or a Work stream
// (stays, holds up to max_in_flight jobs from any of its queues).
struct Consumer {
  uint64_t id = 0;
  bool stream = false;
  LeaseSpec spec;  // worker_id and lease_duration for both; queue and max_jobs for a long poll
  // Long poll.
  absl::Time deadline;
  LeaseDone done;
  // Stream.
  std::vector<std::string> queues;
  int max_in_flight = 1;
  int in_flight = 0;
  std::shared_ptr<StreamSink> sink;
  absl::flat_hash_set<std::string> enlisted;  // queues whose line it stands in
  std::shared_ptr<StreamCredit> credit;       // shared with other partitions' brokers, if any
  int credit_member = 0;
  absl::Time since = absl::InfinitePast();  // when it subscribed or began to wait

  bool has_slot() const { return in_flight < max_in_flight; }
};

// The consumers waiting for jobs, by handle, and which stream holds each ACTIVE job it was
// pushed (so an ack gives the stream its slot back, and a lost lease or a cancel reaches it).
// Each queue's line of consumers is in its QueueState; this owns the consumers themselves.
//
// Not thread-safe (the broker's mutex guards it). Handles are never reused.
class Consumers {
 public:
  // A new consumer with the next handle; the caller fills it in.
  Consumer& Add(bool stream);
  Consumer* Find(uint64_t id);
  // Calls `f(const Consumer&)` for each consumer, in no particular order.
  template <typename F>
  void ForEach(F f) const {
    for (const auto& [id, consumer] : by_id_) f(*consumer);
  }
  // A long poll or stream that ended: forgotten (a stream's holds stay until its jobs end).
  void Erase(uint64_t id) { by_id_.erase(id); }

  // The stream `stream` holds the ACTIVE job `job_seq`.
  void Hold(uint64_t job_seq, uint64_t stream) { holders_[job_seq] = stream; }
  // The job left ACTIVE: the stream that held it, if it still exists.
  Consumer* EndHold(uint64_t job_seq);
  // The stream that holds `job_seq`, if any and if it still exists.
  Consumer* HolderOf(uint64_t job_seq);

  // Ends every consumer: their callbacks (long polls) and sinks (streams) are handed out, to be
  // answered without the broker's lock.
  void DetachAll(std::vector<LeaseDone>& waiting,
                 std::vector<std::shared_ptr<StreamSink>>& streams);

 private:
  absl::flat_hash_map<uint64_t, std::unique_ptr<Consumer>> by_id_;
  absl::flat_hash_map<uint64_t, uint64_t> holders_;  // job seq -> stream handle
  uint64_t next_id_ = 1;
};

}  // namespace jobbroker::core
