#pragma once

#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "jobbroker/v1/broker.pb.h"
#include "node/partitions.h"
#include "server/grpc/forwarder.h"
#include "server/grpc/outbox.h"
#include "server/grpc/rpc_auth.h"
#include "server/grpc/rpc_metrics.h"
#include "server/routing/router.h"

namespace jobbroker::server {

// One Broker.EnqueueStream: EnqueueBatch calls as messages of one stream.
//
// Why it exists: a producer that coalesces its callers' enqueues sends a batch per round, and in
// some gRPC libraries a unary call costs the client far more than a message on an open stream
// (grpc-js: about 250 µs of its main thread against about 40, docs/performance.md), so a round
// could not be split into batches that overlap with the broker's write. Here each batch costs a
// message.
//
// Each request is handled as EnqueueBatch handles its own (the caller's token, every job
// validated, all or nothing, one write) and answered, once durable, by a response carrying its
// request_id; answers go out in the order they are ready. A refused batch is answered with its
// code and does not end the stream. Several batches may be in flight: the stream keeps reading
// while earlier ones wait for their write, up to kMaxPending unanswered, then waits.
//
// Cluster mode: a batch for a partition another node leads is sent there as a unary
// EnqueueBatch (the Forwarder) and its answer relayed; a batch over several partitions is
// refused by the local brokers as EnqueueBatch refuses it.
//
// Ending: after the client half-closes, the answers still owed are sent, then the stream
// finishes OK. Owns itself (self_) until OnDone; a broker callback holds a reference, so an
// answer after the client went away is dropped safely. Thread-safe; gRPC calls are never made
// under mu_.
class ProducerStream final
    : public grpc::ServerBidiReactor<v1::EnqueueStreamRequest, v1::EnqueueStreamResponse> {
 public:
  // Unanswered batches one stream may hold; its reads wait beyond this (back-pressure).
  static constexpr int kMaxPending = 64;
  // How long a batch sent on to its partition's leader may take. The stream's own deadline, if
  // any, spans the producer's session, so a batch has none of its own: without this, a leader
  // that stopped answering (frozen, or cut off without a reset) would hold the batch, and one of
  // the stream's places, until it came back. Past the replication's commit timeout (10 s).
  static constexpr absl::Duration kForwardDeadline = absl::Seconds(15);

  // A new stream, already reading. `caller` is the stream's authenticated token (nullptr: auth
  // off). Each batch is timed in `timers` as a call of EnqueueStream. `open` counts the streams
  // open: one more from here until OnDone. Everything borrowed must outlive the stream;
  // `forwarder` is null on a single node.
  static ProducerStream* Start(node::Partitions& broker, const RpcAuth& auth,
                               const TokenEntry* caller, Router& router, Forwarder* forwarder,
                               const RpcServiceTimers& timers, std::atomic<int>& open,
                               grpc::CallbackServerContext* ctx);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  ProducerStream(node::Partitions& broker, const RpcAuth& auth, const TokenEntry* caller,
                 Router& router, Forwarder* forwarder, const RpcServiceTimers& timers,
                 std::atomic<int>& open, grpc::CallbackServerContext* ctx)
      : broker_(broker),
        auth_(auth),
        caller_(caller),
        router_(router),
        forwarder_(forwarder),
        timers_(timers),
        open_(open),
        ctx_(ctx) {}

  // Handles one batch, read at `timing`; its answer comes through Answer.
  void Handle(v1::EnqueueStreamRequest request, RpcTiming timing);
  // Sends the batch to the leader of `partition` when that is another node; false when this
  // node's broker takes it.
  bool Forwarded(uint32_t partition, uint64_t request_id,
                 std::shared_ptr<v1::EnqueueBatchRequest> batch, RpcTiming timing);
  // Records the batch's time, queues `response` for the client and ends the batch it answers;
  // from any thread.
  void Answer(v1::EnqueueStreamResponse response, RpcTiming timing);
  // Starts the next write or read, or finishes, as the state allows. Call without mu_.
  void Pump();

  node::Partitions& broker_;
  const RpcAuth& auth_;
  const TokenEntry* const caller_;
  Router& router_;
  Forwarder* const forwarder_;
  const RpcServiceTimers& timers_;
  std::atomic<int>& open_;
  grpc::CallbackServerContext* const ctx_;
  std::shared_ptr<ProducerStream> self_;  // released in OnDone
  v1::EnqueueStreamRequest request_;      // the read in progress

  absl::Mutex mu_;
  Outbox<v1::EnqueueStreamResponse> outbox_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;           // batches read and not yet answered
  bool reading_ ABSL_GUARDED_BY(mu_) = false;      // a read is started
  bool read_closed_ ABSL_GUARDED_BY(mu_) = false;  // the client sends no more
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;    // the client is gone
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace jobbroker::server
