#include "server/grpc/admin_service.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/validation.h"
#include "server/convert/convert.h"
#include "server/grpc/fan_out.h"
#include "server/grpc/grpc_status.h"
#include "server/grpc/job_watch.h"
#include "server/routing/router.h"

namespace jobbroker::server {

void AdminService::AddPlacement(v1::QueueInfo* info) const { AddPlacement(info, *router_.view()); }

void AdminService::AddPlacement(v1::QueueInfo* info, const ClusterView& view) const {
  const uint32_t partition = router_.PartitionOfQueue(info->name());
  info->set_partition(partition);
  if (partition < view.partitions.size())
    info->set_leader_node_id(view.partitions[partition].leader);
}

grpc::ServerUnaryReactor* AdminService::GetCluster(grpc::CallbackServerContext* ctx,
                                                   const v1::GetClusterRequest*,
                                                   v1::ClusterInfo* resp) {
  UnaryCall call(ctx, timers_.Start("GetCluster"));
  // Any valid token: a worker or producer needs the leaders as much as an operator does.
  if (absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx); !caller.ok())
    return call.Finish(caller.status());
  std::shared_ptr<const ClusterView> view = router_.view();
  resp->set_cluster_name(view->cluster_name);
  resp->set_node_id(view->node_id);
  resp->set_partition_count(static_cast<uint32_t>(view->partitions.size()));
  resp->set_replication_factor(view->replication_factor);
  resp->set_min_in_sync(view->min_in_sync);
  for (const ClusterView::Node& node : view->nodes) {
    v1::NodeInfo* out = resp->add_nodes();
    out->set_node_id(node.node_id);
    out->set_address(node.address);
    out->set_alive(node.alive);
  }
  for (uint32_t p = 0; p < view->partitions.size(); ++p) {
    const ClusterView::Partition& partition = view->partitions[p];
    v1::PartitionInfo* out = resp->add_partitions();
    out->set_partition(p);
    out->set_leader_node_id(partition.leader);
    out->set_leader_address(partition.leader_address);
    out->set_epoch(partition.epoch);
    for (const std::string& node : partition.replicas) out->add_replicas(node);
    for (const std::string& node : partition.in_sync) out->add_in_sync(node);
  }
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::GetJob(grpc::CallbackServerContext* ctx,
                                               const v1::GetJobRequest* req, v1::Job* resp) {
  const RpcTiming timing = timers_.Start("GetJob");
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfJob(req->job_id()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->GetJob(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  core::ReadFence fence;
  absl::StatusOr<core::Job> job = broker_.GetJob(req->job_id(), &fence);
  if (job.ok()) ToProto(*job, resp);
  return FinishRead(UnaryCall(ctx, timing), fence, job.status());
}

grpc::ServerUnaryReactor* AdminService::FinishRead(UnaryCall call, const core::ReadFence& fence,
                                                   absl::Status status) {
  fence.Await([call, status = std::move(status)](absl::Status passed) {
    call.Finish(passed.ok() ? status : passed);
  });
  return call.reactor();
}

grpc::ServerWriteReactor<v1::Job>* AdminService::WatchJob(grpc::CallbackServerContext* ctx,
                                                          const v1::WatchJobRequest* req) {
  return JobWatchCall::Start(ctx, *req, broker_, auth_, router_, forwarder_);
}

grpc::ServerUnaryReactor* AdminService::ListJobs(grpc::CallbackServerContext* ctx,
                                                 const v1::ListJobsRequest* req,
                                                 v1::ListJobsResponse* resp) {
  const RpcTiming timing = timers_.Start("ListJobs");
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  absl::StatusOr<core::ListJobsSpec> spec = FromProto(*req);
  if (!spec.ok()) return UnaryCall(ctx, timing).Finish(spec.status());
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->ListJobs(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  core::ReadFence fence;
  absl::StatusOr<core::ListJobsResult> page = broker_.ListJobs(*spec, &fence);
  if (page.ok()) ToProto(*page, resp);
  return FinishRead(UnaryCall(ctx, timing), fence, page.status());
}

grpc::ServerUnaryReactor* AdminService::CancelJob(grpc::CallbackServerContext* ctx,
                                                  const v1::CancelJobRequest* req, v1::Job* resp) {
  const RpcTiming timing = timers_.Start("CancelJob");
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfJob(req->job_id()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->CancelJob(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  broker_.CancelJob(req->job_id(), [call, resp](absl::StatusOr<core::Job> job) {
    if (job.ok()) ToProto(*job, resp);
    call.Finish(job.status());
  });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminService::RetryJob(grpc::CallbackServerContext* ctx,
                                                 const v1::RetryJobRequest* req,
                                                 v1::RetryJobResponse* resp) {
  const RpcTiming timing = timers_.Start("RetryJob");
  const bool one = !req->job_id().empty();
  const bool bulk = !req->queue().empty();
  absl::Status allowed = auth_.Check(*ctx, Role::kAdmin);
  if (allowed.ok() && bulk) allowed = auth_.Check(*ctx, Role::kAdmin, req->queue());
  if (allowed.ok() && one) allowed = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id());
  if (!allowed.ok()) return UnaryCall(ctx, timing).Finish(allowed);
  if (absl::Status form = CheckRetryJobForm(*req); !form.ok())
    return UnaryCall(ctx, timing).Finish(form);
  if (auto* forwarded = Elsewhere(
          ctx, one ? router_.PartitionOfJob(req->job_id()) : router_.PartitionOfQueue(req->queue()),
          timing,
          [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                      std::function<void(grpc::Status)> done) {
            stub.async()->RetryJob(c, req, resp, std::move(done));
          }))
    return forwarded;
  UnaryCall call(ctx, timing);
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
                                                  v1::DeleteJobResponse* resp) {
  const RpcTiming timing = timers_.Start("DeleteJob");
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kAdmin, req->job_id()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfJob(req->job_id()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->DeleteJob(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  broker_.DeleteJob(req->job_id(), [call](absl::Status s) { call.Finish(s); });
  return call.reactor();
}

absl::StatusOr<std::vector<std::string>> AdminService::OtherLeaders(
    const std::vector<bool>& here) const {
  // A partition without a leader fails the call rather than leave its part out unsaid.
  std::vector<std::string> leaders;
  for (uint32_t p = 0; p < here.size(); ++p) {
    if (here[p]) continue;  // answered here
    const Route route = router_.RouteOf(p, /*forwarded=*/false);
    if (route.kind == Route::Kind::kLocal)  // this node began to serve it just now
      return absl::UnavailableError(
          absl::StrCat("partition ", p, " changed leader while listed; retry"));
    if (route.kind == Route::Kind::kUnavailable) return route.why;
    if (std::find(leaders.begin(), leaders.end(), route.address) == leaders.end())
      leaders.push_back(route.address);
  }
  return leaders;
}

std::vector<bool> AdminService::ServedHere() const {
  std::vector<bool> here(router_.partitions());
  for (uint32_t p = 0; p < here.size(); ++p) here[p] = router_.ServedHere(p);
  return here;
}

grpc::ServerUnaryReactor* AdminService::ListQueues(grpc::CallbackServerContext* ctx,
                                                   const v1::ListQueuesRequest* req,
                                                   v1::ListQueuesResponse* resp) {
  const RpcTiming timing = timers_.Start("ListQueues");
  absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx);
  if (!caller.ok()) return UnaryCall(ctx, timing).Finish(caller.status());
  if (*caller != nullptr) {
    if (absl::Status s = Authorizer::AllowRole(**caller, Role::kAdmin); !s.ok())
      return UnaryCall(ctx, timing).Finish(s);
  }
  std::shared_ptr<const ClusterView> view = router_.view();
  // Which partitions this node answers for, read once: the others are asked below.
  const std::vector<bool> here = ServedHere();
  core::ReadFence fence;
  for (const core::QueueInfo& q : broker_.ListQueues(&here, &fence)) {
    // A token scoped to some queues sees those only; the others' names are not its business.
    if (*caller != nullptr && !Authorizer::MatchesQueue(**caller, q.name)) continue;
    const uint32_t partition = router_.PartitionOfQueue(q.name);
    // A broker that stopped leading its partition still remembers its queues as they were.
    if (partition >= here.size() || !here[partition]) continue;
    v1::QueueInfo* info = resp->add_queues();
    ToProto(q, info);
    AddPlacement(info, *view);
  }
  if (!router_.cluster_mode() || Router::IsForwarded(*ctx))
    return FinishRead(UnaryCall(ctx, timing), fence, absl::OkStatus());
  // Cluster mode: and the queues of every other partition, from the nodes that lead them.
  absl::StatusOr<std::vector<std::string>> leaders = OtherLeaders(here);
  if (!leaders.ok()) return UnaryCall(ctx, timing).Finish(leaders.status());
  if (leaders->empty()) return FinishRead(UnaryCall(ctx, timing), fence, absl::OkStatus());
  auto* fan_out = new FanOut<v1::ListQueuesResponse>(
      resp, timing, leaders->size() + 1,
      [resp](v1::ListQueuesResponse& part) {
        for (v1::QueueInfo& q : *part.mutable_queues()) resp->add_queues()->Swap(&q);
      },
      [resp] {
        auto* queues = resp->mutable_queues();
        std::sort(
            queues->begin(), queues->end(),
            [](const v1::QueueInfo& a, const v1::QueueInfo& b) { return a.name() < b.name(); });
      });
  for (const std::string& address : *leaders) {
    auto& part = fan_out->part(address);
    part.ctx = forwarder_->ContextFor(*ctx);
    forwarder_->AdminAt(address).async()->ListQueues(
        part.ctx.get(), req, &part.response,
        [fan_out, &part](grpc::Status status) { fan_out->Done(part, status); });
  }
  fence.Await([fan_out](absl::Status passed) { fan_out->LocalPassed(ToGrpcStatus(passed)); });
  return fan_out;
}

grpc::ServerUnaryReactor* AdminService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                    const v1::ListWorkersRequest* req,
                                                    v1::ListWorkersResponse* resp) {
  const RpcTiming timing = timers_.Start("ListWorkers");
  absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx);
  if (!caller.ok()) return UnaryCall(ctx, timing).Finish(caller.status());
  if (!req->queue().empty()) {
    if (absl::Status s = core::ValidateQueueName(req->queue()); !s.ok())
      return UnaryCall(ctx, timing).Finish(s);
  }
  if (*caller != nullptr) {
    absl::Status s = req->queue().empty() ? Authorizer::AllowRole(**caller, Role::kAdmin)
                                          : auth_.Check(*ctx, Role::kAdmin, req->queue());
    if (!s.ok()) return UnaryCall(ctx, timing).Finish(s);
  }
  const std::vector<bool> here = ServedHere();
  std::vector<core::WorkerInfo> workers = broker_.ListWorkers(req->queue(), here);
  // A token scoped to some queues sees their workers and jobs only.
  const TokenEntry* scoped = *caller;
  auto visible = [scoped](std::vector<core::WorkerInfo>& some) {
    if (scoped == nullptr) return;
    for (core::WorkerInfo& w : some) {
      std::erase_if(w.queues,
                    [&](const std::string& q) { return !Authorizer::MatchesQueue(*scoped, q); });
      std::erase_if(w.running, [&](const core::RunningJob& r) {
        return !Authorizer::MatchesQueue(*scoped, r.queue);
      });
    }
    std::erase_if(some,
                  [](const core::WorkerInfo& w) { return w.queues.empty() && w.running.empty(); });
  };
  auto answer = [resp](const std::vector<core::WorkerInfo>& all) {
    resp->clear_workers();
    for (const core::WorkerInfo& w : all) ToProto(w, resp->add_workers());
  };
  visible(workers);
  if (!router_.cluster_mode() || Router::IsForwarded(*ctx)) {
    answer(workers);
    return UnaryCall(ctx, timing).Finish(absl::OkStatus());
  }
  // Cluster mode: a worker may hold streams to several leaders; each is asked, and what they
  // say of one worker_id is merged into one entry.
  absl::StatusOr<std::vector<std::string>> leaders = OtherLeaders(here);
  if (!leaders.ok()) return UnaryCall(ctx, timing).Finish(leaders.status());
  if (leaders->empty()) {
    answer(workers);
    return UnaryCall(ctx, timing).Finish(absl::OkStatus());
  }
  auto merged = std::make_shared<std::vector<core::WorkerInfo>>(std::move(workers));
  auto* fan_out = new FanOut<v1::ListWorkersResponse>(
      resp, timing, leaders->size(),
      [merged](v1::ListWorkersResponse& part) {
        std::vector<core::WorkerInfo> theirs;
        for (const v1::WorkerInfo& w : part.workers()) theirs.push_back(FromProto(w));
        core::MergeWorkers(*merged, std::move(theirs));
      },
      [merged, answer] { answer(*merged); });
  for (const std::string& address : *leaders) {
    auto& part = fan_out->part(address);
    part.ctx = forwarder_->ContextFor(*ctx);
    forwarder_->AdminAt(address).async()->ListWorkers(
        part.ctx.get(), req, &part.response,
        [fan_out, &part](grpc::Status status) { fan_out->Done(part, status); });
  }
  return fan_out;
}

grpc::ServerUnaryReactor* AdminService::GetQueue(grpc::CallbackServerContext* ctx,
                                                 const v1::GetQueueRequest* req,
                                                 v1::QueueInfo* resp) {
  const RpcTiming timing = timers_.Start("GetQueue");
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->GetQueue(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  core::ReadFence fence;
  absl::StatusOr<core::QueueInfo> info = broker_.GetQueue(req->queue(), &fence);
  if (info.ok()) {
    ToProto(*info, resp);
    AddPlacement(resp);
  }
  return FinishRead(UnaryCall(ctx, timing), fence, info.status());
}

grpc::ServerUnaryReactor* AdminService::UpdateQueuePolicy(grpc::CallbackServerContext* ctx,
                                                          const v1::UpdateQueuePolicyRequest* req,
                                                          v1::QueueInfo* resp) {
  const RpcTiming timing = timers_.Start("UpdateQueuePolicy");
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  absl::StatusOr<core::PolicyOverride> policy = FromProto(req->policy(), "policy");
  if (!policy.ok()) return UnaryCall(ctx, timing).Finish(policy.status());
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->UpdateQueuePolicy(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  broker_.UpdateQueuePolicy(req->queue(), std::move(*policy), req->reset(),
                            [this, call, resp](absl::StatusOr<core::QueueInfo> info) {
                              if (info.ok()) {
                                ToProto(*info, resp);
                                AddPlacement(resp);
                              }
                              call.Finish(info.status());
                            });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminService::PauseQueue(grpc::CallbackServerContext* ctx,
                                                   const v1::PauseQueueRequest* req,
                                                   v1::QueueInfo* resp) {
  const RpcTiming timing = timers_.Start("PauseQueue");
  if (auto* refused = CheckQueue(ctx, timing, req->queue())) return refused;
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->PauseQueue(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  return SetPaused(UnaryCall(ctx, timing), req->queue(), /*paused=*/true, resp);
}

grpc::ServerUnaryReactor* AdminService::ResumeQueue(grpc::CallbackServerContext* ctx,
                                                    const v1::ResumeQueueRequest* req,
                                                    v1::QueueInfo* resp) {
  const RpcTiming timing = timers_.Start("ResumeQueue");
  if (auto* refused = CheckQueue(ctx, timing, req->queue())) return refused;
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->ResumeQueue(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  return SetPaused(UnaryCall(ctx, timing), req->queue(), /*paused=*/false, resp);
}

grpc::ServerUnaryReactor* AdminService::CheckQueue(grpc::CallbackServerContext* ctx,
                                                   RpcTiming timing, const std::string& queue) {
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, queue); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  return nullptr;
}

grpc::ServerUnaryReactor* AdminService::SetPaused(UnaryCall call, const std::string& queue,
                                                  bool paused, v1::QueueInfo* resp) {
  broker_.SetQueuePaused(queue, paused, [this, call, resp](absl::StatusOr<core::QueueInfo> info) {
    if (info.ok()) {
      ToProto(*info, resp);
      AddPlacement(resp);
    }
    call.Finish(info.status());
  });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminService::PurgeQueue(grpc::CallbackServerContext* ctx,
                                                   const v1::PurgeQueueRequest* req,
                                                   v1::PurgeQueueResponse* resp) {
  const RpcTiming timing = timers_.Start("PurgeQueue");
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, req->queue()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  absl::StatusOr<std::vector<core::JobState>> states = FromProto(*req);
  if (!states.ok()) return UnaryCall(ctx, timing).Finish(states.status());
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->PurgeQueue(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  broker_.PurgeQueue(req->queue(), std::move(*states),
                     [call, resp](absl::StatusOr<int64_t> purged) {
                       if (purged.ok()) resp->set_purged(*purged);
                       call.Finish(purged.status());
                     });
  return call.reactor();
}

}  // namespace jobbroker::server
