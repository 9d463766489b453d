#include "core/commit_pipeline.h"

#include <utility>

#include "absl/synchronization/notification.h"

namespace jobbroker {

CommitPipeline::CommitPipeline(Store& store, Mode mode, const Clock* clock,
                               BrokerObserver* observer)
    : store_(store), mode_(mode), clock_(clock), observer_(observer) {
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
      if (!error_.ok()) return seq;
    }
    std::vector<Transition> batch;
    batch.push_back(std::move(t));
    WriteAndNotify(std::move(batch), seq);
    return seq;
  }
  absl::MutexLock lock(&mu_);
  if (t.empty()) return next_seq_ - 1;
  pending_.push_back(std::move(t));
  work_cv_.Signal();
  return next_seq_++;
}

void CommitPipeline::WhenDurable(uint64_t seq, Callback done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (error_.ok() && seq > durable_seq_) {
      waiters_.emplace(seq, std::move(done));
      return;
    }
    status = error_;
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

uint64_t CommitPipeline::writes() const {
  absl::MutexLock lock(&mu_);
  return writes_;
}

void CommitPipeline::WriterLoop() {
  while (true) {
    std::vector<Transition> batch;
    uint64_t last;
    {
      absl::MutexLock lock(&mu_);
      while (pending_.empty() && !stopping_) work_cv_.Wait(&mu_);
      if (pending_.empty()) return;  // stopping, and everything is written
      batch.swap(pending_);
      last = next_seq_ - 1;
    }
    WriteAndNotify(std::move(batch), last);
  }
}

void CommitPipeline::WriteAndNotify(std::vector<Transition> batch, uint64_t last) {
  bool broken;
  {
    absl::MutexLock lock(&mu_);
    broken = !error_.ok();
  }
  // After a failed write memory is ahead of disk; writing later transitions on top could persist
  // a state that never existed, so nothing more is written.
  const absl::Time start = clock_ != nullptr ? clock_->Now() : absl::InfinitePast();
  absl::Status status = broken ? absl::OkStatus() : store_.Write(batch);
  if (observer_ != nullptr && clock_ != nullptr && !broken && status.ok())
    observer_->Committed(batch.size(), clock_->Now() - start);
  std::vector<Callback> ready;
  {
    absl::MutexLock lock(&mu_);
    ++writes_;
    if (status.ok() && error_.ok()) {
      durable_seq_ = last;
      auto end = waiters_.upper_bound(last);
      for (auto it = waiters_.begin(); it != end; ++it) ready.push_back(std::move(it->second));
      waiters_.erase(waiters_.begin(), end);
    } else {
      if (error_.ok() && observer_ != nullptr) observer_->StoreFailed(status);
      if (error_.ok()) error_ = status;
      status = error_;
      for (auto& [seq, cb] : waiters_) ready.push_back(std::move(cb));
      waiters_.clear();
    }
  }
  for (Callback& cb : ready) cb(status);
}

}  // namespace jobbroker
