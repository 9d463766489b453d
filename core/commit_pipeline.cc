#include "core/commit_pipeline.h"

#include <utility>

#include "absl/synchronization/notification.h"

namespace jobbroker {

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

uint64_t CommitPipeline::Append(Transition t) {
  if (mode_ == Mode::kInline) {
    // The broker calls Append under its mutex, so inline writes happen in memory order.
    absl::MutexLock write_lock(&inline_write_mu_);
    uint64_t seq;
    {
      absl::MutexLock lock(&mu_);
      if (t.empty()) return next_seq_ - 1;
      seq = next_seq_++;
      if (!error_.ok()) return seq;  // not written: WhenDurable answers it with the error
    }
    std::vector<Transition> batch;
    batch.push_back(std::move(t));
    WriteAndNotify(std::move(batch), seq, /*broken=*/false);
    return seq;
  }
  absl::MutexLock lock(&mu_);
  if (t.empty()) return next_seq_ - 1;
  pending_.push_back(std::move(t));
  work_cv_.Signal();
  return next_seq_++;
}

const absl::Status* CommitPipeline::DroppedLocked(uint64_t seq) const {
  auto it = dropped_.upper_bound(seq);
  if (it == dropped_.begin()) return nullptr;
  --it;
  return seq <= it->second.first ? &it->second.second : nullptr;
}

void CommitPipeline::WhenDurable(uint64_t seq, Callback done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (const absl::Status* dropped = DroppedLocked(seq); dropped != nullptr) {
      status = *dropped;
    } else if (seq > durable_seq_) {
      if (error_.ok()) {
        waiters_.emplace(seq, std::move(done));
        return;
      }
      status = error_;
    }
  }
  done(status);
}

absl::Status CommitPipeline::WaitDurable(uint64_t seq) {
  absl::Notification ready;
  absl::Status result;
  WhenDurable(seq, [&](absl::Status s) {
    result = std::move(s);
    ready.Notify();
  });
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

uint64_t CommitPipeline::writes() const {
  absl::MutexLock lock(&mu_);
  return writes_;
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
  durable_seq_ = next_seq_ - 1;
  // Waiters register only while healthy and were all answered at the failure; none is left.
  error_ = absl::OkStatus();
  failed_at_ = absl::InfinitePast();
  healthy_.store(true, std::memory_order_release);
}

void CommitPipeline::WriterLoop() {
  while (true) {
    std::vector<Transition> batch;
    uint64_t last;
    bool broken;
    {
      absl::MutexLock lock(&mu_);
      while (pending_.empty() && !stopping_) work_cv_.Wait(&mu_);
      if (pending_.empty()) return;  // stopping, and everything is written
      batch.swap(pending_);
      last = next_seq_ - 1;
      broken = !error_.ok();
      writing_ = true;
    }
    WriteAndNotify(std::move(batch), last, broken);
  }
}

void CommitPipeline::WriteAndNotify(std::vector<Transition> batch, uint64_t last, bool broken) {
  // After a failed write memory is ahead of disk; writing later transitions on top could persist
  // a state that never existed, so nothing more is written until Reset().
  const absl::Time start = clock_ != nullptr ? clock_->Now() : absl::InfinitePast();
  absl::Status status = broken ? absl::OkStatus() : store_.Write(batch);
  if (observer_ != nullptr && clock_ != nullptr && !broken && status.ok())
    observer_->Committed(batch.size(), clock_->Now() - start);
  std::vector<Callback> ready;
  bool first_failure = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!broken) ++writes_;
    if (!broken && status.ok()) {
      durable_seq_ = last;
      auto end = waiters_.upper_bound(last);
      for (auto it = waiters_.begin(); it != end; ++it) ready.push_back(std::move(it->second));
      waiters_.erase(waiters_.begin(), end);
    } else {
      if (error_.ok()) {
        first_failure = true;
        error_ = status;
        failed_at_ = clock_ != nullptr ? clock_->Now() : absl::InfinitePast();
        healthy_.store(false, std::memory_order_release);
        if (observer_ != nullptr) observer_->StoreFailed(status);
      }
      status = error_;
      for (auto& [seq, cb] : waiters_) ready.push_back(std::move(cb));
      waiters_.clear();
    }
  }
  if (first_failure && on_failure_) on_failure_(status);
  for (Callback& cb : ready) cb(status);
}

}  // namespace jobbroker
