#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/consumers.h"
#include "core/policy.h"
#include "core/requests.h"
#include "core/stream_credit.h"
#include "core/stream_sink.h"
#include "core/watchers.h"

namespace jobbroker::core {

// What one change of the broker's state must do once its transition is durable, and how durable
// that must be. Collected under the broker's mutex, carried out without it (Broker::Finish).
struct Effects {
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
    // For a lost lease: how the attempt ended (kLeaseExpired or kTimedOut).
    AttemptOutcome outcome = AttemptOutcome::kLeaseExpired;
  };
  std::vector<Notice> lost;       // leases that ran out under a stream
  std::vector<Notice> cancelled;  // cancel requests for jobs a stream holds
  bool wake = false;              // an earlier deadline appeared: wake the ticker
  // What watchers of the changed jobs are told (Admin.WatchJob), once the change is durable.
  std::vector<WatchNotice> watches;
  // Streams shared with other partitions that got credit back while some member starved.
  std::vector<std::shared_ptr<StreamCredit>> refills;

  // The durability the change is committed at: the strictest asked for, by these rules (the
  // one place they are written down; Broker::CommitChangeLocked applies them):
  //  - a producer's or a worker's change is as durable as the queue of each job it changes asks
  //    (Touch); a call that names a queue asks for it even if it changes nothing, so an empty
  //    Lease of a DURABILITY_NONE queue is answered at once, not after an fsync;
  //  - jobs leased to waiting consumers, expired leases and retention ask for their queue's;
  //  - an operator's change (the Admin calls) is kSync whatever the queues (Require): they are
  //    rare, and what an operator was told was done must not be undone by a power cut;
  //  - a change that asks for nothing (an empty tick, recovery's first commit) is kSync.
  std::optional<Durability> durability;
  absl::Duration group_delay = absl::InfiniteDuration();
  void Touch(const QueuePolicy& p) {
    Require(p.durability);
    if (p.durability == Durability::kGroup)
      group_delay = std::min(group_delay, p.group_commit_delay);
  }
  void Require(Durability d) { durability = durability.has_value() ? Stricter(*durability, d) : d; }
  Durability level() const { return durability.value_or(Durability::kSync); }
  // Whether anything goes to a worker (Broker::Deliver).
  bool reaches_workers() const {
    return !deliveries.empty() || !pushes.empty() || !lost.empty() || !cancelled.empty();
  }
};

}  // namespace jobbroker::core
