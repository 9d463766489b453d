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
  // READY jobs: higher priority first, then FIFO (priority negated so begin() is next).
  absl::btree_set<std::pair<int64_t, uint64_t>> ready;
  absl::btree_set<uint64_t> ready_by_seq;  // oldest READY job, for its age
  absl::btree_set<uint64_t> all;           // every job of the queue, for listing
  absl::btree_set<TimeKey> completed;      // (completed_at, seq), for retention
  absl::btree_set<TimeKey> dead;           // FAILED and CANCELLED, for retention
  std::array<int64_t, 7> counts{};         // indexed by JobState
  std::deque<uint64_t> consumers;          // long polls and streams with a free slot, in turn

  int64_t count(JobState s) const { return counts[static_cast<int>(s)]; }
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
};

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
             done(absl::UnavailableError(
                 absl::StrCat("the change could not be made durable: ", written.message())));
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
      absl::Time now = clock_.Now();
      Transition t;
      ProcessDue(now, t, fx);
      result = op(now, t, fx);
      seq = CommitLocked(std::move(t));
    }
    if (next_wake_ == absl::InfinitePast()) fx.wake = true;
  }
  Reply<T>(seq, std::move(fx), std::move(done), std::move(result));
}

}  // namespace jobbroker
