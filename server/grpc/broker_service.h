#pragma once

#include <atomic>

#include "jobbroker/v1/broker.grpc.pb.h"
#include "node/partitions.h"
#include "server/grpc/forwarder.h"
#include "server/grpc/rpc_auth.h"
#include "server/grpc/rpc_metrics.h"
#include "server/grpc/work_stream_limit.h"
#include "server/routing/router.h"

namespace jobbroker::server {

// The Broker gRPC service: convert, call core, map the status, finish. Handlers never block:
// each reply is finished from the broker's callback once the change is durable, and a long-poll
// Lease holds no thread while it waits. Every call passes `auth` first (roles producer and
// worker). In cluster mode a call for a partition another node leads goes there (`router`
// decides, `forwarder` sends). Everything is borrowed and must outlive the service.
class BrokerService final : public v1::Broker::CallbackService {
 public:
  // `streams` bounds the open Work streams. Unary calls are timed in `metrics`. `forwarder` may
  // be null on a single node (the router sends nothing elsewhere).
  BrokerService(node::Partitions& broker, const RpcAuth& auth, WorkStreamLimit& streams,
                const RpcMetrics& metrics, Router& router, Forwarder* forwarder)
      : broker_(broker),
        auth_(auth),
        streams_(streams),
        router_(router),
        forwarder_(forwarder),
        timers_(metrics.For(*v1::EnqueueRequest::descriptor()->file(), "Broker",
                            /*per_message=*/{"EnqueueStream"})) {}

  grpc::ServerUnaryReactor* Enqueue(grpc::CallbackServerContext* ctx, const v1::EnqueueRequest* req,
                                    v1::EnqueueResponse* resp) override;
  grpc::ServerUnaryReactor* EnqueueBatch(grpc::CallbackServerContext* ctx,
                                         const v1::EnqueueBatchRequest* req,
                                         v1::EnqueueBatchResponse* resp) override;
  // EnqueueBatch calls as messages of one stream: see server/grpc/producer_stream.h.
  grpc::ServerBidiReactor<v1::EnqueueStreamRequest, v1::EnqueueStreamResponse>* EnqueueStream(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Lease(grpc::CallbackServerContext* ctx, const v1::LeaseRequest* req,
                                  v1::LeaseResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* Ack(grpc::CallbackServerContext* ctx, const v1::AckRequest* req,
                                v1::AckResponse* resp) override;
  grpc::ServerUnaryReactor* Fail(grpc::CallbackServerContext* ctx, const v1::FailRequest* req,
                                 v1::FailResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  // The streaming worker protocol: see server/grpc/work_stream.h.
  grpc::ServerBidiReactor<v1::WorkRequest, v1::WorkResponse>* Work(
      grpc::CallbackServerContext* ctx) override;

  // EnqueueStreams open now (jobbroker_enqueue_streams_open): one per producer and node that
  // sends batches; a count that only grows is a client that opens streams and never ends them.
  int enqueue_streams_open() const { return enqueue_streams_.load(std::memory_order_relaxed); }

 private:
  // Null when this node's broker answers a call for `partition`; else the reactor that answers
  // it from the partition's leader (`start` sends it there) or refuses it (no leader now).
  template <typename Start>
  grpc::ServerUnaryReactor* Elsewhere(grpc::CallbackServerContext* ctx, uint32_t partition,
                                      RpcTiming timing, Start start);

  node::Partitions& broker_;
  const RpcAuth& auth_;
  WorkStreamLimit& streams_;
  Router& router_;
  Forwarder* const forwarder_;
  const RpcServiceTimers timers_;
  std::atomic<int> enqueue_streams_{0};
};

}  // namespace jobbroker::server
