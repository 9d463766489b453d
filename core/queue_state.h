#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "core/job.h"
#include "core/policy.h"

namespace jobbroker::core {

// One queue's indexes and limits: its READY jobs grouped by concurrency key and taken in turn,
// its counts by state, its ended jobs in the order retention removes them, the token bucket of
// its rate limit, and the line of consumers waiting for its jobs.
//
// A plain value owned by QueueIndex; not thread-safe (the broker's mutex guards it). Index() and
// Unindex() are the only way a job enters or leaves the per-state indexes, so the counts always
// agree with them. The time-ordered indexes that span queues (scheduled jobs, leases) live in
// Deadlines.
class QueueState {
 public:
  // READY jobs of one concurrency key ("" = none). Inside a group, higher priority first, then
  // FIFO (priority negated so begin() is next).
  struct Group {
    absl::btree_set<std::pair<int64_t, uint64_t>> ready;
    int64_t active = 0;    // ACTIVE jobs of the key, for max_concurrency_per_key
    bool in_ring = false;  // queued in `ring`
  };

  QueueState(std::string name, QueuePolicy policy) : name(std::move(name)), policy(policy) {}

  // Counts `job` in its state and enters it in the index of that state (READY: its group and
  // the ring; ACTIVE: its key's active count; ended: the retention order). SCHEDULED jobs are
  // only counted here.
  void Index(const Job& job);
  // The reverse of Index, for the job's current state and fields.
  void Unindex(const Job& job);
  // Forgets the READY or SCHEDULED job `seq` found in no other way (a cold job whose record
  // cannot be read): a scan of the groups. Returns the state it was counted in.
  JobState DropWaiting(uint64_t seq);

  int64_t count(JobState s) const { return counts_[static_cast<int>(s)]; }
  // READY, SCHEDULED and ACTIVE jobs: what max_length limits.
  int64_t live() const {
    return count(JobState::kReady) + count(JobState::kScheduled) + count(JobState::kActive) +
           count(JobState::kWaiting);
  }

  // May `key` start another job? The unkeyed group ("") is exempt from the per-key limit.
  bool HasRoom(const std::string& key, const Group& g) const {
    return key.empty() || policy.max_concurrency_per_key <= 0 ||
           g.active < policy.max_concurrency_per_key;
  }
  // Puts `key` at the back of the ring if it has a ready job and room, and is not there yet.
  void Offer(const std::string& key, Group& g);
  // Drops a group that holds nothing.
  void MaybeForget(const std::string& key);

  // The rate limit's token bucket. Refill tops it up to `now`; TakeToken spends one lease.
  void Refill(absl::Time now);
  void TakeToken() { tokens_ -= 1; }
  bool has_token() const { return tokens_ >= 1; }
  // When the bucket next holds a whole token for a waiting consumer; InfiniteFuture if the queue
  // has no rate limit, a token already, no consumer waiting or no READY job.
  absl::Time RefillTime() const;
  // After a policy change: a fresh token bucket, and keys that now have room back in turn.
  void PolicyChanged();

  // Retention: whether an ended set is over its max_count, and when its oldest job gets too old
  // (InfiniteFuture without a max_age).
  bool OverRetentionCount() const;
  absl::Time NextRetentionAge() const;

  const std::string name;
  PolicyOverride runtime;  // persisted run-time changes
  QueuePolicy policy;      // effective: built-ins <- config <- runtime

  // Public for the broker's walks over them (leasing, listing, retention, redrive, purge);
  // changed only through Index/Unindex and the methods above.
  absl::flat_hash_map<std::string, Group> groups;
  std::deque<std::string> ring;            // groups that may have a leasable job, in turn
  absl::btree_set<uint64_t> ready_by_seq;  // oldest READY job, for its age
  absl::btree_set<uint64_t> all;           // every job of the queue, for listing and purging
  absl::btree_set<TimeKey> completed;      // (completed_at, seq), for retention
  // COMPLETED jobs that retention reached while a WAITING job still waits for its other
  // dependencies and will want their results: out of `completed` (so they neither count against
  // max_count nor make the ticker sweep again), back in once no WAITING job needs them.
  absl::btree_set<TimeKey> held_for_dependents;
  absl::btree_set<TimeKey> dead;   // FAILED and CANCELLED, for retention
  std::deque<uint64_t> consumers;  // long polls and streams with a free slot, in turn
  int64_t enqueued_total = 0;      // since start: jobs created, for QueueInfo
  int64_t completed_total = 0;     // since start: attempts acked, for QueueInfo

 private:
  std::array<int64_t, 8> counts_{};  // indexed by JobState
  // rate_limit's token bucket; tokens_at_ = InfinitePast: full at the next look.
  double tokens_ = 0;
  absl::Time tokens_at_ = absl::InfinitePast();
};

}  // namespace jobbroker::core
