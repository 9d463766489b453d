#include "core/queue_index.h"

namespace jobbroker::core {

QueueState& QueueIndex::Get(const std::string& name) {
  auto it = queues_.find(name);
  if (it != queues_.end()) return *it->second;
  auto q = std::make_unique<QueueState>(name, EffectivePolicy(name, PolicyOverride{}));
  return *queues_.emplace(name, std::move(q)).first->second;
}

QueueState* QueueIndex::Find(const std::string& name) {
  auto it = queues_.find(name);
  return it == queues_.end() ? nullptr : it->second.get();
}

const QueueState* QueueIndex::Find(const std::string& name) const {
  auto it = queues_.find(name);
  return it == queues_.end() ? nullptr : it->second.get();
}

QueuePolicy QueueIndex::EffectivePolicy(const std::string& queue,
                                        const PolicyOverride& runtime) const {
  QueuePolicy p = default_policy_.ApplyTo(QueuePolicy{});
  if (auto it = configured_.find(queue); it != configured_.end()) p = it->second.ApplyTo(p);
  return runtime.ApplyTo(p);
}

void QueueIndex::SetRuntime(QueueState& q, PolicyOverride runtime) {
  q.policy = EffectivePolicy(q.name, runtime);
  q.runtime = std::move(runtime);
  q.PolicyChanged();
}

void QueueIndex::CreateConfigured() {
  for (const auto& [name, unused] : configured_) Get(name);
}

}  // namespace jobbroker::core
