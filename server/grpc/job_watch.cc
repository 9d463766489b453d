#include "server/grpc/job_watch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert/convert.h"
#include "server/grpc/grpc_status.h"

namespace jobbroker::server {

// What the broker tells the call. Holds the call weakly: a watch the broker still has after the
// caller went away costs one failed lock, and never keeps the call alive.
class JobWatchCall::Watcher final : public core::JobWatcher {
 public:
  explicit Watcher(std::weak_ptr<JobWatchCall> call) : call_(std::move(call)) {}
  void Changed(core::Job job) override {
    std::shared_ptr<JobWatchCall> call = call_.lock();
    if (call == nullptr) return;
    v1::Job message;
    ToProto(job, &message);
    call->Send(std::move(message));
  }
  void End(absl::Status status) override {
    if (std::shared_ptr<JobWatchCall> call = call_.lock()) call->End(std::move(status));
  }

 private:
  const std::weak_ptr<JobWatchCall> call_;
};

// The same call to the leader of the job's partition, relayed message by message. Owns itself
// while the upstream call runs (until OnDone).
class JobWatchCall::Upstream final : public grpc::ClientReadReactor<v1::Job> {
 public:
  static std::shared_ptr<Upstream> Start(std::weak_ptr<JobWatchCall> call, Forwarder& forwarder,
                                         const grpc::CallbackServerContext& server,
                                         const std::string& address,
                                         const v1::WatchJobRequest& request) {
    auto upstream = std::shared_ptr<Upstream>(new Upstream(std::move(call)));
    upstream->self_ = upstream;
    upstream->ctx_ = forwarder.ContextFor(server);
    upstream->request_ = request;
    forwarder.AdminAt(address).async()->WatchJob(upstream->ctx_.get(), &upstream->request_,
                                                 upstream.get());
    upstream->StartRead(&upstream->job_);
    upstream->StartCall();
    return upstream;
  }

  void Cancel() { ctx_->TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the call is over: OnDone says how
    if (std::shared_ptr<JobWatchCall> call = call_.lock()) call->Send(job_);
    StartRead(&job_);
  }
  void OnDone(const grpc::Status& status) override {
    if (std::shared_ptr<JobWatchCall> call = call_.lock())
      call->End(
          absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message()));
    self_.reset();  // may delete this
  }

 private:
  explicit Upstream(std::weak_ptr<JobWatchCall> call) : call_(std::move(call)) {}

  const std::weak_ptr<JobWatchCall> call_;
  std::shared_ptr<Upstream> self_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  v1::WatchJobRequest request_;
  v1::Job job_;
};

grpc::ServerWriteReactor<v1::Job>* JobWatchCall::Start(grpc::CallbackServerContext* ctx,
                                                       const v1::WatchJobRequest& request,
                                                       node::Partitions& broker,
                                                       const RpcAuth& auth, Router& router,
                                                       Forwarder* forwarder) {
  auto call = std::shared_ptr<JobWatchCall>(new JobWatchCall(router));
  call->self_ = call;
  if (absl::Status s = auth.CheckJob(*ctx, Role::kAdmin, request.job_id()); !s.ok()) {
    // Another node's DependencyRelay watches the jobs its partitions' jobs wait for.
    absl::StatusOr<const TokenEntry*> caller = auth.Caller(*ctx);
    const bool peer =
        caller.ok() && *caller != nullptr && Authorizer::AllowRole(**caller, Role::kPeer).ok();
    if (!peer) {
      call->End(std::move(s));
      return call.get();
    }
  }
  Route route;
  std::shared_ptr<const ClusterView> seen = router.view();
  if (router.cluster_mode()) route = router.RouteOf(router.PartitionOfJob(request.job_id()), *ctx);
  switch (route.kind) {
    case Route::Kind::kUnavailable:
      call->End(route.why);
      break;
    case Route::Kind::kForward: {
      std::shared_ptr<Upstream> upstream =
          Upstream::Start(call, *forwarder, *ctx, route.address, request);
      {
        absl::MutexLock lock(&call->mu_);
        call->upstream_ = std::move(upstream);
      }
      call->EndOnLeaderChange(route.partition, std::move(seen));
      break;
    }
    case Route::Kind::kLocal: {
      core::Broker& partition = broker.BrokerOfJob(request.job_id());
      absl::StatusOr<uint64_t> watch =
          partition.WatchJob(request.job_id(), std::make_shared<Watcher>(call));
      if (!watch.ok()) {
        call->End(watch.status());
        break;
      }
      absl::MutexLock lock(&call->mu_);
      call->watched_ = &partition;
      call->watch_ = *watch;
      break;
    }
  }
  return call.get();
}

void JobWatchCall::EndOnLeaderChange(uint32_t partition, std::shared_ptr<const ClusterView> seen) {
  auto moved = [partition] {
    return absl::UnavailableError(absl::StrCat(
        "partition ", partition,
        " changed leader while this watch was relayed from its former leader; watch again"));
  };
  std::weak_ptr<JobWatchCall> weak = self_;
  const Router::LeaderWatch watch =
      router_.ListenForLeaderChange({partition}, seen, [weak, moved](uint32_t) {
        if (std::shared_ptr<JobWatchCall> call = weak.lock()) call->EndRelay(moved());
      });
  bool done;
  {
    absl::MutexLock lock(&mu_);
    listener_ = watch.handle;
    done = released_;
  }
  // OnDone ran before listener_ was set, so it could not let go of it.
  if (done) return router_.Unlisten(watch.handle);
  if (watch.changed_since_seen.has_value()) EndRelay(moved());
}

void JobWatchCall::EndRelay(absl::Status status) {
  std::shared_ptr<Upstream> upstream;
  {
    absl::MutexLock lock(&mu_);
    upstream = upstream_;
  }
  End(std::move(status));
  if (upstream != nullptr) upstream->Cancel();
}

void JobWatchCall::Send(v1::Job job) {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finished_ || ended_.has_value()) return;
    outbox_.Push(std::move(job));
  }
  Pump();
}

void JobWatchCall::End(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!ended_.has_value()) ended_ = std::move(status);
    watch_ = 0;  // the broker has let go of it
  }
  Pump();
}

void JobWatchCall::Pump() {
  const v1::Job* to_write = nullptr;
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!cancelled_) to_write = outbox_.NextToWrite();
    if ((cancelled_ || ended_.has_value()) && !outbox_.writing() &&
        (cancelled_ || outbox_.drained())) {
      finished_ = true;
      finish = cancelled_ ? grpc::Status::CANCELLED : ToGrpcStatus(*ended_);
    }
  }
  if (to_write != nullptr) StartWrite(to_write);
  if (finish.has_value()) Finish(*finish);
}

void JobWatchCall::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    if (!outbox_.WriteDone(ok)) {
      cancelled_ = true;     // the caller is gone
      outbox_.TakeUnsent();  // answers nobody will read: nothing to give back
    }
  }
  Pump();
}

void JobWatchCall::OnCancel() {
  core::Broker* watched = nullptr;
  uint64_t watch = 0;
  std::shared_ptr<Upstream> upstream;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    std::swap(watched, watched_);
    std::swap(watch, watch_);
    upstream = upstream_;
  }
  if (watch != 0) watched->Unwatch(watch);
  if (upstream != nullptr) upstream->Cancel();
  Pump();
}

void JobWatchCall::OnDone() {
  core::Broker* watched = nullptr;
  uint64_t watch = 0;
  uint64_t listener = 0;
  std::shared_ptr<Upstream> upstream;
  {
    absl::MutexLock lock(&mu_);
    std::swap(watched, watched_);
    std::swap(watch, watch_);
    std::swap(listener, listener_);
    released_ = true;
    upstream = std::move(upstream_);
  }
  if (watch != 0) watched->Unwatch(watch);
  if (listener != 0) router_.Unlisten(listener);
  if (upstream != nullptr) upstream->Cancel();
  self_.reset();  // may delete this
}

}  // namespace jobbroker::server
