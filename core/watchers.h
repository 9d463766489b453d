#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "core/job.h"

namespace jobbroker::core {

// Where the broker sends what it tells one watcher of a job (Admin.WatchJob). The first Changed
// comes from Broker::WatchJob itself, under the broker's lock, so that it precedes every later
// call; the later ones come without the lock, once the change they describe is durable, from the
// pipeline's thread. Implementations must not block or call into the broker (queue the message
// and return).
class JobWatcher {
 public:
  virtual ~JobWatcher() = default;
  // The job as it is after a change of its state, attempt, progress or cancel request (the
  // first call: as it was when the watch began).
  virtual void Changed(Job job) = 0;
  // No more calls: OK after the job reached a terminal state (the last Changed showed it);
  // kNotFound if it was removed; kUnavailable if the broker shut down or rebuilt its state.
  virtual void End(absl::Status status) = 0;
};

// What one change tells one watcher: a new snapshot, the end of the watch, or both (in that
// order).
struct WatchNotice {
  std::shared_ptr<JobWatcher> watcher;
  std::optional<Job> job;
  std::optional<absl::Status> end;
};

// The watchers of jobs, by job id, and what each was last shown, so that a change a watcher
// would not see (a heartbeat that only moved the lease) costs it no message. Many watchers cost
// no polling: a change looks up its job's watchers in one hash probe, and nothing runs while
// nothing changes.
//
// Not thread-safe (the broker's mutex guards it). Handles are never reused.
class Watchers {
 public:
  // Registers `watcher` for `current` (not terminal), remembering it as shown. Returns the
  // handle for Remove.
  uint64_t Add(const Job& current, std::shared_ptr<JobWatcher> watcher);
  // The watch ended from the watcher's side (the caller went away). False if unknown.
  bool Remove(uint64_t handle);
  bool empty() const { return by_job_.empty(); }
  size_t size() const { return handles_.size(); }

  // `job` was put by a transition: a notice for each watcher that has not seen this much of it,
  // and the end of every watch of it once it is terminal.
  void Collect(const Job& job, std::vector<WatchNotice>& out);
  // The job `id` was removed: its watches end with kNotFound.
  void CollectRemoved(const std::string& id, std::vector<WatchNotice>& out);
  // Ends every watch with `why` (shutdown, a rebuild after a storage failure).
  void DetachAll(const absl::Status& why, std::vector<WatchNotice>& out);

 private:
  // What a watcher has seen of its job: a new message is due when any of it changed.
  struct Seen {
    JobState state = JobState::kReady;
    int attempt = 0;
    std::string progress;
    bool cancel_requested = false;
    int snoozes = 0;
    bool operator==(const Seen&) const = default;
  };
  static Seen SeenOf(const Job& job) {
    return Seen{job.state, job.attempt, job.progress, job.cancel_requested, job.snoozes};
  }
  struct Entry {
    uint64_t handle = 0;
    std::shared_ptr<JobWatcher> watcher;
    Seen seen;
  };

  absl::flat_hash_map<std::string, std::vector<Entry>> by_job_;
  absl::flat_hash_map<uint64_t, std::string> handles_;  // handle -> job id
  uint64_t next_handle_ = 1;
};

}  // namespace jobbroker::core
