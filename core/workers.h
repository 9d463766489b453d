#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "core/job.h"

namespace jobbroker::core {

// Where a worker's call came from, as the server saw it: its address, the library it says it is
// (the jobbroker-client metadata, else gRPC's user agent) and the node it is connected to.
struct WorkerOrigin {
  std::string peer;
  std::string client;
  std::string node_id;

  bool operator==(const WorkerOrigin&) const = default;
};

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
  WorkerOrigin origin;              // of its newest stream, else of its latest Lease call
  std::vector<std::string> queues;  // subscribed or waited on, sorted, each once
  int streams = 0;                  // open Work stream subscriptions
  int lease_waits = 0;              // Lease calls waiting for a job
  int max_in_flight = 0;            // the streams' max_in_flight, summed
  // When its oldest open stream or waiting Lease began; InfiniteFuture if it has none.
  absl::Time connected_at = absl::InfiniteFuture();
  // The latest lease, subscription, heartbeat, ack, fail or release heard from it;
  // InfinitePast if none since the broker started (it holds jobs leased before).
  absl::Time last_seen = absl::InfinitePast();
  std::vector<RunningJob> running;  // oldest attempt first

  bool operator==(const WorkerInfo&) const = default;
};

// When the broker last heard from each worker, and from where; what lists a worker that leases
// with unary Lease calls (no stream) between its calls. Entries older than kForgetAfter are
// dropped as new ones come, so a fleet of short-lived worker ids costs bounded memory.
//
// Not thread-safe (the broker's mutex guards it).
class RecentWorkers {
 public:
  // A worker that leased by a unary call and holds nothing is listed this long after.
  static constexpr absl::Duration kListedFor = absl::Minutes(5);
  static constexpr absl::Duration kForgetAfter = absl::Minutes(10);

  struct Seen {
    absl::Time last_seen = absl::InfinitePast();
    WorkerOrigin origin;
    std::string lease_queue;  // the queue of its latest unary Lease; empty if it made none
    absl::Time leased_at = absl::InfinitePast();
  };

  // Heard from `worker_id` at `now` (a heartbeat, ack, fail or release).
  void Heard(const std::string& worker_id, absl::Time now);
  // A unary Lease (or a subscription, with `queue` empty) from `origin`.
  void Leased(const std::string& worker_id, const std::string& queue, const WorkerOrigin& origin,
              absl::Time now);
  const Seen* Find(const std::string& worker_id) const;
  // Calls `f(worker_id, seen)` for each worker whose unary Lease is at most kListedFor old.
  template <typename F>
  void ForEachListed(absl::Time now, F f) const {
    for (const auto& [id, seen] : by_id_)
      if (!seen.lease_queue.empty() && now - seen.leased_at <= kListedFor) f(id, seen);
  }
  size_t size() const { return by_id_.size(); }

 private:
  Seen& Touch(const std::string& worker_id, absl::Time now);

  absl::flat_hash_map<std::string, Seen> by_id_;
  absl::Time swept_at_ = absl::InfinitePast();
};

// What one attempt of `job` (ACTIVE) shows as running.
RunningJob RunningJobOf(const Job& job);

// Adds `more` (from another partition or node) to `into`: a worker seen in both is one worker,
// its streams, queues and jobs together. Leaves `into` sorted by worker_id, each worker's queues
// sorted and its running jobs oldest first.
void MergeWorkers(std::vector<WorkerInfo>& into, std::vector<WorkerInfo> more);

}  // namespace jobbroker::core
