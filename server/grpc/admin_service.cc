#include "server/grpc/admin_service.h"

#include <string>
#include <utility>
#include <vector>

#include "server/convert/convert.h"
#include "server/grpc/grpc_status.h"

namespace jobbroker::server {
grpc::ServerUnaryReactor* AdminService::GetJob(grpc::CallbackServerContext* ctx,
                                               const v1::GetJobRequest* req, v1::Job* resp) {
  UnaryCall call(ctx, timers_.Start("GetJob"));
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return call.Finish(s);
  absl::StatusOr<core::Job> job = broker_.GetJob(req->job_id());
  if (job.ok()) ToProto(*job, resp);
  return call.Finish(job.status());
}

grpc::ServerUnaryReactor* AdminService::ListJobs(grpc::CallbackServerContext* ctx,
                                                 const v1::ListJobsRequest* req,
                                                 v1::ListJobsResponse* resp) {
  UnaryCall call(ctx, timers_.Start("ListJobs"));
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return call.Finish(s);
  absl::StatusOr<core::ListJobsSpec> spec = FromProto(*req);
  if (!spec.ok()) return call.Finish(spec.status());
  absl::StatusOr<core::ListJobsResult> page = broker_.ListJobs(*spec);
  if (page.ok()) ToProto(*page, resp);
  return call.Finish(page.status());
}

grpc::ServerUnaryReactor* AdminService::CancelJob(grpc::CallbackServerContext* ctx,
                                                  const v1::CancelJobRequest* req, v1::Job* resp) {
  UnaryCall call(ctx, timers_.Start("CancelJob"));
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return call.Finish(s);
  broker_.CancelJob(req->job_id(), [call, resp](absl::StatusOr<core::Job> job) {
    if (job.ok()) ToProto(*job, resp);
    call.Finish(job.status());
  });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminService::RetryJob(grpc::CallbackServerContext* ctx,
                                                 const v1::RetryJobRequest* req,
                                                 v1::RetryJobResponse* resp) {
  UnaryCall call(ctx, timers_.Start("RetryJob"));
  const bool one = !req->job_id().empty();
  const bool bulk = !req->queue().empty();
  absl::Status allowed = auth_.Check(*ctx, Role::kAdmin);
  if (allowed.ok() && bulk) allowed = auth_.Check(*ctx, Role::kAdmin, req->queue());
  if (allowed.ok() && one) allowed = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id());
  if (!allowed.ok()) return call.Finish(allowed);
  if (absl::Status form = CheckRetryJobForm(*req); !form.ok()) return call.Finish(form);
  if (one) {
    broker_.RetryJob(req->job_id(), [call, resp](absl::StatusOr<core::Job> job) {
      if (job.ok()) {
        ToProto(*job, resp->mutable_job());
        resp->set_matched(1);
        resp->set_retried(1);
      }
      call.Finish(job.status());
    });
    return call.reactor();
  }
  absl::StatusOr<core::RetryJobsSpec> spec = FromProto(*req);
  if (!spec.ok()) return call.Finish(spec.status());
  broker_.RetryJobs(std::move(*spec), [call, resp](absl::StatusOr<core::RetryJobsResult> result) {
    if (result.ok()) ToProto(*result, resp);
    call.Finish(result.status());
  });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                  const v1::DeleteJobRequest* req,
                                                  v1::DeleteJobResponse*) {
  UnaryCall call(ctx, timers_.Start("DeleteJob"));
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return call.Finish(s);
  broker_.DeleteJob(req->job_id(), [call](absl::Status s) { call.Finish(s); });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminService::ListQueues(grpc::CallbackServerContext* ctx,
                                                   const v1::ListQueuesRequest*,
                                                   v1::ListQueuesResponse* resp) {
  UnaryCall call(ctx, timers_.Start("ListQueues"));
  absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx);
  if (!caller.ok()) return call.Finish(caller.status());
  if (*caller != nullptr) {
    if (absl::Status s = Authorizer::AllowRole(**caller, Role::kAdmin); !s.ok())
      return call.Finish(s);
  }
  for (const core::QueueInfo& q : broker_.ListQueues()) {
    // A token scoped to some queues sees those only; the others' names are not its business.
    if (*caller == nullptr || Authorizer::MatchesQueue(**caller, q.name))
      ToProto(q, resp->add_queues());
  }
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::GetQueue(grpc::CallbackServerContext* ctx,
                                                 const v1::GetQueueRequest* req,
                                                 v1::QueueInfo* resp) {
  UnaryCall call(ctx, timers_.Start("GetQueue"));
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return call.Finish(s);
  absl::StatusOr<core::QueueInfo> info = broker_.GetQueue(req->queue());
  if (info.ok()) ToProto(*info, resp);
  return call.Finish(info.status());
}

grpc::ServerUnaryReactor* AdminService::UpdateQueuePolicy(grpc::CallbackServerContext* ctx,
                                                          const v1::UpdateQueuePolicyRequest* req,
                                                          v1::QueueInfo* resp) {
  UnaryCall call(ctx, timers_.Start("UpdateQueuePolicy"));
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return call.Finish(s);
  absl::StatusOr<core::PolicyOverride> policy = FromProto(req->policy(), "policy");
  if (!policy.ok()) return call.Finish(policy.status());
  broker_.UpdateQueuePolicy(req->queue(), std::move(*policy), req->reset(),
                            [call, resp](absl::StatusOr<core::QueueInfo> info) {
                              if (info.ok()) ToProto(*info, resp);
                              call.Finish(info.status());
                            });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminService::PauseQueue(grpc::CallbackServerContext* ctx,
                                                   const v1::PauseQueueRequest* req,
                                                   v1::QueueInfo* resp) {
  return SetPaused(UnaryCall(ctx, timers_.Start("PauseQueue")), *ctx, req->queue(), /*paused=*/true,
                   resp);
}

grpc::ServerUnaryReactor* AdminService::ResumeQueue(grpc::CallbackServerContext* ctx,
                                                    const v1::ResumeQueueRequest* req,
                                                    v1::QueueInfo* resp) {
  return SetPaused(UnaryCall(ctx, timers_.Start("ResumeQueue")), *ctx, req->queue(),
                   /*paused=*/false, resp);
}

grpc::ServerUnaryReactor* AdminService::SetPaused(UnaryCall call,
                                                  const grpc::CallbackServerContext& ctx,
                                                  const std::string& queue, bool paused,
                                                  v1::QueueInfo* resp) {
  if (absl::Status s = auth_.Check(ctx, Role::kAdmin, queue); !s.ok()) return call.Finish(s);
  broker_.SetQueuePaused(queue, paused, [call, resp](absl::StatusOr<core::QueueInfo> info) {
    if (info.ok()) ToProto(*info, resp);
    call.Finish(info.status());
  });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminService::PurgeQueue(grpc::CallbackServerContext* ctx,
                                                   const v1::PurgeQueueRequest* req,
                                                   v1::PurgeQueueResponse* resp) {
  UnaryCall call(ctx, timers_.Start("PurgeQueue"));
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return call.Finish(s);
  absl::StatusOr<std::vector<core::JobState>> states = FromProto(*req);
  if (!states.ok()) return call.Finish(states.status());
  broker_.PurgeQueue(req->queue(), std::move(*states),
                     [call, resp](absl::StatusOr<int64_t> purged) {
                       if (purged.ok()) resp->set_purged(*purged);
                       call.Finish(purged.status());
                     });
  return call.reactor();
}

}  // namespace jobbroker::server
