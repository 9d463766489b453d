#include "server/observability/queue_labels.h"

namespace jobbroker::server {

std::string QueueLabels::For(const std::string& queue) {
  absl::MutexLock lock(&mu_);
  if (labelled_.contains(queue)) return queue;
  if (max_queues_ != 0 && labelled_.size() >= max_queues_) return kOtherQueues;
  labelled_.insert(queue);
  return queue;
}

}  // namespace jobbroker::server
