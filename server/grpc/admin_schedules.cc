// AdminService: recurring schedules. A schedule lives in the partition of its template's queue,
// so PutSchedule is routed like any call naming a queue. The calls by id look in this node's
// partitions first and, in cluster mode, then ask the other leaders (FindOne); ListSchedules
// gathers every leader's (FanOut). Role admin, on the schedule's queue.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/validation.h"
#include "server/convert/convert.h"
#include "server/grpc/admin_service.h"
#include "server/grpc/fan_out.h"
#include "server/grpc/grpc_status.h"

namespace jobbroker::server {

void AdminService::ToProtoPlaced(const core::ScheduleInfo& info, v1::Schedule* out) const {
  ToProto(info, out);
  out->set_partition(router_.PartitionOfQueue(info.schedule.job.queue));
}

template <typename Response, typename Start>
grpc::ServerUnaryReactor* AdminService::AskOtherLeaders(
    grpc::CallbackServerContext* ctx, RpcTiming timing, const std::vector<bool>& here,
    const absl::Status& not_found, const core::ReadFence& fence, Response* resp, Start start) {
  if (!router_.cluster_mode() || Router::IsForwarded(*ctx))
    return FinishRead(UnaryCall(ctx, timing), fence, not_found);
  absl::StatusOr<std::vector<std::string>> leaders = OtherLeaders(here);
  if (!leaders.ok()) return UnaryCall(ctx, timing).Finish(leaders.status());
  if (leaders->empty()) return FinishRead(UnaryCall(ctx, timing), fence, not_found);
  auto* find = new FindOne<Response>(resp, timing, leaders->size() + 1, ToGrpcStatus(not_found));
  for (const std::string& address : *leaders) {
    auto& part = find->part(address);
    part.ctx = forwarder_->ContextFor(*ctx);
    start(forwarder_->AdminAt(address), part.ctx.get(), &part.response,
          [find, &part](grpc::Status status) { find->Done(part, status); });
  }
  fence.Await([find](absl::Status passed) { find->LocalPassed(ToGrpcStatus(passed)); });
  return find;
}

absl::StatusOr<core::ScheduleInfo> AdminService::FindScheduleHere(grpc::CallbackServerContext* ctx,
                                                                  const std::string& id,
                                                                  const std::vector<bool>& here,
                                                                  core::ReadFence* fence) {
  absl::StatusOr<core::ScheduleInfo> found = broker_.GetSchedule(id, here, fence);
  if (!found.ok()) return found.status();
  // Checked on the schedule's queue only once it is found: before that, only the role.
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin, found->schedule.job.queue); !s.ok())
    return s;
  return found;
}

grpc::ServerUnaryReactor* AdminService::PutSchedule(grpc::CallbackServerContext* ctx,
                                                    const v1::PutScheduleRequest* req,
                                                    v1::Schedule* resp) {
  const RpcTiming timing = timers_.Start("PutSchedule");
  absl::StatusOr<core::Schedule> schedule = FromProto(req->schedule());
  if (schedule.ok()) {
    absl::Status s = core::ValidateSchedule(*schedule);
    if (!s.ok()) schedule = s;
  }
  if (!schedule.ok()) {
    // Who may be told what is wrong with it: any admin (the queue may be the bad part).
    if (absl::Status s = auth_.Check(*ctx, Role::kAdmin); !s.ok())
      return UnaryCall(ctx, timing).Finish(s);
    return UnaryCall(ctx, timing).Finish(schedule.status());
  }
  const std::string& queue = schedule->job.queue;
  if (auto* refused = CheckQueue(ctx, timing, queue)) return refused;
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(queue), timing,
                                  [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->PutSchedule(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  broker_.PutSchedule(*std::move(schedule), ServedHere(),
                      [this, call, resp](absl::StatusOr<core::ScheduleInfo> info) {
                        if (info.ok()) ToProtoPlaced(*info, resp);
                        call.Finish(info.status());
                      });
  return call.reactor();
}

template <typename Request, typename Response, typename Act, typename Send>
grpc::ServerUnaryReactor* AdminService::ScheduleById(grpc::CallbackServerContext* ctx,
                                                     absl::string_view method, const Request* req,
                                                     Response* resp, Act act, Send send) {
  const RpcTiming timing = timers_.Start(method);
  if (absl::Status s = auth_.Check(*ctx, Role::kAdmin); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  if (absl::Status s = core::ValidateScheduleId(req->schedule_id()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  const std::vector<bool> here = ServedHere();
  core::ReadFence fence;
  absl::StatusOr<core::ScheduleInfo> found =
      FindScheduleHere(ctx, req->schedule_id(), here, &fence);
  if (found.ok()) {
    UnaryCall call(ctx, timing);
    act(call, *found, here, fence);
    return call.reactor();
  }
  if (!absl::IsNotFound(found.status())) return UnaryCall(ctx, timing).Finish(found.status());
  return AskOtherLeaders<Response>(
      ctx, timing, here, found.status(), fence, resp,
      [req, send](v1::Admin::Stub& stub, grpc::ClientContext* c, Response* r,
                  std::function<void(grpc::Status)> done) {
        send(stub, c, req, r, std::move(done));
      });
}

grpc::ServerUnaryReactor* AdminService::GetSchedule(grpc::CallbackServerContext* ctx,
                                                    const v1::GetScheduleRequest* req,
                                                    v1::Schedule* resp) {
  return ScheduleById(
      ctx, "GetSchedule", req, resp,
      [this, resp](UnaryCall call, const core::ScheduleInfo& found, const std::vector<bool>&,
                   const core::ReadFence& fence) {
        ToProtoPlaced(found, resp);
        FinishRead(call, fence, absl::OkStatus());
      },
      [](v1::Admin::Stub& stub, grpc::ClientContext* c, const v1::GetScheduleRequest* r,
         v1::Schedule* out, std::function<void(grpc::Status)> done) {
        stub.async()->GetSchedule(c, r, out, std::move(done));
      });
}

grpc::ServerUnaryReactor* AdminService::DeleteSchedule(grpc::CallbackServerContext* ctx,
                                                       const v1::DeleteScheduleRequest* req,
                                                       v1::DeleteScheduleResponse* resp) {
  return ScheduleById(
      ctx, "DeleteSchedule", req, resp,
      // A write: its answer waits for its own change, so for every change the lookup saw too.
      [this, req](UnaryCall call, const core::ScheduleInfo&, const std::vector<bool>& here,
                  const core::ReadFence&) {
        broker_.DeleteSchedule(req->schedule_id(), here,
                               [call](absl::Status deleted) { call.Finish(deleted); });
      },
      [](v1::Admin::Stub& stub, grpc::ClientContext* c, const v1::DeleteScheduleRequest* r,
         v1::DeleteScheduleResponse* out, std::function<void(grpc::Status)> done) {
        stub.async()->DeleteSchedule(c, r, out, std::move(done));
      });
}

grpc::ServerUnaryReactor* AdminService::TriggerSchedule(grpc::CallbackServerContext* ctx,
                                                        const v1::TriggerScheduleRequest* req,
                                                        v1::TriggerScheduleResponse* resp) {
  return ScheduleById(
      ctx, "TriggerSchedule", req, resp,
      [this, req, resp](UnaryCall call, const core::ScheduleInfo&, const std::vector<bool>& here,
                        const core::ReadFence&) {
        broker_.TriggerSchedule(req->schedule_id(), here,
                                [call, resp](absl::StatusOr<core::EnqueueResult> run) {
                                  if (run.ok()) {
                                    resp->set_job_id(run->job_id);
                                    resp->set_deduplicated(run->deduplicated);
                                  }
                                  call.Finish(run.status());
                                });
      },
      [](v1::Admin::Stub& stub, grpc::ClientContext* c, const v1::TriggerScheduleRequest* r,
         v1::TriggerScheduleResponse* out, std::function<void(grpc::Status)> done) {
        stub.async()->TriggerSchedule(c, r, out, std::move(done));
      });
}

grpc::ServerUnaryReactor* AdminService::ListSchedules(grpc::CallbackServerContext* ctx,
                                                      const v1::ListSchedulesRequest* req,
                                                      v1::ListSchedulesResponse* resp) {
  const RpcTiming timing = timers_.Start("ListSchedules");
  absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx);
  if (!caller.ok()) return UnaryCall(ctx, timing).Finish(caller.status());
  if (!req->queue().empty()) {
    // One queue: one partition, answered by its leader.
    if (absl::Status s = core::ValidateQueueName(req->queue()); !s.ok())
      return UnaryCall(ctx, timing).Finish(s);
    if (auto* refused = CheckQueue(ctx, timing, req->queue())) return refused;
    if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                    [req, resp](v1::Admin::Stub& stub, grpc::ClientContext* c,
                                                std::function<void(grpc::Status)> done) {
                                      stub.async()->ListSchedules(c, req, resp, std::move(done));
                                    }))
      return forwarded;
  } else if (*caller != nullptr) {
    if (absl::Status s = Authorizer::AllowRole(**caller, Role::kAdmin); !s.ok())
      return UnaryCall(ctx, timing).Finish(s);
  }
  const std::vector<bool> here = ServedHere();
  core::ReadFence fence;
  for (const core::ScheduleInfo& info : broker_.ListSchedules(req->queue(), here, &fence)) {
    // A token scoped to some queues sees their schedules only.
    if (*caller != nullptr && !Authorizer::MatchesQueue(**caller, info.schedule.job.queue))
      continue;
    ToProtoPlaced(info, resp->add_schedules());
  }
  if (!req->queue().empty() || !router_.cluster_mode() || Router::IsForwarded(*ctx))
    return FinishRead(UnaryCall(ctx, timing), fence, absl::OkStatus());
  absl::StatusOr<std::vector<std::string>> leaders = OtherLeaders(here);
  if (!leaders.ok()) return UnaryCall(ctx, timing).Finish(leaders.status());
  if (leaders->empty()) return FinishRead(UnaryCall(ctx, timing), fence, absl::OkStatus());
  auto* fan_out = new FanOut<v1::ListSchedulesResponse>(
      resp, timing, leaders->size() + 1,
      [resp](v1::ListSchedulesResponse& part) {
        for (v1::Schedule& s : *part.mutable_schedules()) resp->add_schedules()->Swap(&s);
      },
      [resp] {
        auto* all = resp->mutable_schedules();
        std::sort(all->begin(), all->end(), [](const v1::Schedule& a, const v1::Schedule& b) {
          return a.schedule_id() < b.schedule_id();
        });
      });
  for (const std::string& address : *leaders) {
    auto& part = fan_out->part(address);
    part.ctx = forwarder_->ContextFor(*ctx);
    forwarder_->AdminAt(address).async()->ListSchedules(
        part.ctx.get(), req, &part.response,
        [fan_out, &part](grpc::Status status) { fan_out->Done(part, status); });
  }
  fence.Await([fan_out](absl::Status passed) { fan_out->LocalPassed(ToGrpcStatus(passed)); });
  return fan_out;
}

}  // namespace jobbroker::server
