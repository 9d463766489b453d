#include "server/grpc/work_stream.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/convert/convert.h"
#include "server/grpc/grpc_status.h"

namespace jobbroker::server {
namespace {

// Makes `m` the WorkResult answering request `id` with `status`; the caller adds the rest.
v1::WorkResult* NewResult(v1::WorkResponse& m, uint64_t id, const absl::Status& status) {
  v1::WorkResult* result = m.mutable_result();
  ToProto(id, status, result);
  return result;
}

// What a WorkResult carries beside the status of the broker's answer: a heartbeat's new deadline,
// the status of each ack of a batch; nothing for a plain status or a fail.
absl::Status StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& r) {
  return r.status();
}
void AddDetails(const absl::Status&, v1::WorkResult*) {}
void AddDetails(const absl::StatusOr<core::FailResult>&, v1::WorkResult*) {}
void AddDetails(const absl::StatusOr<core::HeartbeatResult>& r, v1::WorkResult* out) {
  if (r.ok()) ToProto(*r, out);
}
void AddDetails(const absl::StatusOr<std::vector<absl::Status>>& r, v1::WorkResult* out) {
  if (r.ok()) ToProto(*r, out);
}

}  // namespace

// What the broker pushes, forwarded to the stream while it lives. The broker may keep the sink
// after the stream is gone, hence the weak reference. Pushes that arrive before the subscribe's
// own answer is queued wait here, so a worker sees that answer first.
class WorkStream::Sink final : public core::StreamSink {
 public:
  explicit Sink(std::weak_ptr<WorkStream> stream) : stream_(std::move(stream)) {}

  void PushJob(core::LeasedJob job) override {
    v1::WorkResponse m;
    ToProto(job, m.mutable_job());
    Forward(std::move(m));
  }
  void PushJobs(std::vector<core::LeasedJob> jobs) override {
    std::vector<v1::WorkResponse> messages(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) ToProto(jobs[i], messages[i].mutable_job());
    ForwardAll(std::move(messages));
  }
  void LeaseLost(std::string job_id) override {
    v1::WorkResponse m;
    m.mutable_lease_lost()->set_job_id(std::move(job_id));
    Forward(std::move(m));
  }
  void CancelRequested(std::string job_id) override {
    v1::WorkResponse m;
    m.mutable_cancel_requested()->set_job_id(std::move(job_id));
    Forward(std::move(m));
  }
  void End(absl::Status status) override {
    if (std::shared_ptr<WorkStream> s = stream_.lock()) s->End(std::move(status));
  }

  // The subscribe was answered: let held pushes through.
  void Open() {
    std::vector<v1::WorkResponse> held;
    {
      absl::MutexLock lock(&mu_);
      open_ = true;
      held.swap(held_);
    }
    if (std::shared_ptr<WorkStream> s = stream_.lock()) s->SendAll(std::move(held));
  }

 private:
  void Forward(v1::WorkResponse m) {
    {
      absl::MutexLock lock(&mu_);
      if (!open_) {
        held_.push_back(std::move(m));
        return;
      }
    }
    if (std::shared_ptr<WorkStream> s = stream_.lock()) s->Send(std::move(m));
  }
  void ForwardAll(std::vector<v1::WorkResponse> messages) {
    {
      absl::MutexLock lock(&mu_);
      if (!open_) {
        for (v1::WorkResponse& m : messages) held_.push_back(std::move(m));
        return;
      }
    }
    if (std::shared_ptr<WorkStream> s = stream_.lock()) s->SendAll(std::move(messages));
  }

  const std::weak_ptr<WorkStream> stream_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::WorkResponse> held_ ABSL_GUARDED_BY(mu_);
};

WorkStream* WorkStream::Start(node::Partitions& broker, const RpcAuth& auth,
                              const TokenEntry* caller, WorkStreamLimit* limit) {
  std::shared_ptr<WorkStream> stream(new WorkStream(broker, auth, caller, limit));
  stream->self_ = stream;
  stream->StartRead(&stream->request_);
  return stream.get();
}

void WorkStream::OnReadDone(bool ok) {
  if (!ok) {
    uint64_t stream;
    {
      absl::MutexLock lock(&mu_);
      read_closed_ = true;
      stream = stream_id_;
    }
    // No new jobs for a worker that stopped talking; what it holds runs out or is acked.
    if (stream != 0) broker_.Unsubscribe(stream);
    Pump();
    return;
  }
  Handle(request_);
  {
    absl::MutexLock lock(&mu_);
    if (outbox_.size() >= kMaxOutbox) {
      read_paused_ = true;  // Pump resumes once the client has read some
      return;
    }
  }
  StartRead(&request_);
}

absl::Status WorkStream::Authorize(const v1::WorkRequest& request) const {
  switch (request.request_case()) {
    case v1::WorkRequest::kSubscribe:
      for (const std::string& queue : request.subscribe().queues()) {
        if (absl::Status s = auth_.Allow(caller_, Role::kWorker, queue); !s.ok()) return s;
      }
      return absl::OkStatus();
    case v1::WorkRequest::kHeartbeat:
      return auth_.AllowJob(caller_, Role::kWorker, request.heartbeat().job_id());
    case v1::WorkRequest::kAck:
      return auth_.AllowJob(caller_, Role::kWorker, request.ack().job_id());
    case v1::WorkRequest::kAckBatch:
      // Refused whole, like EnqueueBatch: a caller does not get a partly applied batch for
      // asking beyond its rights.
      for (const v1::AckRequest& ack : request.ack_batch().acks()) {
        if (absl::Status s = auth_.AllowJob(caller_, Role::kWorker, ack.job_id()); !s.ok())
          return s;
      }
      return absl::OkStatus();
    case v1::WorkRequest::kFail:
      return auth_.AllowJob(caller_, Role::kWorker, request.fail().job_id());
    case v1::WorkRequest::kRelease:
      return auth_.AllowJob(caller_, Role::kWorker, request.release().job_id());
    default:
      return absl::OkStatus();
  }
}

template <typename Result>
core::Done<Result> WorkStream::AnswerWhenDone(uint64_t request_id) {
  BeginOp();
  return [this, request_id](Result result) {
    v1::WorkResponse m;
    AddDetails(result, NewResult(m, request_id, StatusOf(result)));
    Send(std::move(m));
    EndOp();
  };
}

void WorkStream::Handle(const v1::WorkRequest& request) {
  const uint64_t id = request.request_id();
  if (absl::Status s = Authorize(request); !s.ok()) return Answer(id, s);
  switch (request.request_case()) {
    case v1::WorkRequest::kSubscribe:
      Subscribe(id, request.subscribe());
      return;
    case v1::WorkRequest::kHeartbeat: {
      absl::StatusOr<core::HeartbeatSpec> spec = FromProto(request.heartbeat());
      if (!spec.ok()) return Answer(id, spec.status());
      return broker_.Heartbeat(std::move(*spec),
                               AnswerWhenDone<absl::StatusOr<core::HeartbeatResult>>(id));
    }
    case v1::WorkRequest::kAck:
      return broker_.Ack(FromProto(request.ack()), AnswerWhenDone<absl::Status>(id));
    case v1::WorkRequest::kAckBatch:
      return broker_.AckBatch(FromProto(request.ack_batch()),
                              AnswerWhenDone<absl::StatusOr<std::vector<absl::Status>>>(id));
    case v1::WorkRequest::kFail: {
      absl::StatusOr<core::FailSpec> spec = FromProto(request.fail());
      if (!spec.ok()) return Answer(id, spec.status());
      return broker_.Fail(std::move(*spec), AnswerWhenDone<absl::StatusOr<core::FailResult>>(id));
    }
    case v1::WorkRequest::kRelease:
      return broker_.Release(FromProto(request.release()), AnswerWhenDone<absl::Status>(id));
    case v1::WorkRequest::kFlow: {
      uint64_t stream;
      {
        absl::MutexLock lock(&mu_);
        stream = stream_id_;
      }
      if (stream == 0)
        return Answer(id, absl::FailedPreconditionError("flow needs a subscribe first"));
      return Answer(id, broker_.SetFlow(stream, request.flow().max_in_flight()));
    }
    case v1::WorkRequest::REQUEST_NOT_SET:
      break;
  }
  Answer(id, absl::InvalidArgumentError("request must set one of subscribe, heartbeat, ack, "
                                        "ack_batch, fail, release, flow"));
}

void WorkStream::Subscribe(uint64_t request_id, const v1::SubscribeRequest& subscribe) {
  bool already;
  {
    absl::MutexLock lock(&mu_);
    already = stream_id_ != 0;
  }
  if (already)
    return Answer(
        request_id,
        absl::FailedPreconditionError(
            "subscribe: this stream has already subscribed; open another stream for other queues"));
  absl::StatusOr<core::SubscribeSpec> spec = FromProto(subscribe);
  if (!spec.ok()) return Answer(request_id, spec.status());
  auto sink = std::make_shared<Sink>(self_);
  absl::StatusOr<uint64_t> stream = broker_.Subscribe(*std::move(spec), sink);
  if (!stream.ok()) return Answer(request_id, stream.status());
  {
    absl::MutexLock lock(&mu_);
    stream_id_ = *stream;
    batch_pushes_ = subscribe.batch_pushes();
  }
  Answer(request_id, absl::OkStatus());
  sink->Open();
}

void WorkStream::Answer(uint64_t request_id, const absl::Status& status) {
  v1::WorkResponse m;
  NewResult(m, request_id, status);
  Send(std::move(m));
}

void WorkStream::Send(v1::WorkResponse message) {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finished_) return;
    outbox_.push_back(std::move(message));
  }
  Pump();
}

void WorkStream::SendAll(std::vector<v1::WorkResponse> messages) {
  if (messages.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finished_) return;
    for (v1::WorkResponse& m : messages) outbox_.push_back(std::move(m));
  }
  Pump();
}

void WorkStream::End(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!ended_.has_value()) ended_ = std::move(status);
  }
  Pump();
}

void WorkStream::BeginOp() {
  absl::MutexLock lock(&mu_);
  ++pending_ops_;
}

void WorkStream::EndOp() {
  {
    absl::MutexLock lock(&mu_);
    --pending_ops_;
  }
  Pump();
}

void WorkStream::Pump() {
  const v1::WorkResponse* to_write = nullptr;
  bool resume_read = false;
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!writing_ && !outbox_.empty() && !cancelled_) {
      if (batch_pushes_) CoalesceJobsLocked();
      writing_ = true;
      to_write = &outbox_.front();  // stays put until OnWriteDone pops it
    }
    if (read_paused_ && outbox_.size() < kMaxOutbox / 2 && !read_closed_ && !cancelled_) {
      read_paused_ = false;
      resume_read = true;
    }
    bool done_talking = read_closed_ || cancelled_ || ended_.has_value();
    if (done_talking && pending_ops_ == 0 && !writing_ && (outbox_.empty() || cancelled_)) {
      finished_ = true;
      if (cancelled_) {
        finish = grpc::Status::CANCELLED;
      } else {
        finish = ToGrpcStatus(ended_.value_or(absl::OkStatus()));
      }
    }
  }
  if (to_write != nullptr) StartWrite(to_write);
  if (resume_read) StartRead(&request_);
  if (finish.has_value()) Finish(*finish);
}

void WorkStream::CoalesceJobsLocked() {
  if (outbox_.size() < 2 || !outbox_[0].has_job() || !outbox_[1].has_job()) return;
  v1::WorkResponse batch;
  v1::JobBatch* jobs = batch.mutable_job_batch();
  size_t bytes = 0;
  while (!outbox_.empty() && outbox_.front().has_job() && jobs->jobs_size() < kMaxJobsPerBatch) {
    v1::LeasedJob* job = outbox_.front().mutable_job();
    // Roughly its encoded size: a batch stays far below clients' message size limits.
    const size_t size = job->payload().size() + job->checkpoint().size() + 256;
    if (jobs->jobs_size() > 0 && bytes + size > kMaxBatchBytes) break;
    bytes += size;
    jobs->add_jobs()->Swap(job);
    outbox_.pop_front();
  }
  outbox_.push_front(std::move(batch));
}

void WorkStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    outbox_.pop_front();
    if (!ok) {
      cancelled_ = true;  // the client is gone: nothing more can be written
      outbox_.clear();
    }
  }
  Pump();
}

void WorkStream::OnCancel() {
  uint64_t stream;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    stream = stream_id_;
  }
  if (stream != 0) broker_.Unsubscribe(stream);
  Pump();
}

void WorkStream::OnDone() {
  uint64_t stream;
  {
    absl::MutexLock lock(&mu_);
    stream = stream_id_;
  }
  if (stream != 0) broker_.Unsubscribe(stream);
  limit_->Release();
  self_.reset();  // may delete this
}

}  // namespace jobbroker::server
