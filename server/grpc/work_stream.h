#pragma once

#include <grpcpp/support/server_callback.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "jobbroker/v1/broker.pb.h"
#include "node/partitions.h"
#include "server/grpc/forwarder.h"
#include "server/grpc/outbox.h"
#include "server/grpc/rpc_auth.h"
#include "server/grpc/work_stream_limit.h"
#include "server/grpc/work_upstream.h"
#include "server/routing/router.h"

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
// stay, DESIGN.md), answers still owed are sent, then the stream finishes. Jobs pushed that the
// client never got (still in the outbox, or their write failed) are given back to the broker at
// once, READY with no attempt counted, rather than left to their lease. When the broker
// shuts down the stream finishes with UNAVAILABLE so workers reconnect elsewhere.
//
// Cluster mode: the queues of partitions another node leads are subscribed there, through a
// WorkUpstream per leader, and what it pushes is relayed; the stream's max_in_flight is shared
// out evenly over the leaders (each gets at least 1). A heartbeat, ack, fail or release goes to
// the leader of its job's partition (on its upstream, or as a unary call when the stream has
// none to it); an ack batch is split by leader and its answers joined. When a subscribed
// partition changes leader, or an upstream ends, the stream ends with UNAVAILABLE: the worker
// reconnects and is routed afresh, and the leases it holds stay valid (they are replicated).
// When the stream ends its upstreams are drained, not cancelled (they do not share the client's
// cancellation): each leader unsubscribes and sends what it had pushed, and those jobs, which
// the client never got, are given back to it with a Release.
//
// Owns itself (self_) until OnDone; the broker's sink holds only a weak reference, so a push
// racing the stream's end is given back rather than dropped. Thread-safe: gRPC reactions, broker
// callbacks and pushes may come from different threads; gRPC calls (StartWrite, StartRead, Finish)
// are never made under a lock.
class WorkStream final : public grpc::ServerBidiReactor<v1::WorkRequest, v1::WorkResponse> {
 public:
  static constexpr size_t kMaxOutbox = 4096;
  // A stream that subscribed with batch_pushes gets the jobs waiting together in the outbox as
  // one JobBatch message, up to these bounds (headers are not counted: they are small).
  static constexpr int kMaxJobsPerBatch = 256;
  static constexpr size_t kMaxBatchBytes = 1 << 20;
  // How long a Release sent to another leader, for a relayed job the client never got, may take.
  static constexpr absl::Duration kGiveBackTimeout = absl::Seconds(15);

  // A new stream, already reading; gRPC gets the raw pointer. `caller` is the stream's
  // authenticated token (nullptr: auth off); every subscribed queue and every job the stream
  // heartbeats, acks, fails or releases is checked against it. `auth` must outlive the stream.
  // `limit` holds the slot the caller took for it; the stream gives it back when it ends.
  // `router`, `forwarder` (null on a single node) and `ctx` (the stream's) must outlive it too.
  static WorkStream* Start(node::Partitions& broker, const RpcAuth& auth, const TokenEntry* caller,
                           WorkStreamLimit* limit, Router& router, Forwarder* forwarder,
                           grpc::CallbackServerContext* ctx);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Sink;
  friend class Sink;
  struct AckJoin;

  // Where a request about one job goes (cluster mode).
  struct Destination {
    enum class Kind { kLocal, kUpstream, kUnary, kUnavailable };
    Kind kind = Kind::kLocal;
    std::string address;  // kUpstream, kUnary
    absl::Status why;     // kUnavailable
  };
  // A request sent on an upstream, waiting for its answer there.
  struct Relayed {
    enum class Kind { kAnswer, kBatchPart, kSubscribe, kFlow };
    Kind kind = Kind::kAnswer;
    std::string address;             // the upstream's
    uint64_t client_request_id = 0;  // kAnswer
    std::shared_ptr<AckJoin> join;   // kBatchPart
    std::vector<int> indexes;        // kBatchPart: the items' places in the client's batch
  };

  WorkStream(node::Partitions& broker, const RpcAuth& auth, const TokenEntry* caller,
             WorkStreamLimit* limit, Router& router, Forwarder* forwarder,
             grpc::CallbackServerContext* ctx)
      : broker_(broker),
        auth_(auth),
        caller_(caller),
        limit_(limit),
        router_(router),
        forwarder_(forwarder),
        ctx_(ctx),
        forwarded_(router.cluster_mode() && Router::IsForwarded(*ctx)),
        authorization_([ctx] {
          std::vector<absl::string_view> values = AuthorizationOf(*ctx);
          return std::vector<std::string>(values.begin(), values.end());
        }()) {}

  // Queues `message` for the client; safe from any thread.
  void Send(v1::WorkResponse message);
  // Queues `messages` together (so pushed jobs can go out as one JobBatch).
  void SendAll(std::vector<v1::WorkResponse> messages);
  // Gives back the leases in `unsent`: jobs pushed that the client never got (it went away
  // first). Those of this node's brokers at once; those relayed from another leader by a
  // Release sent there. Call without mu_.
  void GiveBack(const std::vector<v1::WorkResponse>& unsent);
  // Sends a Release of `job` to its leader, as the caller whose token `leader` carries, and
  // counts it in `given_back` once taken; needs no stream (the upstream's callback calls it once
  // the stream is gone).
  static void GiveBackAt(const Forwarder::Detached& leader, const v1::LeasedJob& job,
                         SharedCount given_back);
  // The broker ended the stream (shutdown).
  void End(absl::Status status);
  void Handle(const v1::WorkRequest& request);
  // PERMISSION_DENIED if the caller may not touch a queue or job `request` names.
  absl::Status Authorize(const v1::WorkRequest& request) const;
  void Subscribe(uint64_t request_id, const v1::SubscribeRequest& subscribe);

  // --- Cluster mode -------------------------------------------------------------------------
  // Subscribes the local queues here and the others at their leaders. False when every queue is
  // local (the caller subscribes as on a single node).
  bool SubscribeAcross(uint64_t request_id, const v1::SubscribeRequest& subscribe,
                       std::shared_ptr<const ClusterView> seen);
  // Ends the stream (UNAVAILABLE: reconnect) when one of `partitions` changes leader, epoch or
  // where it is served, counting from `seen`, the view its routes were chosen from: a change
  // published before the listener was registered is caught too.
  void ListenForLeaderChanges(std::vector<uint32_t> partitions,
                              std::shared_ptr<const ClusterView> seen);
  Destination DestinationOfJob(const std::string& job_id);
  // Sends `request` on the upstream to `address`, to be answered as `relayed` says. False if
  // the stream has none to it (any more).
  bool Relay(const std::string& address, v1::WorkRequest request, Relayed relayed);
  // Sends a request about one job that is not local (Destination kUpstream, kUnary,
  // kUnavailable) and answers it.
  void HandleElsewhere(const v1::WorkRequest& request, const Destination& where);
  void ForwardUnary(const v1::WorkRequest& request, const std::string& address);
  void AckBatchAcross(uint64_t request_id, const v1::AckBatchRequest& batch);
  // Answers a split ack batch once its last part has answered.
  void FinishJoin(AckJoin& join);
  void FlowAcross(uint64_t request_id, int max_in_flight);
  void OnUpstreamMessage(const std::string& address, v1::WorkResponse message);
  void OnUpstreamEnd(const std::string& address, const grpc::Status& status);
  // Every upstream, to close or cancel them (called without mu_).
  std::vector<std::shared_ptr<WorkUpstream>> Upstreams();
  // `max_in_flight` shared out over the stream's leaders: the local one (if any) first.
  std::vector<int> Shares(int max_in_flight) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  WorkStreamLimit* const limit_;  // the slot this stream holds, given back in OnDone
  Router& router_;
  Forwarder* const forwarder_;
  grpc::CallbackServerContext* const ctx_;
  const bool forwarded_;  // another node relays this stream: nothing is sent on from here
  // The caller's `authorization` metadata, kept for the calls made for it after its context may
  // be gone (GiveBackAt).
  const std::vector<std::string> authorization_;
  std::shared_ptr<WorkStream> self_;  // released in OnDone
  // What an answer that may come after OnDone holds (the broker's callbacks, forwarded calls):
  // the stream's memory stays until it has run; a finished stream sends nothing. Called only
  // from reactions (Handle), so never while OnDone releases self_.
  std::shared_ptr<WorkStream> KeepAlive() const { return self_; }
  v1::WorkRequest request_;  // the read in progress

  absl::Mutex mu_;
  Outbox<v1::WorkResponse> outbox_ ABSL_GUARDED_BY(mu_);
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;  // stopped reading: outbox full
  bool read_closed_ ABSL_GUARDED_BY(mu_) = false;  // the client sends no more
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;    // the client is gone
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);  // the broker ended it
  int pending_ops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stream_id_ ABSL_GUARDED_BY(mu_) = 0;     // the broker's subscription; 0 = none
  bool batch_pushes_ ABSL_GUARDED_BY(mu_) = false;  // the client takes JobBatch messages
  // Cluster mode.
  bool subscribed_ ABSL_GUARDED_BY(mu_) = false;  // across nodes (stream_id_ may stay 0)
  bool has_local_ ABSL_GUARDED_BY(mu_) = false;   // some queues are subscribed here
  bool relaying_ ABSL_GUARDED_BY(mu_) = false;    // counted in limit_'s relaying streams
  std::map<std::string, std::shared_ptr<WorkUpstream>> upstreams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Relayed> relayed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_relay_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t listener_ ABSL_GUARDED_BY(mu_) = 0;  // Router::Listen's handle; 0 = none
};

}  // namespace jobbroker::server
