// Model-based fuzzing of the broker core. The input chooses a sequence of operations (enqueue,
// lease, heartbeat, ack, fail, release, clock moves and ticks, admin calls, policy changes,
// restarts; tests/fuzz/model_ops.h) run against a Broker over a MemoryStore with a FakeClock and
// inline commits. Next to it runs a reference model: what DESIGN.md and docs/decisions.md say the
// state of every job, dedup key and queue must be. After every operation the broker's answer and
// its whole visible state must agree with the model; on the first disagreement the operation log
// is printed and the process aborts, so libFuzzer keeps the input as a crash.
//
// The model decides which jobs may be leased (paused, max_concurrency, max_concurrency_per_key,
// priority then FIFO inside a concurrency key) but not the turn order between keys, which it
// checks as a property instead (keys take turns: within one Lease no key gets two more jobs
// than another key that still had one to give). Rate limits, Work streams and long polls are
// left to the unit tests.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/broker.h"
#include "core/clock.h"
#include "storage/memory_store.h"
#include "tests/fuzz/model_ops.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"

namespace jobbroker::fuzz {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;

namespace {

using Code = absl::StatusCode;

constexpr absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);
constexpr int kMaxOps = 64;       // per input: longer inputs add nothing but time
constexpr size_t kJobLimit = 40;  // enqueues beyond this many jobs are skipped
constexpr int kAttemptHistory = core::kMaxAttemptHistory;
// A computed backoff goes through floating point; the model takes the broker's exact value once
// it is within this much of the model's.
constexpr absl::Duration kBackoffSlack = absl::Milliseconds(1);
constexpr char kNoSuchJob[] = "01NOSUCHJOB0000000000000000";

// Reports a disagreement; `why` is only built when `ok` is false (checks run after every
// operation, so building each message up front would cost more than the checks).
#define MODEL_EXPECT(ok, why) \
  do {                        \
    if (!(ok)) Mismatch(why); \
  } while (0)

std::string Show(absl::Duration d) { return absl::FormatDuration(d); }
std::string Show(const std::optional<absl::Duration>& d) {
  return d.has_value() ? absl::FormatDuration(*d) : "unset";
}
std::string Show(absl::Time t) { return absl::StrCat("T+", Show(t - kStart)); }

// What the model knows of one job.
struct ModelJob {
  std::string id, queue, payload, dedup_key, concurrency_key;
  int32_t priority = 0;
  uint64_t order = 0;  // enqueue order: FIFO among equal priorities, and retention's tie-break
  core::JobState state = core::JobState::kReady;
  int attempt = 0;
  int max_attempts = 0;
  absl::Time created_at, run_at;
  bool run_at_approx = false;  // a computed backoff, not yet compared with the broker's
  absl::Time completed_at = absl::InfinitePast();
  absl::Duration job_lease = absl::ZeroDuration();  // the producer's lease_duration
  std::string lease_id;  // the current or latest lease; empty after a release or a retry
  absl::Time lease_deadline = absl::InfinitePast();
  absl::Duration lease_length = absl::ZeroDuration();
  bool cancel_requested = false;
  // Came due in memory only: a promotion is not written, so after a restart the job is
  // SCHEDULED again until the first operation or tick (core/broker.cc, ProcessDue).
  bool promoted_unsaved = false;
  core::FailReason fail_reason = core::FailReason::kNone;
  std::vector<std::pair<int, core::AttemptOutcome>> attempts;  // (attempt, outcome), oldest first
  std::string checkpoint, result;
  bool removed = false;
  // Revived by RetryJob while another job held its dedup key: the key stays with that one.
  bool key_elsewhere = false;
  // Seen in the broker by the last check: attempt numbers only go down by a release or a
  // retry, and a completed job stays completed.
  int seen_attempt = 0;
  core::JobState seen_state = core::JobState::kReady;
  bool may_lower_attempt = false;  // this operation released or retried it

  bool live() const { return !removed && !core::IsTerminal(state); }
  // The record of the current attempt, if it has one.
  std::pair<int, core::AttemptOutcome>* current_record() {
    if (attempts.empty() || attempts.back().first != attempt) return nullptr;
    return &attempts.back();
  }
};

struct ModelDedup {
  std::string job_id;
  absl::Time expires_at;
  std::string payload;
};

struct ModelQueue {
  bool exists = false;
  core::PolicyOverride runtime;  // persisted run-time changes
  // Active counts seen by the last check, to tell whether an operation added leases.
  int64_t seen_active = 0;
  std::map<std::string, int64_t> seen_key_active;
};

class Harness {
 public:
  explicit Harness(FuzzedDataProvider& data) : data_(data), clock_(kStart) {
    for (const char* q : kQueues) queues_[q];
  }

  void Run() {
    OpenArgs first;
    Decode(first);
    Open(first);
    Log(absl::StrCat("open uniform=", kUniforms[first.uniform], " config=", first.config));
    CheckAll();
    for (int n = 0; n < kMaxOps && data_.remaining_bytes() > 0; ++n) {
      auto kind = static_cast<OpKind>(Choose(static_cast<int>(OpKind::kCount)));
      for (auto& [id, j] : jobs_) j.may_lower_attempt = false;
      Step(kind);
      CheckAll();
    }
    // JOBBROKER_FUZZ_LOG=1 prints what an input did (README.md: reading an input).
    if (std::getenv("JOBBROKER_FUZZ_LOG") != nullptr) PrintLog(stdout);
  }

 private:
  // ---------------------------------------------------------------------------------------
  // Input
  int Choose(size_t n) { return data_.ConsumeIntegralInRange<int>(0, static_cast<int>(n) - 1); }
  template <typename Args>
  void Decode(Args& args) {
    args.Visit([this](int& field, size_t n) { field = Choose(n); });
  }

  // ---------------------------------------------------------------------------------------
  // Reporting
  void Log(std::string line) { log_.push_back(std::move(line)); }

  void PrintLog(std::FILE* out) const {
    std::fprintf(out, "operations (clock starts at T+0):\n");
    for (size_t i = 0; i < log_.size(); ++i) std::fprintf(out, "  %3zu. %s\n", i, log_[i].c_str());
  }

  [[noreturn]] void Mismatch(const std::string& why) {
    std::fprintf(stderr, "\n==== core_model_fuzzer: the broker and the model disagree ====\n");
    PrintLog(stderr);
    std::fprintf(stderr, "at %s: %s\n", Show(clock_.Now()).c_str(), why.c_str());
    std::fflush(stderr);
    std::abort();
  }

  // The broker's answer must carry the model's code; a refusal must say why.
  void ExpectCode(Code want, const absl::Status& got, const std::string& what) {
    if (got.code() != want)
      Mismatch(absl::StrCat(what, ": the broker answered ", got.ToString(), ", the model expected ",
                            absl::StatusCodeToString(want)));
    if (!got.ok() && got.message().empty())
      Mismatch(absl::StrCat(what, ": a refusal without a message"));
  }

  // ---------------------------------------------------------------------------------------
  // Broker lifetime
  core::BrokerOptions Options(const OpenArgs& args) {
    core::BrokerOptions o;
    o.commit_mode = core::CommitPipeline::Mode::kInline;
    const double u = kUniforms[args.uniform];
    o.uniform = [u] { return u; };
    o.default_policy = ConfigPolicy(args.config);
    return o;
  }

  static core::PolicyOverride ConfigPolicy(int config) {
    core::PolicyOverride p;
    if (config == 1) {
      p.lease_duration = absl::Seconds(2);
      p.max_attempts = 2;
      p.jitter = core::Jitter::kEqual;
    }
    return p;
  }

  void Open(const OpenArgs& args) {
    broker_.reset();  // destroyed before the new one reads the store: a restart
    uniform_ = kUniforms[args.uniform];
    config_ = ConfigPolicy(args.config);
    absl::StatusOr<std::unique_ptr<BlockingBroker>> opened =
        BlockingBroker::Open(store_, clock_, Options(args));
    if (!opened.ok()) Mismatch(absl::StrCat("Broker::Open failed: ", opened.status().ToString()));
    broker_ = std::move(*opened);
  }

  core::QueuePolicy Policy(const std::string& queue) {
    return queues_[queue].runtime.ApplyTo(config_.ApplyTo(core::QueuePolicy{}));
  }

  // ---------------------------------------------------------------------------------------
  // The model's rules
  std::vector<ModelJob*> Live(const std::string& queue, std::optional<core::JobState> state) {
    std::vector<ModelJob*> out;
    for (auto& [id, j] : jobs_) {
      if (j.removed || j.queue != queue) continue;
      if (state.has_value() && j.state != *state) continue;
      out.push_back(&j);
    }
    return out;
  }

  int64_t Count(const std::string& queue, core::JobState state) {
    return static_cast<int64_t>(Live(queue, state).size());
  }

  // Backoff before the attempt after `failed_attempt` (DESIGN.md's formula, then the jitter
  // with the broker's pinned draw).
  absl::Duration Backoff(const core::RetryPolicy& r, int failed_attempt) const {
    double seconds = absl::ToDoubleSeconds(r.initial_backoff) *
                     std::pow(r.backoff_multiplier, std::max(failed_attempt, 1) - 1);
    double cap = absl::ToDoubleSeconds(r.max_backoff);
    double base = std::isfinite(seconds) ? std::min(seconds, cap) : cap;
    switch (r.jitter) {
      case core::Jitter::kNone:
        break;
      case core::Jitter::kFull:
        base *= uniform_;
        break;
      case core::Jitter::kEqual:
        base = base / 2 + base / 2 * uniform_;
        break;
    }
    return absl::Seconds(base);
  }

  // A failed attempt (an error, a permanent error, or the lease running out).
  void EndAttemptFailed(ModelJob& j, absl::Time now, core::AttemptOutcome outcome,
                        std::optional<absl::Duration> retry_after) {
    if (j.cancel_requested) {
      j.state = core::JobState::kCancelled;
      j.completed_at = now;
    } else if (outcome == core::AttemptOutcome::kPermanentError) {
      j.state = core::JobState::kFailed;
      j.fail_reason = core::FailReason::kPermanent;
      j.completed_at = now;
    } else if (j.attempt >= j.max_attempts) {
      j.state = core::JobState::kFailed;
      j.fail_reason = core::FailReason::kAttemptsExhausted;
      j.completed_at = now;
    } else {
      absl::Duration wait =
          retry_after.has_value() ? *retry_after : Backoff(Policy(j.queue).retry, j.attempt);
      j.run_at = now + wait;
      j.run_at_approx = !retry_after.has_value() && wait > absl::ZeroDuration();
      j.state = wait > absl::ZeroDuration() ? core::JobState::kScheduled : core::JobState::kReady;
    }
  }

  void ExpireLease(ModelJob& j, absl::Time now) {
    if (auto* rec = j.current_record()) rec->second = core::AttemptOutcome::kLeaseExpired;
    EndAttemptFailed(j, now, core::AttemptOutcome::kLeaseExpired, std::nullopt);
  }

  // What every changing call does first: leases that ran out, then jobs that came due.
  void Due(absl::Time now) {
    for (auto& [id, j] : jobs_) {
      if (!j.removed && j.state == core::JobState::kActive && j.lease_deadline <= now)
        ExpireLease(j, now);
    }
    for (auto& [id, j] : jobs_) {
      if (!j.removed && j.state == core::JobState::kScheduled && j.run_at <= now) {
        j.state = core::JobState::kReady;
        j.promoted_unsaved = true;
      }
    }
  }

  void Remove(ModelJob& j) { j.removed = true; }

  // Retention, run by Tick: oldest ended first, while over max_count or older than max_age.
  void Retention(absl::Time now) {
    for (const char* name : kQueues) {
      const core::QueuePolicy p = Policy(name);
      auto sweep = [&](bool completed, const core::Retention& r) {
        std::vector<ModelJob*> ended;
        for (auto& [id, j] : jobs_) {
          if (j.removed || j.queue != name) continue;
          bool dead = j.state == core::JobState::kFailed || j.state == core::JobState::kCancelled;
          if (completed ? j.state == core::JobState::kCompleted : dead) ended.push_back(&j);
        }
        std::sort(ended.begin(), ended.end(), [](const ModelJob* a, const ModelJob* b) {
          return std::tie(a->completed_at, a->order) < std::tie(b->completed_at, b->order);
        });
        size_t left = ended.size();
        for (ModelJob* j : ended) {
          bool over = r.max_count > 0 && static_cast<int64_t>(left) > r.max_count;
          bool old = r.max_age > absl::ZeroDuration() && j->completed_at + r.max_age <= now;
          if (!over && !old) break;
          Remove(*j);
          --left;
        }
      };
      sweep(true, p.completed_retention);
      sweep(false, p.failed_retention);
    }
  }

  // Dedup entries whose TTL passed are forgotten by Tick once their job has ended; while it
  // runs, the broker looks again a minute later.
  void SweepDedup(absl::Time now) {
    while (!dedup_sweeps_.empty() && std::get<0>(*dedup_sweeps_.begin()) <= now) {
      auto [when, queue, key] = *dedup_sweeps_.begin();
      dedup_sweeps_.erase(dedup_sweeps_.begin());
      auto it = dedup_.find({queue, key});
      if (it == dedup_.end() || it->second.expires_at > now) continue;
      auto holder = jobs_.find(it->second.job_id);
      if (holder != jobs_.end() && holder->second.live()) {
        dedup_sweeps_.emplace(now + absl::Minutes(1), queue, key);
        continue;
      }
      dedup_.erase(it);
    }
  }

  // RetryJob's change: READY, due now, attempts from 1 again, and the dedup key held again if
  // nobody holds it.
  void Revive(ModelJob& j, absl::Time now) {
    j.state = core::JobState::kReady;
    j.run_at = now;
    j.run_at_approx = false;
    j.attempt = 0;
    j.fail_reason = core::FailReason::kNone;
    j.completed_at = absl::InfinitePast();
    j.lease_id.clear();
    j.lease_deadline = absl::InfinitePast();
    j.lease_length = absl::ZeroDuration();
    j.cancel_requested = false;
    j.may_lower_attempt = true;
    if (j.dedup_key.empty()) return;
    auto key = std::make_pair(j.queue, j.dedup_key);
    auto it = dedup_.find(key);
    if (it == dedup_.end()) {
      dedup_[key] = ModelDedup{j.id, now, j.payload};
      dedup_sweeps_.emplace(now, j.queue, j.dedup_key);
      j.key_elsewhere = false;
    } else {
      j.key_elsewhere = it->second.job_id != j.id;
    }
  }

  // The job a reference names (newest first), or nullptr for one the broker never made.
  ModelJob* JobRef(int ref) {
    if (ref >= kRefs || ref >= static_cast<int>(ids_.size())) return nullptr;
    return &jobs_.at(ids_[ids_.size() - 1 - ref]);
  }
  std::string JobIdRef(int ref) {
    ModelJob* j = JobRef(ref);
    return j != nullptr ? j->id : kNoSuchJob;
  }
  // A lease the broker handed out (newest first); past the end, a made-up lease of the newest
  // job, or of no job.
  std::pair<std::string, std::string> LeaseRef(int ref) {
    if (ref < kRefs && ref < static_cast<int>(leases_.size()))
      return leases_[leases_.size() - 1 - ref];
    if (!ids_.empty()) return {ids_.back(), "9-00000000deadbeef"};
    return {kNoSuchJob, "1-00000000deadbeef"};
  }

  // The code a call about lease `lease_id` of job `job_id` gets before it looks at the state:
  // NOT_FOUND for an unknown job, FAILED_PRECONDITION for a lease that is not the job's latest.
  std::optional<Code> LeaseRefusal(const std::string& job_id, const std::string& lease_id) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || it->second.removed) return Code::kNotFound;
    if (it->second.lease_id != lease_id) return Code::kFailedPrecondition;
    return std::nullopt;
  }

  // Can `queue` lease a job now, and from which concurrency keys?
  bool KeyHasRoom(const std::string& queue, const std::string& key) {
    int per_key = Policy(queue).max_concurrency_per_key;
    if (key.empty() || per_key <= 0) return true;
    int64_t active = 0;
    for (ModelJob* j : Live(queue, core::JobState::kActive)) active += j->concurrency_key == key;
    return active < per_key;
  }
  bool QueueHasRoom(const std::string& queue) {
    core::QueuePolicy p = Policy(queue);
    if (p.paused) return false;
    return p.max_concurrency <= 0 || Count(queue, core::JobState::kActive) < p.max_concurrency;
  }
  // The next job of `key`'s group: highest priority, then oldest.
  ModelJob* Head(const std::string& queue, const std::string& key) {
    ModelJob* best = nullptr;
    for (ModelJob* j : Live(queue, core::JobState::kReady)) {
      if (j->concurrency_key != key) continue;
      if (best == nullptr || j->priority > best->priority ||
          (j->priority == best->priority && j->order < best->order))
        best = j;
    }
    return best;
  }
  bool Leasable(const std::string& queue) {
    if (!QueueHasRoom(queue)) return false;
    for (ModelJob* j : Live(queue, core::JobState::kReady)) {
      if (KeyHasRoom(queue, j->concurrency_key)) return true;
    }
    return false;
  }
  bool KeyLeasable(const std::string& queue, const std::string& key) {
    return Head(queue, key) != nullptr && KeyHasRoom(queue, key);
  }

  // ---------------------------------------------------------------------------------------
  // Operations
  void Step(OpKind kind) {
    switch (kind) {
      case OpKind::kEnqueue: {
        BatchArgs args;
        Decode(args.jobs[0]);
        return Enqueue(args, /*batch=*/false);
      }
      case OpKind::kEnqueueBatch: {
        BatchArgs args;
        Decode(args);
        return Enqueue(args, /*batch=*/true);
      }
      case OpKind::kLease: {
        LeaseArgs args;
        Decode(args);
        return Lease(args);
      }
      case OpKind::kHeartbeat: {
        HeartbeatArgs args;
        Decode(args);
        return Heartbeat(args);
      }
      case OpKind::kAck: {
        AckArgs args;
        Decode(args);
        return Ack(args);
      }
      case OpKind::kFail: {
        FailArgs args;
        Decode(args);
        return FailOp(args);
      }
      case OpKind::kRelease: {
        RefArgs args;
        Decode(args);
        return Release(args);
      }
      case OpKind::kAdvance: {
        AdvanceArgs args;
        Decode(args);
        clock_.Advance(kAdvances[args.amount]);
        Log(absl::StrCat("advance ", Show(kAdvances[args.amount]), " -> ", Show(clock_.Now())));
        return;
      }
      case OpKind::kTick: {
        absl::Time now = clock_.Now();
        Due(now);
        Retention(now);
        SweepDedup(now);
        broker_->Tick();
        Log("tick");
        return;
      }
      case OpKind::kCancel: {
        RefArgs args;
        Decode(args);
        return Cancel(args);
      }
      case OpKind::kRetry: {
        RefArgs args;
        Decode(args);
        return Retry(args);
      }
      case OpKind::kRetryQueue: {
        RetryQueueArgs args;
        Decode(args);
        return RetryQueue(args);
      }
      case OpKind::kDelete: {
        RefArgs args;
        Decode(args);
        return Delete(args);
      }
      case OpKind::kPurge: {
        PurgeArgs args;
        Decode(args);
        return Purge(args);
      }
      case OpKind::kUpdatePolicy: {
        PolicyArgs args;
        Decode(args);
        return UpdatePolicy(args);
      }
      case OpKind::kPause:
      case OpKind::kResume: {
        QueueArgs args;
        Decode(args);
        return SetPaused(args, kind == OpKind::kPause);
      }
      case OpKind::kRestart: {
        OpenArgs args;
        Decode(args);
        return Restart(args);
      }
      case OpKind::kCount:
        break;
    }
  }

  core::EnqueueSpec Spec(const EnqueueArgs& a) {
    core::EnqueueSpec s;
    s.queue = kQueues[a.queue];
    s.payload = kPayloads[a.payload];
    s.dedup_key = kDedupKeys[a.dedup_key];
    s.dedup_ttl = kDedupTtls[a.dedup_ttl];
    if (kDelays[a.delay].has_value()) s.delay = kDelays[a.delay];
    s.concurrency_key = kConcurrencyKeys[a.concurrency_key];
    s.max_attempts = kMaxAttempts[a.max_attempts];
    s.priority = kPriorities[a.priority];
    s.lease_duration = kJobLeases[a.lease];
    return s;
  }

  void Enqueue(const BatchArgs& args, bool batch) {
    const int n = batch ? args.extra + 1 : 1;
    if (ids_.size() + n > kJobLimit) return Log("enqueue skipped: enough jobs");
    std::vector<core::EnqueueSpec> specs;
    std::string what = batch ? "enqueue batch" : "enqueue";
    for (int i = 0; i < n; ++i) {
      specs.push_back(Spec(args.jobs[i]));
      const core::EnqueueSpec& s = specs.back();
      absl::StrAppend(&what, i == 0 ? " " : " | ", s.queue, " payload=", s.payload, " dedup=\"",
                      s.dedup_key, "\" ttl=", Show(s.dedup_ttl), " delay=", Show(s.delay),
                      " ckey=\"", s.concurrency_key, "\" attempts=", s.max_attempts,
                      " prio=", s.priority, " lease=", Show(s.lease_duration));
    }

    // The model's answer. Refusals of shape come before anything runs.
    Code want = Code::kOk;
    for (const core::EnqueueSpec& s : specs) {
      if (s.dedup_ttl.has_value() && s.dedup_key.empty()) want = Code::kInvalidArgument;
    }
    const absl::Time now = clock_.Now();
    // Per job: the id of the job it is a duplicate of (an earlier one of this batch: "#i").
    std::vector<std::optional<std::string>> dup(n);
    std::vector<std::optional<int>> dup_in_batch(n);
    if (want == Code::kOk) {
      Due(now);
      std::map<std::pair<std::string, std::string>, int> batch_keys;
      std::map<std::string, int64_t> added;
      for (int i = 0; i < n && want == Code::kOk; ++i) {
        const core::EnqueueSpec& s = specs[i];
        if (!s.dedup_key.empty()) {
          auto key = std::make_pair(s.queue, s.dedup_key);
          if (auto it = batch_keys.find(key); it != batch_keys.end()) {
            if (specs[it->second].payload != s.payload) {
              want = Code::kAlreadyExists;
              break;
            }
            dup_in_batch[i] = it->second;
            continue;
          }
          if (auto it = dedup_.find(key); it != dedup_.end()) {
            auto holder = jobs_.find(it->second.job_id);
            bool held =
                now < it->second.expires_at || (holder != jobs_.end() && holder->second.live());
            if (held) {
              if (it->second.payload != s.payload) {
                want = Code::kAlreadyExists;
                break;
              }
              dup[i] = it->second.job_id;
              continue;
            }
          }
          batch_keys.emplace(key, i);
        }
        ++added[s.queue];
      }
      for (const auto& [queue, count] : added) {
        int64_t live = 0;
        for (core::JobState st :
             {core::JobState::kReady, core::JobState::kScheduled, core::JobState::kActive})
          live += Count(queue, st);
        int64_t max_length = Policy(queue).max_length;
        if (want == Code::kOk && max_length > 0 && live + count > max_length)
          want = Code::kResourceExhausted;
      }
    }

    absl::StatusOr<std::vector<core::EnqueueResult>> got = broker_->EnqueueBatch(specs);
    Log(absl::StrCat(what, " -> ", got.status().ToString()));
    ExpectCode(want, got.status(), what);
    if (!got.ok()) return;
    MODEL_EXPECT(got->size() == specs.size(), "enqueue: one result per job");

    for (int i = 0; i < n; ++i) {
      const core::EnqueueResult& r = (*got)[i];
      const core::EnqueueSpec& s = specs[i];
      if (dup_in_batch[i].has_value() || dup[i].has_value()) {
        std::string want_id = dup[i].has_value() ? *dup[i] : (*got)[*dup_in_batch[i]].job_id;
        MODEL_EXPECT(r.deduplicated && r.job_id == want_id,
                     absl::StrCat("enqueue #", i, ": dedup key \"", s.dedup_key,
                                  "\" is held by job ", want_id, ", yet the broker answered job ",
                                  r.job_id, r.deduplicated ? " (deduplicated)" : " (a new job)"));
        continue;
      }
      MODEL_EXPECT(!r.deduplicated, absl::StrCat("enqueue #", i, ": deduplicated, but dedup key \"",
                                                 s.dedup_key, "\" is free in the model"));
      MODEL_EXPECT(!r.job_id.empty() && !jobs_.contains(r.job_id),
                   absl::StrCat("enqueue #", i, ": job id ", r.job_id, " is empty or not new"));
      ModelJob j;
      j.id = r.job_id;
      j.queue = s.queue;
      j.payload = s.payload;
      j.dedup_key = s.dedup_key;
      j.concurrency_key = s.concurrency_key;
      j.priority = s.priority;
      j.order = next_order_++;
      j.max_attempts = s.max_attempts > 0 ? s.max_attempts : Policy(s.queue).retry.max_attempts;
      j.created_at = now;
      j.run_at = s.delay.has_value() ? now + *s.delay : now;
      j.state = j.run_at > now ? core::JobState::kScheduled : core::JobState::kReady;
      j.job_lease = s.lease_duration;
      j.seen_state = j.state;
      if (!s.dedup_key.empty()) {
        auto key = std::make_pair(s.queue, s.dedup_key);
        absl::Time expires = now + s.dedup_ttl.value_or(Policy(s.queue).dedup_ttl);
        if (auto old = dedup_.find(key); old != dedup_.end())
          dedup_sweeps_.erase({old->second.expires_at, s.queue, s.dedup_key});
        dedup_sweeps_.emplace(expires, s.queue, s.dedup_key);
        dedup_[key] = ModelDedup{j.id, expires, j.payload};
      }
      queues_[s.queue].exists = true;
      ids_.push_back(j.id);
      jobs_.emplace(j.id, std::move(j));
    }
  }

  void Lease(const LeaseArgs& args) {
    const std::string queue = kQueues[args.queue];
    const int max_jobs = kMaxJobs[args.max_jobs];
    const absl::Duration lease = kWorkerLeases[args.lease];
    const absl::Time now = clock_.Now();
    Due(now);
    queues_[queue].exists = true;
    absl::StatusOr<std::vector<core::LeasedJob>> got =
        broker_->Lease(core::LeaseSpec{queue, "w", max_jobs, lease});
    std::string what =
        absl::StrCat("lease ", queue, " max_jobs=", max_jobs, " lease=", Show(lease));
    ExpectCode(Code::kOk, got.status(), what);
    std::map<std::string, int> per_key;
    std::vector<std::string> leased_ids;
    for (const core::LeasedJob& l : *got) {
      auto it = jobs_.find(l.job_id);
      MODEL_EXPECT(it != jobs_.end() && !it->second.removed,
                   absl::StrCat(what, ": leased job ", l.job_id, " that the model does not know"));
      ModelJob& j = it->second;
      MODEL_EXPECT(j.queue == queue && j.state == core::JobState::kReady,
                   absl::StrCat(what, ": leased job ", j.id, " of queue ", j.queue, " in state ",
                                core::JobStateName(j.state),
                                "; only READY jobs of the queue may be leased"));
      MODEL_EXPECT(
          QueueHasRoom(queue),
          absl::StrCat(what, ": leased job ", j.id, " though the queue is paused or has ",
                       Count(queue, core::JobState::kActive), " active jobs (max_concurrency ",
                       Policy(queue).max_concurrency, ")"));
      MODEL_EXPECT(
          KeyHasRoom(queue, j.concurrency_key),
          absl::StrCat(what, ": leased job ", j.id, " though concurrency key \"", j.concurrency_key,
                       "\" is at max_concurrency_per_key ", Policy(queue).max_concurrency_per_key));
      ModelJob* head = Head(queue, j.concurrency_key);
      MODEL_EXPECT(head == &j,
                   absl::StrCat(what, ": leased job ", j.id, " (priority ", j.priority,
                                ") before job ", head->id, " (priority ", head->priority,
                                ") of the same concurrency key: out of order"));
      MODEL_EXPECT(l.attempt == j.attempt + 1 && l.max_attempts == j.max_attempts,
                   absl::StrCat(what, ": job ", j.id, " leased as attempt ", l.attempt, " of ",
                                l.max_attempts, "; the model expected ", j.attempt + 1, " of ",
                                j.max_attempts));
      absl::Duration length = lease > absl::ZeroDuration()         ? lease
                              : j.job_lease > absl::ZeroDuration() ? j.job_lease
                                                                   : Policy(queue).lease_duration;
      MODEL_EXPECT(l.lease_deadline == now + length,
                   absl::StrCat(what, ": job ", j.id, " lease deadline ", Show(l.lease_deadline),
                                ", the model expected ", Show(now + length)));
      MODEL_EXPECT(l.payload == j.payload && l.queue == queue && l.checkpoint == j.checkpoint &&
                       l.enqueued_at == j.created_at &&
                       l.idempotency_key == (j.dedup_key.empty() ? j.id : j.dedup_key),
                   absl::StrCat(what, ": job ", j.id,
                                " leased with another payload, checkpoint, enqueue time or "
                                "idempotency key than it has"));
      MODEL_EXPECT(
          absl::StartsWith(l.lease_id, absl::StrCat(l.attempt, "-")) && l.lease_id != j.lease_id,
          absl::StrCat(what, ": lease id ", l.lease_id, " of attempt ", l.attempt,
                       " is not a fresh \"<attempt>-...\""));
      j.state = core::JobState::kActive;
      j.promoted_unsaved = false;
      ++j.attempt;
      j.lease_id = l.lease_id;
      j.lease_length = length;
      j.lease_deadline = now + length;
      j.attempts.emplace_back(j.attempt, core::AttemptOutcome::kRunning);
      if (j.attempts.size() > static_cast<size_t>(kAttemptHistory))
        j.attempts.erase(j.attempts.begin());
      leases_.emplace_back(j.id, l.lease_id);
      ++per_key[j.concurrency_key];
      leased_ids.push_back(j.id);
    }
    int want = std::max(max_jobs, 1);
    MODEL_EXPECT(static_cast<int>(got->size()) <= want,
                 absl::StrCat(what, ": leased ", got->size(), " jobs, more than ", want));
    MODEL_EXPECT(
        static_cast<int>(got->size()) == want || !Leasable(queue),
        absl::StrCat(what, ": leased ", got->size(), " jobs though the model can lease more"));
    // Keys take turns: a key may be two jobs ahead of another only if that one has run dry.
    for (const auto& [a, na] : per_key) {
      for (const char* b : kConcurrencyKeys) {
        int nb = per_key.contains(b) ? per_key[b] : 0;
        MODEL_EXPECT(na <= nb + 1 || !KeyLeasable(queue, b),
                     absl::StrCat(what, ": key \"", a, "\" got ", na, " jobs and key \"", b, "\" ",
                                  nb, " though it still has a leasable job: keys must take turns"));
      }
    }
    Log(absl::StrCat(what, " -> ", got->size(), " jobs ", absl::StrJoin(leased_ids, ",")));
  }

  void Heartbeat(const HeartbeatArgs& args) {
    auto [job_id, lease_id] = LeaseRef(args.lease_ref);
    const absl::Duration extend = kExtends[args.extend];
    const char* checkpoint = kCheckpoints[args.checkpoint];
    const absl::Time now = clock_.Now();
    std::string what =
        absl::StrCat("heartbeat ", job_id, " lease ", lease_id, " extend=", Show(extend),
                     " checkpoint=", checkpoint == nullptr ? "unset" : checkpoint);
    Due(now);
    std::optional<Code> refused = LeaseRefusal(job_id, lease_id);
    if (!refused.has_value() && jobs_.at(job_id).state != core::JobState::kActive)
      refused = Code::kFailedPrecondition;
    core::HeartbeatSpec spec{job_id, lease_id, extend, std::nullopt};
    if (checkpoint != nullptr) spec.checkpoint = checkpoint;
    absl::StatusOr<core::HeartbeatResult> got = broker_->Heartbeat(spec);
    Log(absl::StrCat(what, " -> ", got.status().ToString()));
    ExpectCode(refused.value_or(Code::kOk), got.status(), what);
    if (!got.ok()) return;
    ModelJob& j = jobs_.at(job_id);
    j.lease_deadline = now + (extend > absl::ZeroDuration() ? extend : j.lease_length);
    if (checkpoint != nullptr) j.checkpoint = checkpoint;
    MODEL_EXPECT(
        got->lease_deadline == j.lease_deadline && got->cancel_requested == j.cancel_requested,
        absl::StrCat(what, ": answered deadline ", Show(got->lease_deadline), " cancel ",
                     got->cancel_requested, "; the model expected ", Show(j.lease_deadline),
                     " cancel ", j.cancel_requested));
  }

  void Ack(const AckArgs& args) {
    auto [job_id, lease_id] = LeaseRef(args.lease_ref);
    const absl::Time now = clock_.Now();
    std::string what = absl::StrCat("ack ", job_id, " lease ", lease_id);
    Due(now);
    std::optional<Code> refused = LeaseRefusal(job_id, lease_id);
    bool change = false;
    if (!refused.has_value()) {
      ModelJob& j = jobs_.at(job_id);
      if (j.state == core::JobState::kActive) {
        change = true;
      } else if (j.state != core::JobState::kCompleted) {
        // A late ack is taken while the attempt it belongs to ended only by running out.
        auto* rec = j.current_record();
        if (rec != nullptr && rec->second == core::AttemptOutcome::kLeaseExpired) {
          change = true;
        } else {
          refused = Code::kFailedPrecondition;
        }
      }
    }
    absl::Status got = broker_->Ack(core::AckSpec{job_id, lease_id, kPayloads[args.result]});
    Log(absl::StrCat(what, " -> ", got.ToString()));
    ExpectCode(refused.value_or(Code::kOk), got, what);
    if (!change) return;
    ModelJob& j = jobs_.at(job_id);
    if (auto* rec = j.current_record()) rec->second = core::AttemptOutcome::kCompleted;
    j.state = core::JobState::kCompleted;
    j.fail_reason = core::FailReason::kNone;
    j.result = kPayloads[args.result];
    j.completed_at = now;
  }

  void FailOp(const FailArgs& args) {
    auto [job_id, lease_id] = LeaseRef(args.lease_ref);
    const bool permanent = args.permanent == 1;
    const std::optional<absl::Duration> retry_after = kRetryAfters[args.retry_after];
    const absl::Time now = clock_.Now();
    std::string what = absl::StrCat("fail ", job_id, " lease ", lease_id, " permanent=", permanent,
                                    " retry_after=", Show(retry_after));
    Due(now);
    std::optional<Code> refused = LeaseRefusal(job_id, lease_id);
    if (!refused.has_value()) {
      ModelJob& j = jobs_.at(job_id);
      const core::AttemptOutcome outcome =
          permanent ? core::AttemptOutcome::kPermanentError : core::AttemptOutcome::kError;
      auto* rec = j.current_record();
      if (j.state == core::JobState::kActive) {
        if (rec != nullptr) rec->second = outcome;
        EndAttemptFailed(j, now, outcome, retry_after);
      } else if (rec != nullptr && (rec->second == core::AttemptOutcome::kError ||
                                    rec->second == core::AttemptOutcome::kPermanentError)) {
        // A repeated Fail of the same attempt: answered again, nothing changes.
      } else if (rec == nullptr || rec->second != core::AttemptOutcome::kLeaseExpired) {
        refused = Code::kFailedPrecondition;
      } else {
        // A late Fail of an attempt whose lease ran out: its error counts, `permanent` kills.
        // The broker writes the record again with the state it has in memory, so a promotion
        // made in memory only is saved with it.
        rec->second = outcome;
        j.promoted_unsaved = false;
        if (permanent && !core::IsTerminal(j.state)) {
          j.state = core::JobState::kFailed;
          j.fail_reason = core::FailReason::kPermanent;
          j.completed_at = now;
        }
      }
    }
    absl::StatusOr<core::FailResult> got =
        broker_->Fail(core::FailSpec{job_id, lease_id, "boom", permanent, retry_after});
    Log(absl::StrCat(what, " -> ", got.status().ToString()));
    ExpectCode(refused.value_or(Code::kOk), got.status(), what);
    if (!got.ok()) return;
    ModelJob& j = jobs_.at(job_id);
    MODEL_EXPECT(got->state == j.state,
                 absl::StrCat(what, ": answered state ", core::JobStateName(got->state),
                              ", the model expected ", core::JobStateName(j.state)));
    if (j.state == core::JobState::kScheduled || j.state == core::JobState::kReady) {
      absl::Duration off = absl::AbsDuration(got->next_attempt_at - j.run_at);
      MODEL_EXPECT(off <= (j.run_at_approx ? kBackoffSlack : absl::ZeroDuration()),
                   absl::StrCat(what, ": next attempt at ", Show(got->next_attempt_at),
                                ", the model expected ", Show(j.run_at)));
    }
  }

  void Release(const RefArgs& args) {
    auto [job_id, lease_id] = LeaseRef(args.ref);
    const absl::Time now = clock_.Now();
    std::string what = absl::StrCat("release ", job_id, " lease ", lease_id);
    Due(now);
    std::optional<Code> refused = LeaseRefusal(job_id, lease_id);
    if (!refused.has_value() && jobs_.at(job_id).state != core::JobState::kActive)
      refused = Code::kFailedPrecondition;
    absl::Status got = broker_->Release(core::ReleaseSpec{job_id, lease_id});
    Log(absl::StrCat(what, " -> ", got.ToString()));
    ExpectCode(refused.value_or(Code::kOk), got, what);
    if (!got.ok()) return;
    // Given back unstarted: the attempt is taken back.
    ModelJob& j = jobs_.at(job_id);
    if (j.current_record() != nullptr) j.attempts.pop_back();
    --j.attempt;
    j.may_lower_attempt = true;
    j.lease_id.clear();
    j.lease_deadline = absl::InfinitePast();
    j.lease_length = absl::ZeroDuration();
    j.state = j.cancel_requested ? core::JobState::kCancelled : core::JobState::kReady;
    if (j.state == core::JobState::kCancelled) j.completed_at = now;
    j.run_at = now;
    j.run_at_approx = false;
  }

  // NOT_FOUND for a job the model does not have (never made, or removed).
  ModelJob* Find(const std::string& id) {
    auto it = jobs_.find(id);
    return it == jobs_.end() || it->second.removed ? nullptr : &it->second;
  }

  void Cancel(const RefArgs& args) {
    const std::string id = JobIdRef(args.ref);
    const absl::Time now = clock_.Now();
    Due(now);
    ModelJob* j = Find(id);
    Code want = j == nullptr                 ? Code::kNotFound
                : core::IsTerminal(j->state) ? Code::kFailedPrecondition
                                             : Code::kOk;
    absl::StatusOr<core::Job> got = broker_->CancelJob(id);
    Log(absl::StrCat("cancel ", id, " -> ", got.status().ToString()));
    ExpectCode(want, got.status(), absl::StrCat("cancel ", id));
    if (!got.ok()) return;
    if (j->state == core::JobState::kActive) {
      j->cancel_requested = true;  // the worker's next heartbeat says so
    } else {
      j->state = core::JobState::kCancelled;
      j->promoted_unsaved = false;
      j->completed_at = now;
    }
    MODEL_EXPECT(got->state == j->state && got->cancel_requested == j->cancel_requested,
                 absl::StrCat("cancel ", id, ": answered state ", core::JobStateName(got->state)));
  }

  void Retry(const RefArgs& args) {
    const std::string id = JobIdRef(args.ref);
    const absl::Time now = clock_.Now();
    Due(now);
    ModelJob* j = Find(id);
    Code want = j == nullptr ? Code::kNotFound
                : (j->state == core::JobState::kFailed || j->state == core::JobState::kCancelled)
                    ? Code::kOk
                    : Code::kFailedPrecondition;
    absl::StatusOr<core::Job> got = broker_->RetryJob(id);
    Log(absl::StrCat("retry ", id, " -> ", got.status().ToString()));
    ExpectCode(want, got.status(), absl::StrCat("retry ", id));
    if (!got.ok()) return;
    Revive(*j, now);
    MODEL_EXPECT(got->state == core::JobState::kReady && got->attempt == 0,
                 absl::StrCat("retry ", id, ": answered state ", core::JobStateName(got->state),
                              " attempt ", got->attempt));
  }

  void RetryQueue(const RetryQueueArgs& args) {
    const std::string queue = kQueues[args.queue];
    const core::JobState state =
        args.cancelled == 1 ? core::JobState::kCancelled : core::JobState::kFailed;
    const int64_t limit = args.limit;  // 0: the default (1000), more than the model ever has
    const bool dry_run = args.dry_run == 1;
    const absl::Time now = clock_.Now();
    std::string what = absl::StrCat("retry queue ", queue, " state=", core::JobStateName(state),
                                    " limit=", limit, " dry_run=", dry_run);
    if (!dry_run) Due(now);  // a dry run only reads
    Code want = queues_[queue].exists ? Code::kOk : Code::kNotFound;
    std::vector<ModelJob*> picked = Live(queue, state);
    std::sort(picked.begin(), picked.end(), [](const ModelJob* a, const ModelJob* b) {
      return std::tie(a->completed_at, a->order) < std::tie(b->completed_at, b->order);
    });
    if (limit > 0 && static_cast<int64_t>(picked.size()) > limit) picked.resize(limit);
    absl::StatusOr<core::RetryJobsResult> got =
        broker_->RetryJobs(core::RetryJobsSpec{queue, state, dry_run, limit});
    Log(absl::StrCat(what, " -> ", got.status().ToString()));
    ExpectCode(want, got.status(), what);
    if (!got.ok()) return;
    const int64_t n = static_cast<int64_t>(picked.size());
    MODEL_EXPECT(got->matched == n && got->retried == (dry_run ? 0 : n),
                 absl::StrCat(what, ": matched ", got->matched, " retried ", got->retried,
                              "; the model expected ", n));
    if (dry_run) return;
    for (ModelJob* j : picked) Revive(*j, now);
  }

  void Delete(const RefArgs& args) {
    const std::string id = JobIdRef(args.ref);
    Due(clock_.Now());
    ModelJob* j = Find(id);
    Code want = j == nullptr                          ? Code::kNotFound
                : j->state == core::JobState::kActive ? Code::kFailedPrecondition
                                                      : Code::kOk;
    absl::Status got = broker_->DeleteJob(id);
    Log(absl::StrCat("delete ", id, " -> ", got.ToString()));
    ExpectCode(want, got, absl::StrCat("delete ", id));
    if (got.ok()) Remove(*j);  // its dedup key stays held until the TTL
  }

  void Purge(const PurgeArgs& args) {
    const std::string queue = kQueues[args.queue];
    std::vector<core::JobState> states;
    switch (args.states) {
      case kPurgeReady:
        states = {core::JobState::kReady};
        break;
      case kPurgeScheduled:
        states = {core::JobState::kScheduled};
        break;
      case kPurgeActive:
        states = {core::JobState::kActive};
        break;
      case kPurgeCompleted:
        states = {core::JobState::kCompleted};
        break;
      default:
        break;
    }
    std::string what = absl::StrCat("purge ", queue, " states=", args.states);
    Code want = Code::kOk;
    std::vector<ModelJob*> picked;
    if (args.states == kPurgeActive) {
      want = Code::kInvalidArgument;  // refused before anything runs
    } else {
      Due(clock_.Now());
      if (!queues_[queue].exists) want = Code::kNotFound;
      std::vector<core::JobState> match =
          states.empty()
              ? std::vector<core::JobState>{core::JobState::kCompleted, core::JobState::kFailed,
                                            core::JobState::kCancelled}
              : states;
      for (core::JobState s : match) {
        for (ModelJob* j : Live(queue, s)) picked.push_back(j);
      }
    }
    absl::StatusOr<int64_t> got = broker_->PurgeQueue(queue, states);
    Log(absl::StrCat(what, " -> ", got.status().ToString()));
    ExpectCode(want, got.status(), what);
    if (!got.ok()) return;
    MODEL_EXPECT(*got == static_cast<int64_t>(picked.size()),
                 absl::StrCat(what, ": purged ", *got, ", the model expected ", picked.size()));
    for (ModelJob* j : picked) Remove(*j);
  }

  void UpdatePolicy(const PolicyArgs& a) {
    const std::string queue = kQueues[a.queue];
    auto pick = [&a](const auto& values) { return values[a.value % values.size()]; };
    core::PolicyOverride change;
    std::string field = "nothing";
    switch (a.field) {
      case kSetMaxConcurrency:
        change.max_concurrency = pick(kMaxConcurrency);
        field = absl::StrCat("max_concurrency=", *change.max_concurrency);
        break;
      case kSetMaxPerKey:
        change.max_concurrency_per_key = pick(kMaxPerKey);
        field = absl::StrCat("max_concurrency_per_key=", *change.max_concurrency_per_key);
        break;
      case kSetMaxAttempts:
        change.max_attempts = pick(kPolicyAttempts);
        field = absl::StrCat("max_attempts=", *change.max_attempts);
        break;
      case kSetInitialBackoff:
        change.initial_backoff = pick(kInitialBackoffs);
        field = absl::StrCat("initial_backoff=", Show(*change.initial_backoff));
        break;
      case kSetMaxBackoff:
        change.max_backoff = pick(kMaxBackoffs);
        field = absl::StrCat("max_backoff=", Show(*change.max_backoff));
        break;
      case kSetMultiplier:
        change.backoff_multiplier = pick(kMultipliers);
        field = absl::StrCat("backoff_multiplier=", *change.backoff_multiplier);
        break;
      case kSetJitter:
        change.jitter = static_cast<core::Jitter>(1 + a.value % 3);
        field = absl::StrCat("jitter=", static_cast<int>(*change.jitter));
        break;
      case kSetLease:
        change.lease_duration = pick(kPolicyLeases);
        field = absl::StrCat("lease_duration=", Show(*change.lease_duration));
        break;
      case kSetDedupTtl:
        change.dedup_ttl = pick(kPolicyDedupTtls);
        field = absl::StrCat("dedup_ttl=", Show(*change.dedup_ttl));
        break;
      case kSetCompletedCount:
        change.completed_max_count = pick(kRetentionCounts);
        field = absl::StrCat("completed_max_count=", *change.completed_max_count);
        break;
      case kSetCompletedAge:
        change.completed_max_age = pick(kRetentionAges);
        field = absl::StrCat("completed_max_age=", Show(*change.completed_max_age));
        break;
      case kSetFailedCount:
        change.failed_max_count = pick(kRetentionCounts);
        field = absl::StrCat("failed_max_count=", *change.failed_max_count);
        break;
      case kSetFailedAge:
        change.failed_max_age = pick(kRetentionAges);
        field = absl::StrCat("failed_max_age=", Show(*change.failed_max_age));
        break;
      case kSetMaxLength:
        change.max_length = pick(kMaxLengths);
        field = absl::StrCat("max_length=", *change.max_length);
        break;
      case kSetPaused:
        change.paused = a.value % 2 == 1;
        field = absl::StrCat("paused=", *change.paused);
        break;
      default:
        break;
    }
    const bool reset = a.reset == 1;
    std::string what = absl::StrCat("update policy ", queue, reset ? " reset " : " ", field);
    Due(clock_.Now());
    ModelQueue& q = queues_[queue];
    core::PolicyOverride runtime = reset || !q.exists ? core::PolicyOverride{} : q.runtime;
    runtime.MergeFrom(change);
    core::QueuePolicy effective = runtime.ApplyTo(config_.ApplyTo(core::QueuePolicy{}));
    bool valid = effective.max_concurrency >= 0 &&
                 effective.retry.max_backoff >= effective.retry.initial_backoff;
    absl::StatusOr<core::QueueInfo> got = broker_->UpdateQueuePolicy(queue, change, reset);
    Log(absl::StrCat(what, " -> ", got.status().ToString()));
    ExpectCode(valid ? Code::kOk : Code::kInvalidArgument, got.status(), what);
    if (!got.ok()) return;
    q.exists = true;
    q.runtime = runtime;
    MODEL_EXPECT(got->policy == effective, absl::StrCat(what, ": answered another policy"));
  }

  void SetPaused(const QueueArgs& args, bool paused) {
    const std::string queue = kQueues[args.queue];
    std::string what = absl::StrCat(paused ? "pause " : "resume ", queue);
    Due(clock_.Now());
    ModelQueue& q = queues_[queue];
    absl::StatusOr<core::QueueInfo> got = broker_->SetQueuePaused(queue, paused);
    Log(absl::StrCat(what, " -> ", got.status().ToString()));
    ExpectCode(q.exists ? Code::kOk : Code::kNotFound, got.status(), what);
    if (!got.ok()) return;
    q.runtime.paused = paused;
    MODEL_EXPECT(got->policy.paused == paused,
                 absl::StrCat(what, ": answered paused ", got->policy.paused));
  }

  void Restart(const OpenArgs& args) {
    Log(absl::StrCat("restart uniform=", kUniforms[args.uniform], " config=", args.config));
    Open(args);
    // What survives: queues with a stored policy or a stored job; dedup entries; jobs. Leases
    // that ran out while "down" are failed attempts now. Nothing else (no promotion) happens.
    for (auto& [name, q] : queues_) {
      q.exists = !q.runtime.empty();
      for (auto& [id, j] : jobs_) q.exists = q.exists || (!j.removed && j.queue == name);
    }
    dedup_sweeps_.clear();
    for (const auto& [key, e] : dedup_) dedup_sweeps_.emplace(e.expires_at, key.first, key.second);
    const absl::Time now = clock_.Now();
    for (auto& [id, j] : jobs_) {
      if (j.promoted_unsaved && j.state == core::JobState::kReady)
        j.state = core::JobState::kScheduled;
      j.promoted_unsaved = false;
      if (!j.removed && j.state == core::JobState::kActive && j.lease_deadline <= now)
        ExpireLease(j, now);
    }
  }

  // ---------------------------------------------------------------------------------------
  // The whole visible state against the model
  void CheckAll() {
    for (const char* name : kQueues) CheckQueue(name);
    for (auto& [id, j] : jobs_) CheckJob(j);
    // A dedup key is held by at most one live job (a job revived while another held its key
    // does not hold it: docs/decisions.md, "A retried job holds its dedup key again").
    std::map<std::pair<std::string, std::string>, std::string> holders;
    for (auto& [id, j] : jobs_) {
      if (!j.live() || j.dedup_key.empty() || j.key_elsewhere) continue;
      auto [it, fresh] = holders.emplace(std::make_pair(j.queue, j.dedup_key), id);
      MODEL_EXPECT(fresh, absl::StrCat("dedup key \"", j.dedup_key, "\" of ", j.queue,
                                       " is held by two live jobs: ", it->second, " and ", id));
    }
  }

  void CheckQueue(const std::string& name) {
    ModelQueue& mq = queues_[name];
    absl::StatusOr<core::QueueInfo> info = broker_->GetQueue(name);
    if (!mq.exists) {
      MODEL_EXPECT(
          info.status().code() == Code::kNotFound,
          absl::StrCat("queue ", name, " should not exist; GetQueue: ", info.status().ToString()));
      MODEL_EXPECT(mq.runtime.empty(),
                   absl::StrCat("model: queue ", name, " has a policy but no queue"));
      return;
    }
    MODEL_EXPECT(info.ok(), absl::StrCat("queue ", name, ": GetQueue: ", info.status().ToString()));
    const core::QueuePolicy policy = Policy(name);
    MODEL_EXPECT(info->policy == policy,
                 absl::StrCat("queue ", name, ": another effective policy"));

    std::set<std::string> seen;
    for (core::JobState state :
         {core::JobState::kReady, core::JobState::kScheduled, core::JobState::kActive,
          core::JobState::kCompleted, core::JobState::kFailed, core::JobState::kCancelled}) {
      std::set<std::string> want;
      for (ModelJob* j : Live(name, state)) want.insert(j->id);
      std::set<std::string> got = List(name, state);
      for (const std::string& id : got) {
        MODEL_EXPECT(seen.insert(id).second,
                     absl::StrCat("job ", id, " is listed in two states (again in ",
                                  core::JobStateName(state), ")"));
      }
      if (got != want) {
        std::string diff;
        for (const std::string& id : got)
          if (!want.contains(id)) absl::StrAppend(&diff, " extra ", id);
        for (const std::string& id : want)
          if (!got.contains(id)) absl::StrAppend(&diff, " missing ", id);
        Mismatch(absl::StrCat("queue ", name, " lists other jobs in ", core::JobStateName(state),
                              ":", diff));
      }
      MODEL_EXPECT(info->counts.at(state) == static_cast<int64_t>(want.size()),
                   absl::StrCat("queue ", name, " counts ", info->counts.at(state), " jobs in ",
                                core::JobStateName(state), "; the model has ", want.size()));
    }
    MODEL_EXPECT(
        List(name, std::nullopt) == seen,
        absl::StrCat("queue ", name, ": the list of every job is not the union of the states"));

    // Leases are only granted under the limits; a lowered limit may leave more running.
    const int64_t active = Count(name, core::JobState::kActive);
    MODEL_EXPECT(
        active <= mq.seen_active || policy.max_concurrency <= 0 || active <= policy.max_concurrency,
        absl::StrCat("queue ", name, " went to ", active, " active jobs, max_concurrency is ",
                     policy.max_concurrency));
    std::map<std::string, int64_t> key_active;
    for (ModelJob* j : Live(name, core::JobState::kActive)) ++key_active[j->concurrency_key];
    for (const auto& [key, n] : key_active) {
      MODEL_EXPECT(key.empty() || n <= mq.seen_key_active[key] ||
                       policy.max_concurrency_per_key <= 0 || n <= policy.max_concurrency_per_key,
                   absl::StrCat("queue ", name, " key \"", key, "\" went to ", n,
                                " active jobs, max_concurrency_per_key is ",
                                policy.max_concurrency_per_key));
    }
    mq.seen_active = active;
    mq.seen_key_active = std::move(key_active);
  }

  std::set<std::string> List(const std::string& queue, std::optional<core::JobState> state) {
    core::ListJobsSpec spec;
    spec.queue = queue;
    spec.state = state;
    spec.page_size = core::kMaxLeaseBatch;
    absl::StatusOr<core::ListJobsResult> page = broker_->ListJobs(spec);
    MODEL_EXPECT(page.ok(), absl::StrCat("ListJobs ", queue, ": ", page.status().ToString()));
    MODEL_EXPECT(page->next_page_token.empty(), "ListJobs: more than one page");
    std::set<std::string> ids;
    for (const core::Job& j : page->jobs) {
      MODEL_EXPECT(!state.has_value() || j.state == *state,
                   absl::StrCat("ListJobs ", queue, " ", core::JobStateName(*state),
                                " returned job ", j.id, " in ", core::JobStateName(j.state)));
      ids.insert(j.id);
    }
    return ids;
  }

  void CheckJob(ModelJob& m) {
    absl::StatusOr<core::Job> got = broker_->GetJob(m.id);
    if (m.removed) {
      MODEL_EXPECT(got.status().code() == Code::kNotFound,
                   absl::StrCat("job ", m.id, " was removed; GetJob: ", got.status().ToString()));
      return;
    }
    MODEL_EXPECT(got.ok(), absl::StrCat("job ", m.id, ": GetJob: ", got.status().ToString()));
    const core::Job& j = *got;
    std::string who = absl::StrCat("job ", m.id, " (", core::JobStateName(j.state), "): ");
    MODEL_EXPECT(j.state == m.state,
                 absl::StrCat(who, "the model expected ", core::JobStateName(m.state)));
    // Invariants that hold whatever the model says.
    MODEL_EXPECT(j.attempt >= m.seen_attempt || m.may_lower_attempt,
                 absl::StrCat(who, "attempt went down from ", m.seen_attempt, " to ", j.attempt,
                              " without a release or a retry"));
    MODEL_EXPECT(
        m.seen_state != core::JobState::kCompleted || j.state == core::JobState::kCompleted,
        absl::StrCat(who, "was COMPLETED"));
    MODEL_EXPECT(j.attempt == m.attempt && j.max_attempts == m.max_attempts,
                 absl::StrCat(who, "attempt ", j.attempt, "/", j.max_attempts,
                              ", the model expected ", m.attempt, "/", m.max_attempts));
    MODEL_EXPECT(j.queue == m.queue && j.payload == m.payload && j.dedup_key == m.dedup_key &&
                     j.concurrency_key == m.concurrency_key && j.priority == m.priority &&
                     j.created_at == m.created_at,
                 absl::StrCat(who, "its enqueue fields changed"));
    MODEL_EXPECT(j.fail_reason == m.fail_reason,
                 absl::StrCat(who, "fail_reason ", static_cast<int>(j.fail_reason),
                              ", the model expected ", static_cast<int>(m.fail_reason)));
    MODEL_EXPECT(j.cancel_requested == m.cancel_requested,
                 absl::StrCat(who, "cancel_requested ", j.cancel_requested));
    MODEL_EXPECT(j.checkpoint == m.checkpoint,
                 absl::StrCat(who, "checkpoint \"", j.checkpoint, "\""));
    MODEL_EXPECT(
        j.lease_id == m.lease_id,
        absl::StrCat(who, "lease \"", j.lease_id, "\", the model expected \"", m.lease_id, "\""));
    if (m.state == core::JobState::kActive)
      MODEL_EXPECT(j.lease_deadline == m.lease_deadline,
                   absl::StrCat(who, "lease deadline ", Show(j.lease_deadline),
                                ", the model expected ", Show(m.lease_deadline)));
    if (m.state == core::JobState::kScheduled) {
      absl::Duration off = absl::AbsDuration(j.run_at - m.run_at);
      MODEL_EXPECT(
          off <= (m.run_at_approx ? kBackoffSlack : absl::ZeroDuration()),
          absl::StrCat(who, "due at ", Show(j.run_at), ", the model expected ", Show(m.run_at)));
      m.run_at = j.run_at;  // exact from now on
      m.run_at_approx = false;
    }
    if (core::IsTerminal(m.state))
      MODEL_EXPECT(j.completed_at == m.completed_at,
                   absl::StrCat(who, "ended at ", Show(j.completed_at), ", the model expected ",
                                Show(m.completed_at)));
    if (m.state == core::JobState::kCompleted)
      MODEL_EXPECT(j.result == m.result, absl::StrCat(who, "result \"", j.result, "\""));
    bool same_history = j.attempts.size() == m.attempts.size();
    for (size_t i = 0; same_history && i < j.attempts.size(); ++i) {
      same_history = j.attempts[i].attempt == m.attempts[i].first &&
                     j.attempts[i].outcome == m.attempts[i].second;
    }
    if (!same_history) {
      std::string have, want;
      for (const core::AttemptRecord& r : j.attempts)
        absl::StrAppend(&have, " ", r.attempt, ":", static_cast<int>(r.outcome));
      for (const auto& [n, outcome] : m.attempts)
        absl::StrAppend(&want, " ", n, ":", static_cast<int>(outcome));
      Mismatch(absl::StrCat(who, "attempt history", have, "; the model expected", want));
    }
    m.seen_attempt = j.attempt;
    m.seen_state = j.state;
  }

  FuzzedDataProvider& data_;
  FakeClock clock_;
  storage::MemoryStore store_;
  std::unique_ptr<BlockingBroker> broker_;
  double uniform_ = 0.5;
  core::PolicyOverride config_;

  std::map<std::string, ModelJob> jobs_;
  std::vector<std::string> ids_;                             // in enqueue order
  std::vector<std::pair<std::string, std::string>> leases_;  // (job, lease) in lease order
  std::map<std::string, ModelQueue> queues_;
  std::map<std::pair<std::string, std::string>, ModelDedup> dedup_;
  // When the broker looks at a dedup entry next (its TTL, or a minute after it found the job
  // still running).
  std::set<std::tuple<absl::Time, std::string, std::string>> dedup_sweeps_;
  uint64_t next_order_ = 1;
  std::vector<std::string> log_;
};

}  // namespace
}  // namespace jobbroker::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider provider(data, size);
  jobbroker::fuzz::Harness harness(provider);
  harness.Run();
  return 0;
}
