#pragma once

// Broker's private types and templates, shared by the files that implement it
// (broker.cc, broker_enqueue.cc, broker_consumers.cc, broker_attempts.cc, broker_admin.cc).
// Not part of the interface: include core/broker.h.

#include <algorithm>
#include <array>
#include <deque>
#include <limits>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/broker.h"

namespace jobbroker {

using LeaseDone = Done<absl::StatusOr<std::vector<LeasedJob>>>;

// A long-poll Lease (waits once, for up to spec.max_jobs jobs of spec.queue) or a Work stream
// (stays, holds up to max_in_flight jobs from any of its queues).
struct Broker::Consumer {
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

  bool has_slot() const { return in_flight < max_in_flight; }
};

struct Broker::QueueState {
  std::string name;
  PolicyOverride runtime;  // persisted run-time changes
  QueuePolicy policy;      // effective: built-ins <- config <- runtime
  // READY jobs, grouped by concurrency_key ("" = none). Groups take turns (`ring`), so one busy
  // key cannot starve the others; inside a group, higher priority first, then FIFO (priority
  // negated so begin() is next).
  struct Group {
    absl::btree_set<std::pair<int64_t, uint64_t>> ready;
    int64_t active = 0;    // ACTIVE jobs of the key, for max_concurrency_per_key
    bool in_ring = false;  // queued in `ring`
  };
  absl::flat_hash_map<std::string, Group> groups;
  std::deque<std::string> ring;  // groups that may have a leasable job, in turn
  // rate_limit's token bucket; tokens_at = InfinitePast: full at the next look.
  double tokens = 0;
  absl::Time tokens_at = absl::InfinitePast();
  absl::btree_set<uint64_t> ready_by_seq;  // oldest READY job, for its age
  absl::btree_set<uint64_t> all;           // every job of the queue, for listing
  absl::btree_set<TimeKey> completed;      // (completed_at, seq), for retention
  absl::btree_set<TimeKey> dead;           // FAILED and CANCELLED, for retention
  std::array<int64_t, 7> counts{};         // indexed by JobState
  std::deque<uint64_t> consumers;          // long polls and streams with a free slot, in turn
  int64_t enqueued_total = 0;              // since start: jobs created, for QueueInfo
  int64_t completed_total = 0;             // since start: attempts acked, for QueueInfo

  int64_t count(JobState s) const { return counts[static_cast<int>(s)]; }
  // May `key` start another job? The unkeyed group ("") is exempt from the per-key limit.
  bool HasRoom(const std::string& key, const Group& g) const {
    return key.empty() || policy.max_concurrency_per_key <= 0 ||
           g.active < policy.max_concurrency_per_key;
  }
  // Puts `key` at the back of the ring if it has a ready job and room, and is not there yet.
  void Offer(const std::string& key, Group& g) {
    if (g.in_ring || g.ready.empty() || !HasRoom(key, g)) return;
    g.in_ring = true;
    ring.push_back(key);
  }
  // Drops a group that holds nothing.
  void MaybeForget(const std::string& key) {
    auto it = groups.find(key);
    if (it != groups.end() && it->second.ready.empty() && it->second.active == 0 &&
        !it->second.in_ring)
      groups.erase(it);
  }
  int64_t live() const {
    return count(JobState::kReady) + count(JobState::kScheduled) + count(JobState::kActive);
  }
};

// What an operation must do after its transition is durable.
struct Broker::Effects {
  struct Delivery {
    LeaseDone done;
    std::vector<LeasedJob> jobs;
  };
  std::vector<Delivery> deliveries;  // answers to waiting Leases
  struct Push {
    std::shared_ptr<StreamSink> sink;
    LeasedJob job;
  };
  std::vector<Push> pushes;  // jobs for streams
  struct Notice {
    std::shared_ptr<StreamSink> sink;
    std::string job_id;
  };
  std::vector<Notice> lost;       // leases that ran out under a stream
  std::vector<Notice> cancelled;  // cancel requests for jobs a stream holds
  bool wake = false;              // an earlier deadline appeared: wake the ticker

  // The durability the answer waits for: the strictest of the policies of the queues the
  // operation changed (Touch), kSync when it named none (admin operations, the ticker).
  std::optional<Durability> durability;
  absl::Duration group_delay = absl::InfiniteDuration();
  void Touch(const QueuePolicy& p) {
    durability = durability.has_value() ? Stricter(*durability, p.durability) : p.durability;
    if (p.durability == Durability::kGroup)
      group_delay = std::min(group_delay, p.group_commit_delay);
  }
  Durability level() const { return durability.value_or(Durability::kSync); }
  // Whether anything goes to a worker (Broker::Deliver).
  bool reaches_workers() const {
    return !deliveries.empty() || !pushes.empty() || !lost.empty() || !cancelled.empty();
  }
};

// Everything a store's Recover reported, collected so memory can be built under the lock. Past
// `hot_limit` whole jobs, a READY or SCHEDULED job is kept as the few fields its indexes need
// (Broker::max_hot_jobs): at millions of jobs, whole ones would not fit in memory.
struct Broker::Recovered final : RecoveryVisitor {
  struct ColdJob {
    PackedJobId id;
    uint64_t seq = 0;
    absl::Time run_at;
    int32_t priority = 0;
    uint32_t queue = 0;  // index into queue_names
    JobState state = JobState::kReady;
    std::string concurrency_key;
  };
  explicit Recovered(int64_t hot_limit) : hot_limit(hot_limit) {}
  const int64_t hot_limit;
  std::vector<Job> jobs;
  std::vector<ColdJob> cold;
  std::vector<std::string> queue_names;  // of cold jobs, each once
  absl::flat_hash_map<std::string, uint32_t> queue_index;
  std::vector<DedupEntry> dedup;
  std::vector<std::pair<std::string, PolicyOverride>> policies;
  std::vector<CorruptRecord> corrupt;

  size_t job_count() const { return jobs.size() + cold.size(); }
  void OnJob(Job job) override {
    std::optional<PackedJobId> id;
    if (static_cast<int64_t>(jobs.size()) >= hot_limit &&
        (job.state == JobState::kReady || job.state == JobState::kScheduled))
      id = PackJobId(job.id);
    if (!id.has_value()) {
      jobs.push_back(std::move(job));
      return;
    }
    auto [it, added] = queue_index.try_emplace(job.queue, queue_names.size());
    if (added) queue_names.push_back(job.queue);
    cold.push_back(ColdJob{*id, job.seq, job.run_at, job.priority, it->second, job.state,
                           std::move(job.concurrency_key)});
  }
  void OnDedup(DedupEntry entry) override { dedup.push_back(std::move(entry)); }
  void OnPolicy(std::string queue, PolicyOverride policy) override {
    policies.emplace_back(std::move(queue), std::move(policy));
  }
  void OnCorrupt(CorruptRecord record) override { corrupt.push_back(std::move(record)); }
};

// HotRef::put_at of a job whose first put is not committed yet.
inline constexpr uint64_t kNotWritten = std::numeric_limits<uint64_t>::max();

inline constexpr absl::Duration kMaxLeaseWait = absl::Seconds(60);

// Runs an asynchronous operation and blocks for its answer.
template <typename T, typename Start>
T Await(Start start) {
  absl::Notification ready;
  std::optional<T> out;
  start([&](T value) {
    out.emplace(std::move(value));
    ready.Notify();
  });
  ready.WaitForNotification();
  return std::move(*out);
}

template <typename T>
void Broker::Reply(uint64_t seq, Effects fx, Done<absl::StatusOr<T>> done,
                   absl::StatusOr<T> result) {
  Finish(seq, std::move(fx),
         [done = std::move(done), result = std::move(result)](absl::Status written) mutable {
           if (written.ok()) {
             done(std::move(result));
           } else {
             done(NotDurable(written));
           }
         });
}

template <typename T, typename Op>
void Broker::Run(Done<absl::StatusOr<T>> done, Op op) {
  Effects fx;
  absl::StatusOr<T> result;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status refused = RefusalLocked(); !refused.ok()) {
      result = refused;
    } else {
      FreezeLocked();
      absl::Time now = clock_.Now();
      Transition t;
      ProcessDue(now, t, fx);
      result = op(now, t, fx);
      seq = CommitLocked(std::move(t), fx);
    }
    if (next_wake_ == absl::InfinitePast()) fx.wake = true;
  }
  Reply<T>(seq, std::move(fx), std::move(done), std::move(result));
}

}  // namespace jobbroker
