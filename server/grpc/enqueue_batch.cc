#include "server/grpc/enqueue_batch.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert/convert.h"

namespace jobbroker::server {

absl::StatusOr<std::vector<core::EnqueueSpec>> BatchSpecs(const RpcAuth& auth,
                                                          const TokenEntry* caller,
                                                          const v1::EnqueueBatchRequest& batch) {
  for (const v1::EnqueueRequest& job : batch.jobs()) {
    if (absl::Status s = auth.Allow(caller, Role::kProducer, job.queue()); !s.ok()) return s;
  }
  std::vector<core::EnqueueSpec> specs;
  specs.reserve(batch.jobs_size());
  for (int i = 0; i < batch.jobs_size(); ++i) {
    absl::StatusOr<core::EnqueueSpec> spec = FromProto(batch.jobs(i));
    if (!spec.ok())
      return absl::Status(spec.status().code(),
                          absl::StrCat("jobs[", i, "].", spec.status().message()));
    specs.push_back(std::move(*spec));
  }
  return specs;
}

std::optional<uint32_t> OnePartition(const Router& router,
                                     const std::vector<core::EnqueueSpec>& specs) {
  if (!router.cluster_mode() || specs.empty()) return std::nullopt;
  const uint32_t first = router.PartitionOfQueue(specs.front().queue);
  const bool one = std::all_of(specs.begin(), specs.end(), [&](const core::EnqueueSpec& spec) {
    return router.PartitionOfQueue(spec.queue) == first;
  });
  if (!one) return std::nullopt;
  return first;
}

}  // namespace jobbroker::server
