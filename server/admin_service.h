#pragma once

#include "core/broker.h"
#include "jobbroker/v1/admin.grpc.pb.h"

namespace jobbroker {

// The Admin gRPC service. Reads answer at once; changes answer once durable. RPCs not listed
// here (RetryJob, DeleteJob, PauseQueue, ResumeQueue, PurgeQueue) answer UNIMPLEMENTED for now.
// `broker` is borrowed and must outlive the service.
class AdminService final : public v1::Admin::CallbackService {
 public:
  explicit AdminService(Broker& broker) : broker_(broker) {}

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListQueues(grpc::CallbackServerContext* ctx,
                                       const v1::ListQueuesRequest* req,
                                       v1::ListQueuesResponse* resp) override;
  grpc::ServerUnaryReactor* GetQueue(grpc::CallbackServerContext* ctx,
                                     const v1::GetQueueRequest* req, v1::QueueInfo* resp) override;
  grpc::ServerUnaryReactor* UpdateQueuePolicy(grpc::CallbackServerContext* ctx,
                                              const v1::UpdateQueuePolicyRequest* req,
                                              v1::QueueInfo* resp) override;

 private:
  Broker& broker_;
};

}  // namespace jobbroker
