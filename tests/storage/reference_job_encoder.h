#pragma once

// A JobRecord as protobuf writes the message built from a Job field by field: what
// storage::EncodeJob, which writes the wire format itself, must produce byte for byte
// (record_codec_test.cc), and what it is timed against (bench/codec_bench.cc).
#include <cstdint>
#include <limits>
#include <string>

#include "absl/time/time.h"
#include "core/job.h"
#include "storage/record.pb.h"

namespace jobbroker::storage {

inline int64_t ReferenceMicros(absl::Time t) {
  if (t == absl::InfinitePast()) return std::numeric_limits<int64_t>::min();
  if (t == absl::InfiniteFuture()) return std::numeric_limits<int64_t>::max();
  return absl::ToUnixMicros(t);
}
inline int64_t ReferenceMicros(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return std::numeric_limits<int64_t>::max();
  if (d == -absl::InfiniteDuration()) return std::numeric_limits<int64_t>::min();
  return absl::ToInt64Microseconds(d);
}
inline std::string ReferenceEncode(const core::Job& job) {
  JobRecord r;
  r.set_format_version(1);
  r.set_id(job.id);
  r.set_queue(job.queue);
  r.set_state(static_cast<int32_t>(job.state));
  r.set_payload(job.payload);
  for (const auto& [key, value] : job.headers) {
    HeaderRecord* h = r.add_headers();
    h->set_key(key);
    h->set_value(value);
  }
  r.set_priority(job.priority);
  r.set_seq(job.seq);
  r.set_attempt(job.attempt);
  r.set_max_attempts(job.max_attempts);
  r.set_dedup_key(job.dedup_key);
  r.set_concurrency_key(job.concurrency_key);
  r.set_created_at_us(ReferenceMicros(job.created_at));
  r.set_run_at_us(ReferenceMicros(job.run_at));
  r.set_lease_duration_us(ReferenceMicros(job.lease_duration));
  r.set_lease_id(job.lease_id);
  r.set_worker_id(job.worker_id);
  r.set_lease_deadline_us(ReferenceMicros(job.lease_deadline));
  r.set_lease_length_us(ReferenceMicros(job.lease_length));
  r.set_cancel_requested(job.cancel_requested);
  r.set_last_error(job.last_error);
  r.set_fail_reason(static_cast<int32_t>(job.fail_reason));
  for (const core::AttemptRecord& a : job.attempts) {
    AttemptRecord* ar = r.add_attempts();
    ar->set_attempt(a.attempt);
    ar->set_worker_id(a.worker_id);
    ar->set_started_at_us(ReferenceMicros(a.started_at));
    ar->set_ended_at_us(ReferenceMicros(a.ended_at));
    ar->set_outcome(static_cast<int32_t>(a.outcome));
    ar->set_error(a.error);
  }
  r.set_result(job.result);
  r.set_checkpoint(job.checkpoint);
  r.set_completed_at_us(ReferenceMicros(job.completed_at));
  r.set_timeout_us(ReferenceMicros(job.timeout));
  if (job.timeout_at != absl::InfiniteFuture())
    r.set_timeout_at_us(ReferenceMicros(job.timeout_at));
  if (job.expire_at != absl::InfiniteFuture()) r.set_expire_at_us(ReferenceMicros(job.expire_at));
  r.set_snoozes(job.snoozes);
  r.set_progress(job.progress);
  for (const std::string& id : job.depends_on) r.add_depends_on(id);
  for (const auto& [id, result] : job.dependency_results) {
    HeaderRecord* d = r.add_dependency_results();
    d->set_key(id);
    d->set_value(result);
  }
  return r.SerializeAsString();
}

}  // namespace jobbroker::storage
