#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/requests.h"
#include "jobbroker/v1/broker.pb.h"
#include "server/grpc/rpc_auth.h"
#include "server/routing/router.h"

namespace jobbroker::server {

// What EnqueueBatch and EnqueueStream both do with a batch before the broker sees it, so that
// the two ways in refuse the same batches with the same messages.

// The batch's jobs as the broker takes them. Every job's queue is checked against `caller`
// first (nullptr: auth off), so that one job the token may not enqueue refuses the whole batch;
// then each job's fields, a refusal naming the job ("jobs[3].delay: ...").
absl::StatusOr<std::vector<core::EnqueueSpec>> BatchSpecs(const RpcAuth& auth,
                                                          const TokenEntry* caller,
                                                          const v1::EnqueueBatchRequest& batch);

// In cluster mode, the partition of every job of `specs` when they share one; nullopt on a
// single node, for an empty batch, or for a batch over several partitions (which this node's
// brokers then refuse, naming the partitions).
std::optional<uint32_t> OnePartition(const Router& router,
                                     const std::vector<core::EnqueueSpec>& specs);

}  // namespace jobbroker::server
