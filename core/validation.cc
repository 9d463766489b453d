#include "core/validation.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace jobbroker::core {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", why));
}

absl::Status ValidateKey(absl::string_view value, absl::string_view field, bool required) {
  if (required && value.empty()) return Invalid(field, "is required");
  if (value.size() > kMaxKeyBytes)
    return Invalid(field, absl::StrCat("is ", value.size(), " bytes; the limit is ", kMaxKeyBytes));
  return absl::OkStatus();
}

absl::Status ValidateLeaseLength(absl::Duration d, absl::string_view field) {
  if (d < absl::ZeroDuration()) return Invalid(field, "must not be negative");
  if (d != absl::ZeroDuration() && (d < kMinLeaseDuration || d > kMaxLeaseDuration))
    return Invalid(field, "must be between 100ms and 12h (or unset)");
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateQueueName(absl::string_view name, absl::string_view field) {
  if (name.empty()) return Invalid(field, "is required");
  if (name.size() > kMaxQueueNameBytes)
    return Invalid(
        field, absl::StrCat("is ", name.size(), " characters; the limit is ", kMaxQueueNameBytes));
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-') {
      return Invalid(field, "may contain only letters, digits and . _ : -");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDedupKey(absl::string_view key) {
  return ValidateKey(key, "dedup_key", /*required=*/false);
}

absl::Status ValidateEnqueueSpec(const EnqueueSpec& spec) {
  if (absl::Status s = ValidateQueueName(spec.queue); !s.ok()) return s;
  if (spec.payload.size() > kMaxPayloadBytes)
    return absl::ResourceExhaustedError(absl::StrCat("payload is ", spec.payload.size(),
                                                     " bytes; the limit is ", kMaxPayloadBytes));
  if (spec.headers.size() > kMaxHeaders)
    return absl::ResourceExhaustedError(absl::StrCat("headers holds ", spec.headers.size(),
                                                     " entries; the limit is ", kMaxHeaders));
  size_t header_bytes = 0;
  for (const auto& [k, v] : spec.headers) {
    if (k.empty()) return Invalid("headers", "must not have an empty name");
    header_bytes += k.size() + v.size();
  }
  if (header_bytes > kMaxHeaderBytes)
    return absl::ResourceExhaustedError(absl::StrCat(
        "headers are ", header_bytes, " bytes in all; the limit is ", kMaxHeaderBytes));
  if (spec.delay.has_value() && spec.run_at.has_value())
    return Invalid("delay", "and run_at are exclusive: set at most one");
  if (spec.delay.has_value() && *spec.delay < absl::ZeroDuration())
    return Invalid("delay", "must not be negative");
  if (absl::Status s = ValidateDedupKey(spec.dedup_key); !s.ok()) return s;
  if (spec.dedup_ttl.has_value() && *spec.dedup_ttl < absl::ZeroDuration())
    return Invalid("dedup_ttl", "must not be negative");
  if (spec.dedup_ttl.has_value() && spec.dedup_key.empty())
    return Invalid("dedup_ttl", "needs a dedup_key");
  if (spec.max_attempts < 0 || spec.max_attempts > kMaxAttemptsLimit)
    return Invalid("max_attempts",
                   absl::StrCat("must be between 0 (the queue's) and ", kMaxAttemptsLimit));
  if (absl::Status s = ValidateLeaseLength(spec.lease_duration, "lease_duration"); !s.ok())
    return s;
  if (spec.timeout < absl::ZeroDuration()) return Invalid("timeout", "must not be negative");
  if (spec.timeout != absl::ZeroDuration() &&
      (spec.timeout < kMinTimeout || spec.timeout > kMaxTimeout))
    return Invalid("timeout", "must be between 100ms and 720h (or unset: the queue's)");
  if (spec.expire_at.has_value() && spec.run_at.has_value() && *spec.expire_at <= *spec.run_at)
    return Invalid("expire_at", "must be after run_at: the job could never start");
  if (spec.depends_on.size() + spec.depends_on_index.size() > kMaxDependencies)
    return Invalid("depends_on",
                   absl::StrCat("names ", spec.depends_on.size() + spec.depends_on_index.size(),
                                " jobs; the limit is ", kMaxDependencies));
  for (size_t k = 0; k < spec.depends_on.size(); ++k) {
    if (absl::Status s = ValidateKey(spec.depends_on[k], absl::StrCat("depends_on[", k, "]"), true);
        !s.ok())
      return s;
  }
  return ValidateKey(spec.concurrency_key, "concurrency_key", false);
}

absl::Status ValidateScheduleId(absl::string_view id, absl::string_view field) {
  return ValidateQueueName(id, field);
}

absl::Status ValidateSchedule(const Schedule& schedule) {
  if (absl::Status s = ValidateScheduleId(schedule.id, "schedule.schedule_id"); !s.ok()) return s;
  const EnqueueSpec& job = schedule.job;
  // Each run's name and time are the schedule's to give.
  if (!job.dedup_key.empty())
    return Invalid("schedule.template.dedup_key",
                   "must be empty: each run's dedup key is \"<schedule_id>@<run time>\"");
  EnqueueSpec run = job;
  run.dedup_key = schedule.id;  // as each run has one (so that a dedup_ttl is accepted)
  if (absl::Status s = ValidateEnqueueSpec(run); !s.ok())
    return absl::Status(s.code(), absl::StrCat("schedule.template.", s.message()));
  if (job.delay.has_value() || job.run_at.has_value())
    return Invalid(job.delay.has_value() ? "schedule.template.delay" : "schedule.template.run_at",
                   "must be unset: the schedule decides when each run is enqueued");
  if (job.expire_at.has_value())
    return Invalid("schedule.template.expire_at",
                   "must be unset: one fixed time cannot bound every run");
  if (!job.depends_on.empty() || !job.depends_on_index.empty())
    return Invalid("schedule.template.depends_on", "must be empty: a run waits for nothing");
  return absl::OkStatus();
}

absl::Status ValidateLeaseSpec(const LeaseSpec& spec) {
  if (absl::Status s = ValidateQueueName(spec.queue); !s.ok()) return s;
  if (absl::Status s = ValidateKey(spec.worker_id, "worker_id", true); !s.ok()) return s;
  if (spec.max_jobs < 0 || spec.max_jobs > kMaxLeaseBatch)
    return Invalid("max_jobs", absl::StrCat("must be between 0 and ", kMaxLeaseBatch));
  return ValidateLeaseLength(spec.lease_duration, "lease_duration");
}

absl::Status ValidateLeaseRef(absl::string_view job_id, absl::string_view lease_id) {
  if (absl::Status s = ValidateKey(job_id, "job_id", true); !s.ok()) return s;
  return ValidateKey(lease_id, "lease_id", true);
}

absl::Status ValidateJobId(absl::string_view job_id) { return ValidateKey(job_id, "job_id", true); }

absl::Status ValidateReleaseSpec(const ReleaseSpec& spec) {
  if (absl::Status s = ValidateLeaseRef(spec.job_id, spec.lease_id); !s.ok()) return s;
  if (spec.delay.has_value() && *spec.delay < absl::ZeroDuration())
    return Invalid("delay", "must not be negative");
  if (spec.delay.has_value() && *spec.delay > kMaxSnooze)
    return Invalid("delay", "must be at most 720h");
  return absl::OkStatus();
}

absl::Status ValidateHeartbeatSpec(const HeartbeatSpec& spec) {
  if (absl::Status s = ValidateLeaseRef(spec.job_id, spec.lease_id); !s.ok()) return s;
  if (spec.checkpoint.has_value() && spec.checkpoint->size() > kMaxCheckpointBytes)
    return absl::ResourceExhaustedError(absl::StrCat("checkpoint is ", spec.checkpoint->size(),
                                                     " bytes; the limit is ", kMaxCheckpointBytes));
  if (spec.progress.has_value() && spec.progress->size() > kMaxProgressBytes)
    return absl::ResourceExhaustedError(absl::StrCat("progress is ", spec.progress->size(),
                                                     " bytes; the limit is ", kMaxProgressBytes));
  return ValidateLeaseLength(spec.extend_by, "extend_by");
}

absl::Status ValidateAckSpec(const AckSpec& spec) {
  if (absl::Status s = ValidateLeaseRef(spec.job_id, spec.lease_id); !s.ok()) return s;
  if (spec.result.size() > kMaxCheckpointBytes)
    return absl::ResourceExhaustedError(absl::StrCat("result is ", spec.result.size(),
                                                     " bytes; the limit is ", kMaxCheckpointBytes));
  return absl::OkStatus();
}

absl::Status ValidateFailSpec(const FailSpec& spec) {
  if (absl::Status s = ValidateLeaseRef(spec.job_id, spec.lease_id); !s.ok()) return s;
  if (spec.retry_after.has_value() && *spec.retry_after < absl::ZeroDuration())
    return Invalid("retry_after", "must not be negative");
  return absl::OkStatus();
}

absl::Status ValidateEnqueueBatch(const std::vector<EnqueueSpec>& specs, bool name_jobs) {
  if (specs.empty()) return absl::InvalidArgumentError("jobs must hold at least one job");
  if (specs.size() > static_cast<size_t>(kMaxLeaseBatch))
    return absl::InvalidArgumentError(
        absl::StrCat("jobs holds ", specs.size(), " jobs; the limit is ", kMaxLeaseBatch));
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::Status s = ValidateEnqueueSpec(specs[i]);
    // An index names an earlier job of the batch: a later one (or itself) would make a cycle.
    for (size_t k = 0; s.ok() && k < specs[i].depends_on_index.size(); ++k) {
      const int index = specs[i].depends_on_index[k];
      if (!name_jobs) {
        s = Invalid("depends_on_index", "is for EnqueueBatch: it names earlier jobs of the batch");
      } else if (index < 0 || static_cast<size_t>(index) >= i) {
        s = Invalid(absl::StrCat("depends_on_index[", k, "]"),
                    absl::StrCat(index, " is not an earlier job of the batch (0 to ",
                                 static_cast<int>(i) - 1,
                                 "): a job may depend only on jobs before it, so no cycle forms"));
      }
    }
    if (s.ok()) continue;
    if (name_jobs) s = absl::Status(s.code(), absl::StrCat("jobs[", i, "].", s.message()));
    return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateLease(const LeaseSpec& spec, absl::Duration wait) {
  if (absl::Status s = ValidateLeaseSpec(spec); !s.ok()) return s;
  if (wait < absl::ZeroDuration() || wait > kMaxLeaseWait)
    return absl::InvalidArgumentError("wait must be between 0 and 60s");
  return absl::OkStatus();
}

absl::Status ValidateMaxInFlight(int max_in_flight) {
  if (max_in_flight < 0 || max_in_flight > kMaxInFlight)
    return absl::InvalidArgumentError(
        absl::StrCat("max_in_flight must be between 0 and ", kMaxInFlight));
  return absl::OkStatus();
}

absl::Status ValidateSubscribeSpec(const SubscribeSpec& spec) {
  if (spec.queues.empty()) return absl::InvalidArgumentError("queues must name at least one queue");
  if (spec.queues.size() > static_cast<size_t>(kMaxSubscribedQueues))
    return absl::InvalidArgumentError(
        absl::StrCat("queues names ", spec.queues.size(), "; the limit is ", kMaxSubscribedQueues));
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < spec.queues.size(); ++i) {
    if (absl::Status s = ValidateQueueName(spec.queues[i], absl::StrCat("queues[", i, "]"));
        !s.ok())
      return s;
    if (!seen.insert(spec.queues[i]).second)
      return absl::InvalidArgumentError(absl::StrCat("queues[", i, "] repeats ", spec.queues[i]));
  }
  if (absl::Status s = ValidateMaxInFlight(spec.max_in_flight); !s.ok()) return s;
  return ValidateLeaseSpec(LeaseSpec{spec.queues[0], spec.worker_id, 1, spec.lease_duration});
}

absl::Status ValidateAckBatch(const std::vector<AckSpec>& specs) {
  if (specs.empty()) return absl::InvalidArgumentError("acks must hold at least one ack");
  if (specs.size() > static_cast<size_t>(kMaxLeaseBatch))
    return absl::InvalidArgumentError(
        absl::StrCat("acks holds ", specs.size(), " acks; the limit is ", kMaxLeaseBatch));
  for (size_t i = 0; i < specs.size(); ++i) {
    if (absl::Status s = ValidateAckSpec(specs[i]); !s.ok())
      return absl::Status(s.code(), absl::StrCat("acks[", i, "].", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ValidateListJobsSpec(const ListJobsSpec& spec) {
  if (absl::Status s = ValidateQueueName(spec.queue); !s.ok()) return s;
  if (absl::Status s = ValidateDedupKey(spec.dedup_key); !s.ok()) return s;
  if (spec.page_size < 0 || spec.page_size > kMaxLeaseBatch)
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be between 0 and ", kMaxLeaseBatch));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParsePageToken(absl::string_view token) {
  uint64_t after = 0;
  if (!token.empty() && !absl::SimpleAtoi(token, &after))
    return absl::InvalidArgumentError("page_token is not one this server handed out");
  return after;
}

absl::Status ValidateRetryJobsSpec(const RetryJobsSpec& spec) {
  if (absl::Status s = ValidateQueueName(spec.queue); !s.ok()) return s;
  if (spec.state != JobState::kFailed && spec.state != JobState::kCancelled)
    return absl::InvalidArgumentError(absl::StrCat(
        "state must be JOB_STATE_FAILED or JOB_STATE_CANCELLED, not ", JobStateName(spec.state)));
  if (spec.limit < 0 || spec.limit > kMaxRetryLimit)
    return absl::InvalidArgumentError(absl::StrCat("limit must be between 0 and ", kMaxRetryLimit,
                                                   " (0 means ", kDefaultRetryLimit, ")"));
  return absl::OkStatus();
}

absl::Status ValidatePurge(absl::string_view queue, const std::vector<JobState>& states) {
  if (absl::Status s = ValidateQueueName(queue); !s.ok()) return s;
  for (JobState s : states) {
    if (s == JobState::kActive)
      return absl::InvalidArgumentError(
          "states must not include JOB_STATE_ACTIVE: workers hold those jobs; cancel them first");
  }
  return absl::OkStatus();
}

absl::Status ValidateStartPolicies(const PolicyOverride& default_policy,
                                   const std::map<std::string, PolicyOverride>& queue_policies) {
  const QueuePolicy defaults = default_policy.ApplyTo({});
  if (absl::Status s = ValidatePolicy(defaults, "default_policy"); !s.ok()) return s;
  for (const auto& [name, policy] : queue_policies) {
    std::string field = absl::StrCat("queues[\"", name, "\"]");
    if (absl::Status s = ValidateQueueName(name, field); !s.ok()) return s;
    if (absl::Status s = ValidatePolicy(policy.ApplyTo(defaults), field.c_str()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace jobbroker::core
