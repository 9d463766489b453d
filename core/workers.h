#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/job.h"

namespace jobbroker::core {

// An attempt a worker is running: what the Workers page and Admin.ListWorkers show of it.
struct RunningJob {
  std::string job_id;
  std::string queue;
  int attempt = 0;
  absl::Time started_at = absl::InfinitePast();
  absl::Time lease_deadline = absl::InfinitePast();
  absl::Time timeout_at = absl::InfiniteFuture();  // InfiniteFuture: no run-time limit
  std::string progress;                            // its latest Heartbeat's report

  bool operator==(const RunningJob&) const = default;
};

// One worker, by the worker_id it gave (Subscribe or Lease): how it is connected and what it
// runs. Nothing here is stored: it is what the broker holds in memory now, so a worker that
// went away while holding jobs stays listed (with no stream) until their leases end.
struct WorkerInfo {
  std::string worker_id;
  std::vector<std::string> queues;  // subscribed or waited on, sorted, each once
  int streams = 0;                  // open Work stream subscriptions
  int lease_waits = 0;              // Lease calls waiting for a job
  int max_in_flight = 0;            // the streams' max_in_flight, summed
  // When its oldest open stream or waiting Lease began; InfiniteFuture if it has none.
  absl::Time connected_at = absl::InfiniteFuture();
  std::vector<RunningJob> running;  // oldest attempt first

  bool operator==(const WorkerInfo&) const = default;
};

// What one attempt of `job` (ACTIVE) shows as running.
RunningJob RunningJobOf(const Job& job);

// Adds `more` (from another partition or node) to `into`: a worker seen in both is one worker,
// its streams, queues and jobs together. Leaves `into` sorted by worker_id, each worker's queues
// sorted and its running jobs oldest first.
void MergeWorkers(std::vector<WorkerInfo>& into, std::vector<WorkerInfo> more);

}  // namespace jobbroker::core
