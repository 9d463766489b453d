#pragma once

#include <cstdint>
#include <optional>

#include "absl/container/btree_set.h"
#include "absl/time/time.h"
#include "core/job.h"

namespace jobbroker::core {

// The times at which the broker must act without being asked: SCHEDULED jobs coming due, leases
// running out (or attempts reaching their run-time limit), waiting jobs expiring, long polls
// timing out; and when the ticker plans to run next, so that a new
// deadline earlier than that wakes it.
//
// Each set is ordered by (time, id): the earliest is first. Ids are job seqs for jobs and
// consumer handles for long polls. Not thread-safe (the broker's mutex guards it).
class Deadlines {
 public:
  void AddScheduled(absl::Time run_at, uint64_t seq);
  void RemoveScheduled(absl::Time run_at, uint64_t seq) { scheduled_.erase({run_at, seq}); }
  bool HasScheduled(absl::Time run_at, uint64_t seq) const {
    return scheduled_.contains({run_at, seq});
  }
  // Forgets the scheduled job `seq` whatever its time, and its expiry (a scan: for a record that
  // cannot be read).
  void DropScheduled(uint64_t seq);

  // READY and SCHEDULED jobs with an expire_at: they fail if still waiting then.
  void AddExpiry(absl::Time expire_at, uint64_t seq);
  void RemoveExpiry(absl::Time expire_at, uint64_t seq) { expiries_.erase({expire_at, seq}); }

  // An ACTIVE job's deadline: the earlier of its lease's end and its attempt's run-time limit.
  void AddLease(absl::Time deadline, uint64_t seq);
  void RemoveLease(absl::Time deadline, uint64_t seq) { leases_.erase({deadline, seq}); }
  // Every ACTIVE job as (deadline, seq), the earliest first.
  const absl::btree_set<TimeKey>& leases() const { return leases_; }

  void AddWaiter(absl::Time deadline, uint64_t consumer);
  void RemoveWaiter(absl::Time deadline, uint64_t consumer) {
    waiters_.erase({deadline, consumer});
  }

  // The earliest job or consumer whose time is at or before `now`, if any.
  std::optional<uint64_t> DueLease(absl::Time now) const { return Due(leases_, now); }
  std::optional<uint64_t> DueScheduled(absl::Time now) const { return Due(scheduled_, now); }
  std::optional<uint64_t> DueExpiry(absl::Time now) const { return Due(expiries_, now); }
  std::optional<uint64_t> DueWaiter(absl::Time now) const { return Due(waiters_, now); }

  // The earliest time in any set; InfiniteFuture if all are empty. With `jobs` false, only the
  // long polls' (what still times out while the store refuses writes).
  absl::Time Earliest(bool jobs = true) const;

  // The ticker's plan. Planned(t): it will next run at t. Note(when): something is due at
  // `when`; if that is before the plan, the ticker must be woken (wake_needed) to plan again.
  void Planned(absl::Time next) { next_wake_ = next; }
  void Note(absl::Time when) {
    if (when < next_wake_) next_wake_ = absl::InfinitePast();
  }
  bool wake_needed() const { return next_wake_ == absl::InfinitePast(); }

  // Forgets every job's deadline (a rebuild from the store); ClearWaiters the long polls'.
  void ClearJobs();
  void ClearWaiters() { waiters_.clear(); }

 private:
  static std::optional<uint64_t> Due(const absl::btree_set<TimeKey>& set, absl::Time now) {
    if (set.empty() || set.begin()->first > now) return std::nullopt;
    return set.begin()->second;
  }

  absl::btree_set<TimeKey> scheduled_;  // (run_at, job seq)
  absl::btree_set<TimeKey> leases_;     // (Job::active_deadline(), job seq)
  absl::btree_set<TimeKey> expiries_;   // (expire_at, job seq) of READY and SCHEDULED jobs
  absl::btree_set<TimeKey> waiters_;    // (deadline, consumer handle)
  absl::Time next_wake_ = absl::InfinitePast();
};

}  // namespace jobbroker::core
