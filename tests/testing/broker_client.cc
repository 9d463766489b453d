#include "tests/testing/broker_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace jobbroker::testing {

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return absl::StrCat("code ", static_cast<int>(code));
  }
}

BrokerClient::BrokerClient(std::shared_ptr<grpc::Channel> channel, absl::Duration call_timeout)
    : call_timeout_(call_timeout),
      broker_(v1::Broker::NewStub(channel)),
      admin_(v1::Admin::NewStub(channel)) {}

void BrokerClient::SetDeadline(grpc::ClientContext* ctx, absl::Duration extra) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_ + extra));
}

grpc::Status BrokerClient::Enqueue(const v1::EnqueueRequest& req, v1::EnqueueResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return broker_->Enqueue(&ctx, req, resp);
}

grpc::Status BrokerClient::EnqueueBatch(const v1::EnqueueBatchRequest& req,
                                        v1::EnqueueBatchResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return broker_->EnqueueBatch(&ctx, req, resp);
}

grpc::Status BrokerClient::Lease(const v1::LeaseRequest& req, v1::LeaseResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, FromProto(req.wait()));
  return broker_->Lease(&ctx, req, resp);
}

grpc::Status BrokerClient::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return broker_->Heartbeat(&ctx, req, resp);
}

grpc::Status BrokerClient::Ack(const v1::AckRequest& req) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::AckResponse resp;
  return broker_->Ack(&ctx, req, &resp);
}

grpc::Status BrokerClient::Fail(const v1::FailRequest& req, v1::FailResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return broker_->Fail(&ctx, req, resp);
}

grpc::Status BrokerClient::Release(const v1::ReleaseRequest& req) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ReleaseResponse resp;
  return broker_->Release(&ctx, req, &resp);
}

grpc::Status BrokerClient::GetJob(const std::string& job_id, v1::Job* job) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  return admin_->GetJob(&ctx, req, job);
}

grpc::Status BrokerClient::ListJobs(const v1::ListJobsRequest& req, v1::ListJobsResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return admin_->ListJobs(&ctx, req, resp);
}

grpc::Status BrokerClient::GetQueue(const std::string& queue, v1::QueueInfo* info) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetQueueRequest req;
  req.set_queue(queue);
  return admin_->GetQueue(&ctx, req, info);
}

grpc::Status BrokerClient::UpdateQueuePolicy(const v1::UpdateQueuePolicyRequest& req,
                                             v1::QueueInfo* info) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return admin_->UpdateQueuePolicy(&ctx, req, info);
}

grpc::Status BrokerClient::CancelJob(const std::string& job_id, v1::Job* job) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  return admin_->CancelJob(&ctx, req, job);
}

grpc::Status BrokerClient::RetryJob(const v1::RetryJobRequest& req, v1::RetryJobResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return admin_->RetryJob(&ctx, req, resp);
}

grpc::Status BrokerClient::DeleteJob(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::DeleteJobRequest req;
  req.set_job_id(job_id);
  v1::DeleteJobResponse resp;
  return admin_->DeleteJob(&ctx, req, &resp);
}

grpc::Status BrokerClient::PauseQueue(const std::string& queue, v1::QueueInfo* info) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::PauseQueueRequest req;
  req.set_queue(queue);
  return admin_->PauseQueue(&ctx, req, info);
}

grpc::Status BrokerClient::ResumeQueue(const std::string& queue, v1::QueueInfo* info) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ResumeQueueRequest req;
  req.set_queue(queue);
  return admin_->ResumeQueue(&ctx, req, info);
}

grpc::Status BrokerClient::PurgeQueue(const v1::PurgeQueueRequest& req,
                                      v1::PurgeQueueResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return admin_->PurgeQueue(&ctx, req, resp);
}

std::string BrokerClient::MustEnqueue(const std::string& queue, const std::string& payload) {
  v1::EnqueueRequest req;
  req.set_queue(queue);
  req.set_payload(payload);
  return MustEnqueue(req);
}

std::string BrokerClient::MustEnqueue(const v1::EnqueueRequest& req) {
  v1::EnqueueResponse resp;
  grpc::Status s = Enqueue(req, &resp);
  EXPECT_THAT(s, IsOk()) << "Enqueue on " << req.queue();
  if (s.ok()) {
    EXPECT_FALSE(resp.job_id().empty()) << "Enqueue returned no job_id";
  }
  return resp.job_id();
}

std::vector<v1::LeasedJob> BrokerClient::MustLease(const std::string& queue,
                                                   const std::string& worker_id, int max_jobs,
                                                   absl::Duration wait,
                                                   absl::Duration lease_duration) {
  v1::LeaseRequest req;
  req.set_queue(queue);
  req.set_worker_id(worker_id);
  req.set_max_jobs(max_jobs);
  if (wait > absl::ZeroDuration()) *req.mutable_wait() = ToProto(wait);
  if (lease_duration > absl::ZeroDuration())
    *req.mutable_lease_duration() = ToProto(lease_duration);
  v1::LeaseResponse resp;
  grpc::Status s = Lease(req, &resp);
  EXPECT_THAT(s, IsOk()) << "Lease on " << queue;
  return {resp.jobs().begin(), resp.jobs().end()};
}

std::optional<v1::LeasedJob> BrokerClient::LeaseOne(const std::string& queue,
                                                    const std::string& worker_id,
                                                    absl::Duration wait,
                                                    absl::Duration lease_duration) {
  std::vector<v1::LeasedJob> jobs = MustLease(queue, worker_id, 1, wait, lease_duration);
  EXPECT_LE(jobs.size(), 1u) << "Lease with max_jobs 1 returned more than one job";
  if (jobs.empty()) return std::nullopt;
  return jobs.front();
}

void BrokerClient::MustAck(const v1::LeasedJob& job, const std::string& result) {
  v1::AckRequest req;
  req.set_job_id(job.job_id());
  req.set_lease_id(job.lease_id());
  req.set_result(result);
  EXPECT_THAT(Ack(req), IsOk()) << "Ack of " << job.job_id();
}

v1::Job BrokerClient::MustGetJob(const std::string& job_id) {
  v1::Job job;
  EXPECT_THAT(GetJob(job_id, &job), IsOk()) << "GetJob " << job_id;
  return job;
}

std::map<std::string, int64_t> BrokerClient::Counts(const std::string& queue) {
  v1::QueueInfo info;
  grpc::Status s = GetQueue(queue, &info);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) return {};
  EXPECT_THAT(s, IsOk()) << "GetQueue " << queue;
  std::map<std::string, int64_t> counts;
  // Zero counts may or may not be listed; drop them so maps compare by meaning.
  for (const auto& [state, n] : info.counts()) {
    if (n != 0) counts[state] = n;
  }
  return counts;
}

std::vector<v1::Job> BrokerClient::ListAll(const std::string& queue, v1::JobState state,
                                           int page_size) {
  std::vector<v1::Job> jobs;
  v1::ListJobsRequest req;
  req.set_queue(queue);
  req.set_state(state);
  req.set_page_size(page_size);
  // Bounded so that a server that always returns a token cannot loop the test forever.
  for (int page = 0; page < 100000; ++page) {
    v1::ListJobsResponse resp;
    grpc::Status s = ListJobs(req, &resp);
    EXPECT_THAT(s, IsOk()) << "ListJobs " << queue << " page " << page;
    if (!s.ok()) break;
    jobs.insert(jobs.end(), resp.jobs().begin(), resp.jobs().end());
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  return jobs;
}

bool PollUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return done();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace jobbroker::testing

namespace jobbroker::v1 {
namespace {

void PrintShort(const google::protobuf::Message& m, std::ostream* os) {
  constexpr size_t kMaxChars = 2000;
  std::string text = m.ShortDebugString();
  if (text.size() > kMaxChars) {
    text.resize(kMaxChars);
    text += "...";
  }
  *os << "{" << text << "}";
}

}  // namespace

void PrintTo(const Job& job, std::ostream* os) { PrintShort(job, os); }
void PrintTo(const LeasedJob& job, std::ostream* os) { PrintShort(job, os); }
void PrintTo(const AttemptRecord& record, std::ostream* os) { PrintShort(record, os); }
void PrintTo(const EnqueueResponse& resp, std::ostream* os) { PrintShort(resp, os); }
void PrintTo(const QueueInfo& info, std::ostream* os) { PrintShort(info, os); }

}  // namespace jobbroker::v1
