#include "server/grpc/broker_service.h"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/convert/convert.h"
#include "server/grpc/enqueue_batch.h"
#include "server/grpc/grpc_status.h"
#include "server/grpc/producer_stream.h"
#include "server/grpc/work_stream.h"
#include "server/grpc/worker_origin.h"
#include "server/routing/router.h"

namespace jobbroker::server {
namespace {

// A long-poll Lease. The broker may answer from any thread, even before Lease() returns, so the
// waiter handle lives in shared state that outlives the reactor rather than in the reactor.
class LeaseReactor final : public grpc::ServerUnaryReactor {
 public:
  LeaseReactor(node::Partitions& broker, v1::LeaseResponse* resp, RpcTiming timing)
      : broker_(broker),
        resp_(resp),
        timing_(timing),
        waiter_(std::make_shared<std::atomic<uint64_t>>(0)) {}

  void Start(core::LeaseSpec spec, absl::Duration wait) {
    auto waiter = waiter_;
    uint64_t id = broker_.Lease(std::move(spec), wait,
                                [this](absl::StatusOr<std::vector<core::LeasedJob>> jobs) {
                                  if (jobs.ok()) {
                                    for (const core::LeasedJob& j : *jobs)
                                      ToProto(j, resp_->add_jobs());
                                  }
                                  grpc::Status status = ToGrpcStatus(jobs.status());
                                  timing_.Record(status);
                                  Finish(status);  // may delete this
                                });
    waiter->store(id);
  }

  // The client went away: stop waiting, so no job is leased to nobody.
  void OnCancel() override { broker_.CancelWait(waiter_->load()); }
  void OnDone() override { delete this; }

 private:
  node::Partitions& broker_;
  v1::LeaseResponse* resp_;
  const RpcTiming timing_;
  std::shared_ptr<std::atomic<uint64_t>> waiter_;
};

// A stream refused before it starts (no token, or not the role): finished at once.
template <typename Request, typename Response>
class RefusedStream final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit RefusedStream(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};
using RefusedWork = RefusedStream<v1::WorkRequest, v1::WorkResponse>;

}  // namespace

template <typename Start>
grpc::ServerUnaryReactor* BrokerService::Elsewhere(grpc::CallbackServerContext* ctx,
                                                   uint32_t partition, RpcTiming timing,
                                                   Start start) {
  return AnswerElsewhere<v1::Broker::Stub>(router_, forwarder_, ctx, partition, timing,
                                           std::move(start));
}

grpc::ServerUnaryReactor* BrokerService::Enqueue(grpc::CallbackServerContext* ctx,
                                                 const v1::EnqueueRequest* req,
                                                 v1::EnqueueResponse* resp) {
  const RpcTiming timing = timers_.Start("Enqueue");
  if (absl::Status s = auth_.Check(*ctx, Role::kProducer, req->queue()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  absl::StatusOr<core::EnqueueSpec> spec = FromProto(*req);
  if (!spec.ok()) return UnaryCall(ctx, timing).Finish(spec.status());
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                  [req, resp](v1::Broker::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->Enqueue(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  std::vector<core::EnqueueSpec> one;
  one.push_back(std::move(*spec));
  broker_.EnqueueBatch(std::move(one),
                       [call, resp](absl::StatusOr<std::vector<core::EnqueueResult>> r) {
                         if (r.ok()) ToProto(r->front(), resp);
                         call.Finish(r.status());
                       });
  return call.reactor();
}

grpc::ServerUnaryReactor* BrokerService::EnqueueBatch(grpc::CallbackServerContext* ctx,
                                                      const v1::EnqueueBatchRequest* req,
                                                      v1::EnqueueBatchResponse* resp) {
  const RpcTiming timing = timers_.Start("EnqueueBatch");
  absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx);
  if (!caller.ok()) return UnaryCall(ctx, timing).Finish(caller.status());
  if (*caller != nullptr) {
    if (absl::Status s = Authorizer::AllowRole(**caller, Role::kProducer); !s.ok())
      return UnaryCall(ctx, timing).Finish(s);
  }
  absl::StatusOr<std::vector<core::EnqueueSpec>> specs = BatchSpecs(auth_, *caller, *req);
  if (!specs.ok()) return UnaryCall(ctx, timing).Finish(specs.status());
  if (std::optional<uint32_t> partition = OnePartition(router_, *specs)) {
    if (auto* forwarded = Elsewhere(ctx, *partition, timing,
                                    [req, resp](v1::Broker::Stub& stub, grpc::ClientContext* c,
                                                std::function<void(grpc::Status)> done) {
                                      stub.async()->EnqueueBatch(c, req, resp, std::move(done));
                                    }))
      return forwarded;
  }
  UnaryCall call(ctx, timing);
  broker_.EnqueueBatch(
      std::move(*specs),
      [call, resp](absl::StatusOr<std::vector<core::EnqueueResult>> r) {
        if (r.ok()) {
          for (const core::EnqueueResult& e : *r) ToProto(e, resp->add_results());
        }
        call.Finish(r.status());
      },
      /*batch=*/true);
  return call.reactor();
}

grpc::ServerBidiReactor<v1::EnqueueStreamRequest, v1::EnqueueStreamResponse>*
BrokerService::EnqueueStream(grpc::CallbackServerContext* ctx) {
  using Refused = RefusedStream<v1::EnqueueStreamRequest, v1::EnqueueStreamResponse>;
  // The metadata comes once per stream: the token is checked here, each job's queue later.
  absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx);
  if (!caller.ok()) return new Refused(caller.status());
  if (*caller != nullptr) {
    if (absl::Status s = Authorizer::AllowRole(**caller, Role::kProducer); !s.ok())
      return new Refused(s);
  }
  return ProducerStream::Start(broker_, auth_, *caller, router_, forwarder_, timers_,
                               enqueue_streams_, ctx);
}

grpc::ServerUnaryReactor* BrokerService::Lease(grpc::CallbackServerContext* ctx,
                                               const v1::LeaseRequest* req,
                                               v1::LeaseResponse* resp) {
  const RpcTiming timing = timers_.Start("Lease");
  if (absl::Status s = auth_.Check(*ctx, Role::kWorker, req->queue()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  absl::StatusOr<core::LeaseSpec> spec = FromProto(*req);
  if (!spec.ok()) return UnaryCall(ctx, timing).Finish(spec.status());
  absl::Duration wait = absl::ZeroDuration();
  if (req->has_wait()) {
    absl::StatusOr<absl::Duration> w = FromProto(req->wait(), "wait");
    if (!w.ok()) return UnaryCall(ctx, timing).Finish(w.status());
    wait = *w;
  }
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfQueue(req->queue()), timing,
                                  [req, resp](v1::Broker::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->Lease(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  spec->origin = OriginOf(*ctx, router_.node_id());
  auto* reactor = new LeaseReactor(broker_, resp, timing);
  reactor->Start(std::move(*spec), wait);
  return reactor;
}

grpc::ServerUnaryReactor* BrokerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                   const v1::HeartbeatRequest* req,
                                                   v1::HeartbeatResponse* resp) {
  const RpcTiming timing = timers_.Start("Heartbeat");
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kWorker, req->job_id()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  absl::StatusOr<core::HeartbeatSpec> spec = FromProto(*req);
  if (!spec.ok()) return UnaryCall(ctx, timing).Finish(spec.status());
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfJob(req->job_id()), timing,
                                  [req, resp](v1::Broker::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->Heartbeat(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  broker_.Heartbeat(std::move(*spec), [call, resp](absl::StatusOr<core::HeartbeatResult> r) {
    if (r.ok()) ToProto(*r, resp);
    call.Finish(r.status());
  });
  return call.reactor();
}

grpc::ServerUnaryReactor* BrokerService::Ack(grpc::CallbackServerContext* ctx,
                                             const v1::AckRequest* req, v1::AckResponse* resp) {
  const RpcTiming timing = timers_.Start("Ack");
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kWorker, req->job_id()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfJob(req->job_id()), timing,
                                  [req, resp](v1::Broker::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->Ack(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  broker_.Ack(FromProto(*req), [call](absl::Status s) { call.Finish(s); });
  return call.reactor();
}

grpc::ServerUnaryReactor* BrokerService::Fail(grpc::CallbackServerContext* ctx,
                                              const v1::FailRequest* req, v1::FailResponse* resp) {
  const RpcTiming timing = timers_.Start("Fail");
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kWorker, req->job_id()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  absl::StatusOr<core::FailSpec> spec = FromProto(*req);
  if (!spec.ok()) return UnaryCall(ctx, timing).Finish(spec.status());
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfJob(req->job_id()), timing,
                                  [req, resp](v1::Broker::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->Fail(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  UnaryCall call(ctx, timing);
  broker_.Fail(std::move(*spec), [call, resp](absl::StatusOr<core::FailResult> r) {
    if (r.ok()) ToProto(*r, resp);
    call.Finish(r.status());
  });
  return call.reactor();
}

grpc::ServerUnaryReactor* BrokerService::Release(grpc::CallbackServerContext* ctx,
                                                 const v1::ReleaseRequest* req,
                                                 v1::ReleaseResponse* resp) {
  const RpcTiming timing = timers_.Start("Release");
  if (absl::Status s = auth_.CheckJob(*ctx, Role::kWorker, req->job_id()); !s.ok())
    return UnaryCall(ctx, timing).Finish(s);
  if (auto* forwarded = Elsewhere(ctx, router_.PartitionOfJob(req->job_id()), timing,
                                  [req, resp](v1::Broker::Stub& stub, grpc::ClientContext* c,
                                              std::function<void(grpc::Status)> done) {
                                    stub.async()->Release(c, req, resp, std::move(done));
                                  }))
    return forwarded;
  absl::StatusOr<core::ReleaseSpec> spec = FromProto(*req);
  if (!spec.ok()) return UnaryCall(ctx, timing).Finish(spec.status());
  UnaryCall call(ctx, timing);
  broker_.Release(std::move(*spec), [call](absl::Status s) { call.Finish(s); });
  return call.reactor();
}

grpc::ServerBidiReactor<v1::WorkRequest, v1::WorkResponse>* BrokerService::Work(
    grpc::CallbackServerContext* ctx) {
  // The metadata comes once per stream: the token is checked here, each queue and job later.
  absl::StatusOr<const TokenEntry*> caller = auth_.Caller(*ctx);
  if (!caller.ok()) return new RefusedWork(caller.status());
  if (*caller != nullptr) {
    if (absl::Status s = Authorizer::AllowRole(**caller, Role::kWorker); !s.ok())
      return new RefusedWork(s);
  }
  if (!streams_.TryAcquire())
    return new RefusedWork(absl::ResourceExhaustedError(
        absl::StrCat("Work streams: all ", streams_.max(),
                     " are open (--max-work-streams); retry later or on another broker")));
  return WorkStream::Start(broker_, auth_, *caller, &streams_, router_, forwarder_, ctx);
}

}  // namespace jobbroker::server
