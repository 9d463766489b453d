#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/job.h"
#include "core/policy.h"
#include "core/requests.h"
#include "core/schedules.h"
#include "core/workers.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"
#include "jobbroker/v1/admin.pb.h"
#include "jobbroker/v1/broker.pb.h"
#include "jobbroker/v1/policy.pb.h"

namespace jobbroker::server {

// Wire <-> core. Parsing checks what only the wire form can get wrong (a malformed Duration, an
// unknown enum value, delay and run_at both set) and names the field; range checks of values
// live in core so that every entry point shares them.

absl::StatusOr<absl::Duration> FromProto(const google::protobuf::Duration& d,
                                         absl::string_view field);
absl::StatusOr<absl::Time> FromProto(const google::protobuf::Timestamp& t, absl::string_view field);
// False for the infinite times that stand for "not happened" (no lease yet, not ended): such a
// field stays unset on the wire.
inline bool HasTime(absl::Time t) {
  return t != absl::InfinitePast() && t != absl::InfiniteFuture();
}
void ToProto(absl::Time t, google::protobuf::Timestamp* out);
void ToProto(absl::Duration d, google::protobuf::Duration* out);

absl::StatusOr<core::EnqueueSpec> FromProto(const v1::EnqueueRequest& req);
absl::StatusOr<core::LeaseSpec> FromProto(const v1::LeaseRequest& req);
absl::StatusOr<core::HeartbeatSpec> FromProto(const v1::HeartbeatRequest& req);
core::AckSpec FromProto(const v1::AckRequest& req);
std::vector<core::AckSpec> FromProto(const v1::AckBatchRequest& req);
absl::StatusOr<core::FailSpec> FromProto(const v1::FailRequest& req);
absl::StatusOr<core::ReleaseSpec> FromProto(const v1::ReleaseRequest& req);
absl::StatusOr<core::SubscribeSpec> FromProto(const v1::SubscribeRequest& req);
absl::StatusOr<core::ListJobsSpec> FromProto(const v1::ListJobsRequest& req);
// RetryJob's two forms: job_id (one job) or queue (bulk), exactly one; state, dry_run and limit
// only with queue. INVALID_ARGUMENT says which rule the request breaks.
absl::Status CheckRetryJobForm(const v1::RetryJobRequest& req);
// The bulk form of RetryJob (queue set); an unset state means JOB_STATE_FAILED.
absl::StatusOr<core::RetryJobsSpec> FromProto(const v1::RetryJobRequest& req);
// PurgeQueueRequest.states; JOB_STATE_UNSPECIFIED and unknown values are refused, by index.
absl::StatusOr<std::vector<core::JobState>> FromProto(const v1::PurgeQueueRequest& req);
// `field` prefixes field names in errors ("policy", "default_policy", "queues[\"q\"]").
absl::StatusOr<core::PolicyOverride> FromProto(const v1::QueuePolicy& p, absl::string_view field);

void ToProto(const core::EnqueueResult& r, v1::EnqueueResponse* out);
void ToProto(const core::LeasedJob& j, v1::LeasedJob* out);
void ToProto(const core::HeartbeatResult& r, v1::HeartbeatResponse* out);
void ToProto(const core::FailResult& r, v1::FailResponse* out);
// A Work stream's answer to request `request_id`: its code and message. Then the answer's body:
// a heartbeat's lease deadline and cancel flag; an ack batch's refused items (ok ones are left
// out), by index.
void ToProto(uint64_t request_id, const absl::Status& status, v1::WorkResult* out);
void ToProto(const core::HeartbeatResult& r, v1::WorkResult* out);
void ToProto(const std::vector<absl::Status>& items, v1::WorkResult* out);
void ToProto(const core::ListJobsResult& r, v1::ListJobsResponse* out);
void ToProto(const core::RetryJobsResult& r, v1::RetryJobResponse* out);
void ToProto(const core::Job& j, v1::Job* out);
void ToProto(const core::QueuePolicy& p, v1::QueuePolicy* out);
void ToProto(const core::QueueInfo& q, v1::QueueInfo* out);
void ToProto(const core::WorkerInfo& w, v1::WorkerInfo* out);
// PutScheduleRequest.schedule; refusals name "schedule.<field>". The output fields are ignored.
absl::StatusOr<core::Schedule> FromProto(const v1::Schedule& s);
// Without the partition, which is the router's to add.
void ToProto(const core::ScheduleInfo& info, v1::Schedule* out);
// Another node's answer, to merge with this node's (core::MergeWorkers).
core::WorkerInfo FromProto(const v1::WorkerInfo& w);

}  // namespace jobbroker::server
