#pragma once

// The one mutation path's templates, shared by the files that implement Broker (broker.cc has
// its non-template half: StartChangeLocked, CommitChangeLocked, Finish). Not part of the
// interface: include core/broker.h.

#include <optional>
#include <utility>

#include "core/broker.h"

namespace jobbroker::core {

template <typename Op>
absl::Status Broker::Mutate(Effects& fx, uint64_t& commit, Op op) {
  absl::MutexLock lock(&mu_);
  absl::Status status = RefusalLocked();
  if (status.ok()) {
    Transition t;
    const absl::Time now = StartChangeLocked(t, fx);
    status = op(now, t, fx);
    // Committed even when `op` refused: the due work StartChangeLocked did is in `t` too.
    commit = CommitChangeLocked(std::move(t), fx);
  } else if (deadlines_.wake_needed()) {
    fx.wake = true;
  }
  return status;
}

template <typename T, typename Op>
void Broker::Run(Done<absl::StatusOr<T>> done, Op op) {
  Effects fx;
  uint64_t commit = 0;
  std::optional<absl::StatusOr<T>> result;
  absl::Status refused = Mutate(fx, commit,
                                [&](absl::Time now, Transition& t, Effects& effects)
                                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                      result.emplace(op(now, t, effects));
                                      return absl::OkStatus();
                                    });
  if (!refused.ok()) result.emplace(std::move(refused));
  Reply<T>(commit, std::move(fx), std::move(done), *std::move(result));
}

template <typename T>
void Broker::Reply(uint64_t commit, Effects fx, Done<absl::StatusOr<T>> done,
                   absl::StatusOr<T> result) {
  Finish(commit, std::move(fx),
         [done = std::move(done), result = std::move(result)](absl::Status written) mutable {
           if (written.ok()) {
             done(std::move(result));
           } else {
             done(NotDurable(written));
           }
         });
}

}  // namespace jobbroker::core
