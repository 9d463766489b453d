#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "node/partitions.h"
#include "server/grpc/forwarder.h"
#include "server/grpc/outbox.h"
#include "server/grpc/rpc_auth.h"
#include "server/routing/router.h"

namespace jobbroker::server {

// One Admin.WatchJob call: the job as it is, then one message per change of its state, attempt,
// progress, snoozes or cancel request, and the end of the call (OK) after its terminal state.
// Answered by this node's broker (a core::JobWatcher: messages arrive once their change is
// durable, and cost nothing in between), or, in cluster mode, relayed from the leader of the
// job's partition as it sends them. A watcher that reads slowly gets every message in order:
// they queue here (a job changes a bounded number of times: each attempt a few messages).
//
// Owns itself: made by Start, it lives until gRPC is done with the call (OnDone).
class JobWatchCall final : public grpc::ServerWriteReactor<v1::Job>,
                           public std::enable_shared_from_this<JobWatchCall> {
 public:
  // Checks the caller (admin on the job's queue), routes, and starts the watch. Everything is
  // borrowed and must outlive the call (the server's services do).
  static grpc::ServerWriteReactor<v1::Job>* Start(grpc::CallbackServerContext* ctx,
                                                  const v1::WatchJobRequest& request,
                                                  node::Partitions& broker, const RpcAuth& auth,
                                                  Router& router, Forwarder* forwarder);

  // Queues `job` for the caller.
  void Send(v1::Job job);
  // Ends the call with `status` once everything queued is written.
  void End(absl::Status status);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Watcher;   // the broker's JobWatcher for this call
  class Upstream;  // the leader's WatchJob, relayed

  explicit JobWatchCall(Router& router) : router_(router) {}
  // Writes the next queued message, or finishes once there is nothing left to say.
  void Pump();
  // A relayed watch ends, UNAVAILABLE, when the job's partition changes leader: the node it is
  // relayed from may have stopped leading without ending it (frozen, or cut off from this node),
  // and the caller's watch again reaches the new leader. `seen` is the view it was routed by.
  void EndOnLeaderChange(uint32_t partition, std::shared_ptr<const ClusterView> seen);
  // Ends the call with `status` and cancels the relayed call.
  void EndRelay(absl::Status status);

  Router& router_;

  std::shared_ptr<JobWatchCall> self_;  // keeps the call alive until OnDone

  absl::Mutex mu_;
  Outbox<v1::Job> outbox_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);
  // The broker's watch (0: none, or it ended), and the partition's broker that holds it.
  core::Broker* watched_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t watch_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<Upstream> upstream_ ABSL_GUARDED_BY(mu_);
  uint64_t listener_ ABSL_GUARDED_BY(mu_) = 0;  // Router::Listen's handle (0: none)
  bool released_ ABSL_GUARDED_BY(mu_) = false;  // OnDone has run
};

}  // namespace jobbroker::server
