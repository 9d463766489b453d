#include "core/consumers.h"

namespace jobbroker::core {

Consumer& Consumers::Add(bool stream) {
  auto c = std::make_unique<Consumer>();
  c->id = next_id_++;
  c->stream = stream;
  Consumer& added = *c;
  by_id_.emplace(added.id, std::move(c));
  return added;
}

Consumer* Consumers::Find(uint64_t id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

Consumer* Consumers::EndHold(uint64_t job_seq) {
  auto held = holders_.find(job_seq);
  if (held == holders_.end()) return nullptr;
  const uint64_t id = held->second;
  holders_.erase(held);
  return Find(id);  // nullptr if the stream has ended since
}

Consumer* Consumers::HolderOf(uint64_t job_seq) {
  auto held = holders_.find(job_seq);
  return held == holders_.end() ? nullptr : Find(held->second);
}

void Consumers::DetachAll(std::vector<LeaseDone>& waiting,
                          std::vector<std::shared_ptr<StreamSink>>& streams) {
  for (auto& [id, c] : by_id_) {
    if (c->stream) {
      streams.push_back(std::move(c->sink));
    } else {
      waiting.push_back(std::move(c->done));
    }
  }
  by_id_.clear();
  holders_.clear();
}

}  // namespace jobbroker::core
