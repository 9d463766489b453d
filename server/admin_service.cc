#include "server/admin_service.h"

#include <utility>

#include "server/convert.h"
#include "server/grpc_status.h"

namespace jobbroker {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* AdminService::GetJob(grpc::CallbackServerContext* ctx,
                                               const v1::GetJobRequest* req, v1::Job* resp) {
  absl::StatusOr<Job> job = broker_.GetJob(req->job_id());
  if (job.ok()) ToProto(*job, resp);
  return Answer(ctx, job.status());
}

grpc::ServerUnaryReactor* AdminService::ListJobs(grpc::CallbackServerContext* ctx,
                                                 const v1::ListJobsRequest* req,
                                                 v1::ListJobsResponse* resp) {
  absl::StatusOr<ListJobsSpec> spec = FromProto(*req);
  if (!spec.ok()) return Answer(ctx, spec.status());
  absl::StatusOr<ListJobsResult> page = broker_.ListJobs(*spec);
  if (page.ok()) {
    for (const Job& j : page->jobs) ToProto(j, resp->add_jobs());
    resp->set_next_page_token(page->next_page_token);
  }
  return Answer(ctx, page.status());
}

grpc::ServerUnaryReactor* AdminService::CancelJob(grpc::CallbackServerContext* ctx,
                                                  const v1::CancelJobRequest* req, v1::Job* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  broker_.CancelJob(req->job_id(), [reactor, resp](absl::StatusOr<Job> job) {
    if (job.ok()) ToProto(*job, resp);
    reactor->Finish(ToGrpcStatus(job.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListQueues(grpc::CallbackServerContext* ctx,
                                                   const v1::ListQueuesRequest*,
                                                   v1::ListQueuesResponse* resp) {
  for (const QueueInfo& q : broker_.ListQueues()) ToProto(q, resp->add_queues());
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::GetQueue(grpc::CallbackServerContext* ctx,
                                                 const v1::GetQueueRequest* req,
                                                 v1::QueueInfo* resp) {
  absl::StatusOr<QueueInfo> info = broker_.GetQueue(req->queue());
  if (info.ok()) ToProto(*info, resp);
  return Answer(ctx, info.status());
}

grpc::ServerUnaryReactor* AdminService::UpdateQueuePolicy(grpc::CallbackServerContext* ctx,
                                                          const v1::UpdateQueuePolicyRequest* req,
                                                          v1::QueueInfo* resp) {
  absl::StatusOr<PolicyOverride> policy = FromProto(req->policy(), "policy");
  if (!policy.ok()) return Answer(ctx, policy.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  broker_.UpdateQueuePolicy(req->queue(), std::move(*policy), req->reset(),
                            [reactor, resp](absl::StatusOr<QueueInfo> info) {
                              if (info.ok()) ToProto(*info, resp);
                              reactor->Finish(ToGrpcStatus(info.status()));
                            });
  return reactor;
}

}  // namespace jobbroker
