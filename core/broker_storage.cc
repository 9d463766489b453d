// Broker: living with a failing store. Refusing changes while it fails, trying it again, and
// rebuilding memory from it before changes are accepted again.
#include "absl/strings/str_cat.h"
#include "core/broker_mutation.h"
#include "core/recovered_state.h"

namespace jobbroker::core {

absl::Status Broker::StorageRefusal(const absl::Status& cause) {
  if (cause.ok() || IsNotStorageFailure(cause)) return cause;
  if (cause.code() == absl::StatusCode::kResourceExhausted)
    return absl::ResourceExhaustedError(
        absl::StrCat("storage is full: ", cause.message(), "; writes resume when space is freed"));
  return absl::UnavailableError(absl::StrCat("storage is failing: ", cause.message(),
                                             "; writes resume once the store recovers"));
}

absl::Status Broker::NotDurable(const absl::Status& written) {
  absl::Status refusal = StorageRefusal(written);
  return absl::Status(refusal.code(),
                      absl::StrCat("the change could not be made durable: ", refusal.message()));
}

absl::Status Broker::storage_status() const { return StorageRefusal(pipeline_.status()); }

int64_t Broker::corrupt_records() const {
  absl::MutexLock lock(&mu_);
  return jobs_.corrupt_records();
}

void Broker::MaybeResume() {
  if (pipeline_.healthy() && pipeline_.resets() == rebuilt_at_resets_.load()) return;
  bool due = false;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_ || resuming_) return;
    if (resume_at_ == absl::InfinitePast())
      resume_at_ = pipeline_.failed_at() + options_.store_retry_interval;
    // Healthy but reset by another broker: rebuild now, not at the retry interval.
    due = pipeline_.healthy() || clock_.Now() >= resume_at_;
  }
  if (due) ResumeWrites().IgnoreError();  // a failure schedules the next try
}

absl::Status Broker::ResumeWrites() {
  absl::Status cause;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("the broker is shutting down");
    cause = pipeline_.status();
    if (cause.ok() && WritableLocked()) return absl::OkStatus();
    if (resuming_) return absl::UnavailableError("the store is being tried again already");
    resuming_ = true;
  }
  // Nothing is written while the pipeline is stopped, so the store holds still for this read.
  const absl::Time started = clock_.Now();
  RecoveredState found(options_.max_hot_jobs);
  // A broker rebuilding after another one resumed the store (cause OK) only reads it.
  absl::Status s = cause.ok() ? absl::OkStatus() : store_.Resume();
  // Announced only once the store takes writes: a store still failing (or, in cluster mode, a
  // node that does not lead the partition) refuses here every retry, and recovers nothing.
  const bool recovering = s.ok();
  if (recovering) {
    observer_.RecoveryStarted(options_.partition);
    s = store_.Recover(options_.partition, found);
  }
  found.Finish();

  std::vector<LeaseDone> waiting;
  std::vector<std::shared_ptr<StreamSink>> streams;
  std::vector<WatchNotice> watches;
  Effects fx;
  uint64_t commit = 0;
  size_t expired = 0;
  {
    absl::MutexLock lock(&mu_);
    resuming_ = false;
    const absl::Time now = clock_.Now();
    if (s.ok() && shutting_down_) s = absl::UnavailableError("the broker is shutting down");
    if (!s.ok()) {
      resume_at_ = now + options_.store_retry_interval;
      if (recovering) observer_.RecoveryFailed(options_.partition, s);
      return s;
    }
    // Memory may hold changes the store never took (and miss one it did take, if a failed fsync
    // left it in the log): what the store holds now is the truth.
    ClearLocked(waiting, streams, watches);
    // Told once per failure: by the broker that resets the pipeline, not by those that rebuild
    // after it (their cause is OK).
    if (!cause.ok()) observer_.StoreResumed(cause, now - pipeline_.failed_at());
    // Before anything is appended, and under mu_, so no transition of the old memory slips in.
    // A no-op if another broker sharing the pipeline reset it already.
    pipeline_.Reset();
    rebuilt_at_resets_.store(pipeline_.resets());
    rebuilt_through_ = pipeline_.last_appended();
    resume_at_ = absl::InfinitePast();
    Transition t;
    fx.Require(Durability::kSync);  // as at Open: the rebuilt state's first commit
    expired = LoadLocked(found, now, t, fx);
    commit = CommitChangeLocked(std::move(t), fx);
    deadlines_.Planned(absl::InfinitePast());  // every deadline was rebuilt: the ticker looks again
    fx.wake = true;
  }
  observer_.Recovered(options_.partition, found.job_count(), expired, clock_.Now() - started);
  for (LeaseDone& done : waiting) done(std::vector<LeasedJob>{});
  for (auto& sink : streams)
    sink->End(absl::UnavailableError(
        "the broker rebuilt its state after a storage failure; subscribe again"));
  Notify(watches);
  Finish(commit, std::move(fx), nullptr);
  return absl::OkStatus();
}

void Broker::ClearLocked(std::vector<LeaseDone>& waiting,
                         std::vector<std::shared_ptr<StreamSink>>& streams,
                         std::vector<WatchNotice>& watches) {
  DetachConsumersLocked(waiting, streams);
  watchers_.DetachAll(
      absl::UnavailableError("the broker rebuilt its state after a storage failure; watch again"),
      watches);
  jobs_.Clear();  // sequence numbers go on: LoadLocked only raises the next one
  queues_.Clear();
  deadlines_.ClearJobs();
  dedup_.Clear();
  schedules_.Clear();
  dependents_.clear();
  waiting_on_.clear();
  remote_awaited_.clear();
  needed_by_.clear();
}

}  // namespace jobbroker::core
