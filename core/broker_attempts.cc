// Broker: what a worker says about an attempt: Heartbeat, Ack, Fail, Release (lease fencing,
// late-ack salvage, retries).
#include "absl/strings/str_cat.h"
#include "core/broker_mutation.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker::core {
namespace {

// " (the job is SCHEDULED)", or why the attempt ended when the broker ended it, for the
// refusals of a worker's late Heartbeat, Ack or Fail.
std::string HowItEnded(const Job& job) {
  const AttemptRecord* last = job.attempts.empty() || job.attempts.back().attempt != job.attempt
                                  ? nullptr
                                  : &job.attempts.back();
  if (last != nullptr && last->outcome == AttemptOutcome::kTimedOut)
    return absl::StrCat(": it timed out at its run-time limit (the job is ",
                        JobStateName(job.state), ")");
  return absl::StrCat(" (the job is ", JobStateName(job.state), ")");
}

}  // namespace

absl::StatusOr<Job*> Broker::LeasedJobForLocked(const std::string& job_id,
                                                const std::string& lease_id, absl::Time now,
                                                Effects& fx) {
  Job* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  // What a worker says of a job is as durable as the job's queue asks.
  fx.Touch(queues_.Get(job->queue).policy);
  if (job->lease_id != lease_id) {
    if (job->lease_id.empty())
      return absl::FailedPreconditionError(absl::StrCat("lease ", lease_id, " of job ", job_id,
                                                        " is not held: the job was released"));
    return absl::FailedPreconditionError(absl::StrCat("lease ", lease_id, " of job ", job_id,
                                                      " is stale: attempt ", job->attempt,
                                                      " (lease ", job->lease_id, ") replaced it"));
  }
  if (!job->attempts.empty()) recent_workers_.Heard(job->attempts.back().worker_id, now);
  return job;
}

void Broker::Heartbeat(HeartbeatSpec spec, Done<absl::StatusOr<HeartbeatResult>> done) {
  if (absl::Status s = ValidateHeartbeatSpec(spec); !s.ok()) return done(s);
  Run<HeartbeatResult>(
      std::move(done),
      [this, spec = std::move(spec)](absl::Time now, Transition& t, Effects& fx)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable { return HeartbeatLocked(spec, now, t, fx); });
}

absl::StatusOr<HeartbeatResult> Broker::HeartbeatLocked(HeartbeatSpec& spec, absl::Time now,
                                                        Transition& t, Effects& fx) {
  BROKER_ASSIGN_OR_RETURN(Job * found, LeasedJobForLocked(spec.job_id, spec.lease_id, now, fx));
  Job& job = *found;
  if (job.state != JobState::kActive)
    return absl::FailedPreconditionError(absl::StrCat("lease ", spec.lease_id, " of job ", job.id,
                                                      " has ended", HowItEnded(job),
                                                      "; stop working on it"));
  UnindexLocked(job);
  absl::Duration extend = spec.extend_by > absl::ZeroDuration() ? spec.extend_by : job.lease_length;
  job.lease_deadline = now + extend;
  if (spec.checkpoint.has_value()) job.checkpoint = std::move(*spec.checkpoint);
  if (spec.progress.has_value()) job.progress = std::move(*spec.progress);
  IndexLocked(job);
  t.put_jobs.push_back(job);
  return HeartbeatResult{job.lease_deadline, job.cancel_requested};
}

void Broker::Ack(AckSpec spec, Done<absl::Status> done) {
  if (absl::Status s = ValidateAckSpec(spec); !s.ok()) return done(s);
  Run<bool>([done = std::move(done)](absl::StatusOr<bool> r) mutable { done(r.status()); },
            [this, spec = std::move(spec)](absl::Time now, Transition& t, Effects& fx)
                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable -> absl::StatusOr<bool> {
                  BROKER_RETURN_IF_ERROR(AckLocked(spec, now, t, fx));
                  return true;
                });
}

void Broker::AckBatch(std::vector<AckSpec> specs,
                      Done<absl::StatusOr<std::vector<absl::Status>>> done) {
  if (absl::Status s = ValidateAckBatch(specs); !s.ok()) return done(s);
  using Statuses = std::vector<absl::Status>;
  Run<Statuses>(std::move(done),
                [this, specs = std::move(specs)](absl::Time now, Transition& t, Effects& fx)
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable -> absl::StatusOr<Statuses> {
                      Statuses out;
                      out.reserve(specs.size());
                      for (size_t i = 0; i < specs.size(); ++i) {
                        absl::Status s = AckLocked(specs[i], now, t, fx);
                        if (!s.ok())
                          s = absl::Status(s.code(), absl::StrCat("acks[", i, "]: ", s.message()));
                        out.push_back(std::move(s));
                      }
                      return out;
                    });
}

absl::Status Broker::AckLocked(AckSpec& spec, absl::Time now, Transition& t, Effects& fx) {
  BROKER_ASSIGN_OR_RETURN(Job * found, LeasedJobForLocked(spec.job_id, spec.lease_id, now, fx));
  Job& job = *found;
  if (job.state == JobState::kCompleted) return absl::OkStatus();  // a retried Ack of this lease
  if (job.state != JobState::kActive) {
    // Late-ack salvage: the lease ran out but no newer attempt started, so the work the worker
    // finished still counts and saves a needless rerun.
    bool expired = !job.attempts.empty() && job.attempts.back().attempt == job.attempt &&
                   job.attempts.back().outcome == AttemptOutcome::kLeaseExpired;
    if (!expired)
      return absl::FailedPreconditionError(absl::StrCat("attempt ", job.attempt, " of job ", job.id,
                                                        " already ended", HowItEnded(job)));
  }
  UnindexLocked(job);
  FinishAttemptRecordLocked(job, now, AttemptOutcome::kCompleted, "");
  job.state = JobState::kCompleted;
  job.fail_reason = FailReason::kNone;
  job.result = std::move(spec.result);
  job.completed_at = now;
  SettleLocked(job, now, t, fx);
  return absl::OkStatus();
}

void Broker::Fail(FailSpec spec, Done<absl::StatusOr<FailResult>> done) {
  if (absl::Status s = ValidateFailSpec(spec); !s.ok()) return done(s);
  Run<FailResult>(
      std::move(done),
      [this, spec = std::move(spec)](absl::Time now, Transition& t, Effects& fx)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable { return FailLocked(spec, now, t, fx); });
}

absl::StatusOr<FailResult> Broker::FailLocked(FailSpec& spec, absl::Time now, Transition& t,
                                              Effects& fx) {
  BROKER_ASSIGN_OR_RETURN(Job * found, LeasedJobForLocked(spec.job_id, spec.lease_id, now, fx));
  Job& job = *found;
  std::string error = TruncateUtf8(std::move(spec.error), kMaxErrorBytes);
  const AttemptOutcome outcome =
      spec.permanent ? AttemptOutcome::kPermanentError : AttemptOutcome::kError;
  auto answer = [&job] {
    FailResult r{job.state, absl::InfinitePast()};
    if (job.state == JobState::kScheduled || job.state == JobState::kReady)
      r.next_attempt_at = job.run_at;
    return r;
  };
  if (job.state == JobState::kActive) {
    UnindexLocked(job);
    FinishAttemptRecordLocked(job, now, outcome, error);
    EndAttemptFailedLocked(job, now, outcome, std::move(error), spec.retry_after);
    // Before SettleLocked: it may hand a job that is due at once to a waiting lease, and the
    // worker that failed it is told what its Fail did.
    FailResult r = answer();
    SettleLocked(job, now, t, fx);
    return r;
  }
  const AttemptRecord* last = job.attempts.empty() || job.attempts.back().attempt != job.attempt
                                  ? nullptr
                                  : &job.attempts.back();
  if (last != nullptr && (last->outcome == AttemptOutcome::kError ||
                          last->outcome == AttemptOutcome::kPermanentError)) {
    return answer();  // a retried Fail of this lease
  }
  if (last == nullptr || last->outcome != AttemptOutcome::kLeaseExpired)
    return absl::FailedPreconditionError(absl::StrCat("attempt ", job.attempt, " of job ", job.id,
                                                      " already ended", HowItEnded(job)));
  // A late Fail of an expired attempt: keep the worker's error, and honour `permanent`.
  UnindexLocked(job);
  job.attempts.back().outcome = outcome;
  job.attempts.back().error = error;
  job.last_error = std::move(error);
  if (spec.permanent && !IsTerminal(job.state)) {
    job.state = JobState::kFailed;
    job.fail_reason = FailReason::kPermanent;
    job.completed_at = now;
    observer_.Dead(job);
  }
  IndexLocked(job);
  t.put_jobs.push_back(job);
  return answer();
}

void Broker::Release(ReleaseSpec spec, Done<absl::Status> done) {
  if (absl::Status s = ValidateReleaseSpec(spec); !s.ok()) return done(s);
  Run<bool>([done = std::move(done)](absl::StatusOr<bool> r) mutable { done(r.status()); },
            [this, spec = std::move(spec)](absl::Time now, Transition& t, Effects& fx)
                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable -> absl::StatusOr<bool> {
                  BROKER_RETURN_IF_ERROR(ReleaseLocked(spec, now, t, fx));
                  return true;
                });
}

absl::Status Broker::ReleaseLocked(ReleaseSpec& spec, absl::Time now, Transition& t, Effects& fx) {
  BROKER_ASSIGN_OR_RETURN(Job * found, LeasedJobForLocked(spec.job_id, spec.lease_id, now, fx));
  Job& job = *found;
  if (job.state != JobState::kActive)
    return absl::FailedPreconditionError(absl::StrCat("lease ", spec.lease_id, " of job ", job.id,
                                                      " has ended (the job is ",
                                                      JobStateName(job.state), ")"));
  UnindexLocked(job);
  const absl::Duration delay = spec.delay.value_or(absl::ZeroDuration());
  const bool snooze = delay > absl::ZeroDuration() && !job.cancel_requested;
  // Given back unstarted: the attempt does not count. A snooze stays in the history (as
  // kSnoozed), so that an operator sees why the job waits; a plain release leaves no trace.
  if (!job.attempts.empty() && job.attempts.back().attempt == job.attempt) {
    if (snooze) {
      FinishAttemptRecordLocked(job, now, AttemptOutcome::kSnoozed,
                                absl::StrCat("snoozed for ", absl::FormatDuration(delay)));
    } else {
      job.attempts.pop_back();
    }
  }
  --job.attempt;
  job.lease_id.clear();
  job.worker_id.clear();
  job.lease_deadline = absl::InfinitePast();
  job.lease_length = absl::ZeroDuration();
  job.timeout_at = absl::InfiniteFuture();
  job.run_at = now;
  if (job.cancel_requested) {
    job.state = JobState::kCancelled;
    job.completed_at = now;
  } else if (snooze) {
    ++job.snoozes;
    const int limit = queues_.Get(job.queue).policy.max_snoozes;
    if (limit > 0 && job.snoozes > limit) {
      job.state = JobState::kFailed;
      job.fail_reason = FailReason::kSnoozeLimit;
      job.last_error = absl::StrCat("snoozed ", job.snoozes, " times; queue ", job.queue,
                                    " allows ", limit, " (its policy's max_snoozes)");
      job.completed_at = now;
    } else {
      job.state = JobState::kScheduled;
      job.run_at = now + delay;
    }
  } else {
    job.state = JobState::kReady;
  }
  observer_.Released(job);
  if (job.state == JobState::kCancelled) observer_.Cancelled(job);
  if (job.state == JobState::kFailed) observer_.Dead(job);
  SettleLocked(job, now, t, fx);
  return absl::OkStatus();
}

void Broker::SettleLocked(Job& job, absl::Time now, Transition& t, Effects& fx) {
  IndexLocked(job);
  t.put_jobs.push_back(job);
  EndHoldLocked(job, /*lost=*/false, now, t, fx);
  ServeConsumersLocked(queues_.Get(job.queue), now, t, fx);  // a concurrency slot may have freed
}

void Broker::FinishAttemptRecordLocked(Job& job, absl::Time now, AttemptOutcome outcome,
                                       std::string error) {
  if (job.attempts.empty() || job.attempts.back().attempt != job.attempt) return;
  AttemptRecord& rec = job.attempts.back();
  rec.ended_at = now;
  rec.outcome = outcome;
  rec.error = std::move(error);
  if (outcome == AttemptOutcome::kCompleted) ++queues_.Get(job.queue).completed_total;
  observer_.AttemptEnded(job, outcome, std::max(now - rec.started_at, absl::ZeroDuration()));
}

void Broker::EndAttemptFailedLocked(Job& job, absl::Time now, AttemptOutcome outcome,
                                    std::string error, std::optional<absl::Duration> retry_after) {
  job.last_error = std::move(error);
  if (job.cancel_requested) {
    job.state = JobState::kCancelled;
    job.completed_at = now;
  } else if (outcome == AttemptOutcome::kPermanentError) {
    job.state = JobState::kFailed;
    job.fail_reason = FailReason::kPermanent;
    job.completed_at = now;
  } else if (job.attempt >= job.max_attempts) {
    job.state = JobState::kFailed;
    job.fail_reason = FailReason::kAttemptsExhausted;
    job.completed_at = now;
  } else {
    const RetryPolicy& retry = queues_.Get(job.queue).policy.retry;
    absl::Duration wait = retry_after.value_or(retry.Backoff(job.attempt, UniformLocked()));
    job.run_at = now + wait;
    job.state = wait > absl::ZeroDuration() ? JobState::kScheduled : JobState::kReady;
  }
  switch (job.state) {
    case JobState::kScheduled:
    case JobState::kReady:
      observer_.Retried(job);
      break;
    case JobState::kFailed:
      observer_.Dead(job);
      break;
    case JobState::kCancelled:
      observer_.Cancelled(job);
      break;
    default:
      break;
  }
}

}  // namespace jobbroker::core
