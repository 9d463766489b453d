// The operations core_model_fuzzer drives a Broker with, and how they are read from the fuzzer's
// input. Shared with make_corpus.cc, which writes seed inputs in the same layout.
//
// Layout: every decision is one choice among a few (`Choose(n)`, a value in [0, n)), taken with
// FuzzedDataProvider::ConsumeIntegralInRange, which reads ONE byte from the END of the input per
// choice (none when n == 1) and reduces it modulo n. So an input is its list of choices, last
// choice first. Every argument is an index into a small table below: a few queues, keys and
// durations make collisions (the same dedup key, the same concurrency key, a lease that expires
// exactly now) likely.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace jobbroker::fuzz {

enum class OpKind : int {
  kEnqueue,
  kEnqueueBatch,
  kLease,
  kHeartbeat,
  kAck,
  kFail,
  kRelease,
  kAdvance,
  kTick,
  kCancel,
  kRetry,
  kRetryQueue,
  kDelete,
  kPurge,
  kUpdatePolicy,
  kPause,
  kResume,
  kRestart,
  kCount,
};

inline constexpr std::array<const char*, 3> kQueues = {"q0", "q1", "q2"};
inline constexpr std::array<const char*, 2> kPayloads = {"a", "b"};
inline constexpr std::array<const char*, 4> kDedupKeys = {"", "k0", "k1", "k2"};
inline constexpr std::array<const char*, 3> kConcurrencyKeys = {"", "c0", "c1"};
inline constexpr std::array<int, 4> kMaxAttempts = {0, 1, 2, 3};
inline constexpr std::array<int32_t, 4> kPriorities = {0, 1, -1, 5};
inline constexpr std::array<int, 4> kMaxJobs = {1, 2, 3, 0};
// How far the clock moves per kAdvance.
inline const std::array<absl::Duration, 8> kAdvances = {
    absl::Milliseconds(1), absl::Milliseconds(100), absl::Seconds(1),  absl::Seconds(5),
    absl::Seconds(30),     absl::Seconds(61),       absl::Minutes(10), absl::Hours(25)};
// nullopt: the field is left unset.
inline const std::array<std::optional<absl::Duration>, 5> kDelays = {
    std::nullopt, absl::ZeroDuration(), absl::Seconds(1), absl::Seconds(10), absl::Seconds(100)};
// Mostly unset: a TTL without a dedup key is refused (INVALID_ARGUMENT), which a few should be.
inline const std::array<std::optional<absl::Duration>, 6> kDedupTtls = {
    std::nullopt,         std::nullopt,      std::nullopt,
    absl::ZeroDuration(), absl::Seconds(10), absl::Hours(1)};
// Zero: the queue's (or the job's).
inline const std::array<absl::Duration, 3> kJobLeases = {absl::ZeroDuration(), absl::Seconds(1),
                                                         absl::Seconds(5)};
inline const std::array<absl::Duration, 4> kWorkerLeases = {
    absl::ZeroDuration(), absl::Milliseconds(500), absl::Seconds(2), absl::Seconds(30)};
inline const std::array<absl::Duration, 4> kExtends = {
    absl::ZeroDuration(), absl::Milliseconds(500), absl::Seconds(5), absl::Seconds(60)};
inline constexpr std::array<const char*, 4> kCheckpoints = {nullptr, "", "cp1", "cp2"};
inline const std::array<std::optional<absl::Duration>, 3> kRetryAfters = {
    std::nullopt, absl::ZeroDuration(), absl::Seconds(2)};
// Retry jitter draws, fixed per broker so the model knows each backoff.
inline constexpr std::array<double, 3> kUniforms = {0.5, 0.0, 0.999};

// A reference to a job or a lease the model has seen, newest first; one past the end names one
// the broker never handed out.
inline constexpr int kRefs = 8;

struct EnqueueArgs {
  int queue = 0, payload = 0, dedup_key = 0, dedup_ttl = 0, delay = 0, concurrency_key = 0,
      max_attempts = 0, priority = 0, lease = 0;
  template <typename F>
  void Visit(F&& f) {
    f(queue, kQueues.size());
    f(payload, kPayloads.size());
    f(dedup_key, kDedupKeys.size());
    f(dedup_ttl, kDedupTtls.size());
    f(delay, kDelays.size());
    f(concurrency_key, kConcurrencyKeys.size());
    f(max_attempts, kMaxAttempts.size());
    f(priority, kPriorities.size());
    f(lease, kJobLeases.size());
  }
};

inline constexpr int kMaxBatch = 3;
struct BatchArgs {
  int extra = 0;  // the batch holds extra + 1 jobs
  std::array<EnqueueArgs, kMaxBatch> jobs;
  template <typename F>
  void Visit(F&& f) {
    f(extra, kMaxBatch);
    for (int i = 0; i <= extra; ++i) jobs[i].Visit(f);
  }
};

struct LeaseArgs {
  int queue = 0, max_jobs = 0, lease = 0;
  template <typename F>
  void Visit(F&& f) {
    f(queue, kQueues.size());
    f(max_jobs, kMaxJobs.size());
    f(lease, kWorkerLeases.size());
  }
};

struct HeartbeatArgs {
  int lease_ref = 0, extend = 0, checkpoint = 0;
  template <typename F>
  void Visit(F&& f) {
    f(lease_ref, kRefs + 1);
    f(extend, kExtends.size());
    f(checkpoint, kCheckpoints.size());
  }
};

struct AckArgs {
  int lease_ref = 0, result = 0;
  template <typename F>
  void Visit(F&& f) {
    f(lease_ref, kRefs + 1);
    f(result, kPayloads.size());
  }
};

struct FailArgs {
  int lease_ref = 0, permanent = 0, retry_after = 0;
  template <typename F>
  void Visit(F&& f) {
    f(lease_ref, kRefs + 1);
    f(permanent, 2);
    f(retry_after, kRetryAfters.size());
  }
};

struct RefArgs {  // Release (a lease), Cancel, Retry, Delete (a job)
  int ref = 0;
  template <typename F>
  void Visit(F&& f) {
    f(ref, kRefs + 1);
  }
};

struct AdvanceArgs {
  int amount = 0;
  template <typename F>
  void Visit(F&& f) {
    f(amount, kAdvances.size());
  }
};

struct QueueArgs {  // Pause, Resume
  int queue = 0;
  template <typename F>
  void Visit(F&& f) {
    f(queue, kQueues.size());
  }
};

struct RetryQueueArgs {
  int queue = 0, cancelled = 0, limit = 0, dry_run = 0;
  template <typename F>
  void Visit(F&& f) {
    f(queue, kQueues.size());
    f(cancelled, 2);  // 0: FAILED jobs, 1: CANCELLED jobs
    f(limit, 3);      // 0 means the default limit
    f(dry_run, 2);
  }
};

// Purge: which states; kPurgeActive is refused (INVALID_ARGUMENT).
enum PurgeStates : int {
  kPurgeDefault,
  kPurgeReady,
  kPurgeScheduled,
  kPurgeActive,
  kPurgeCompleted
};
struct PurgeArgs {
  int queue = 0, states = 0;
  template <typename F>
  void Visit(F&& f) {
    f(queue, kQueues.size());
    f(states, 5);
  }
};

// One policy change per kPolicy: the field, and an index into its values (modulo their number).
// Several changes in a row make combinations, some refused (max_backoff below initial_backoff,
// a negative max_concurrency).
enum PolicyField : int {
  kSetMaxConcurrency,
  kSetMaxPerKey,
  kSetMaxAttempts,
  kSetInitialBackoff,
  kSetMaxBackoff,
  kSetMultiplier,
  kSetJitter,
  kSetLease,
  kSetDedupTtl,
  kSetCompletedCount,
  kSetCompletedAge,
  kSetFailedCount,
  kSetFailedAge,
  kSetMaxLength,
  kSetPaused,
  kSetNothing,  // changes nothing: with reset, drops the queue's run-time policy
  kPolicyFieldCount,
};
inline constexpr std::array<int, 5> kMaxConcurrency = {0, 1, 2, 3, -1};
inline constexpr std::array<int, 3> kMaxPerKey = {0, 1, 2};
inline constexpr std::array<int, 3> kPolicyAttempts = {1, 2, 4};
inline const std::array<absl::Duration, 4> kInitialBackoffs = {
    absl::ZeroDuration(), absl::Milliseconds(100), absl::Seconds(1), absl::Seconds(10)};
inline const std::array<absl::Duration, 3> kMaxBackoffs = {absl::Seconds(1), absl::Seconds(10),
                                                           absl::Minutes(5)};
inline constexpr std::array<double, 3> kMultipliers = {1.0, 2.0, 3.0};
inline const std::array<absl::Duration, 3> kPolicyLeases = {absl::Milliseconds(500),
                                                            absl::Seconds(3), absl::Seconds(30)};
inline const std::array<absl::Duration, 3> kPolicyDedupTtls = {absl::ZeroDuration(),
                                                               absl::Seconds(10), absl::Hours(24)};
inline constexpr std::array<int64_t, 3> kRetentionCounts = {0, 1, 3};
inline const std::array<absl::Duration, 2> kRetentionAges = {absl::ZeroDuration(),
                                                             absl::Seconds(60)};
inline constexpr std::array<int64_t, 3> kMaxLengths = {0, 2, 5};
inline constexpr int kPolicyValues = 5;  // the most values any field has

struct PolicyArgs {
  int queue = 0, reset = 0, field = kSetNothing, value = 0;
  template <typename F>
  void Visit(F&& f) {
    f(queue, kQueues.size());
    f(reset, 2);
    f(field, kPolicyFieldCount);
    f(value, kPolicyValues);
  }
};

// A (re)start: the jitter draw and the config file's default policy (none, or short leases and
// few attempts) of the broker opened next. The input starts with one, for the first broker.
struct OpenArgs {
  int uniform = 0, config = 0;
  template <typename F>
  void Visit(F&& f) {
    f(uniform, kUniforms.size());
    f(config, 2);
  }
};

}  // namespace jobbroker::fuzz
