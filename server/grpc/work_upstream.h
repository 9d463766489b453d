#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "jobbroker/v1/broker.grpc.pb.h"

namespace jobbroker::server {

// A Work stream this node opened to another node, on behalf of one of its own Work streams whose
// queues (some of them) live in partitions that node leads (cluster mode; work_stream.h). It
// sends what it is given, one write at a time, and hands every message it receives and its end
// to the callbacks, on gRPC's threads.
//
// Owns itself until gRPC is done with it; Start's shared_ptr is the caller's handle. Thread-safe.
class WorkUpstream final : public grpc::ClientBidiReactor<v1::WorkRequest, v1::WorkResponse> {
 public:
  using OnMessage = std::function<void(v1::WorkResponse message)>;
  using OnEnd = std::function<void(const grpc::Status& status)>;

  // Opens the stream on `stub` with `ctx` and sends `first` (its subscribe). `on_end` is called
  // once, last.
  static std::shared_ptr<WorkUpstream> Start(v1::Broker::Stub& stub,
                                             std::unique_ptr<grpc::ClientContext> ctx,
                                             v1::WorkRequest first, OnMessage on_message,
                                             OnEnd on_end);

  // Queues `request` for the other node; dropped once the stream has ended.
  void Send(v1::WorkRequest request);
  // Sends no more after what is queued (the other node unsubscribes it, answers what it owes,
  // then finishes).
  void CloseWrites();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  WorkUpstream(std::unique_ptr<grpc::ClientContext> ctx, OnMessage on_message, OnEnd on_end)
      : ctx_(std::move(ctx)), on_message_(std::move(on_message)), on_end_(std::move(on_end)) {}
  // Starts the next write if none is in progress. Call without mu_.
  void Pump();
  // Removes the hold once no write is in progress and none will start: the stream broke or
  // ended (gRPC then calls OnDone once the read is over too). Call without mu_.
  void MaybeRelease();

  const std::unique_ptr<grpc::ClientContext> ctx_;
  const OnMessage on_message_;
  const OnEnd on_end_;
  std::shared_ptr<WorkUpstream> self_;  // released in OnDone
  v1::WorkResponse incoming_;           // the read in progress

  absl::Mutex mu_;
  std::deque<v1::WorkRequest> outbox_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool close_ ABSL_GUARDED_BY(mu_) = false;   // CloseWrites was called
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // writes-done sent
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  // A hold (AddHold) is on the call while this is true: gRPC does not call OnDone, so a write
  // that Send starts from outside gRPC's reactions never meets a finished call. Writes start only
  // while it holds; it is released once, when the stream broke (a read or a write failed) or
  // writes-done was sent.
  bool held_ ABSL_GUARDED_BY(mu_) = true;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // a read or a write failed: no more writes
};

}  // namespace jobbroker::server
