#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/requests.h"

namespace jobbroker::core {

// Where the broker sends what it pushes to one Work stream. The broker calls it without its
// lock held, after the leases it pushes are durable, possibly from several threads at once:
// implementations serialise and must not block (queue the message and return).
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // A job leased to this stream.
  virtual void PushJob(LeasedJob job) = 0;
  // Several jobs leased to this stream by one transition, in order. Sinks that can send them
  // together (one message to a worker that takes batches) override this.
  virtual void PushJobs(std::vector<LeasedJob> jobs) {
    for (LeasedJob& job : jobs) PushJob(std::move(job));
  }
  // A lease this stream held ended without an answer from the worker: it ran out
  // (kLeaseExpired) or the attempt reached its run-time limit (kTimedOut). The worker must stop
  // working on the job.
  virtual void LeaseLost(std::string job_id, AttemptOutcome outcome) = 0;
  // An operator cancelled a job this stream holds.
  virtual void CancelRequested(std::string job_id) = 0;
  // The broker is shutting down, or rebuilt its state after a storage failure (the worker
  // subscribes again): no more pushes; end the stream with `status`.
  virtual void End(absl::Status status) = 0;
};

}  // namespace jobbroker::core
