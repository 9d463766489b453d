#include "server/convert/convert.h"

#include <google/protobuf/util/time_util.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace jobbroker::server {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", why));
}

}  // namespace

absl::StatusOr<absl::Duration> FromProto(const google::protobuf::Duration& d,
                                         absl::string_view field) {
  if (std::abs(d.nanos()) > 999'999'999 || (d.seconds() > 0 && d.nanos() < 0) ||
      (d.seconds() < 0 && d.nanos() > 0)) {
    return Invalid(field, "is not a valid duration (nanos out of range or of the wrong sign)");
  }
  // The range google.protobuf.Duration allows: beyond it no JSON form exists, and the times it
  // leads to cannot be written back as Timestamps.
  using google::protobuf::util::TimeUtil;
  if (d.seconds() < TimeUtil::kDurationMinSeconds || d.seconds() > TimeUtil::kDurationMaxSeconds)
    return Invalid(field, "is out of range (at most 10000 years either way)");
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

absl::StatusOr<absl::Time> FromProto(const google::protobuf::Timestamp& t,
                                     absl::string_view field) {
  if (t.nanos() < 0 || t.nanos() > 999'999'999)
    return Invalid(field, "is not a valid timestamp (nanos out of range)");
  using google::protobuf::util::TimeUtil;
  if (t.seconds() < TimeUtil::kTimestampMinSeconds || t.seconds() > TimeUtil::kTimestampMaxSeconds)
    return Invalid(field, "is out of range (0001-01-01 to 9999-12-31)");
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

void ToProto(absl::Time t, google::protobuf::Timestamp* out) {
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) return;
  int64_t seconds = absl::ToUnixSeconds(t);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>((t - absl::FromUnixSeconds(seconds)) / absl::Nanoseconds(1)));
}

void ToProto(absl::Duration d, google::protobuf::Duration* out) {
  int64_t seconds = absl::IDivDuration(d, absl::Seconds(1), &d);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(d / absl::Nanoseconds(1)));
}

absl::StatusOr<core::EnqueueSpec> FromProto(const v1::EnqueueRequest& req) {
  core::EnqueueSpec s;
  s.queue = req.queue();
  s.payload = req.payload();
  s.headers.insert(req.headers().begin(), req.headers().end());
  s.priority = req.priority();
  if (req.has_delay() && req.has_run_at())
    return Invalid("delay", "and run_at are exclusive: set at most one");
  if (req.has_delay()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.delay(), "delay");
    if (!d.ok()) return d.status();
    s.delay = *d;
  }
  if (req.has_run_at()) {
    absl::StatusOr<absl::Time> t = FromProto(req.run_at(), "run_at");
    if (!t.ok()) return t.status();
    s.run_at = *t;
  }
  s.dedup_key = req.dedup_key();
  if (req.has_dedup_ttl()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.dedup_ttl(), "dedup_ttl");
    if (!d.ok()) return d.status();
    s.dedup_ttl = *d;
  }
  s.max_attempts = req.max_attempts();
  if (req.has_lease_duration()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.lease_duration(), "lease_duration");
    if (!d.ok()) return d.status();
    s.lease_duration = *d;
  }
  s.concurrency_key = req.concurrency_key();
  if (req.has_timeout()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.timeout(), "timeout");
    if (!d.ok()) return d.status();
    s.timeout = *d;
  }
  if (req.has_expire_at()) {
    absl::StatusOr<absl::Time> t = FromProto(req.expire_at(), "expire_at");
    if (!t.ok()) return t.status();
    s.expire_at = *t;
  }
  s.depends_on.assign(req.depends_on().begin(), req.depends_on().end());
  s.depends_on_index.assign(req.depends_on_index().begin(), req.depends_on_index().end());
  return s;
}

absl::StatusOr<core::LeaseSpec> FromProto(const v1::LeaseRequest& req) {
  core::LeaseSpec s;
  s.queue = req.queue();
  s.worker_id = req.worker_id();
  s.max_jobs = req.max_jobs();
  if (req.has_lease_duration()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.lease_duration(), "lease_duration");
    if (!d.ok()) return d.status();
    s.lease_duration = *d;
  }
  return s;
}

absl::StatusOr<core::HeartbeatSpec> FromProto(const v1::HeartbeatRequest& req) {
  core::HeartbeatSpec s;
  s.job_id = req.job_id();
  s.lease_id = req.lease_id();
  if (req.has_extend_by()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.extend_by(), "extend_by");
    if (!d.ok()) return d.status();
    s.extend_by = *d;
  }
  if (req.has_checkpoint()) s.checkpoint = req.checkpoint();
  if (req.has_progress()) s.progress = req.progress();
  return s;
}

core::AckSpec FromProto(const v1::AckRequest& req) {
  return core::AckSpec{req.job_id(), req.lease_id(), req.result()};
}

absl::StatusOr<core::FailSpec> FromProto(const v1::FailRequest& req) {
  core::FailSpec s{req.job_id(), req.lease_id(), req.error(), req.permanent(), std::nullopt};
  if (req.has_retry_after()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.retry_after(), "retry_after");
    if (!d.ok()) return d.status();
    s.retry_after = *d;
  }
  return s;
}

std::vector<core::AckSpec> FromProto(const v1::AckBatchRequest& req) {
  std::vector<core::AckSpec> specs;
  specs.reserve(static_cast<size_t>(req.acks_size()));
  for (const v1::AckRequest& ack : req.acks()) specs.push_back(FromProto(ack));
  return specs;
}

absl::StatusOr<core::ReleaseSpec> FromProto(const v1::ReleaseRequest& req) {
  core::ReleaseSpec s{req.job_id(), req.lease_id(), std::nullopt};
  if (req.has_delay()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.delay(), "delay");
    if (!d.ok()) return d.status();
    s.delay = *d;
  }
  return s;
}

absl::StatusOr<core::SubscribeSpec> FromProto(const v1::SubscribeRequest& req) {
  core::SubscribeSpec s;
  s.queues.assign(req.queues().begin(), req.queues().end());
  s.worker_id = req.worker_id();
  s.max_in_flight = req.max_in_flight();
  if (req.has_lease_duration()) {
    absl::StatusOr<absl::Duration> d = FromProto(req.lease_duration(), "lease_duration");
    if (!d.ok()) return d.status();
    s.lease_duration = *d;
  }
  return s;
}

absl::StatusOr<core::ListJobsSpec> FromProto(const v1::ListJobsRequest& req) {
  core::ListJobsSpec s;
  s.queue = req.queue();
  if (req.state() != v1::JOB_STATE_UNSPECIFIED) {
    if (req.state() < v1::JOB_STATE_READY || req.state() > v1::JOB_STATE_WAITING)
      return Invalid("state", "is not a known JobState");
    s.state = static_cast<core::JobState>(req.state());
  }
  s.page_size = req.page_size();
  s.page_token = req.page_token();
  s.newest_first = req.newest_first();
  s.dedup_key = req.dedup_key();
  return s;
}

absl::Status CheckRetryJobForm(const v1::RetryJobRequest& req) {
  const bool one = !req.job_id().empty();
  const bool bulk = !req.queue().empty();
  if (one && bulk)
    return absl::InvalidArgumentError(
        "job_id and queue are exclusive: set job_id to retry one job, or queue "
        "to retry the queue's failed (or cancelled) jobs");
  if (!one && !bulk)
    return absl::InvalidArgumentError(
        "job_id or queue is required: job_id retries one job, queue the "
        "queue's failed (or cancelled) jobs");
  // Refused rather than ignored: a caller who set them meant a bulk retry.
  if (one && (req.state() != v1::JOB_STATE_UNSPECIFIED || req.dry_run() || req.limit() != 0))
    return absl::InvalidArgumentError(
        "state, dry_run and limit apply only with queue, not with job_id");
  return absl::OkStatus();
}

absl::StatusOr<core::RetryJobsSpec> FromProto(const v1::RetryJobRequest& req) {
  core::RetryJobsSpec s;
  s.queue = req.queue();
  if (req.state() != v1::JOB_STATE_UNSPECIFIED) {
    if (req.state() < v1::JOB_STATE_READY || req.state() > v1::JOB_STATE_WAITING)
      return Invalid("state", "is not a known JobState");
    s.state = static_cast<core::JobState>(req.state());
  }
  s.dry_run = req.dry_run();
  s.limit = req.limit();
  return s;
}

absl::StatusOr<std::vector<core::JobState>> FromProto(const v1::PurgeQueueRequest& req) {
  std::vector<core::JobState> states;
  for (int i = 0; i < req.states_size(); ++i) {
    int state = req.states(i);
    if (state < v1::JOB_STATE_READY || state > v1::JOB_STATE_WAITING)
      return Invalid(absl::StrCat("states[", i, "]"),
                     "is not a known JobState (leave states empty for every terminal state)");
    states.push_back(static_cast<core::JobState>(state));
  }
  return states;
}

absl::StatusOr<core::PolicyOverride> FromProto(const v1::QueuePolicy& p, absl::string_view field) {
  core::PolicyOverride o;
  auto duration = [&](const google::protobuf::Duration& d, absl::string_view name,
                      std::optional<absl::Duration>& dst) -> absl::Status {
    absl::StatusOr<absl::Duration> v = FromProto(d, absl::StrCat(field, ".", name));
    if (!v.ok()) return v.status();
    dst = *v;
    return absl::OkStatus();
  };
  if (p.has_max_concurrency()) o.max_concurrency = p.max_concurrency();
  if (p.has_max_concurrency_per_key()) o.max_concurrency_per_key = p.max_concurrency_per_key();
  if (p.has_retry()) {
    const v1::RetryPolicy& r = p.retry();
    if (r.has_max_attempts()) o.max_attempts = r.max_attempts();
    if (r.has_initial_backoff()) {
      if (auto s = duration(r.initial_backoff(), "retry.initial_backoff", o.initial_backoff);
          !s.ok())
        return s;
    }
    if (r.has_backoff_multiplier()) o.backoff_multiplier = r.backoff_multiplier();
    if (r.has_max_backoff()) {
      if (auto s = duration(r.max_backoff(), "retry.max_backoff", o.max_backoff); !s.ok()) return s;
    }
    if (r.jitter() != v1::JITTER_UNSPECIFIED) {
      if (r.jitter() < v1::JITTER_NONE || r.jitter() > v1::JITTER_EQUAL)
        return Invalid(absl::StrCat(field, ".retry.jitter"), "is not a known Jitter");
      o.jitter = static_cast<core::Jitter>(r.jitter());
    }
  }
  if (p.has_lease_duration()) {
    if (auto s = duration(p.lease_duration(), "lease_duration", o.lease_duration); !s.ok())
      return s;
  }
  if (p.has_dedup_ttl()) {
    if (auto s = duration(p.dedup_ttl(), "dedup_ttl", o.dedup_ttl); !s.ok()) return s;
  }
  if (p.has_completed_retention()) {
    const v1::Retention& r = p.completed_retention();
    if (r.has_max_count()) o.completed_max_count = r.max_count();
    if (r.has_max_age()) {
      if (auto s = duration(r.max_age(), "completed_retention.max_age", o.completed_max_age);
          !s.ok())
        return s;
    }
  }
  if (p.has_failed_retention()) {
    const v1::Retention& r = p.failed_retention();
    if (r.has_max_count()) o.failed_max_count = r.max_count();
    if (r.has_max_age()) {
      if (auto s = duration(r.max_age(), "failed_retention.max_age", o.failed_max_age); !s.ok())
        return s;
    }
  }
  if (p.has_max_length()) o.max_length = p.max_length();
  if (p.has_rate_limit()) {
    if (p.rate_limit().has_per_second()) o.rate_per_second = p.rate_limit().per_second();
    if (p.rate_limit().has_burst()) o.rate_burst = p.rate_limit().burst();
  }
  if (p.has_paused()) o.paused = p.paused();
  if (p.has_max_payload_bytes()) o.max_payload_bytes = p.max_payload_bytes();
  if (p.durability() != v1::DURABILITY_UNSPECIFIED) {
    if (p.durability() < v1::DURABILITY_SYNC || p.durability() > v1::DURABILITY_NONE)
      return Invalid(absl::StrCat(field, ".durability"), "is not a known Durability");
    o.durability = static_cast<core::Durability>(p.durability());
  }
  if (p.has_group_commit_delay()) {
    if (auto s = duration(p.group_commit_delay(), "group_commit_delay", o.group_commit_delay);
        !s.ok())
      return s;
  }
  if (p.has_timeout()) {
    if (auto s = duration(p.timeout(), "timeout", o.timeout); !s.ok()) return s;
  }
  if (p.has_max_snoozes()) o.max_snoozes = p.max_snoozes();
  return o;
}

void ToProto(const core::EnqueueResult& r, v1::EnqueueResponse* out) {
  out->set_job_id(r.job_id);
  out->set_deduplicated(r.deduplicated);
}

void ToProto(const core::HeartbeatResult& r, v1::HeartbeatResponse* out) {
  if (HasTime(r.lease_deadline)) ToProto(r.lease_deadline, out->mutable_lease_deadline());
  out->set_cancel_requested(r.cancel_requested);
}

void ToProto(const core::FailResult& r, v1::FailResponse* out) {
  out->set_state(static_cast<v1::JobState>(r.state));
  if (HasTime(r.next_attempt_at)) ToProto(r.next_attempt_at, out->mutable_next_attempt_at());
}

void ToProto(uint64_t request_id, const absl::Status& status, v1::WorkResult* out) {
  out->set_request_id(request_id);
  out->set_code(static_cast<int>(status.code()));
  out->set_message(std::string(status.message()));
}

void ToProto(const core::HeartbeatResult& r, v1::WorkResult* out) {
  if (HasTime(r.lease_deadline)) ToProto(r.lease_deadline, out->mutable_lease_deadline());
  out->set_cancel_requested(r.cancel_requested);
}

void ToProto(const std::vector<absl::Status>& items, v1::WorkResult* out) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].ok()) continue;
    v1::ItemError* e = out->add_item_errors();
    e->set_index(static_cast<int32_t>(i));
    e->set_code(static_cast<int>(items[i].code()));
    e->set_message(std::string(items[i].message()));
  }
}

void ToProto(const core::ListJobsResult& r, v1::ListJobsResponse* out) {
  for (const core::Job& j : r.jobs) ToProto(j, out->add_jobs());
  out->set_next_page_token(r.next_page_token);
}

void ToProto(const core::RetryJobsResult& r, v1::RetryJobResponse* out) {
  out->set_matched(r.matched);
  out->set_retried(r.retried);
}

void ToProto(const core::LeasedJob& j, v1::LeasedJob* out) {
  out->set_job_id(j.job_id);
  out->set_lease_id(j.lease_id);
  out->set_queue(j.queue);
  out->set_payload(j.payload);
  out->mutable_headers()->insert(j.headers.begin(), j.headers.end());
  out->set_attempt(j.attempt);
  out->set_max_attempts(j.max_attempts);
  if (HasTime(j.lease_deadline)) ToProto(j.lease_deadline, out->mutable_lease_deadline());
  out->set_idempotency_key(j.idempotency_key);
  out->set_checkpoint(j.checkpoint);
  if (HasTime(j.enqueued_at)) ToProto(j.enqueued_at, out->mutable_enqueued_at());
  if (HasTime(j.timeout_at)) ToProto(j.timeout_at, out->mutable_timeout_at());
  out->mutable_dependency_results()->insert(j.dependency_results.begin(),
                                            j.dependency_results.end());
}

void ToProto(const core::Job& j, v1::Job* out) {
  out->set_id(j.id);
  out->set_queue(j.queue);
  out->set_state(static_cast<v1::JobState>(j.state));
  out->set_payload(j.payload);
  out->mutable_headers()->insert(j.headers.begin(), j.headers.end());
  out->set_priority(j.priority);
  out->set_attempt(j.attempt);
  out->set_max_attempts(j.max_attempts);
  out->set_dedup_key(j.dedup_key);
  out->set_concurrency_key(j.concurrency_key);
  if (HasTime(j.created_at)) ToProto(j.created_at, out->mutable_created_at());
  if ((j.state == core::JobState::kReady || j.state == core::JobState::kScheduled) &&
      HasTime(j.run_at))
    ToProto(j.run_at, out->mutable_run_at());
  if ((j.state == core::JobState::kActive) && HasTime(j.lease_deadline))
    ToProto(j.lease_deadline, out->mutable_lease_deadline());
  out->set_last_error(j.last_error);
  out->set_fail_reason(static_cast<v1::FailReason>(j.fail_reason));
  for (const core::AttemptRecord& a : j.attempts) {
    v1::AttemptRecord* r = out->add_attempts();
    r->set_attempt(a.attempt);
    r->set_worker_id(a.worker_id);
    if (HasTime(a.started_at)) ToProto(a.started_at, r->mutable_started_at());
    if (HasTime(a.ended_at)) ToProto(a.ended_at, r->mutable_ended_at());
    r->set_outcome(static_cast<v1::AttemptOutcome>(a.outcome));
    r->set_error(a.error);
  }
  out->set_result(j.result);
  out->set_checkpoint(j.checkpoint);
  if (HasTime(j.completed_at)) ToProto(j.completed_at, out->mutable_completed_at());
  out->set_cancel_requested(j.cancel_requested);
  out->set_idempotency_key(j.idempotency_key());
  if (j.timeout > absl::ZeroDuration()) ToProto(j.timeout, out->mutable_timeout());
  if (j.state == core::JobState::kActive && HasTime(j.timeout_at))
    ToProto(j.timeout_at, out->mutable_timeout_at());
  if (HasTime(j.expire_at)) ToProto(j.expire_at, out->mutable_expire_at());
  out->set_snoozes(j.snoozes);
  out->set_progress(j.progress);
  for (const std::string& id : j.depends_on) out->add_depends_on(id);
  for (const std::string& id : j.dependents) out->add_dependents(id);
  out->mutable_dependency_results()->insert(j.dependency_results.begin(),
                                            j.dependency_results.end());
}

void ToProto(const core::QueuePolicy& p, v1::QueuePolicy* out) {
  out->set_max_concurrency(p.max_concurrency);
  out->set_max_concurrency_per_key(p.max_concurrency_per_key);
  v1::RetryPolicy* r = out->mutable_retry();
  r->set_max_attempts(p.retry.max_attempts);
  ToProto(p.retry.initial_backoff, r->mutable_initial_backoff());
  r->set_backoff_multiplier(p.retry.backoff_multiplier);
  ToProto(p.retry.max_backoff, r->mutable_max_backoff());
  r->set_jitter(static_cast<v1::Jitter>(p.retry.jitter));
  ToProto(p.lease_duration, out->mutable_lease_duration());
  ToProto(p.dedup_ttl, out->mutable_dedup_ttl());
  out->mutable_completed_retention()->set_max_count(p.completed_retention.max_count);
  ToProto(p.completed_retention.max_age, out->mutable_completed_retention()->mutable_max_age());
  out->mutable_failed_retention()->set_max_count(p.failed_retention.max_count);
  ToProto(p.failed_retention.max_age, out->mutable_failed_retention()->mutable_max_age());
  out->set_max_length(p.max_length);
  out->mutable_rate_limit()->set_per_second(p.rate_limit.per_second);
  out->mutable_rate_limit()->set_burst(p.rate_limit.burst);
  out->set_paused(p.paused);
  out->set_max_payload_bytes(p.max_payload_bytes);
  out->set_durability(static_cast<v1::Durability>(p.durability));
  ToProto(p.group_commit_delay, out->mutable_group_commit_delay());
  ToProto(p.timeout, out->mutable_timeout());
  out->set_max_snoozes(p.max_snoozes);
}

void ToProto(const core::QueueInfo& q, v1::QueueInfo* out) {
  out->set_name(q.name);
  ToProto(q.policy, out->mutable_policy());
  for (const auto& [state, n] : q.counts) (*out->mutable_counts())[core::JobStateName(state)] = n;
  ToProto(q.oldest_ready_age, out->mutable_oldest_ready_age());
  out->set_waiting_leases(q.waiting_leases);
  out->set_active(q.active);
  out->set_dead(q.dead);
  out->set_enqueued_total(q.enqueued_total);
  out->set_completed_total(q.completed_total);
}

absl::StatusOr<core::Schedule> FromProto(const v1::Schedule& s) {
  core::Schedule out;
  out.id = s.schedule_id();
  out.cron = s.cron();
  if (s.has_every()) {
    absl::StatusOr<absl::Duration> every = FromProto(s.every(), "schedule.every");
    if (!every.ok()) return every.status();
    out.every = *every;
  }
  out.time_zone = s.time_zone();
  absl::StatusOr<core::EnqueueSpec> job = FromProto(s.template_());
  if (!job.ok())
    return absl::Status(job.status().code(),
                        absl::StrCat("schedule.template.", job.status().message()));
  out.job = *std::move(job);
  out.paused = s.paused();
  if (s.has_start_at()) {
    absl::StatusOr<absl::Time> t = FromProto(s.start_at(), "schedule.start_at");
    if (!t.ok()) return t.status();
    out.start_at = *t;
  }
  if (s.has_end_at()) {
    absl::StatusOr<absl::Time> t = FromProto(s.end_at(), "schedule.end_at");
    if (!t.ok()) return t.status();
    out.end_at = *t;
  }
  switch (s.catch_up()) {
    case v1::SCHEDULE_CATCH_UP_UNSPECIFIED:
    case v1::SCHEDULE_CATCH_UP_ONE:
      out.catch_up = core::ScheduleCatchUp::kOne;
      break;
    case v1::SCHEDULE_CATCH_UP_NONE:
      out.catch_up = core::ScheduleCatchUp::kNone;
      break;
    default:
      return Invalid("schedule.catch_up", absl::StrCat("has no value ", s.catch_up()));
  }
  return out;
}

void ToProto(const core::ScheduleInfo& info, v1::Schedule* out) {
  const core::Schedule& s = info.schedule;
  out->set_schedule_id(s.id);
  out->set_cron(s.cron);
  if (s.every != absl::ZeroDuration()) ToProto(s.every, out->mutable_every());
  out->set_time_zone(s.time_zone);
  v1::EnqueueRequest* job = out->mutable_template_();
  job->set_queue(s.job.queue);
  job->set_payload(s.job.payload);
  job->mutable_headers()->insert(s.job.headers.begin(), s.job.headers.end());
  job->set_priority(s.job.priority);
  if (s.job.dedup_ttl.has_value()) ToProto(*s.job.dedup_ttl, job->mutable_dedup_ttl());
  job->set_max_attempts(s.job.max_attempts);
  if (s.job.lease_duration != absl::ZeroDuration())
    ToProto(s.job.lease_duration, job->mutable_lease_duration());
  job->set_concurrency_key(s.job.concurrency_key);
  if (s.job.timeout != absl::ZeroDuration()) ToProto(s.job.timeout, job->mutable_timeout());
  out->set_paused(s.paused);
  if (HasTime(s.start_at)) ToProto(s.start_at, out->mutable_start_at());
  if (HasTime(s.end_at)) ToProto(s.end_at, out->mutable_end_at());
  out->set_catch_up(s.catch_up == core::ScheduleCatchUp::kNone ? v1::SCHEDULE_CATCH_UP_NONE
                                                               : v1::SCHEDULE_CATCH_UP_ONE);
  if (HasTime(s.next_run_at)) ToProto(s.next_run_at, out->mutable_next_run_at());
  if (HasTime(s.last_run_at)) ToProto(s.last_run_at, out->mutable_last_run_at());
  out->set_last_job_id(s.last_job_id);
  if (HasTime(s.created_at)) ToProto(s.created_at, out->mutable_created_at());
  out->set_error(info.error);
}

void ToProto(const core::WorkerInfo& w, v1::WorkerInfo* out) {
  out->set_worker_id(w.worker_id);
  out->set_peer(w.origin.peer);
  out->set_client(w.origin.client);
  out->set_node_id(w.origin.node_id);
  if (w.last_seen != absl::InfinitePast()) ToProto(w.last_seen, out->mutable_last_seen());
  for (const std::string& q : w.queues) out->add_queues(q);
  out->set_streams(w.streams);
  out->set_lease_waits(w.lease_waits);
  out->set_max_in_flight(w.max_in_flight);
  if (w.connected_at != absl::InfiniteFuture())
    ToProto(w.connected_at, out->mutable_connected_at());
  for (const core::RunningJob& r : w.running) {
    v1::RunningJob* job = out->add_running();
    job->set_job_id(r.job_id);
    job->set_queue(r.queue);
    job->set_attempt(r.attempt);
    ToProto(r.started_at, job->mutable_started_at());
    ToProto(r.lease_deadline, job->mutable_lease_deadline());
    if (r.timeout_at != absl::InfiniteFuture()) ToProto(r.timeout_at, job->mutable_timeout_at());
    job->set_progress(r.progress);
    out->add_in_flight(r.job_id);
  }
}

core::WorkerInfo FromProto(const v1::WorkerInfo& w) {
  core::WorkerInfo out;
  out.worker_id = w.worker_id();
  out.origin = core::WorkerOrigin{w.peer(), w.client(), w.node_id()};
  if (w.has_last_seen())
    out.last_seen = FromProto(w.last_seen(), "last_seen").value_or(absl::InfinitePast());
  out.queues.assign(w.queues().begin(), w.queues().end());
  out.streams = w.streams();
  out.lease_waits = w.lease_waits();
  out.max_in_flight = w.max_in_flight();
  if (w.has_connected_at())
    out.connected_at = FromProto(w.connected_at(), "connected_at").value_or(absl::InfiniteFuture());
  for (const v1::RunningJob& r : w.running()) {
    core::RunningJob job;
    job.job_id = r.job_id();
    job.queue = r.queue();
    job.attempt = r.attempt();
    job.started_at = FromProto(r.started_at(), "started_at").value_or(absl::InfinitePast());
    job.lease_deadline =
        FromProto(r.lease_deadline(), "lease_deadline").value_or(absl::InfinitePast());
    if (r.has_timeout_at())
      job.timeout_at = FromProto(r.timeout_at(), "timeout_at").value_or(absl::InfiniteFuture());
    job.progress = r.progress();
    out.running.push_back(std::move(job));
  }
  return out;
}

}  // namespace jobbroker::server
