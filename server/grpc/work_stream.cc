#include "server/grpc/work_stream.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "core/validation.h"
#include "server/convert/convert.h"
#include "server/grpc/grpc_status.h"
#include "server/grpc/worker_origin.h"

namespace jobbroker::server {
namespace {

// Makes `m` the WorkResult answering request `id` with `status`; the caller adds the rest.
v1::WorkResult* NewResult(v1::WorkResponse& m, uint64_t id, const absl::Status& status) {
  v1::WorkResult* result = m.mutable_result();
  ToProto(id, status, result);
  return result;
}

// What a WorkResult carries beside the status of the broker's answer: a heartbeat's new deadline,
// the status of each ack of a batch; nothing for a plain status or a fail.
absl::Status StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& r) {
  return r.status();
}
void AddDetails(const absl::Status&, v1::WorkResult*) {}
void AddDetails(const absl::StatusOr<core::FailResult>&, v1::WorkResult*) {}
void AddDetails(const absl::StatusOr<core::HeartbeatResult>& r, v1::WorkResult* out) {
  if (r.ok()) ToProto(*r, out);
}
void AddDetails(const absl::StatusOr<std::vector<absl::Status>>& r, v1::WorkResult* out) {
  if (r.ok()) ToProto(*r, out);
}

// Calls `fn` on each lease `messages` carry: pushed jobs, alone or in a batch.
template <typename Fn>
void ForEachLease(absl::Span<const v1::WorkResponse> messages, Fn fn) {
  for (const v1::WorkResponse& m : messages) {
    if (m.has_job()) fn(m.job());
    for (const v1::LeasedJob& job : m.job_batch().jobs()) fn(job);
  }
}

// Gives back, at once, a lease of this node's broker that its worker never got: a plain
// Release, which leaves no trace in the job's history and does not count the attempt. Without
// it the job would stay ACTIVE until its lease ran out, then wait out a retry backoff.
// Counted in `given_back` once done.
void GiveBackHere(node::Partitions& broker, const v1::LeasedJob& job, SharedCount given_back) {
  core::ReleaseSpec spec;
  spec.job_id = job.job_id();
  spec.lease_id = job.lease_id();
  // Refused only if the lease ended meanwhile (acked elsewhere, expired, cancelled): then there
  // is nothing to give back.
  broker.Release(std::move(spec), [given_back = std::move(given_back)](absl::Status status) {
    if (status.ok()) given_back->fetch_add(1, std::memory_order_relaxed);
  });
}

}  // namespace

// What the broker pushes, forwarded to the stream while it lives. The broker may keep the sink
// after the stream is gone, hence the weak reference. Pushes that arrive before the subscribe's
// own answer is queued wait here, so a worker sees that answer first.
class WorkStream::Sink final : public core::StreamSink {
 public:
  Sink(std::weak_ptr<WorkStream> stream, node::Partitions& broker, SharedCount given_back)
      : stream_(std::move(stream)), broker_(broker), given_back_(std::move(given_back)) {}

  void PushJob(core::LeasedJob job) override {
    v1::WorkResponse m;
    ToProto(job, m.mutable_job());
    Forward(std::move(m));
  }
  void PushJobs(std::vector<core::LeasedJob> jobs) override {
    std::vector<v1::WorkResponse> messages(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) ToProto(jobs[i], messages[i].mutable_job());
    ForwardAll(std::move(messages));
  }
  void LeaseLost(std::string job_id, core::AttemptOutcome outcome) override {
    v1::WorkResponse m;
    m.mutable_lease_lost()->set_job_id(std::move(job_id));
    m.mutable_lease_lost()->set_outcome(static_cast<v1::AttemptOutcome>(outcome));
    Forward(std::move(m));
  }
  void CancelRequested(std::string job_id) override {
    v1::WorkResponse m;
    m.mutable_cancel_requested()->set_job_id(std::move(job_id));
    Forward(std::move(m));
  }
  void End(absl::Status status) override {
    if (std::shared_ptr<WorkStream> s = stream_.lock()) s->End(std::move(status));
  }

  // The subscribe was answered: let held pushes through.
  void Open() {
    std::vector<v1::WorkResponse> held;
    {
      absl::MutexLock lock(&mu_);
      open_ = true;
      held.swap(held_);
    }
    SendAll(std::move(held));
  }

 private:
  void Forward(v1::WorkResponse m) {
    {
      absl::MutexLock lock(&mu_);
      if (!open_) {
        held_.push_back(std::move(m));
        return;
      }
    }
    if (std::shared_ptr<WorkStream> s = stream_.lock()) {
      s->Send(std::move(m));
    } else {
      GiveBackAll({&m, 1});  // a push that raced the stream's end
    }
  }
  void ForwardAll(std::vector<v1::WorkResponse> messages) {
    {
      absl::MutexLock lock(&mu_);
      if (!open_) {
        for (v1::WorkResponse& m : messages) held_.push_back(std::move(m));
        return;
      }
    }
    SendAll(std::move(messages));
  }
  void SendAll(std::vector<v1::WorkResponse> messages) {
    if (std::shared_ptr<WorkStream> s = stream_.lock()) {
      s->SendAll(std::move(messages));
    } else {
      GiveBackAll(messages);
    }
  }
  // Pushes from this node's brokers: their leases are all held here.
  void GiveBackAll(absl::Span<const v1::WorkResponse> messages) {
    ForEachLease(messages,
                 [this](const v1::LeasedJob& job) { GiveBackHere(broker_, job, given_back_); });
  }

  const std::weak_ptr<WorkStream> stream_;
  node::Partitions& broker_;
  const SharedCount given_back_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::WorkResponse> held_ ABSL_GUARDED_BY(mu_);
};

// An ack batch split over several leaders: answered once every part is.
struct WorkStream::AckJoin {
  // Pending starts at 1: the sending of the parts, which ends with Add({}, {}).
  AckJoin(uint64_t id, size_t items) : request_id(id), statuses(items) {}
  // One more part will answer.
  void Expect() {
    absl::MutexLock lock(&mu);
    ++pending;
  }
  // A part's answer: `part[k]` for the batch's item `indexes[k]`. True for the last part.
  bool Add(const std::vector<int>& indexes, const std::vector<absl::Status>& part) {
    absl::MutexLock lock(&mu);
    for (size_t k = 0; k < indexes.size() && k < part.size(); ++k) statuses[indexes[k]] = part[k];
    return --pending == 0;
  }
  bool AddAll(const std::vector<int>& indexes, const absl::Status& status) {
    return Add(indexes, std::vector<absl::Status>(indexes.size(), status));
  }

  const uint64_t request_id;
  absl::Mutex mu;
  std::vector<absl::Status> statuses ABSL_GUARDED_BY(mu);
  int pending ABSL_GUARDED_BY(mu) = 1;
};

WorkStream* WorkStream::Start(node::Partitions& broker, const RpcAuth& auth,
                              const TokenEntry* caller, WorkStreamLimit* limit, Router& router,
                              Forwarder* forwarder, grpc::CallbackServerContext* ctx) {
  std::shared_ptr<WorkStream> stream(
      new WorkStream(broker, auth, caller, limit, router, forwarder, ctx));
  stream->self_ = stream;
  stream->StartRead(&stream->request_);
  return stream.get();
}

void WorkStream::OnReadDone(bool ok) {
  if (!ok) {
    uint64_t stream;
    {
      absl::MutexLock lock(&mu_);
      read_closed_ = true;
      stream = stream_id_;
    }
    // No new jobs for a worker that stopped talking; what it holds runs out or is acked.
    if (stream != 0) broker_.Unsubscribe(stream);
    for (const auto& upstream : Upstreams()) upstream->CloseWrites();
    Pump();
    return;
  }
  Handle(request_);
  {
    absl::MutexLock lock(&mu_);
    if (outbox_.size() >= kMaxOutbox) {
      read_paused_ = true;  // Pump resumes once the client has read some
      return;
    }
  }
  StartRead(&request_);
}

absl::Status WorkStream::Authorize(const v1::WorkRequest& request) const {
  switch (request.request_case()) {
    case v1::WorkRequest::kSubscribe:
      for (const std::string& queue : request.subscribe().queues()) {
        if (absl::Status s = auth_.Allow(caller_, Role::kWorker, queue); !s.ok()) return s;
      }
      return absl::OkStatus();
    case v1::WorkRequest::kHeartbeat:
      return auth_.AllowJob(caller_, Role::kWorker, request.heartbeat().job_id());
    case v1::WorkRequest::kAck:
      return auth_.AllowJob(caller_, Role::kWorker, request.ack().job_id());
    case v1::WorkRequest::kAckBatch:
      // Refused whole, like EnqueueBatch: a caller does not get a partly applied batch for
      // asking beyond its rights.
      for (const v1::AckRequest& ack : request.ack_batch().acks()) {
        if (absl::Status s = auth_.AllowJob(caller_, Role::kWorker, ack.job_id()); !s.ok())
          return s;
      }
      return absl::OkStatus();
    case v1::WorkRequest::kFail:
      return auth_.AllowJob(caller_, Role::kWorker, request.fail().job_id());
    case v1::WorkRequest::kRelease:
      return auth_.AllowJob(caller_, Role::kWorker, request.release().job_id());
    default:
      return absl::OkStatus();
  }
}

template <typename Result>
core::Done<Result> WorkStream::AnswerWhenDone(uint64_t request_id) {
  BeginOp();
  // `alive`: the broker may answer after the stream finished (a read that completed as the
  // client cancelled, then a commit held up by a slow follower); the object must outlive it.
  return [this, alive = KeepAlive(), request_id](Result result) {
    v1::WorkResponse m;
    AddDetails(result, NewResult(m, request_id, StatusOf(result)));
    Send(std::move(m));
    EndOp();
  };
}

void WorkStream::Handle(const v1::WorkRequest& request) {
  const uint64_t id = request.request_id();
  if (absl::Status s = Authorize(request); !s.ok()) return Answer(id, s);
  if (router_.cluster_mode()) {
    const std::string* job_id = nullptr;
    switch (request.request_case()) {
      case v1::WorkRequest::kHeartbeat:
        job_id = &request.heartbeat().job_id();
        break;
      case v1::WorkRequest::kAck:
        job_id = &request.ack().job_id();
        break;
      case v1::WorkRequest::kFail:
        job_id = &request.fail().job_id();
        break;
      case v1::WorkRequest::kRelease:
        job_id = &request.release().job_id();
        break;
      case v1::WorkRequest::kAckBatch:
        return AckBatchAcross(id, request.ack_batch());
      case v1::WorkRequest::kFlow: {
        bool across;
        {
          absl::MutexLock lock(&mu_);
          across = !upstreams_.empty();
        }
        if (across) return FlowAcross(id, request.flow().max_in_flight());
        break;
      }
      default:
        break;
    }
    if (job_id != nullptr) {
      const Destination where = DestinationOfJob(*job_id);
      if (where.kind != Destination::Kind::kLocal) return HandleElsewhere(request, where);
    }
  }
  switch (request.request_case()) {
    case v1::WorkRequest::kSubscribe:
      Subscribe(id, request.subscribe());
      return;
    case v1::WorkRequest::kHeartbeat: {
      absl::StatusOr<core::HeartbeatSpec> spec = FromProto(request.heartbeat());
      if (!spec.ok()) return Answer(id, spec.status());
      return broker_.Heartbeat(std::move(*spec),
                               AnswerWhenDone<absl::StatusOr<core::HeartbeatResult>>(id));
    }
    case v1::WorkRequest::kAck:
      return broker_.Ack(FromProto(request.ack()), AnswerWhenDone<absl::Status>(id));
    case v1::WorkRequest::kAckBatch:
      return broker_.AckBatch(FromProto(request.ack_batch()),
                              AnswerWhenDone<absl::StatusOr<std::vector<absl::Status>>>(id));
    case v1::WorkRequest::kFail: {
      absl::StatusOr<core::FailSpec> spec = FromProto(request.fail());
      if (!spec.ok()) return Answer(id, spec.status());
      return broker_.Fail(std::move(*spec), AnswerWhenDone<absl::StatusOr<core::FailResult>>(id));
    }
    case v1::WorkRequest::kRelease: {
      absl::StatusOr<core::ReleaseSpec> spec = FromProto(request.release());
      if (!spec.ok()) return Answer(id, spec.status());
      return broker_.Release(std::move(*spec), AnswerWhenDone<absl::Status>(id));
    }
    case v1::WorkRequest::kFlow: {
      uint64_t stream;
      {
        absl::MutexLock lock(&mu_);
        stream = stream_id_;
      }
      if (stream == 0)
        return Answer(id, absl::FailedPreconditionError("flow needs a subscribe first"));
      return Answer(id, broker_.SetFlow(stream, request.flow().max_in_flight()));
    }
    case v1::WorkRequest::REQUEST_NOT_SET:
      break;
  }
  Answer(id, absl::InvalidArgumentError("request must set one of subscribe, heartbeat, ack, "
                                        "ack_batch, fail, release, flow"));
}

void WorkStream::Subscribe(uint64_t request_id, const v1::SubscribeRequest& subscribe) {
  bool already;
  {
    absl::MutexLock lock(&mu_);
    already = stream_id_ != 0 || subscribed_;
  }
  if (already)
    return Answer(
        request_id,
        absl::FailedPreconditionError(
            "subscribe: this stream has already subscribed; open another stream for other queues"));
  absl::StatusOr<core::SubscribeSpec> spec = FromProto(subscribe);
  if (!spec.ok()) return Answer(request_id, spec.status());
  // The routes below are chosen from this view (or a later one); leader changes are counted
  // from it.
  std::shared_ptr<const ClusterView> seen = router_.view();
  if (router_.cluster_mode() && SubscribeAcross(request_id, subscribe, seen)) return;
  spec->origin = OriginOf(*ctx_, router_.node_id());
  auto sink = std::make_shared<Sink>(self_, broker_, limit_->given_back_count());
  absl::StatusOr<uint64_t> stream = broker_.Subscribe(*std::move(spec), sink);
  if (!stream.ok()) return Answer(request_id, stream.status());
  bool gone;
  {
    absl::MutexLock lock(&mu_);
    stream_id_ = *stream;
    batch_pushes_ = subscribe.batch_pushes();
    gone = cancelled_;
  }
  // The client went away while this subscribe was being read (OnCancel saw no subscription to
  // end): end it now, or it would take jobs until OnDone. What it was pushed meanwhile is given
  // back through the closed outbox.
  if (gone) broker_.Unsubscribe(*stream);
  Answer(request_id, absl::OkStatus());
  sink->Open();
  if (gone) return;
  if (router_.cluster_mode()) {
    std::vector<uint32_t> partitions;
    for (const std::string& queue : subscribe.queues())
      partitions.push_back(router_.PartitionOfQueue(queue));
    ListenForLeaderChanges(std::move(partitions), std::move(seen));
  }
}

// ---- Cluster mode ----

bool WorkStream::SubscribeAcross(uint64_t request_id, const v1::SubscribeRequest& subscribe,
                                 std::shared_ptr<const ClusterView> seen) {
  std::vector<std::string> local;
  std::map<std::string, std::vector<std::string>> remote;  // leader address -> its queues
  std::vector<uint32_t> partitions;
  for (const std::string& queue : subscribe.queues()) {
    const uint32_t partition = router_.PartitionOfQueue(queue);
    partitions.push_back(partition);
    const Route route = router_.RouteOf(partition, forwarded_);
    if (route.kind == Route::Kind::kUnavailable) {
      Answer(request_id, absl::UnavailableError(
                             absl::StrCat("subscribe: queue ", queue, ": ", route.why.message())));
      return true;
    }
    if (route.kind == Route::Kind::kLocal) {
      local.push_back(queue);
    } else {
      remote[route.address].push_back(queue);
    }
  }
  if (remote.empty()) return false;

  std::vector<int> shares;
  {
    absl::MutexLock lock(&mu_);
    subscribed_ = true;
    has_local_ = !local.empty();
    batch_pushes_ = subscribe.batch_pushes();
    for (const auto& [address, queues] : remote) upstreams_[address] = nullptr;  // for Shares
    shares = Shares(std::max(1, subscribe.max_in_flight()));  // 0 means 1, as on one node
  }
  size_t share = 0;
  std::shared_ptr<Sink> sink;
  if (!local.empty()) {
    v1::SubscribeRequest here = subscribe;
    here.clear_queues();
    for (const std::string& queue : local) here.add_queues(queue);
    here.set_max_in_flight(shares[share++]);
    absl::StatusOr<core::SubscribeSpec> spec = FromProto(here);
    if (spec.ok()) spec->origin = OriginOf(*ctx_, router_.node_id());
    // The whole subscribe was checked already (Subscribe), so its part checks too.
    sink = std::make_shared<Sink>(self_, broker_, limit_->given_back_count());
    absl::StatusOr<uint64_t> stream =
        spec.ok() ? broker_.Subscribe(*std::move(spec), sink) : spec.status();
    if (!stream.ok()) {
      {
        absl::MutexLock lock(&mu_);
        subscribed_ = false;
        upstreams_.clear();
      }
      Answer(request_id, stream.status());
      return true;
    }
    bool gone;
    {
      absl::MutexLock lock(&mu_);
      stream_id_ = *stream;
      gone = cancelled_;
    }
    if (gone) broker_.Unsubscribe(*stream);  // as in Subscribe
  }
  // Answered before any upstream starts, so the worker sees the answer before any push.
  Answer(request_id, absl::OkStatus());
  {
    absl::MutexLock lock(&mu_);
    relaying_ = true;
  }
  limit_->AddRelaying();
  if (sink != nullptr) sink->Open();
  for (const auto& [address, queues] : remote) {
    v1::WorkRequest first;
    v1::SubscribeRequest* there = first.mutable_subscribe();
    *there = subscribe;
    there->clear_queues();
    for (const std::string& queue : queues) there->add_queues(queue);
    there->set_max_in_flight(shares[share++]);
    uint64_t relay_id;
    {
      absl::MutexLock lock(&mu_);
      relay_id = next_relay_id_++;
      relayed_[relay_id] = Relayed{.kind = Relayed::Kind::kSubscribe, .address = address};
    }
    first.set_request_id(relay_id);
    std::weak_ptr<WorkStream> weak = self_;
    // Not cancelled with the client's call: when the client goes, the upstream is drained
    // (CloseWrites), so that the jobs already on their way are given back, not left leased.
    auto upstream = WorkUpstream::Start(
        forwarder_->BrokerAt(address),
        forwarder_->ContextFor(*ctx_, /*propagate_cancellation=*/false), std::move(first),
        [weak, address = address, leader = forwarder_->DetachedAt(address, authorization_),
         given_back = limit_->given_back_count()](v1::WorkResponse message) {
          if (auto stream = weak.lock()) {
            stream->OnUpstreamMessage(address, std::move(message));
          } else {
            // The client's stream is over: a job that still comes is nobody's.
            ForEachLease({&message, 1},
                         [&](const v1::LeasedJob& job) { GiveBackAt(leader, job, given_back); });
          }
        },
        [weak, address = address](const grpc::Status& status) {
          if (auto stream = weak.lock()) stream->OnUpstreamEnd(address, status);
        });
    absl::MutexLock lock(&mu_);
    auto it = upstreams_.find(address);
    if (it != upstreams_.end()) it->second = std::move(upstream);
  }
  ListenForLeaderChanges(std::move(partitions), std::move(seen));
  // The client may have gone while the upstreams started: they end with it.
  bool gone;
  {
    absl::MutexLock lock(&mu_);
    gone = cancelled_ || finished_;
  }
  if (gone) {
    for (const auto& upstream : Upstreams()) upstream->CloseWrites();
  }
  return true;
}

std::vector<int> WorkStream::Shares(int max_in_flight) const {
  const int leaders = static_cast<int>(upstreams_.size()) + (has_local_ ? 1 : 0);
  std::vector<int> shares(leaders, 0);
  if (max_in_flight <= 0) return shares;  // drained everywhere
  for (int i = 0; i < leaders; ++i)
    shares[i] = std::max(1, max_in_flight / leaders + (i < max_in_flight % leaders ? 1 : 0));
  return shares;
}

void WorkStream::ListenForLeaderChanges(std::vector<uint32_t> partitions,
                                        std::shared_ptr<const ClusterView> seen) {
  auto moved = [](uint32_t p) {
    return absl::UnavailableError(absl::StrCat(
        "partition ", p, " changed leader: reconnect (the leases this worker holds stay valid)"));
  };
  std::weak_ptr<WorkStream> weak = self_;
  const Router::LeaderWatch watch =
      router_.ListenForLeaderChange(std::move(partitions), seen, [weak, moved](uint32_t p) {
        if (auto stream = weak.lock()) stream->End(moved(p));
      });
  {
    absl::MutexLock lock(&mu_);
    listener_ = watch.handle;
  }
  if (watch.changed_since_seen.has_value()) End(moved(*watch.changed_since_seen));
}

WorkStream::Destination WorkStream::DestinationOfJob(const std::string& job_id) {
  const Route route = router_.RouteOf(router_.PartitionOfJob(job_id), forwarded_);
  Destination where;
  switch (route.kind) {
    case Route::Kind::kLocal:
      return where;
    case Route::Kind::kUnavailable:
      where.kind = Destination::Kind::kUnavailable;
      where.why = route.why;
      return where;
    case Route::Kind::kForward:
      break;
  }
  where.address = route.address;
  absl::MutexLock lock(&mu_);
  auto it = upstreams_.find(route.address);
  where.kind = it != upstreams_.end() && it->second != nullptr ? Destination::Kind::kUpstream
                                                               : Destination::Kind::kUnary;
  return where;
}

bool WorkStream::Relay(const std::string& address, v1::WorkRequest request, Relayed relayed) {
  std::shared_ptr<WorkUpstream> upstream;
  {
    absl::MutexLock lock(&mu_);
    auto it = upstreams_.find(address);
    if (it == upstreams_.end() || it->second == nullptr) return false;
    upstream = it->second;
    const uint64_t relay_id = next_relay_id_++;
    relayed.address = address;
    relayed_[relay_id] = std::move(relayed);
    request.set_request_id(relay_id);
  }
  upstream->Send(std::move(request));
  return true;
}

void WorkStream::HandleElsewhere(const v1::WorkRequest& request, const Destination& where) {
  const uint64_t id = request.request_id();
  if (where.kind == Destination::Kind::kUnavailable) return Answer(id, where.why);
  if (where.kind == Destination::Kind::kUpstream) {
    BeginOp();  // ended when the upstream answers, or ends
    if (Relay(where.address, request,
              Relayed{.kind = Relayed::Kind::kAnswer, .client_request_id = id})) {
      return;
    }
    EndOp();
  }
  ForwardUnary(request, where.address);
}

void WorkStream::ForwardUnary(const v1::WorkRequest& request, const std::string& address) {
  // One call's state, alive until its answer.
  struct Call {
    std::unique_ptr<grpc::ClientContext> ctx;
    v1::WorkRequest request;
    v1::HeartbeatResponse heartbeat;
    v1::AckResponse ack;
    v1::FailResponse fail;
    v1::ReleaseResponse release;
  };
  auto call = std::make_shared<Call>();
  call->ctx = forwarder_->ContextFor(*ctx_);
  call->request = request;
  const uint64_t id = request.request_id();
  BeginOp();
  auto answer = [this, alive = KeepAlive(), call, id](const grpc::Status& status) {
    v1::WorkResponse m;
    v1::WorkResult* result = NewResult(
        m, id,
        absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message()));
    if (status.ok() && call->request.has_heartbeat()) {
      *result->mutable_lease_deadline() = call->heartbeat.lease_deadline();
      result->set_cancel_requested(call->heartbeat.cancel_requested());
    }
    Send(std::move(m));
    EndOp();
  };
  auto* stub = forwarder_->BrokerAt(address).async();
  switch (request.request_case()) {
    case v1::WorkRequest::kHeartbeat:
      return stub->Heartbeat(call->ctx.get(), &call->request.heartbeat(), &call->heartbeat,
                             std::move(answer));
    case v1::WorkRequest::kAck:
      return stub->Ack(call->ctx.get(), &call->request.ack(), &call->ack, std::move(answer));
    case v1::WorkRequest::kFail:
      return stub->Fail(call->ctx.get(), &call->request.fail(), &call->fail, std::move(answer));
    case v1::WorkRequest::kRelease:
      return stub->Release(call->ctx.get(), &call->request.release(), &call->release,
                           std::move(answer));
    default:
      EndOp();
      return Answer(id, absl::InternalError("only a job's request is forwarded"));
  }
}

void WorkStream::AckBatchAcross(uint64_t request_id, const v1::AckBatchRequest& batch) {
  std::vector<core::AckSpec> specs = FromProto(batch);
  if (absl::Status s = core::ValidateAckBatch(specs); !s.ok()) return Answer(request_id, s);
  // The items by where they go: "" for this node's broker.
  std::map<std::string, std::vector<int>> parts;
  std::map<std::string, bool> by_upstream;  // address -> the stream has an upstream to it
  std::vector<int> unavailable;
  absl::Status why;
  for (int i = 0; i < batch.acks_size(); ++i) {
    const Destination where = DestinationOfJob(batch.acks(i).job_id());
    if (where.kind == Destination::Kind::kUnavailable) {
      unavailable.push_back(i);
      why = where.why;
      continue;
    }
    const std::string key = where.kind == Destination::Kind::kLocal ? "" : where.address;
    parts[key].push_back(i);
    by_upstream[key] = where.kind == Destination::Kind::kUpstream;
  }
  if (parts.size() == 1 && parts.begin()->first.empty() && unavailable.empty()) {
    return broker_.AckBatch(std::move(specs),
                            AnswerWhenDone<absl::StatusOr<std::vector<absl::Status>>>(request_id));
  }
  auto join = std::make_shared<AckJoin>(request_id, specs.size());
  BeginOp();  // ended by FinishJoin
  for (auto& [address, indexes] : parts) {
    if (address.empty()) {
      join->Expect();
      std::vector<core::AckSpec> here;
      for (int i : indexes) here.push_back(specs[i]);
      broker_.AckBatch(std::move(here), [this, alive = KeepAlive(), join, indexes = indexes](
                                            absl::StatusOr<std::vector<absl::Status>> r) {
        if (r.ok() ? join->Add(indexes, *r) : join->AddAll(indexes, r.status())) FinishJoin(*join);
      });
      continue;
    }
    if (by_upstream[address]) {
      v1::WorkRequest there;
      for (int i : indexes) *there.mutable_ack_batch()->add_acks() = batch.acks(i);
      join->Expect();  // before: the answer may come at once
      if (Relay(address, std::move(there),
                Relayed{.kind = Relayed::Kind::kBatchPart, .join = join, .indexes = indexes}))
        continue;
      join->Add({}, {});  // not sent after all; never the last part (the sending still holds one)
    }
    // No stream to that leader: each ack goes as a unary call.
    for (int i : indexes) {
      join->Expect();
      auto ctx = std::shared_ptr<grpc::ClientContext>(forwarder_->ContextFor(*ctx_));
      auto request = std::make_shared<v1::AckRequest>(batch.acks(i));
      auto response = std::make_shared<v1::AckResponse>();
      forwarder_->BrokerAt(address).async()->Ack(
          ctx.get(), request.get(), response.get(),
          [this, alive = KeepAlive(), join, i, ctx, request, response](const grpc::Status& status) {
            const absl::Status result(static_cast<absl::StatusCode>(status.error_code()),
                                      status.error_message());
            if (join->AddAll({i}, result)) FinishJoin(*join);
          });
    }
  }
  if (!unavailable.empty()) {
    join->Expect();
    if (join->AddAll(unavailable, why)) FinishJoin(*join);
  }
  if (join->Add({}, {})) FinishJoin(*join);  // the sending is done
}

void WorkStream::FinishJoin(AckJoin& join) {
  v1::WorkResponse m;
  std::vector<absl::Status> statuses;
  {
    absl::MutexLock lock(&join.mu);
    statuses = join.statuses;
  }
  ToProto(statuses, NewResult(m, join.request_id, absl::OkStatus()));
  Send(std::move(m));
  EndOp();
}

void WorkStream::FlowAcross(uint64_t request_id, int max_in_flight) {
  std::vector<int> shares;
  uint64_t stream;
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    shares = Shares(max_in_flight);
    stream = stream_id_;
    for (const auto& [address, upstream] : upstreams_) addresses.push_back(address);
  }
  size_t share = 0;
  absl::Status status = absl::OkStatus();
  if (stream != 0) status = broker_.SetFlow(stream, shares[share++]);
  for (const std::string& address : addresses) {
    v1::WorkRequest flow;
    flow.mutable_flow()->set_max_in_flight(shares[share++]);
    Relay(address, std::move(flow), Relayed{.kind = Relayed::Kind::kFlow});
  }
  Answer(request_id, status);
}

void WorkStream::OnUpstreamMessage(const std::string& address, v1::WorkResponse message) {
  if (!message.has_result()) {
    Send(std::move(message));  // a push: relayed as is
    return;
  }
  Relayed relayed;
  {
    absl::MutexLock lock(&mu_);
    auto it = relayed_.find(message.result().request_id());
    if (it == relayed_.end()) return;
    relayed = std::move(it->second);
    relayed_.erase(it);
  }
  const v1::WorkResult& result = message.result();
  const absl::Status status(static_cast<absl::StatusCode>(result.code()), result.message());
  switch (relayed.kind) {
    case Relayed::Kind::kAnswer:
      message.mutable_result()->set_request_id(relayed.client_request_id);
      Send(std::move(message));
      EndOp();
      return;
    case Relayed::Kind::kBatchPart: {
      std::vector<absl::Status> part(relayed.indexes.size(), status);
      if (status.ok()) {
        for (const v1::ItemError& e : result.item_errors()) {
          if (e.index() >= 0 && static_cast<size_t>(e.index()) < part.size())
            part[e.index()] = absl::Status(static_cast<absl::StatusCode>(e.code()), e.message());
        }
      }
      if (relayed.join->Add(relayed.indexes, part)) FinishJoin(*relayed.join);
      return;
    }
    case Relayed::Kind::kSubscribe:
      if (!status.ok()) {
        End(absl::Status(status.code(),
                         absl::StrCat("subscribe at ", address, ": ", status.message())));
      }
      return;
    case Relayed::Kind::kFlow:
      return;
  }
}

void WorkStream::OnUpstreamEnd(const std::string& address, const grpc::Status& status) {
  const absl::Status why = absl::UnavailableError(
      absl::StrCat("the stream to the leader at ", address, " ended (",
                   status.ok() ? "OK" : status.error_message(), "); reconnect"));
  std::vector<Relayed> owed;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = relayed_.begin(); it != relayed_.end();) {
      if (it->second.address == address) {
        owed.push_back(std::move(it->second));
        relayed_.erase(it++);
      } else {
        ++it;
      }
    }
    auto upstream = upstreams_.find(address);
    if (upstream != upstreams_.end()) upstream->second = nullptr;
  }
  for (Relayed& relayed : owed) {
    if (relayed.kind == Relayed::Kind::kAnswer) {
      Answer(relayed.client_request_id, why);
      EndOp();
    } else if (relayed.kind == Relayed::Kind::kBatchPart) {
      if (relayed.join->AddAll(relayed.indexes, why)) FinishJoin(*relayed.join);
    }
  }
  // A worker that still talks is told to reconnect: its queues there get no more jobs here. One
  // that has stopped talking closed the upstream itself (CloseWrites): the stream just ends.
  bool closing;
  {
    absl::MutexLock lock(&mu_);
    closing = read_closed_ || cancelled_;
  }
  if (closing && status.ok()) {
    Pump();
    return;
  }
  End(why);
}

std::vector<std::shared_ptr<WorkUpstream>> WorkStream::Upstreams() {
  std::vector<std::shared_ptr<WorkUpstream>> upstreams;
  absl::MutexLock lock(&mu_);
  for (const auto& [address, upstream] : upstreams_) {
    if (upstream != nullptr) upstreams.push_back(upstream);
  }
  return upstreams;
}

void WorkStream::Answer(uint64_t request_id, const absl::Status& status) {
  v1::WorkResponse m;
  NewResult(m, request_id, status);
  Send(std::move(m));
}

// Once the stream is cancelled or finished the outbox is closed: what is pushed then is unsent,
// and Pump gives its leases back.
void WorkStream::Send(v1::WorkResponse message) {
  {
    absl::MutexLock lock(&mu_);
    outbox_.Push(std::move(message));
  }
  Pump();
}

void WorkStream::SendAll(std::vector<v1::WorkResponse> messages) {
  if (messages.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    for (v1::WorkResponse& m : messages) outbox_.Push(std::move(m));
  }
  Pump();
}

void WorkStream::GiveBack(const std::vector<v1::WorkResponse>& unsent) {
  // Answers and notices among them need nothing undone: only the pushed jobs.
  ForEachLease(unsent, [this](const v1::LeasedJob& job) {
    const SharedCount& given_back = limit_->given_back_count();
    if (!router_.cluster_mode()) return GiveBackHere(broker_, job, given_back);
    const Route route = router_.RouteOf(router_.PartitionOfJob(job.job_id()), forwarded_);
    switch (route.kind) {
      case Route::Kind::kLocal:
        return GiveBackHere(broker_, job, given_back);
      case Route::Kind::kForward:
        // Relayed from the job's leader, which thinks it delivered (to this node's upstream).
        if (forwarder_ != nullptr && !forwarded_)
          GiveBackAt(forwarder_->DetachedAt(route.address, authorization_), job, given_back);
        return;
      case Route::Kind::kUnavailable:
        return;  // no leader now: the lease runs out under the next one
    }
  });
}

void WorkStream::GiveBackAt(const Forwarder::Detached& leader, const v1::LeasedJob& job,
                            SharedCount given_back) {
  // Not on the stream's context: its client is gone, and with it its cancellation.
  struct Call {
    std::unique_ptr<v1::Broker::Stub> stub;
    std::unique_ptr<grpc::ClientContext> ctx;
    v1::ReleaseRequest request;
    v1::ReleaseResponse response;
  };
  auto call = std::make_shared<Call>();
  call->stub = v1::Broker::NewStub(leader.channel);
  call->ctx = leader.NewContext(kGiveBackTimeout);
  call->request.set_job_id(job.job_id());
  call->request.set_lease_id(job.lease_id());
  // As on this node, a refusal means the lease already ended; an unreachable leader lets it run
  // out.
  call->stub->async()->Release(call->ctx.get(), &call->request, &call->response,
                               [call, given_back = std::move(given_back)](grpc::Status status) {
                                 if (status.ok())
                                   given_back->fetch_add(1, std::memory_order_relaxed);
                               });
}

void WorkStream::End(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!ended_.has_value()) ended_ = std::move(status);
  }
  Pump();
}

void WorkStream::BeginOp() {
  absl::MutexLock lock(&mu_);
  ++pending_ops_;
}

void WorkStream::EndOp() {
  {
    absl::MutexLock lock(&mu_);
    --pending_ops_;
  }
  Pump();
}

void WorkStream::Pump() {
  const v1::WorkResponse* to_write = nullptr;
  bool resume_read = false;
  std::optional<grpc::Status> finish;
  std::vector<v1::WorkResponse> unsent;
  {
    absl::MutexLock lock(&mu_);
    if (!finished_) {
      if (!outbox_.writing() && !cancelled_) {
        if (batch_pushes_) CoalesceJobsLocked();
        to_write = outbox_.NextToWrite();
      }
      if (read_paused_ && outbox_.size() < kMaxOutbox / 2 && !read_closed_ && !cancelled_) {
        read_paused_ = false;
        resume_read = true;
      }
      bool done_talking = read_closed_ || cancelled_ || ended_.has_value();
      if (done_talking && pending_ops_ == 0 && !outbox_.writing() &&
          (cancelled_ || outbox_.drained())) {
        finished_ = true;
        outbox_.Close();
        if (cancelled_) {
          finish = grpc::Status::CANCELLED;
        } else {
          finish = ToGrpcStatus(ended_.value_or(absl::OkStatus()));
        }
      }
    }
    unsent = outbox_.TakeUnsent();
  }
  if (!unsent.empty()) GiveBack(unsent);
  if (to_write != nullptr) StartWrite(to_write);
  if (resume_read) StartRead(&request_);
  if (finish.has_value()) Finish(*finish);
}

void WorkStream::CoalesceJobsLocked() {
  std::deque<v1::WorkResponse>& waiting = outbox_.waiting();
  if (waiting.size() < 2 || !waiting[0].has_job() || !waiting[1].has_job()) return;
  v1::WorkResponse batch;
  v1::JobBatch* jobs = batch.mutable_job_batch();
  size_t bytes = 0;
  while (!waiting.empty() && waiting.front().has_job() && jobs->jobs_size() < kMaxJobsPerBatch) {
    v1::LeasedJob* job = waiting.front().mutable_job();
    // Roughly its encoded size: a batch stays far below clients' message size limits.
    const size_t size = job->payload().size() + job->checkpoint().size() + 256;
    if (jobs->jobs_size() > 0 && bytes + size > kMaxBatchBytes) break;
    bytes += size;
    jobs->add_jobs()->Swap(job);
    waiting.pop_front();
  }
  waiting.push_front(std::move(batch));
}

void WorkStream::OnWriteDone(bool ok) {
  uint64_t stream = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!outbox_.WriteDone(ok)) {  // the client is gone
      cancelled_ = true;
      stream = stream_id_;
    }
  }
  // At once, not at OnCancel: a lease given back must not be pushed to this stream again.
  if (stream != 0) broker_.Unsubscribe(stream);
  Pump();
}

void WorkStream::OnCancel() {
  uint64_t stream;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    outbox_.Close();
    stream = stream_id_;
  }
  if (stream != 0) broker_.Unsubscribe(stream);
  // Drained, not cancelled: the leader unsubscribes at once and sends what it had pushed, which
  // is given back (GiveBack, or the upstream's own callback once this stream is gone).
  for (const auto& upstream : Upstreams()) upstream->CloseWrites();
  Pump();
}

void WorkStream::OnDone() {
  uint64_t stream;
  uint64_t listener;
  bool relaying;
  {
    absl::MutexLock lock(&mu_);
    stream = stream_id_;
    listener = listener_;
    relaying = relaying_;
  }
  if (relaying) limit_->RemoveRelaying();
  if (stream != 0) broker_.Unsubscribe(stream);
  for (const auto& upstream : Upstreams()) upstream->CloseWrites();  // as in OnCancel
  if (listener != 0) router_.Unlisten(listener);
  limit_->Release();
  self_.reset();  // may delete this
}

}  // namespace jobbroker::server
