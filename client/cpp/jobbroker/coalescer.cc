#include "jobbroker/coalescer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "jobbroker/partition.h"

namespace jobbroker::client {

Coalescer::Coalescer(Options options, Transport transport)
    : options_(options), transport_(std::move(transport)) {}

Coalescer::~Coalescer() {
  Close();
  {
    absl::MutexLock lock(&mu_);
    timer_stop_ = true;
    timer_cv_.Signal();
  }
  // No timer is armed after Close(), so the thread (if any) is not started any more.
  if (timer_thread_.joinable()) timer_thread_.join();
}

int64_t Coalescer::JobBytes(const v1::EnqueueRequest& job) {
  int64_t bytes = static_cast<int64_t>(job.payload().size());
  for (const auto& [name, value] : job.headers()) bytes += name.size() + value.size();
  return bytes;
}

bool Coalescer::RefusesWhole(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
      return true;
    default:
      return false;
  }
}

Coalescer::Key Coalescer::KeyOf(const v1::EnqueueRequest& job) const {
  Key key;
  key.dedup = !job.dedup_key().empty();
  const uint32_t count = transport_.partition_count ? transport_.partition_count() : 0;
  if (count == 0) {
    // Before the first cluster table (or with a fixed channel): one queue is one partition.
    key.by_queue = true;
    key.queue = job.queue();
  } else {
    key.partition = PartitionOfQueue(job.queue(), count);
  }
  return key;
}

absl::StatusOr<Enqueued> Coalescer::Enqueue(const v1::EnqueueRequest& job, absl::Time deadline) {
  // Outside mu_: it takes the router's lock.
  const Key key = KeyOf(job);
  const int64_t bytes = JobBytes(job);
  Waiter self;
  self.deadline = deadline;
  std::unique_ptr<Batch> to_send;
  bool closed = false;
  {
    absl::MutexLock lock(&mu_);
    closed = closing_;
    if (closed) {
      ++alone_sends_;
    } else {
      to_send = JoinLocked(key, bytes, job, &self);
    }
  }
  if (closed) return SendAlone(job, deadline);
  if (to_send == nullptr) {
    self.woken.WaitForNotification();
    if (self.next == Waiter::Next::kSend) to_send = std::move(self.batch);
  }
  if (to_send != nullptr) return SendAndAnswer(std::move(to_send), &self, job);
  if (self.next == Waiter::Next::kAlone) return SendAlone(job, deadline);
  return std::move(self.result);
}

absl::StatusOr<Enqueued> Coalescer::SendAlone(const v1::EnqueueRequest& job, absl::Time deadline) {
  absl::StatusOr<Enqueued> answer = transport_.send_one(job, deadline);
  absl::MutexLock lock(&mu_);
  if (--alone_sends_ == 0 && keys_.empty()) idle_cv_.SignalAll();
  return answer;
}

std::unique_ptr<Coalescer::Batch> Coalescer::JoinLocked(const Key& key, int64_t bytes,
                                                        const v1::EnqueueRequest& job,
                                                        Waiter* self) {
  KeyState& ks = keys_[key];
  // A job that would carry the open batch past max_bytes closes it first, so a batch stays
  // under the limit unless one job alone is larger. This caller is not in that batch.
  if (ks.open != nullptr && ks.open->bytes + bytes > options_.max_bytes) {
    SealLocked(ks, /*caller_in_it=*/false);
  }
  const bool opened = ks.open == nullptr;
  if (opened) {
    ks.open = std::make_unique<Batch>();
    ks.open->key = key;
    ks.open->id = next_batch_id_++;
  }
  Batch& batch = *ks.open;
  *batch.jobs.add_jobs() = job;
  batch.waiters.push_back(self);
  batch.bytes += bytes;
  batch.deadline = std::min(batch.deadline, self->deadline);
  ++waiting_jobs_;
  if (batch.jobs.jobs_size() >= options_.max_jobs || batch.bytes >= options_.max_bytes) {
    return SealLocked(ks, /*caller_in_it=*/true);  // rule 2
  }
  if (ks.in_flight < options_.max_in_flight) {
    // Rule 3. With no linger a thread's "turn" is this call: the batch goes now.
    if (options_.linger <= absl::ZeroDuration()) {
      return DispatchLocked(ks, std::move(ks.open), /*caller_in_it=*/true);
    }
    if (opened) {
      batch.linger_pending = true;
      ArmTimerLocked(batch, absl::Now() + options_.linger);
    }
  }
  // Else rule 4: the end of an in-flight batch of this key sends it.
  return nullptr;
}

std::unique_ptr<Coalescer::Batch> Coalescer::DispatchLocked(KeyState& ks,
                                                            std::unique_ptr<Batch> batch,
                                                            bool caller_in_it) {
  ++ks.in_flight;
  ++in_flight_;
  waiting_jobs_ -= batch->jobs.jobs_size();
  batch->linger_pending = false;
  if (caller_in_it) return batch;
  // Its first caller is blocked in Enqueue and sends it: no thread of our own is needed.
  Waiter* first = batch->waiters.front();
  first->batch = std::move(batch);
  first->next = Waiter::Next::kSend;
  first->woken.Notify();
  return nullptr;
}

std::unique_ptr<Coalescer::Batch> Coalescer::SealLocked(KeyState& ks, bool caller_in_it) {
  std::unique_ptr<Batch> batch = std::move(ks.open);
  if (ks.full.empty() && ks.in_flight < options_.max_in_flight) {
    return DispatchLocked(ks, std::move(batch), caller_in_it);
  }
  // The in-flight limit holds for full batches too; they keep their order.
  batch->linger_pending = false;
  ks.full.push_back(std::move(batch));
  return nullptr;
}

void Coalescer::SendNextLocked(KeyState& ks) {
  while (ks.in_flight < options_.max_in_flight) {
    if (!ks.full.empty()) {
      std::unique_ptr<Batch> batch = std::move(ks.full.front());
      ks.full.pop_front();
      DispatchLocked(ks, std::move(batch), /*caller_in_it=*/false);
      continue;
    }
    if (ks.open != nullptr && !ks.open->linger_pending) {
      DispatchLocked(ks, std::move(ks.open), /*caller_in_it=*/false);
    }
    return;
  }
}

absl::StatusOr<Enqueued> Coalescer::SendAndAnswer(std::unique_ptr<Batch> batch, Waiter* self,
                                                  const v1::EnqueueRequest& own_job) {
  const size_t n = batch->waiters.size();
  absl::StatusOr<std::vector<Enqueued>> results;
  if (n == 1) {
    // Rule 5: a batch of one is the unary call, so a lone enqueue costs what it did.
    absl::StatusOr<Enqueued> one = transport_.send_one(batch->jobs.jobs(0), batch->deadline);
    if (one.ok()) {
      results = std::vector<Enqueued>{*std::move(one)};
    } else {
      results = one.status();
    }
  } else {
    results = transport_.send_batch(batch->jobs, batch->deadline);
    if (results.ok() && results->size() != n) {
      results = absl::InternalError(
          absl::StrCat("EnqueueBatch answered ", results->size(), " results for ", n, " jobs"));
    }
  }
  // Refused whole, nothing applied: each job goes again alone, from its own caller's thread
  // (all at once), and gets the answer a unary call gives, its field named without the batch's
  // "jobs[i]." prefix.
  const bool alone = !results.ok() && n > 1 && RefusesWhole(results.status().code());
  {
    absl::MutexLock lock(&mu_);
    if (alone) alone_sends_ += static_cast<int>(n);
    auto it = keys_.find(batch->key);  // kept while a batch of it is in flight
    --it->second.in_flight;
    --in_flight_;
    SendNextLocked(it->second);
    EraseIfIdleLocked(batch->key);
  }
  // The callers are answered without mu_: each wakes on its own notification.
  absl::StatusOr<Enqueued> mine = absl::InternalError("no answer");
  for (size_t i = 0; i < n; ++i) {
    Waiter* w = batch->waiters[i];
    absl::StatusOr<Enqueued> answer =
        results.ok() ? absl::StatusOr<Enqueued>((*results)[i]) : results.status();
    if (w == self) {
      mine = std::move(answer);
      continue;
    }
    if (alone) {
      w->next = Waiter::Next::kAlone;
    } else {
      w->result = std::move(answer);
      w->next = Waiter::Next::kAnswered;
    }
    w->woken.Notify();
  }
  if (alone) return SendAlone(own_job, self->deadline);
  return mine;
}

void Coalescer::EraseIfIdleLocked(const Key& key) {
  auto it = keys_.find(key);
  if (it == keys_.end()) return;
  const KeyState& ks = it->second;
  if (ks.in_flight > 0 || ks.open != nullptr || !ks.full.empty()) return;
  keys_.erase(it);
  if (keys_.empty() && alone_sends_ == 0) idle_cv_.SignalAll();
}

void Coalescer::ArmTimerLocked(const Batch& batch, absl::Time due) {
  if (!timer_started_) {
    timer_started_ = true;
    timer_thread_ = std::thread([this] { TimerLoop(); });
  }
  timers_.push_back(Timer{.due = due, .key = batch.key, .batch_id = batch.id});
  timer_cv_.Signal();
}

void Coalescer::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!timer_stop_) {
    if (timers_.empty()) {
      timer_cv_.Wait(&mu_);
      continue;
    }
    const absl::Time due = timers_.front().due;
    if (absl::Now() < due) {
      timer_cv_.WaitWithDeadline(&mu_, due);
      continue;
    }
    const Timer timer = std::move(timers_.front());
    timers_.pop_front();
    FireLocked(timer);
  }
}

void Coalescer::FireLocked(const Timer& timer) {
  auto it = keys_.find(timer.key);
  if (it == keys_.end()) return;
  KeyState& ks = it->second;
  // Already sent (it filled up, or Close()) and maybe a newer batch open: nothing to do.
  if (ks.open == nullptr || ks.open->id != timer.batch_id || !ks.open->linger_pending) return;
  ks.open->linger_pending = false;
  // Under the limit it goes now; at the limit the end of an in-flight batch sends it.
  SendNextLocked(ks);
}

void Coalescer::Close() {
  absl::MutexLock lock(&mu_);
  if (!closing_) {
    closing_ = true;
    for (auto& [key, ks] : keys_) {
      if (ks.open != nullptr) ks.open->linger_pending = false;
      SendNextLocked(ks);
    }
  }
  while (!keys_.empty() || alone_sends_ > 0) idle_cv_.Wait(&mu_);
}

Coalescer::Counts Coalescer::counts() const {
  absl::MutexLock lock(&mu_);
  return Counts{.waiting_jobs = waiting_jobs_, .in_flight_batches = in_flight_};
}

}  // namespace jobbroker::client
