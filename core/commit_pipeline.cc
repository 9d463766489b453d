#include "core/commit_pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/synchronization/notification.h"

namespace jobbroker::core {

CommitPipeline::CommitPipeline(Store& store, Mode mode, const Clock* clock,
                               BrokerObserver* observer, FailureHook on_failure)
    : store_(store),
      mode_(mode),
      clock_(clock),
      observer_(observer),
      on_failure_(std::move(on_failure)) {
  if (mode_ == Mode::kBackground) writer_ = std::thread([this] { WriterLoop(); });
}

CommitPipeline::~CommitPipeline() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.Signal();
  }
  if (writer_.joinable()) writer_.join();
}

uint64_t CommitPipeline::Append(Transition t, Durability durability, absl::Duration group_delay,
                                bool early_written) {
  if (mode_ == Mode::kInline) {
    // The broker calls Append under its mutex, so inline writes happen in memory order.
    absl::MutexLock write_lock(&inline_write_mu_);
    WriteTask task;
    {
      absl::MutexLock lock(&mu_);
      if (t.empty()) return next_seq_ - 1;
      task.last = next_seq_++;
      if (!error_.ok()) return task.last;  // not written: WhenDurable answers it with the error
    }
    const uint64_t seq = task.last;
    task.batch.push_back(std::move(t));
    WriteAndNotify(std::move(task));
    return seq;
  }
  absl::MutexLock lock(&mu_);
  if (t.empty()) return next_seq_ - 1;
  pending_.push_back(std::move(t));
  if (durability == Durability::kSync) {
    pending_sync_ = true;
    pending_early_written_ = pending_early_written_ || early_written;
  } else if (durability == Durability::kGroup) {
    pending_sync_by_ = std::min(pending_sync_by_, absl::Now() + group_delay);
  }
  work_cv_.Signal();
  return next_seq_++;
}

const absl::Status* CommitPipeline::DroppedLocked(uint64_t seq) const {
  auto it = dropped_.upper_bound(seq);
  if (it == dropped_.begin()) return nullptr;
  --it;
  return seq <= it->second.first ? &it->second.second : nullptr;
}

void CommitPipeline::WhenDurable(uint64_t seq, Callback done, Durability level) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (const absl::Status* dropped = DroppedLocked(seq); dropped != nullptr) {
      status = *dropped;
    } else if (seq > (level == Durability::kSync ? durable_seq_ : written_seq_)) {
      if (!error_.ok()) {
        status = error_;
      } else if (level == Durability::kSync) {
        waiters_.emplace(seq, std::move(done));
        // What was appended at kGroup or kNone has no fsync coming (or not soon): ask for one,
        // so that waiting on disk (Flush at shutdown, for one) never waits for ever. A kSync
        // append has asked already: nothing to do then, on the hot path.
        if (seq <= written_seq_) {
          unsynced_by_ = absl::InfinitePast();
          work_cv_.Signal();
        } else if (!pending_sync_) {
          pending_sync_ = true;
          work_cv_.Signal();
        }
        return;
      } else if (level == Durability::kGroup) {
        written_waiters_.emplace(seq, std::move(done));
        return;
      }
      // kNone: answered before it is written.
    }
  }
  done(status);
}

absl::Status CommitPipeline::WaitDurable(uint64_t seq, Durability level) {
  absl::Notification ready;
  absl::Status result;
  WhenDurable(
      seq,
      [&](absl::Status s) {
        result = std::move(s);
        ready.Notify();
      },
      level);
  ready.WaitForNotification();
  return result;
}

absl::Status CommitPipeline::status() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::Time CommitPipeline::failed_at() const {
  absl::MutexLock lock(&mu_);
  return failed_at_;
}

uint64_t CommitPipeline::last_appended() const {
  absl::MutexLock lock(&mu_);
  return next_seq_ - 1;
}

uint64_t CommitPipeline::writes() const {
  absl::MutexLock lock(&mu_);
  return writes_;
}

uint64_t CommitPipeline::syncs() const {
  absl::MutexLock lock(&mu_);
  return syncs_;
}

void CommitPipeline::Reset() {
  absl::MutexLock write_lock(&inline_write_mu_);  // no inline write in progress
  absl::MutexLock lock(&mu_);
  // A batch the writer took before the reset was taken as broken: let it settle first.
  mu_.Await(absl::Condition(
      +[](bool* writing) { return !*writing; }, &writing_));
  if (error_.ok()) return;
  pending_.clear();  // appended after the failure: WhenDurable already answered them
  if (durable_seq_ + 1 <= next_seq_ - 1)
    dropped_.emplace(durable_seq_ + 1, std::make_pair(next_seq_ - 1, error_));
  durable_seq_ = written_seq_ = next_seq_ - 1;
  written_.store(written_seq_, std::memory_order_release);
  pending_sync_ = false;
  pending_sync_by_ = unsynced_by_ = absl::InfiniteFuture();
  // Waiters register only while healthy and were all answered at the failure; none is left.
  error_ = absl::OkStatus();
  halted_ = false;
  failed_at_ = absl::InfinitePast();
  resets_.fetch_add(1, std::memory_order_acq_rel);  // before healthy: see resets()
  healthy_.store(true, std::memory_order_release);
}

void CommitPipeline::Halt(absl::Status cause) {
  std::vector<Callback> ready;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) {
      if (halted_ && !cause.ok()) error_ = std::move(cause);
      return;
    }
    halted_ = true;
    error_ = cause.ok() ? absl::UnavailableError("the pipeline was halted") : std::move(cause);
    failed_at_ = clock_ != nullptr ? clock_->Now() : absl::InfinitePast();
    healthy_.store(false, std::memory_order_release);
    for (auto* waiters : {&waiters_, &written_waiters_}) {
      for (auto& [seq, cb] : *waiters) ready.push_back(std::move(cb));
      waiters->clear();
    }
    // What is pending is taken by the writer as broken, and so not written.
    work_cv_.Signal();
    cause = error_;
  }
  if (on_failure_) on_failure_(cause);
  for (Callback& cb : ready) cb(cause);
}

void CommitPipeline::WriterLoop() {
  while (true) {
    WriteTask job;
    {
      absl::MutexLock lock(&mu_);
      while (pending_.empty()) {
        // Written unsynced and not yet fsynced (after a failure nothing more reaches the store).
        const bool unsynced = written_seq_ > durable_seq_ && error_.ok();
        if (stopping_) {
          if (!unsynced) return;  // everything is written and on disk
          break;                  // one last fsync before stopping
        }
        // A kGroup bound is due, or a kSync waiter came for what was written unsynced.
        if (unsynced && (pending_sync_ || unsynced_by_ <= absl::Now())) break;
        // A kSync waiter came for a batch the writer then wrote synced: nothing left to ask.
        pending_sync_ = false;
        if (unsynced_by_ == absl::InfiniteFuture()) {
          work_cv_.Wait(&mu_);
        } else {
          work_cv_.WaitWithDeadline(&mu_, unsynced_by_);
        }
      }
      job.batch.swap(pending_);
      job.last = next_seq_ - 1;
      job.broken = !error_.ok();
      job.sync = pending_sync_ || stopping_ || job.batch.empty() ||
                 std::min(pending_sync_by_, unsynced_by_) <= absl::Now();
      job.sync_by = pending_sync_by_;
      job.early_written = job.sync && pending_early_written_ && !job.batch.empty();
      pending_sync_ = false;
      pending_early_written_ = false;
      pending_sync_by_ = absl::InfiniteFuture();
      writing_ = true;
    }
    WriteAndNotify(std::move(job));
  }
}

void CommitPipeline::WriteAndNotify(WriteTask job) {
  // After a failed write memory is ahead of disk; writing later transitions on top could persist
  // a state that never existed, so nothing more is written until Reset().
  const absl::Time start = clock_ != nullptr ? clock_->Now() : absl::InfinitePast();
  absl::Status status;
  if (!job.broken) {
    if (job.batch.empty()) {
      status = store_.Sync();
    } else if (job.early_written) {
      // Two store calls instead of one synced write, so that what waits only for the log (a
      // worker's next job) goes out while the fsync runs.
      status = store_.WriteUnsynced(job.batch);
      if (status.ok()) {
        ReleaseWritten(job.last);
        status = store_.Sync();
      }
    } else if (job.sync) {
      status = store_.Write(job.batch);
    } else {
      status = store_.WriteUnsynced(job.batch);
    }
  }
  if (observer_ != nullptr && clock_ != nullptr && !job.broken && status.ok() && !job.batch.empty())
    observer_->Committed(job.batch.size(), clock_->Now() - start);
  std::vector<Callback> ready;
  bool first_failure = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!job.broken && !job.batch.empty()) ++writes_;
    if (!job.broken && job.sync) ++syncs_;
    if (!job.broken && status.ok()) {
      written_seq_ = job.last;
      written_.store(written_seq_, std::memory_order_release);
      if (job.sync) {
        durable_seq_ = job.last;
        unsynced_by_ = absl::InfiniteFuture();
      } else {
        unsynced_by_ = std::min(unsynced_by_, job.sync_by);
      }
      auto release = [&ready](std::multimap<uint64_t, Callback>& waiters, uint64_t upto) {
        auto end = waiters.upper_bound(upto);
        for (auto it = waiters.begin(); it != end; ++it) ready.push_back(std::move(it->second));
        waiters.erase(waiters.begin(), end);
      };
      // Written before durable, so each caller's kGroup callbacks run before its kSync ones.
      release(written_waiters_, written_seq_);
      release(waiters_, durable_seq_);
    } else {
      if (error_.ok()) {
        first_failure = true;
        error_ = status;
        failed_at_ = clock_ != nullptr ? clock_->Now() : absl::InfinitePast();
        healthy_.store(false, std::memory_order_release);
        if (observer_ != nullptr) observer_->StoreFailed(status);
      }
      status = error_;
      for (auto* waiters : {&waiters_, &written_waiters_}) {
        for (auto& [seq, cb] : *waiters) ready.push_back(std::move(cb));
        waiters->clear();
      }
    }
  }
  if (first_failure && on_failure_) on_failure_(status);
  for (Callback& cb : ready) cb(status);
}

void CommitPipeline::ReleaseWritten(uint64_t seq) {
  std::vector<Callback> ready;
  {
    absl::MutexLock lock(&mu_);
    written_seq_ = seq;
    written_.store(written_seq_, std::memory_order_release);
    auto end = written_waiters_.upper_bound(seq);
    for (auto it = written_waiters_.begin(); it != end; ++it)
      ready.push_back(std::move(it->second));
    written_waiters_.erase(written_waiters_.begin(), end);
  }
  // On the writer thread, before the fsync: quick callbacks only (they are pushes into streams'
  // queues). The fsync would otherwise come first and they would wait for it.
  for (Callback& cb : ready) cb(absl::OkStatus());
}

}  // namespace jobbroker::core
