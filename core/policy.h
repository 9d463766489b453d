#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace jobbroker::core {

// Values match proto/jobbroker/v1/policy.proto's Jitter.
enum class Jitter : int { kNone = 1, kFull = 2, kEqual = 3 };

struct RetryPolicy {
  int max_attempts = 5;  // attempts in total, the first included
  absl::Duration initial_backoff = absl::Seconds(1);
  double backoff_multiplier = 2.0;
  absl::Duration max_backoff = absl::Minutes(5);
  Jitter jitter = Jitter::kFull;

  // Wait before attempt `failed_attempt + 1`, before jitter:
  // min(max_backoff, initial_backoff * multiplier^(failed_attempt-1)).
  absl::Duration BaseBackoff(int failed_attempt) const;
  // BaseBackoff scaled by the jitter mode; `uniform` is a draw from [0, 1).
  absl::Duration Backoff(int failed_attempt, double uniform) const;

  bool operator==(const RetryPolicy&) const = default;
};

struct Retention {
  int64_t max_count = 0;
  absl::Duration max_age = absl::ZeroDuration();
  bool operator==(const Retention&) const = default;
};

// When the broker answers a change to a queue's jobs, and what a crash can take back. Values
// match proto/jobbroker/v1/policy.proto's Durability; docs/policies.md says what each risks.
enum class Durability : int {
  kSync = 1,   // answer after fsync: nothing answered is lost, even on power loss
  kGroup = 2,  // answer once in the log; fsync within group_commit_delay
  kNone = 3,   // answer once applied in memory; written right after, fsynced by later writes
};

// The stricter of two durabilities (kSync > kGroup > kNone).
inline Durability Stricter(Durability a, Durability b) {
  return static_cast<int>(a) < static_cast<int>(b) ? a : b;
}

struct RateLimit {
  double per_second = 0;  // 0 = no limit
  int burst = 0;
  bool operator==(const RateLimit&) const = default;
};

// A queue's effective policy: every field has a value. Defaults are DESIGN.md's.
struct QueuePolicy {
  int max_concurrency = 0;  // 0 = unlimited
  int max_concurrency_per_key = 0;
  RetryPolicy retry;
  absl::Duration lease_duration = absl::Seconds(30);
  absl::Duration dedup_ttl = absl::Hours(24);
  Retention completed_retention{1000, absl::Hours(24)};
  Retention failed_retention{10000, absl::Hours(24 * 7)};
  int64_t max_length = 0;  // 0 = unlimited
  RateLimit rate_limit;
  bool paused = false;
  // Small by default so that one producer's mistake (a whole file as a payload) cannot fill the
  // WAL and memory; a queue that needs more says so in its policy.
  int64_t max_payload_bytes = 1 << 20;
  Durability durability = Durability::kSync;
  // kGroup: the longest an answered change waits for its fsync.
  absl::Duration group_commit_delay = absl::Milliseconds(10);
  // Run-time limit of an attempt, heartbeats or not; ZeroDuration = none. A job's own timeout
  // replaces it.
  absl::Duration timeout = absl::ZeroDuration();
  // Snoozes (Release with a delay) a job may take; one more fails it (kSnoozeLimit). 0 =
  // unlimited.
  int max_snoozes = 0;

  bool operator==(const QueuePolicy&) const = default;
};

// A partial policy: set fields override the layer below (built-in defaults <- config default
// <- config per-queue <- run-time changes). Mirrors the optional fields of the API's QueuePolicy.
struct PolicyOverride {
  std::optional<int> max_concurrency;
  std::optional<int> max_concurrency_per_key;
  std::optional<int> max_attempts;
  std::optional<absl::Duration> initial_backoff;
  std::optional<double> backoff_multiplier;
  std::optional<absl::Duration> max_backoff;
  std::optional<Jitter> jitter;
  std::optional<absl::Duration> lease_duration;
  std::optional<absl::Duration> dedup_ttl;
  std::optional<int64_t> completed_max_count;
  std::optional<absl::Duration> completed_max_age;
  std::optional<int64_t> failed_max_count;
  std::optional<absl::Duration> failed_max_age;
  std::optional<int64_t> max_length;
  std::optional<double> rate_per_second;
  std::optional<int> rate_burst;
  std::optional<bool> paused;
  std::optional<int64_t> max_payload_bytes;
  std::optional<Durability> durability;
  std::optional<absl::Duration> group_commit_delay;
  std::optional<absl::Duration> timeout;
  std::optional<int> max_snoozes;

  // Copies every field set in `top` over this one.
  void MergeFrom(const PolicyOverride& top);
  // `base` with the fields set here replaced.
  QueuePolicy ApplyTo(QueuePolicy base) const;
  bool empty() const { return *this == PolicyOverride{}; }

  bool operator==(const PolicyOverride&) const = default;
};

// Bounds of lease lengths a worker or producer may ask for.
inline constexpr absl::Duration kMinLeaseDuration = absl::Milliseconds(100);
inline constexpr absl::Duration kMaxLeaseDuration = absl::Hours(12);
// The most a queue's max_payload_bytes may allow. Every job is held in memory while it is not
// finished, and a batch of them travels in one gRPC message.
inline constexpr int64_t kMaxPayloadBytesCeiling = 16 << 20;
// Bounds of group_commit_delay: below 1 ms GROUP would fsync nearly as often as SYNC; above 1 s
// a power loss could take back more than operators expect of a "group commit".
inline constexpr absl::Duration kMinGroupCommitDelay = absl::Milliseconds(1);
inline constexpr absl::Duration kMaxGroupCommitDelay = absl::Seconds(1);
// Bounds of a run-time limit (a queue's timeout, a job's): as short as a lease may be, and at
// most 30 days, beyond which nobody means "limit".
inline constexpr absl::Duration kMinTimeout = kMinLeaseDuration;
inline constexpr absl::Duration kMaxTimeout = absl::Hours(24 * 30);

// kInvalidArgument naming the first out-of-range field (e.g. "policy.retry.max_attempts must be
// at least 1"); `prefix` is put before field names.
absl::Status ValidatePolicy(const QueuePolicy& policy, const char* prefix = "policy");

}  // namespace jobbroker::core
