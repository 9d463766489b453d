#pragma once

#include <grpcpp/support/server_callback.h>

#include <cstdint>
#include <deque>
#include <memory>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "jobbroker/v1/broker.pb.h"
#include "node/partitions.h"
#include "server/grpc/rpc_auth.h"
#include "server/grpc/work_stream_limit.h"

namespace jobbroker::server {

// One Broker.Work stream (DESIGN.md "the streaming worker protocol").
//
// Reads one request at a time and answers each with a WorkResult carrying its request_id;
// the broker pushes jobs, lost leases and cancel notices through a StreamSink. Writes go out one
// at a time from an outbox. Back-pressure: pushed jobs are bounded by max_in_flight, and when
// the outbox holds kMaxOutbox messages (a client that sends but does not read) the stream stops
// reading until it drains, so memory stays bounded.
//
// Ending: when the client half-closes or goes away the subscription ends at once (its leases
// stay, DESIGN.md), answers still owed are sent, then the stream finishes. When the broker
// shuts down the stream finishes with UNAVAILABLE so workers reconnect elsewhere.
//
// Owns itself (self_) until OnDone; the broker's sink holds only a weak reference, so a push
// racing the stream's end is dropped safely. Thread-safe: gRPC reactions, broker callbacks and
// pushes may come from different threads; gRPC calls (StartWrite, StartRead, Finish) are never
// made under a lock.
class WorkStream final : public grpc::ServerBidiReactor<v1::WorkRequest, v1::WorkResponse> {
 public:
  static constexpr size_t kMaxOutbox = 4096;
  // A stream that subscribed with batch_pushes gets the jobs waiting together in the outbox as
  // one JobBatch message, up to these bounds (headers are not counted: they are small).
  static constexpr int kMaxJobsPerBatch = 256;
  static constexpr size_t kMaxBatchBytes = 1 << 20;

  // A new stream, already reading; gRPC gets the raw pointer. `caller` is the stream's
  // authenticated token (nullptr: auth off); every subscribed queue and every job the stream
  // heartbeats, acks, fails or releases is checked against it. `auth` must outlive the stream.
  // `limit` holds the slot the caller took for it; the stream gives it back when it ends.
  static WorkStream* Start(node::Partitions& broker, const RpcAuth& auth, const TokenEntry* caller,
                           WorkStreamLimit* limit);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Sink;
  friend class Sink;

  WorkStream(node::Partitions& broker, const RpcAuth& auth, const TokenEntry* caller,
             WorkStreamLimit* limit)
      : broker_(broker), auth_(auth), caller_(caller), limit_(limit) {}

  // Queues `message` for the client; safe from any thread.
  void Send(v1::WorkResponse message);
  // Queues `messages` together (so pushed jobs can go out as one JobBatch).
  void SendAll(std::vector<v1::WorkResponse> messages);
  // The broker ended the stream (shutdown).
  void End(absl::Status status);
  void Handle(const v1::WorkRequest& request);
  // PERMISSION_DENIED if the caller may not touch a queue or job `request` names.
  absl::Status Authorize(const v1::WorkRequest& request) const;
  void Subscribe(uint64_t request_id, const v1::SubscribeRequest& subscribe);
  void Answer(uint64_t request_id, const absl::Status& status);
  // Begins an operation (BeginOp) and returns the callback for the broker's answer to it: the
  // callback answers request `request_id` with that result, then ends the operation.
  template <typename Result>
  core::Done<Result> AnswerWhenDone(uint64_t request_id);
  // Each broker call in progress holds the stream open until its answer is queued.
  void BeginOp();
  void EndOp();
  // Starts the next write, resumes reading, or finishes, as the state allows. Call without mu_.
  void Pump();
  // Merges the pushed jobs at the front of the outbox into one JobBatch message.
  void CoalesceJobsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  node::Partitions& broker_;
  const RpcAuth& auth_;
  const TokenEntry* const caller_;
  WorkStreamLimit* const limit_;      // the slot this stream holds, given back in OnDone
  std::shared_ptr<WorkStream> self_;  // released in OnDone
  v1::WorkRequest request_;           // the read in progress

  absl::Mutex mu_;
  std::deque<v1::WorkResponse> outbox_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;  // stopped reading: outbox full
  bool read_closed_ ABSL_GUARDED_BY(mu_) = false;  // the client sends no more
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;    // the client is gone
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);  // the broker ended it
  int pending_ops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stream_id_ ABSL_GUARDED_BY(mu_) = 0;     // the broker's subscription; 0 = none
  bool batch_pushes_ ABSL_GUARDED_BY(mu_) = false;  // the client takes JobBatch messages
};

}  // namespace jobbroker::server
