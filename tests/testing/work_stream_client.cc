#include "tests/testing/work_stream_client.h"

#include "absl/time/clock.h"
#include "jobbroker/proto_time.h"

namespace jobbroker::testing {

WorkStreamClient::WorkStreamClient(v1::Broker::Stub& stub) {
  stream_ = stub.Work(&ctx_);
  reader_ = std::thread([this] { ReadLoop(); });
}

WorkStreamClient::~WorkStreamClient() {
  if (!finished_) {
    ctx_.TryCancel();
    reader_.join();
    stream_->Finish().ok();
  }
}

void WorkStreamClient::ReadLoop() {
  v1::WorkResponse m;
  while (stream_->Read(&m)) {
    absl::MutexLock lock(&mu_);
    switch (m.response_case()) {
      case v1::WorkResponse::kJob:
        jobs_.push_back(m.job());
        ++job_messages_;
        break;
      case v1::WorkResponse::kJobBatch:
        for (const v1::LeasedJob& job : m.job_batch().jobs()) jobs_.push_back(job);
        ++job_messages_;
        ++job_batches_;
        break;
      case v1::WorkResponse::kResult:
        results_.push_back(m.result());
        break;
      case v1::WorkResponse::kLeaseLost:
        lost_.push_back(m.lease_lost().job_id());
        lost_notices_.push_back(m.lease_lost());
        break;
      case v1::WorkResponse::kCancelRequested:
        cancels_.push_back(m.cancel_requested().job_id());
        break;
      case v1::WorkResponse::RESPONSE_NOT_SET:
        break;
    }
  }
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

uint64_t WorkStreamClient::Send(v1::WorkRequest request) {
  absl::MutexLock lock(&write_mu_);
  uint64_t id = next_id_++;
  request.set_request_id(id);
  stream_->Write(request);
  return id;
}

v1::WorkResult WorkStreamClient::Call(v1::WorkRequest request) {
  uint64_t id = Send(std::move(request));
  absl::MutexLock lock(&mu_);
  auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_) return true;
    for (const v1::WorkResult& r : results_)
      if (r.request_id() == id) return true;
    return false;
  };
  mu_.AwaitWithTimeout(absl::Condition(&answered), absl::Seconds(30));
  for (auto it = results_.begin(); it != results_.end(); ++it) {
    if (it->request_id() == id) {
      v1::WorkResult r = *it;
      results_.erase(it);
      return r;
    }
  }
  v1::WorkResult none;
  none.set_request_id(id);
  none.set_code(grpc::StatusCode::DEADLINE_EXCEEDED);
  none.set_message("no answer (stream closed or 30 s passed)");
  return none;
}

grpc::StatusCode WorkStreamClient::Subscribe(const std::vector<std::string>& queues,
                                             int max_in_flight, absl::Duration lease_duration,
                                             const std::string& worker_id, bool batch_pushes) {
  v1::WorkRequest r;
  v1::SubscribeRequest* s = r.mutable_subscribe();
  for (const std::string& q : queues) s->add_queues(q);
  s->set_worker_id(worker_id);
  s->set_max_in_flight(max_in_flight);
  s->set_batch_pushes(batch_pushes);
  if (lease_duration > absl::ZeroDuration())
    *s->mutable_lease_duration() = client::ToProtoDuration(lease_duration);
  return static_cast<grpc::StatusCode>(Call(std::move(r)).code());
}

grpc::StatusCode WorkStreamClient::Ack(const v1::LeasedJob& job) {
  v1::WorkRequest r;
  r.mutable_ack()->set_job_id(job.job_id());
  r.mutable_ack()->set_lease_id(job.lease_id());
  return static_cast<grpc::StatusCode>(Call(std::move(r)).code());
}

grpc::StatusCode WorkStreamClient::Flow(int max_in_flight) {
  v1::WorkRequest r;
  r.mutable_flow()->set_max_in_flight(max_in_flight);
  return static_cast<grpc::StatusCode>(Call(std::move(r)).code());
}

namespace {

template <typename T>
std::optional<T> PopWaitingLocked(absl::Mutex& mu, std::deque<T>& queue, const bool& closed,
                                  absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  auto ready = [&]() { return !queue.empty() || closed; };
  mu.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (queue.empty()) return std::nullopt;
  T v = std::move(queue.front());
  queue.pop_front();
  return v;
}

}  // namespace

std::optional<v1::LeasedJob> WorkStreamClient::NextJob(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return PopWaitingLocked(mu_, jobs_, closed_, timeout);
}

std::optional<std::string> WorkStreamClient::NextLeaseLost(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return PopWaitingLocked(mu_, lost_, closed_, timeout);
}

std::optional<v1::LeaseLost> WorkStreamClient::NextLeaseLostNotice(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return PopWaitingLocked(mu_, lost_notices_, closed_, timeout);
}

std::optional<std::string> WorkStreamClient::NextCancel(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return PopWaitingLocked(mu_, cancels_, closed_, timeout);
}

size_t WorkStreamClient::job_messages() {
  absl::MutexLock lock(&mu_);
  return job_messages_;
}

size_t WorkStreamClient::job_batches() {
  absl::MutexLock lock(&mu_);
  return job_batches_;
}

size_t WorkStreamClient::pending_jobs() {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

void WorkStreamClient::Cancel() {
  ctx_.TryCancel();
  reader_.join();
  stream_->Finish().ok();
  finished_ = true;
}

bool WorkStreamClient::ended() {
  absl::MutexLock lock(&mu_);
  return closed_;
}

grpc::Status WorkStreamClient::Close() {
  {
    absl::MutexLock lock(&write_mu_);
    stream_->WritesDone();
  }
  reader_.join();
  finished_ = true;
  return stream_->Finish();
}

}  // namespace jobbroker::testing
