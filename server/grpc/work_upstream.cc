#include "server/grpc/work_upstream.h"

#include <utility>

namespace jobbroker::server {

std::shared_ptr<WorkUpstream> WorkUpstream::Start(v1::Broker::Stub& stub,
                                                  std::unique_ptr<grpc::ClientContext> ctx,
                                                  v1::WorkRequest first, OnMessage on_message,
                                                  OnEnd on_end) {
  std::shared_ptr<WorkUpstream> upstream(
      new WorkUpstream(std::move(ctx), std::move(on_message), std::move(on_end)));
  upstream->self_ = upstream;
  stub.async()->Work(upstream->ctx_.get(), upstream.get());
  {
    absl::MutexLock lock(&upstream->mu_);
    upstream->outbox_.push_back(std::move(first));
  }
  // Released in MaybeRelease or Pump (held_).
  upstream->AddHold();
  upstream->StartRead(&upstream->incoming_);
  upstream->Pump();
  upstream->StartCall();
  return upstream;
}

void WorkUpstream::Send(v1::WorkRequest request) {
  {
    absl::MutexLock lock(&mu_);
    if (done_ || broken_ || closed_) return;
    outbox_.push_back(std::move(request));
  }
  Pump();
}

void WorkUpstream::CloseWrites() {
  {
    absl::MutexLock lock(&mu_);
    close_ = true;
  }
  Pump();
}

void WorkUpstream::Pump() {
  const v1::WorkRequest* next = nullptr;
  bool writes_done = false;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || !held_ || broken_ || closed_) return;
    if (!outbox_.empty()) {
      writing_ = true;
      next = &outbox_.front();  // stays put until OnWriteDone pops it
    } else if (close_) {
      closed_ = true;
      writes_done = true;
      held_ = false;  // the last write this side starts: its completion keeps the call
    }
  }
  if (next != nullptr) StartWrite(next);
  if (writes_done) {
    StartWritesDone();
    RemoveHold();
  }
}

void WorkUpstream::MaybeRelease() {
  {
    absl::MutexLock lock(&mu_);
    if (!held_ || writing_ || !broken_) return;
    held_ = false;
    outbox_.clear();
  }
  RemoveHold();
}

void WorkUpstream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    outbox_.pop_front();
    if (!ok) broken_ = true;  // OnDone says how, once the hold is gone
  }
  Pump();
  MaybeRelease();
}

void WorkUpstream::OnReadDone(bool ok) {
  if (!ok) {
    // The other node finished the stream, or it broke: nothing more goes out.
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
    }
    MaybeRelease();
    return;
  }
  on_message_(std::move(incoming_));
  incoming_.Clear();
  StartRead(&incoming_);
}

void WorkUpstream::OnDone(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    outbox_.clear();
  }
  on_end_(status);
  self_.reset();  // may delete this
}

}  // namespace jobbroker::server
