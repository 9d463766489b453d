#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/policy.h"
#include "core/queue_state.h"

namespace jobbroker::core {

// Every queue the broker knows, by name, and the policy layers each one's effective policy is
// made of: the built-in defaults, then the config file's default policy, then its per-queue
// policy, then the queue's run-time override (UpdateQueuePolicy).
//
// Queues are created on first use and never removed while the broker runs, so a QueueState
// reference stays valid until Clear(). Not thread-safe (the broker's mutex guards it). The
// policy layers are borrowed and must outlive the index.
class QueueIndex {
 public:
  QueueIndex(const PolicyOverride& default_policy,
             const std::map<std::string, PolicyOverride>& configured)
      : default_policy_(default_policy), configured_(configured) {}

  // The queue `name`, created (with the configured policy) if new.
  QueueState& Get(const std::string& name);
  // The queue `name`, or nullptr: for callers that must not create one (reads, refusals).
  QueueState* Find(const std::string& name);
  const QueueState* Find(const std::string& name) const;

  // The policy a queue named `queue` has with the run-time override `runtime`.
  QueuePolicy EffectivePolicy(const std::string& queue, const PolicyOverride& runtime) const;
  // Replaces the run-time override of `q` and recomputes its policy (a fresh rate-limit bucket;
  // keys with room again go back in turn). The caller has validated the result.
  void SetRuntime(QueueState& q, PolicyOverride runtime);

  // Creates every queue the config file names, so they are listed before their first job.
  void CreateConfigured();

  // In name order.
  auto begin() { return queues_.begin(); }
  auto end() { return queues_.end(); }
  size_t size() const { return queues_.size(); }

  void Clear() { queues_.clear(); }

 private:
  const PolicyOverride& default_policy_;
  const std::map<std::string, PolicyOverride>& configured_;
  std::map<std::string, std::unique_ptr<QueueState>> queues_;
};

}  // namespace jobbroker::core
