#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/requests.h"
#include "core/schedules.h"

namespace jobbroker::core {

// The longest a Lease may wait for a job.
inline constexpr absl::Duration kMaxLeaseWait = absl::Seconds(60);
// The most jobs one job may depend on (depends_on and depends_on_index together).
inline constexpr size_t kMaxDependencies = 10'000;
// The longest a worker may snooze a job (Release with a delay).
inline constexpr absl::Duration kMaxSnooze = absl::Hours(24 * 30);

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
// A Release: the lease reference, and a snooze delay between 0 and kMaxSnooze.
absl::Status ValidateReleaseSpec(const ReleaseSpec& spec);
// A dedup key a caller names (Enqueue, ListJobs): empty (none) or at most 256 bytes.
absl::Status ValidateDedupKey(absl::string_view key);
absl::Status ValidateHeartbeatSpec(const HeartbeatSpec& spec);
absl::Status ValidateAckSpec(const AckSpec& spec);
absl::Status ValidateFailSpec(const FailSpec& spec);
// EnqueueBatch: 1 to kMaxLeaseBatch jobs, each valid; with `name_jobs` a refusal about one job
// starts with "jobs[i].".
absl::Status ValidateEnqueueBatch(const std::vector<EnqueueSpec>& specs, bool name_jobs);
// Lease: the spec, and a long-poll `wait` of 0 to kMaxLeaseWait.
absl::Status ValidateLease(const LeaseSpec& spec, absl::Duration wait);
// A Work stream's max_in_flight: 0 (drained) to kMaxInFlight.
absl::Status ValidateMaxInFlight(int max_in_flight);
// A Work stream's first message: 1 to kMaxSubscribedQueues distinct valid queues, and a lease
// spec that ValidateLeaseSpec accepts.
absl::Status ValidateSubscribeSpec(const SubscribeSpec& spec);
// AckBatch: 1 to kMaxLeaseBatch acks, each valid; a refusal names "acks[i].".
absl::Status ValidateAckBatch(const std::vector<AckSpec>& specs);
// ListJobs: queue, dedup key, a page_size of 0 to kMaxLeaseBatch. The page token is checked by
// ParsePageToken, which ListJobs needs for its value anyway.
absl::Status ValidateListJobsSpec(const ListJobsSpec& spec);
// A page token ListJobs handed out (the seq to continue after); empty is 0 (the first page).
// kInvalidArgument naming page_token for anything else.
absl::StatusOr<uint64_t> ParsePageToken(absl::string_view token);
// RetryJobs: queue, a FAILED or CANCELLED state, a limit of 0 to kMaxRetryLimit.
absl::Status ValidateRetryJobsSpec(const RetryJobsSpec& spec);
// A schedule an operator puts (Admin.PutSchedule), all but its timing (ScheduleTable::TimingOf
// checks cron, every, time_zone, start_at and end_at): its id, and a template that
// ValidateEnqueueSpec accepts and that leaves dedup_key, delay, run_at and expire_at to the
// schedule. Messages name "schedule.<field>" ("schedule.template.queue is required").
absl::Status ValidateSchedule(const Schedule& schedule);
// A schedule id alone (Get, Delete, Trigger): as a queue name, named `field`.
absl::Status ValidateScheduleId(absl::string_view id, absl::string_view field = "schedule_id");
// PurgeQueue: queue, and no ACTIVE among `states`.
absl::Status ValidatePurge(absl::string_view queue, const std::vector<JobState>& states);

// The policies a broker starts with (its config file): the default policy, and each named
// queue's policy combined with it. The message names the queue and field, as in
// `queues["emails"].lease_duration must be between 100ms and 12h`.
absl::Status ValidateStartPolicies(const PolicyOverride& default_policy,
                                   const std::map<std::string, PolicyOverride>& queue_policies);

}  // namespace jobbroker::core
