#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/requests.h"

namespace jobbroker {

// Checks of request shape that need no broker state. Each returns kInvalidArgument (or
// kResourceExhausted for an oversized payload or result) with a message that starts with the
// field's name, so a caller sees at once what to fix.

// 1 to 128 characters of [A-Za-z0-9._:-]. `field` names it in the message.
absl::Status ValidateQueueName(absl::string_view name, absl::string_view field = "queue");
absl::Status ValidateEnqueueSpec(const EnqueueSpec& spec);
absl::Status ValidateLeaseSpec(const LeaseSpec& spec);
// job_id and lease_id: present and not over-long.
absl::Status ValidateLeaseRef(absl::string_view job_id, absl::string_view lease_id);
// A job id alone (the admin calls): present and not over-long.
absl::Status ValidateJobId(absl::string_view job_id);
// A dedup key a caller names (Enqueue, ListJobs): empty (none) or at most 256 bytes.
absl::Status ValidateDedupKey(absl::string_view key);
absl::Status ValidateHeartbeatSpec(const HeartbeatSpec& spec);
absl::Status ValidateAckSpec(const AckSpec& spec);
absl::Status ValidateFailSpec(const FailSpec& spec);

// The policies a broker starts with (its config file): the default policy, and each named
// queue's policy combined with it. The message names the queue and field, as in
// `queues["emails"].lease_duration must be between 100ms and 12h`.
absl::Status ValidateStartPolicies(const PolicyOverride& default_policy,
                                   const std::map<std::string, PolicyOverride>& queue_policies);

}  // namespace jobbroker
