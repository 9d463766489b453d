#include "server/admin_service.h"

#include <string>
#include <utility>
#include <vector>

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
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return Answer(ctx, s);
  absl::StatusOr<Job> job = broker_.GetJob(req->job_id());
  if (job.ok()) ToProto(*job, resp);
  return Answer(ctx, job.status());
}

grpc::ServerUnaryReactor* AdminService::ListJobs(grpc::CallbackServerContext* ctx,
                                                 const v1::ListJobsRequest* req,
                                                 v1::ListJobsResponse* resp) {
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return Answer(ctx, s);
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
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return Answer(ctx, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  broker_.CancelJob(req->job_id(), [reactor, resp](absl::StatusOr<Job> job) {
    if (job.ok()) ToProto(*job, resp);
    reactor->Finish(ToGrpcStatus(job.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::RetryJob(grpc::CallbackServerContext* ctx,
                                                 const v1::RetryJobRequest* req,
                                                 v1::RetryJobResponse* resp) {
  const bool one = !req->job_id().empty();
  const bool bulk = !req->queue().empty();
  absl::Status allowed = auth_.Check(*ctx, Role::kAdmin);
  if (allowed.ok() && bulk) allowed = auth_.Check(*ctx, Role::kAdmin, req->queue());
  if (allowed.ok() && one) allowed = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id());
  if (!allowed.ok()) return Answer(ctx, allowed);
  if (one && bulk)
    return Answer(ctx, absl::InvalidArgumentError(
                           "job_id and queue are exclusive: set job_id to retry one job, or queue "
                           "to retry the queue's failed (or cancelled) jobs"));
  if (!one && !bulk)
    return Answer(ctx, absl::InvalidArgumentError(
                           "job_id or queue is required: job_id retries one job, queue the "
                           "queue's failed (or cancelled) jobs"));
  if (one) {
    // Refused rather than ignored: a caller who set them meant a bulk retry.
    if (req->state() != v1::JOB_STATE_UNSPECIFIED || req->dry_run() || req->limit() != 0)
      return Answer(ctx, absl::InvalidArgumentError(
                             "state, dry_run and limit apply only with queue, not with job_id"));
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    broker_.RetryJob(req->job_id(), [reactor, resp](absl::StatusOr<Job> job) {
      if (job.ok()) {
        ToProto(*job, resp->mutable_job());
        resp->set_matched(1);
        resp->set_retried(1);
      }
      reactor->Finish(ToGrpcStatus(job.status()));
    });
    return reactor;
  }
  absl::StatusOr<RetryJobsSpec> spec = FromProto(*req);
  if (!spec.ok()) return Answer(ctx, spec.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  broker_.RetryJobs(std::move(*spec), [reactor, resp](absl::StatusOr<RetryJobsResult> result) {
    if (result.ok()) {
      resp->set_matched(result->matched);
      resp->set_retried(result->retried);
    }
    reactor->Finish(ToGrpcStatus(result.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                  const v1::DeleteJobRequest* req,
                                                  v1::DeleteJobResponse*) {
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return Answer(ctx, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  broker_.DeleteJob(req->job_id(), [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListQueues(grpc::CallbackServerContext* ctx,
                                                   const v1::ListQueuesRequest*,
                                                   v1::ListQueuesResponse* resp) {
  absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx);
  if (!caller.ok()) return Answer(ctx, caller.status());
  if (*caller != nullptr) {
    if (absl::Status s = Authorizer::AllowRole(**caller, Role::kAdmin); !s.ok())
      return Answer(ctx, s);
  }
  for (const QueueInfo& q : broker_.ListQueues()) {
    // A token scoped to some queues sees those only; the others' names are not its business.
    if (*caller == nullptr || Authorizer::MatchesQueue(**caller, q.name))
      ToProto(q, resp->add_queues());
  }
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::GetQueue(grpc::CallbackServerContext* ctx,
                                                 const v1::GetQueueRequest* req,
                                                 v1::QueueInfo* resp) {
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return Answer(ctx, s);
  absl::StatusOr<QueueInfo> info = broker_.GetQueue(req->queue());
  if (info.ok()) ToProto(*info, resp);
  return Answer(ctx, info.status());
}

grpc::ServerUnaryReactor* AdminService::UpdateQueuePolicy(grpc::CallbackServerContext* ctx,
                                                          const v1::UpdateQueuePolicyRequest* req,
                                                          v1::QueueInfo* resp) {
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return Answer(ctx, s);
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

grpc::ServerUnaryReactor* AdminService::PauseQueue(grpc::CallbackServerContext* ctx,
                                                   const v1::PauseQueueRequest* req,
                                                   v1::QueueInfo* resp) {
  return SetPaused(ctx, req->queue(), /*paused=*/true, resp);
}

grpc::ServerUnaryReactor* AdminService::ResumeQueue(grpc::CallbackServerContext* ctx,
                                                    const v1::ResumeQueueRequest* req,
                                                    v1::QueueInfo* resp) {
  return SetPaused(ctx, req->queue(), /*paused=*/false, resp);
}

grpc::ServerUnaryReactor* AdminService::SetPaused(grpc::CallbackServerContext* ctx,
                                                  const std::string& queue, bool paused,
                                                  v1::QueueInfo* resp) {
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, queue); !s.ok()) return Answer(ctx, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  broker_.SetQueuePaused(queue, paused, [reactor, resp](absl::StatusOr<QueueInfo> info) {
    if (info.ok()) ToProto(*info, resp);
    reactor->Finish(ToGrpcStatus(info.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::PurgeQueue(grpc::CallbackServerContext* ctx,
                                                   const v1::PurgeQueueRequest* req,
                                                   v1::PurgeQueueResponse* resp) {
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return Answer(ctx, s);
  absl::StatusOr<std::vector<JobState>> states = FromProto(*req);
  if (!states.ok()) return Answer(ctx, states.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  broker_.PurgeQueue(req->queue(), std::move(*states),
                     [reactor, resp](absl::StatusOr<int64_t> purged) {
                       if (purged.ok()) resp->set_purged(*purged);
                       reactor->Finish(ToGrpcStatus(purged.status()));
                     });
  return reactor;
}

}  // namespace jobbroker
