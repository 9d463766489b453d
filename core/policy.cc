#include "core/policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace jobbroker::core {

absl::Duration RetryPolicy::BaseBackoff(int failed_attempt) const {
  if (failed_attempt < 1) failed_attempt = 1;
  // Multiply in floating point and clamp before converting, so a large attempt number cannot
  // overflow: the cap is reached long before.
  double factor = std::pow(backoff_multiplier, failed_attempt - 1);
  double seconds = absl::ToDoubleSeconds(initial_backoff) * factor;
  double cap = absl::ToDoubleSeconds(max_backoff);
  if (!std::isfinite(seconds) || seconds > cap) return max_backoff;
  return absl::Seconds(seconds);
}

absl::Duration RetryPolicy::Backoff(int failed_attempt, double uniform) const {
  absl::Duration base = BaseBackoff(failed_attempt);
  uniform = std::clamp(uniform, 0.0, 1.0);
  switch (jitter) {
    case Jitter::kNone:
      return base;
    case Jitter::kFull:
      return base * uniform;
    case Jitter::kEqual:
      return base / 2 + (base / 2) * uniform;
  }
  return base;
}

void PolicyOverride::MergeFrom(const PolicyOverride& top) {
  auto merge = [](auto& dst, const auto& src) {
    if (src.has_value()) dst = src;
  };
  merge(max_concurrency, top.max_concurrency);
  merge(max_concurrency_per_key, top.max_concurrency_per_key);
  merge(max_attempts, top.max_attempts);
  merge(initial_backoff, top.initial_backoff);
  merge(backoff_multiplier, top.backoff_multiplier);
  merge(max_backoff, top.max_backoff);
  merge(jitter, top.jitter);
  merge(lease_duration, top.lease_duration);
  merge(dedup_ttl, top.dedup_ttl);
  merge(completed_max_count, top.completed_max_count);
  merge(completed_max_age, top.completed_max_age);
  merge(failed_max_count, top.failed_max_count);
  merge(failed_max_age, top.failed_max_age);
  merge(max_length, top.max_length);
  merge(rate_per_second, top.rate_per_second);
  merge(rate_burst, top.rate_burst);
  merge(paused, top.paused);
  merge(max_payload_bytes, top.max_payload_bytes);
  merge(durability, top.durability);
  merge(group_commit_delay, top.group_commit_delay);
  merge(timeout, top.timeout);
  merge(max_snoozes, top.max_snoozes);
}

QueuePolicy PolicyOverride::ApplyTo(QueuePolicy p) const {
  auto apply = [](auto& dst, const auto& src) {
    if (src.has_value()) dst = *src;
  };
  apply(p.max_concurrency, max_concurrency);
  apply(p.max_concurrency_per_key, max_concurrency_per_key);
  apply(p.retry.max_attempts, max_attempts);
  apply(p.retry.initial_backoff, initial_backoff);
  apply(p.retry.backoff_multiplier, backoff_multiplier);
  apply(p.retry.max_backoff, max_backoff);
  apply(p.retry.jitter, jitter);
  apply(p.lease_duration, lease_duration);
  apply(p.dedup_ttl, dedup_ttl);
  apply(p.completed_retention.max_count, completed_max_count);
  apply(p.completed_retention.max_age, completed_max_age);
  apply(p.failed_retention.max_count, failed_max_count);
  apply(p.failed_retention.max_age, failed_max_age);
  apply(p.max_length, max_length);
  apply(p.rate_limit.per_second, rate_per_second);
  apply(p.rate_limit.burst, rate_burst);
  apply(p.paused, paused);
  apply(p.max_payload_bytes, max_payload_bytes);
  apply(p.durability, durability);
  apply(p.group_commit_delay, group_commit_delay);
  apply(p.timeout, timeout);
  apply(p.max_snoozes, max_snoozes);
  return p;
}

absl::Status ValidatePolicy(const QueuePolicy& p, const char* prefix) {
  auto bad = [prefix](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ".", field, " ", why));
  };
  if (p.max_concurrency < 0) return bad("max_concurrency", "must not be negative");
  if (p.max_concurrency_per_key < 0) return bad("max_concurrency_per_key", "must not be negative");
  if (p.retry.max_attempts < 1 || p.retry.max_attempts > 1000)
    return bad("retry.max_attempts", "must be between 1 and 1000");
  if (p.retry.initial_backoff < absl::ZeroDuration())
    return bad("retry.initial_backoff", "must not be negative");
  if (!(p.retry.backoff_multiplier >= 1.0) || !std::isfinite(p.retry.backoff_multiplier))
    return bad("retry.backoff_multiplier", "must be a finite number of at least 1.0");
  if (p.retry.max_backoff < p.retry.initial_backoff)
    return bad("retry.max_backoff", "must not be less than retry.initial_backoff");
  if (p.lease_duration < kMinLeaseDuration || p.lease_duration > kMaxLeaseDuration)
    return bad("lease_duration", "must be between 100ms and 12h");
  if (p.dedup_ttl < absl::ZeroDuration()) return bad("dedup_ttl", "must not be negative");
  if (p.completed_retention.max_count < 0)
    return bad("completed_retention.max_count", "must not be negative");
  if (p.completed_retention.max_age < absl::ZeroDuration())
    return bad("completed_retention.max_age", "must not be negative");
  if (p.failed_retention.max_count < 0)
    return bad("failed_retention.max_count", "must not be negative");
  if (p.failed_retention.max_age < absl::ZeroDuration())
    return bad("failed_retention.max_age", "must not be negative");
  if (p.max_length < 0) return bad("max_length", "must not be negative");
  if (p.rate_limit.per_second < 0 || !std::isfinite(p.rate_limit.per_second))
    return bad("rate_limit.per_second", "must be a finite number, not negative");
  if (p.rate_limit.burst < 0) return bad("rate_limit.burst", "must not be negative");
  if (p.max_payload_bytes < 1 || p.max_payload_bytes > kMaxPayloadBytesCeiling)
    return bad("max_payload_bytes",
               absl::StrCat("must be between 1 and ", kMaxPayloadBytesCeiling));
  if (p.durability != Durability::kSync && p.durability != Durability::kGroup &&
      p.durability != Durability::kNone)
    return bad("durability", "must be DURABILITY_SYNC, DURABILITY_GROUP or DURABILITY_NONE");
  if (p.group_commit_delay < kMinGroupCommitDelay || p.group_commit_delay > kMaxGroupCommitDelay)
    return bad("group_commit_delay", "must be between 1ms and 1s");
  if (p.timeout != absl::ZeroDuration() && (p.timeout < kMinTimeout || p.timeout > kMaxTimeout))
    return bad("timeout", "must be 0 (none) or between 100ms and 720h");
  if (p.max_snoozes < 0) return bad("max_snoozes", "must not be negative");
  return absl::OkStatus();
}

}  // namespace jobbroker::core
