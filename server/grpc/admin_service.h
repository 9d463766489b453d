#pragma once

#include <string>
#include <vector>

#include "jobbroker/v1/admin.grpc.pb.h"
#include "node/partitions.h"
#include "server/grpc/forwarder.h"
#include "server/grpc/rpc_auth.h"
#include "server/grpc/rpc_metrics.h"
#include "server/routing/router.h"

namespace jobbroker::server {

// The Admin gRPC service. Reads answer at once; changes answer once durable (bulk ones, a
// RetryJob with `queue` and PurgeQueue, once their last batch is). Every call passes `auth` first
// (role admin, on the queue it names or its job's queue; ListQueues shows only the queues the
// caller's token matches). In cluster mode a call goes to the node that leads its partition
// (`router` decides, `forwarder` sends), and ListQueues asks every leader. Everything is borrowed
// and must outlive the service.
class AdminService final : public v1::Admin::CallbackService {
 public:
  // Unary calls are timed in `metrics`. `forwarder` may be null on a single node.
  AdminService(node::Partitions& broker, const RpcAuth& auth, const RpcMetrics& metrics,
               Router& router, Forwarder* forwarder)
      : broker_(broker),
        auth_(auth),
        router_(router),
        forwarder_(forwarder),
        timers_(metrics.For(*v1::GetJobRequest::descriptor()->file(), "Admin")) {}

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerWriteReactor<v1::Job>* WatchJob(grpc::CallbackServerContext* ctx,
                                              const v1::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* RetryJob(grpc::CallbackServerContext* ctx,
                                     const v1::RetryJobRequest* req,
                                     v1::RetryJobResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;
  grpc::ServerUnaryReactor* ListQueues(grpc::CallbackServerContext* ctx,
                                       const v1::ListQueuesRequest* req,
                                       v1::ListQueuesResponse* resp) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;
  grpc::ServerUnaryReactor* GetQueue(grpc::CallbackServerContext* ctx,
                                     const v1::GetQueueRequest* req, v1::QueueInfo* resp) override;
  grpc::ServerUnaryReactor* UpdateQueuePolicy(grpc::CallbackServerContext* ctx,
                                              const v1::UpdateQueuePolicyRequest* req,
                                              v1::QueueInfo* resp) override;
  grpc::ServerUnaryReactor* PauseQueue(grpc::CallbackServerContext* ctx,
                                       const v1::PauseQueueRequest* req,
                                       v1::QueueInfo* resp) override;
  grpc::ServerUnaryReactor* ResumeQueue(grpc::CallbackServerContext* ctx,
                                        const v1::ResumeQueueRequest* req,
                                        v1::QueueInfo* resp) override;
  grpc::ServerUnaryReactor* PurgeQueue(grpc::CallbackServerContext* ctx,
                                       const v1::PurgeQueueRequest* req,
                                       v1::PurgeQueueResponse* resp) override;

  // Recurring schedules (admin_schedules.cc).
  grpc::ServerUnaryReactor* PutSchedule(grpc::CallbackServerContext* ctx,
                                        const v1::PutScheduleRequest* req,
                                        v1::Schedule* resp) override;
  grpc::ServerUnaryReactor* GetSchedule(grpc::CallbackServerContext* ctx,
                                        const v1::GetScheduleRequest* req,
                                        v1::Schedule* resp) override;
  grpc::ServerUnaryReactor* ListSchedules(grpc::CallbackServerContext* ctx,
                                          const v1::ListSchedulesRequest* req,
                                          v1::ListSchedulesResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteSchedule(grpc::CallbackServerContext* ctx,
                                           const v1::DeleteScheduleRequest* req,
                                           v1::DeleteScheduleResponse* resp) override;
  grpc::ServerUnaryReactor* TriggerSchedule(grpc::CallbackServerContext* ctx,
                                            const v1::TriggerScheduleRequest* req,
                                            v1::TriggerScheduleResponse* resp) override;

  grpc::ServerUnaryReactor* GetCluster(grpc::CallbackServerContext* ctx,
                                       const v1::GetClusterRequest* req,
                                       v1::ClusterInfo* resp) override;

 private:
  // As BrokerService::Elsewhere.
  template <typename Start>
  grpc::ServerUnaryReactor* Elsewhere(grpc::CallbackServerContext* ctx, uint32_t partition,
                                      RpcTiming timing, Start start);
  // The refusal when the caller may not administer `queue`; null when it may.
  grpc::ServerUnaryReactor* CheckQueue(grpc::CallbackServerContext* ctx, RpcTiming timing,
                                       const std::string& queue);
  // Finishes a read with `status` once `fence` passes, so a client is never shown a change that
  // a crash or a failover takes back; with the fence's refusal if it does not pass.
  static grpc::ServerUnaryReactor* FinishRead(UnaryCall call, const core::ReadFence& fence,
                                              absl::Status status);
  // PauseQueue and ResumeQueue, once checked and routed here.
  grpc::ServerUnaryReactor* SetPaused(UnaryCall call, const std::string& queue, bool paused,
                                      v1::QueueInfo* resp);
  // Which partitions this node answers for now (by number).
  std::vector<bool> ServedHere() const;
  // The nodes that lead the partitions not `here` (each once), to ask for their part of a
  // listing; UNAVAILABLE if one has no leader or changed leader meanwhile.
  absl::StatusOr<std::vector<std::string>> OtherLeaders(const std::vector<bool>& here) const;
  // A schedule by id in this node's partitions (`here`), if the caller may administer its
  // queue; kNotFound if none of them has it. `fence` gets what the lookup saw (ReadFence).
  absl::StatusOr<core::ScheduleInfo> FindScheduleHere(grpc::CallbackServerContext* ctx,
                                                      const std::string& id,
                                                      const std::vector<bool>& here,
                                                      core::ReadFence* fence);
  // A call by schedule id that `here` could not answer (`not_found`, once `fence` passes): in
  // cluster mode, asked of every other leader (`start(stub, ctx, response, done)` sends it);
  // else `not_found`.
  template <typename Response, typename Start>
  grpc::ServerUnaryReactor* AskOtherLeaders(grpc::CallbackServerContext* ctx, RpcTiming timing,
                                            const std::vector<bool>& here,
                                            const absl::Status& not_found,
                                            const core::ReadFence& fence, Response* resp,
                                            Start start);
  // The calls by schedule id (Get, Delete, Trigger): the role, the id, then `act(call, found,
  // here, fence)` where this node has the schedule (a read answers once `fence` passes), else
  // `send(stub, ctx, req, response, done)` to every other leader (AskOtherLeaders).
  template <typename Request, typename Response, typename Act, typename Send>
  grpc::ServerUnaryReactor* ScheduleById(grpc::CallbackServerContext* ctx, absl::string_view method,
                                         const Request* req, Response* resp, Act act, Send send);
  // The schedule with its partition.
  void ToProtoPlaced(const core::ScheduleInfo& info, v1::Schedule* out) const;
  // Sets the queue's partition and the node that leads it.
  void AddPlacement(v1::QueueInfo* info) const;
  void AddPlacement(v1::QueueInfo* info, const ClusterView& view) const;

  node::Partitions& broker_;
  const RpcAuth& auth_;
  Router& router_;
  Forwarder* const forwarder_;
  const RpcServiceTimers timers_;
};

template <typename Start>
grpc::ServerUnaryReactor* AdminService::Elsewhere(grpc::CallbackServerContext* ctx,
                                                  uint32_t partition, RpcTiming timing,
                                                  Start start) {
  return AnswerElsewhere<v1::Admin::Stub>(router_, forwarder_, ctx, partition, timing,
                                          std::move(start));
}

}  // namespace jobbroker::server
