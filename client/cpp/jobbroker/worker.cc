#include "jobbroker/worker.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <deque>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "jobbroker/client.h"
#include "jobbroker/proto_time.h"
#include "jobbroker/router.h"
#include "jobbroker/v1/broker.grpc.pb.h"

namespace jobbroker::client {
namespace {

// absl::Status payloads that carry a handler's wish to the worker.
constexpr char kPermanentUrl[] = "type.jobbroker.dev/permanent";
constexpr char kRetryAfterUrl[] = "type.jobbroker.dev/retry_after";
constexpr char kSnoozeUrl[] = "type.jobbroker.dev/snooze";

std::string DefaultWorkerId() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return absl::StrCat(host, "-", getpid());
}

// Deadline of each GetCluster the worker sends before it connects. Shorter than a call's
// default, because Stop() waits for a refresh under way.
constexpr absl::Duration kGetClusterTimeout = absl::Seconds(5);

// The broker takes at most 1000 acks per AckBatch.
constexpr int kMaxAcksPerMessage = 1000;

bool LeaseGone(int code) {
  return code == grpc::StatusCode::FAILED_PRECONDITION || code == grpc::StatusCode::NOT_FOUND;
}

}  // namespace

absl::Status PermanentError(absl::string_view message) {
  absl::Status s = absl::FailedPreconditionError(message);
  s.SetPayload(kPermanentUrl, absl::Cord("1"));
  return s;
}

absl::Status RetryAfter(absl::Duration delay, absl::string_view message) {
  absl::Status s = absl::UnavailableError(message);
  s.SetPayload(kRetryAfterUrl, absl::Cord(absl::FormatDuration(delay)));
  return s;
}

absl::Status Snooze(absl::Duration delay) {
  absl::Status s =
      absl::UnavailableError(absl::StrCat("snoozed for ", absl::FormatDuration(delay)));
  s.SetPayload(kSnoozeUrl, absl::Cord(absl::FormatDuration(delay)));
  return s;
}

// What a running job shares between its handler and the worker's threads.
struct JobContext::Shared {
  mutable absl::Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  std::optional<std::string> checkpoint ABSL_GUARDED_BY(mu);  // saved, not yet sent
  std::optional<std::string> progress ABSL_GUARDED_BY(mu);    // reported, not yet sent
  std::string result ABSL_GUARDED_BY(mu);

  void Cancel() {
    absl::MutexLock lock(&mu);
    cancelled = true;
  }
  std::optional<std::string> TakeCheckpoint() {
    absl::MutexLock lock(&mu);
    std::optional<std::string> c = std::move(checkpoint);
    checkpoint.reset();
    return c;
  }
  std::optional<std::string> TakeProgress() {
    absl::MutexLock lock(&mu);
    std::optional<std::string> p = std::move(progress);
    progress.reset();
    return p;
  }
};

void JobContext::SetProgress(std::string progress) {
  absl::MutexLock lock(&shared_->mu);
  shared_->progress = std::move(progress);
}

absl::Time JobContext::timeout_at() const {
  return IsSet(job_.timeout_at()) ? FromProtoTimestamp(job_.timeout_at()) : absl::InfiniteFuture();
}

void JobContext::SaveCheckpoint(std::string data) {
  absl::MutexLock lock(&shared_->mu);
  shared_->checkpoint = std::move(data);
}

void JobContext::SetResult(std::string result) {
  absl::MutexLock lock(&shared_->mu);
  shared_->result = std::move(result);
}

bool JobContext::cancelled() const {
  if (absl::Now() >= timeout_at()) return true;
  absl::MutexLock lock(&shared_->mu);
  return shared_->cancelled;
}

class Worker::Impl {
 public:
  explicit Impl(WorkerOptions options) : options_(std::move(options)) {
    if (options_.worker_id.empty()) options_.worker_id = DefaultWorkerId();
    if (options_.concurrency < 1) options_.concurrency = 1;
    if (options_.prefetch < 0) options_.prefetch = 0;
    if (options_.token.empty()) options_.token = DefaultToken();
    router_ = std::make_unique<Router>(Router::Options::From(options_.address, options_.addresses,
                                                             options_.tls, options_.token,
                                                             kGetClusterTimeout, options_.channel));
  }

  void Handle(std::string queue, Handler handler) {
    absl::MutexLock lock(&mu_);
    handlers_[std::move(queue)] = std::move(handler);
  }

  absl::Status Start() {
    {
      absl::MutexLock lock(&mu_);
      if (handlers_.empty())
        return absl::FailedPreconditionError("register a handler with Handle() before Start()");
      if (started_) return absl::FailedPreconditionError("the worker has already started");
      started_ = true;
    }
    for (int i = 0; i < options_.concurrency; ++i)
      handler_threads_.emplace_back([this] { HandlerLoop(); });
    heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
    connection_thread_ = std::thread([this] { ConnectionLoop(); });

    // A refused subscription (a bad queue name) is the caller's mistake: report it. A broker
    // that is not there yet is not: keep trying in the background.
    absl::Status first;
    {
      absl::MutexLock lock(&mu_);
      auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return first_subscribe_.has_value();
      };
      mu_.AwaitWithTimeout(absl::Condition(&answered), absl::Seconds(10));
      if (first_subscribe_.has_value()) first = *first_subscribe_;
    }
    if (!first.ok() && first.code() != absl::StatusCode::kUnavailable) {
      Stop(absl::ZeroDuration());
      return first;
    }
    return absl::OkStatus();
  }

  void Stop(absl::Duration grace) {
    {
      absl::MutexLock lock(&mu_);
      if (!started_) return;
      if (stopping_) {  // another thread is stopping it: wait for that
        mu_.Await(absl::Condition(&stopped_));
        return;
      }
      stopping_ = true;
    }
    const absl::Time deadline = absl::Now() + grace;
    // No new jobs; those received but not started go back at once.
    v1::WorkRequest flow;
    flow.mutable_flow()->set_max_in_flight(0);
    Write(flow);
    ReleaseQueued();
    {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return running_.empty() && pending_.empty() && acks_.empty();
      };
      mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
      // Past the grace period: ask the stragglers to stop, and wait for them to return.
      for (auto& [id, h] : held_) h.shared->Cancel();
      auto handlers_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_.empty(); };
      mu_.Await(absl::Condition(&handlers_done));
      // Answers to the last acks still get a moment, bounded by the grace period.
      mu_.AwaitWithDeadline(absl::Condition(&idle), std::max(deadline, absl::Now()));
      closing_ = true;
      job_cv_.SignalAll();
    }
    for (std::thread& t : handler_threads_) t.join();
    heartbeat_thread_.join();
    {
      absl::MutexLock lock(&write_mu_);
      if (context_ != nullptr) context_->TryCancel();
    }
    connection_thread_.join();
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&stopped_));
  }

  Stats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  bool running() const {
    absl::MutexLock lock(&mu_);
    return started_ && !stopped_;
  }

 private:
  // A job this worker holds: waiting for a handler thread, or running.
  struct Held {
    v1::LeasedJob job;
    std::shared_ptr<JobContext::Shared> shared;
    absl::Duration lease;  // as granted: deadline - arrival
    absl::Time next_heartbeat;
    bool lost = false;  // the broker says the lease is gone: heartbeats stop
  };

  // Writes on the current stream; false if there is none (the request stays pending, if it
  // is one, and goes out again after the reconnect).
  bool Write(const v1::WorkRequest& request) {
    absl::MutexLock lock(&write_mu_);
    if (stream_ == nullptr) return false;
    return stream_->Write(request);
  }

  uint64_t NextRequestIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_request_id_++; }

  // The node to open the Work stream on: the leader of every handled queue if they share one,
  // else any node (it serves all partitions through one stream).
  std::shared_ptr<const Router::Node> StreamNode() {
    std::vector<std::string> queues;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [queue, handler] : handlers_) queues.push_back(queue);
    }
    const RoutingTable table = router_->Table();
    if (!table.is_cluster()) return router_->NodeFor(Router::Route::Any());
    std::set<std::string> leaders;
    for (const std::string& queue : queues) leaders.insert(table.AddressOfQueue(queue));
    if (leaders.size() == 1) return router_->NodeAt(*leaders.begin());
    return router_->NodeAt(table.AnyAddress());
  }

  void ConnectionLoop() {
    absl::Duration backoff = options_.reconnect_initial;
    while (true) {
      const std::shared_ptr<const Router::Node> node = StreamNode();
      auto context = std::make_unique<grpc::ClientContext>();
      if (absl::Status s = AddBearerToken(options_.token, context.get()); !s.ok()) {
        absl::MutexLock lock(&mu_);
        if (!first_subscribe_.has_value()) first_subscribe_ = s;
        return;  // a token that cannot be sent never will be: Start() reports it
      }
      std::unique_ptr<grpc::ClientReaderWriter<v1::WorkRequest, v1::WorkResponse>> stream =
          node->broker->Work(context.get());
      std::vector<v1::WorkRequest> resend;
      v1::WorkRequest subscribe;
      {
        absl::MutexLock lock(&mu_);
        if (closing_) {
          context->TryCancel();
          stream->Finish().ok();
          return;
        }
        if (!stopping_) {
          subscribe.set_request_id(NextRequestIdLocked());
          subscribe_request_ = subscribe.request_id();
          v1::SubscribeRequest* s = subscribe.mutable_subscribe();
          for (const auto& [queue, handler] : handlers_) s->add_queues(queue);
          s->set_worker_id(options_.worker_id);
          s->set_max_in_flight(options_.concurrency + options_.prefetch);
          s->set_batch_pushes(true);
          if (options_.lease_duration > absl::ZeroDuration())
            *s->mutable_lease_duration() = ToProtoDuration(options_.lease_duration);
        }
        // Acks, fails and releases the last stream did not answer: they are idempotent per
        // lease, so sending them again is safe.
        for (const auto& [id, request] : pending_) resend.push_back(request);
      }
      {
        absl::MutexLock lock(&write_mu_);
        stream_ = stream.get();
        context_ = context.get();
      }
      if (subscribe.has_subscribe()) Write(subscribe);
      for (const v1::WorkRequest& r : resend) Write(r);

      v1::WorkResponse message;
      bool subscribed = false;
      while (stream->Read(&message)) subscribed |= OnMessage(message);
      {
        absl::MutexLock lock(&write_mu_);  // no Write is under way once this is held
        stream_ = nullptr;
        context_ = nullptr;
      }
      grpc::Status end = stream->Finish();
      // The node may have died or stopped leading the queues: ask where they are now.
      router_->MarkStale();
      {
        absl::MutexLock lock(&mu_);
        if (!first_subscribe_.has_value())
          first_subscribe_ =
              absl::Status(static_cast<absl::StatusCode>(end.error_code()), end.error_message());
        if (closing_) return;
        ++stats_.reconnects;
        if (subscribed) backoff = options_.reconnect_initial;
        // Sleep the backoff, but wake at once for Stop.
        auto closing = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&closing), backoff)) return;
      }
      backoff = std::min(backoff * 2, options_.reconnect_max);
    }
  }

  // Returns true for the answer that accepted this stream's subscription.
  bool OnMessage(const v1::WorkResponse& m) {
    std::vector<v1::WorkRequest> to_send;
    bool subscribed = false;
    bool flush_acks = false;  // the ack message in flight was answered: send what waited
    {
      absl::MutexLock lock(&mu_);
      switch (m.response_case()) {
        case v1::WorkResponse::kJob:
          AcceptLocked(m.job(), absl::Now(), to_send);
          break;
        case v1::WorkResponse::kJobBatch: {
          const absl::Time now = absl::Now();
          for (const v1::LeasedJob& job : m.job_batch().jobs()) AcceptLocked(job, now, to_send);
          break;
        }
        case v1::WorkResponse::kResult: {
          const v1::WorkResult& r = m.result();
          if (r.request_id() == subscribe_request_) {
            absl::Status s(static_cast<absl::StatusCode>(r.code()), r.message());
            if (!first_subscribe_.has_value()) first_subscribe_ = s;
            subscribed = s.ok();
            if (!s.ok()) std::cerr << "jobbroker worker: subscribe refused: " << s << "\n";
          } else if (auto p = pending_.find(r.request_id()); p != pending_.end()) {
            if (r.code() != 0 && !LeaseGone(r.code()))
              std::cerr << "jobbroker worker: " << r.message() << "\n";
            for (const v1::ItemError& e : r.item_errors()) {
              if (!LeaseGone(e.code())) std::cerr << "jobbroker worker: " << e.message() << "\n";
            }
            pending_.erase(p);
            if (r.request_id() == ack_request_) {
              ack_request_ = 0;
              flush_acks = true;
            }
          } else if (auto hb = heartbeats_.find(r.request_id()); hb != heartbeats_.end()) {
            if (auto h = held_.find(hb->second); h != held_.end()) {
              if (LeaseGone(r.code())) {
                h->second.lost = true;
                h->second.shared->Cancel();
              } else if (r.cancel_requested()) {
                h->second.shared->Cancel();
              }
            }
            heartbeats_.erase(hb);
          }
          break;
        }
        case v1::WorkResponse::kLeaseLost:
          if (auto h = held_.find(m.lease_lost().job_id()); h != held_.end()) {
            h->second.lost = true;
            h->second.shared->Cancel();
          }
          break;
        case v1::WorkResponse::kCancelRequested:
          if (auto h = held_.find(m.cancel_requested().job_id()); h != held_.end())
            h->second.shared->Cancel();
          break;
        case v1::WorkResponse::RESPONSE_NOT_SET:
          break;
      }
    }
    for (const v1::WorkRequest& r : to_send) Write(r);
    if (flush_acks) FlushAcks();
    return subscribed;
  }

  // A pushed job: queued for a handler thread, or straight back if the worker is stopping.
  void AcceptLocked(const v1::LeasedJob& job, absl::Time now, std::vector<v1::WorkRequest>& to_send)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Heartbeats follow the lease as granted; the floor guards against clock skew.
    absl::Duration lease =
        std::max(FromProtoTimestamp(job.lease_deadline()) - now, absl::Milliseconds(300));
    if (stopping_) {  // pushed before our flow 0 arrived: give it straight back
      to_send.push_back(ReleaseRequestLocked(job));
      return;
    }
    Held& h = held_[job.job_id()];
    h.job = job;
    h.shared = std::make_shared<JobContext::Shared>();
    h.lease = lease;
    h.next_heartbeat = now + lease / 3;
    queued_.push_back(job.job_id());
    job_cv_.Signal();
    heartbeat_wake_ = true;
  }

  v1::WorkRequest ReleaseRequestLocked(const v1::LeasedJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::WorkRequest r;
    r.set_request_id(NextRequestIdLocked());
    r.mutable_release()->set_job_id(job.job_id());
    r.mutable_release()->set_lease_id(job.lease_id());
    pending_[r.request_id()] = r;
    ++stats_.released;
    return r;
  }

  void ReleaseQueued() {
    std::vector<v1::WorkRequest> releases;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& id : queued_) {
        auto h = held_.find(id);
        releases.push_back(ReleaseRequestLocked(h->second.job));
        held_.erase(h);
      }
      queued_.clear();
    }
    for (const v1::WorkRequest& r : releases) Write(r);
  }

  void HandlerLoop() {
    while (true) {
      std::string id;
      v1::LeasedJob job;
      std::shared_ptr<JobContext::Shared> shared;
      Handler handler;
      {
        absl::MutexLock lock(&mu_);
        // A condition variable, not Await(Condition): with one waiter per handler thread, every
        // unlock of mu_ would evaluate all their conditions.
        while (queued_.empty() && !closing_) job_cv_.Wait(&mu_);
        if (queued_.empty()) return;
        id = queued_.front();
        queued_.pop_front();
        Held& h = held_.at(id);
        job = h.job;
        shared = h.shared;
        handler = handlers_.at(job.queue());
        running_.insert(id);
      }
      JobContext context(job, shared);
      absl::Status outcome;
      try {
        outcome = handler(context);
      } catch (const std::exception& e) {
        outcome = absl::UnknownError(absl::StrCat("handler threw: ", e.what()));
      } catch (...) {
        outcome = absl::UnknownError("handler threw a non-standard exception");
      }
      Complete(job, *shared, outcome);
    }
  }

  void Complete(const v1::LeasedJob& job, JobContext::Shared& shared, const absl::Status& outcome) {
    std::vector<v1::WorkRequest> out;
    {
      absl::MutexLock lock(&mu_);
      // A checkpoint saved since the last heartbeat still reaches the broker before a fail, so
      // the next attempt starts from it (requests on a stream are applied in order).
      if (std::optional<std::string> checkpoint = shared.TakeCheckpoint();
          checkpoint.has_value() && !outcome.ok()) {
        v1::WorkRequest hb;
        hb.set_request_id(NextRequestIdLocked());
        hb.mutable_heartbeat()->set_job_id(job.job_id());
        hb.mutable_heartbeat()->set_lease_id(job.lease_id());
        hb.mutable_heartbeat()->set_checkpoint(*checkpoint);
        heartbeats_[hb.request_id()] = job.job_id();
        out.push_back(std::move(hb));
      }
      held_.erase(job.job_id());
      running_.erase(job.job_id());
      absl::Duration snooze;
      if (absl::optional<absl::Cord> delay = outcome.GetPayload(kSnoozeUrl);
          delay.has_value() && absl::ParseDuration(std::string(*delay), &snooze)) {
        v1::WorkRequest r;
        r.set_request_id(NextRequestIdLocked());
        r.mutable_release()->set_job_id(job.job_id());
        r.mutable_release()->set_lease_id(job.lease_id());
        *r.mutable_release()->mutable_delay() = ToProtoDuration(snooze);
        ++stats_.snoozed;
        pending_[r.request_id()] = r;
        out.push_back(std::move(r));
      } else if (outcome.ok()) {
        v1::AckRequest& ack = acks_.emplace_back();
        ack.set_job_id(job.job_id());
        ack.set_lease_id(job.lease_id());
        absl::MutexLock shared_lock(&shared.mu);
        ack.set_result(shared.result);
        ++stats_.acked;
      } else {
        v1::WorkRequest r;
        r.set_request_id(NextRequestIdLocked());
        v1::FailRequest* f = r.mutable_fail();
        f->set_job_id(job.job_id());
        f->set_lease_id(job.lease_id());
        f->set_error(std::string(outcome.message()));
        f->set_permanent(outcome.GetPayload(kPermanentUrl).has_value());
        if (absl::optional<absl::Cord> after = outcome.GetPayload(kRetryAfterUrl)) {
          absl::Duration d;
          if (absl::ParseDuration(std::string(*after), &d))
            *f->mutable_retry_after() = ToProtoDuration(d);
        }
        ++stats_.failed;
        pending_[r.request_id()] = r;
        out.push_back(std::move(r));
      }
    }
    for (const v1::WorkRequest& r : out) Write(r);
    if (outcome.ok()) FlushAcks();
  }

  // Sends the buffered acks, unless an ack message is still unanswered: then they wait for its
  // answer and go out together as one AckBatch. So an idle worker's ack goes out at once, and a
  // busy one sends one message per broker round trip (group commit from the worker's side).
  void FlushAcks() {
    v1::WorkRequest r;
    {
      absl::MutexLock lock(&mu_);
      if (ack_request_ != 0 || acks_.empty()) return;
      r.set_request_id(NextRequestIdLocked());
      const size_t n = std::min(acks_.size(), static_cast<size_t>(kMaxAcksPerMessage));
      if (n == 1) {
        *r.mutable_ack() = std::move(acks_.front());
      } else {
        for (size_t i = 0; i < n; ++i) *r.mutable_ack_batch()->add_acks() = std::move(acks_[i]);
      }
      acks_.erase(acks_.begin(), acks_.begin() + static_cast<std::ptrdiff_t>(n));
      pending_[r.request_id()] = r;
      ack_request_ = r.request_id();
    }
    // Without a stream the message stays in pending_ and goes out again after the reconnect,
    // where its answer clears ack_request_.
    Write(r);
  }

  void HeartbeatLoop() {
    while (true) {
      std::vector<v1::WorkRequest> beats;
      {
        absl::MutexLock lock(&mu_);
        absl::Time next = absl::InfiniteFuture();
        for (const auto& [id, h] : held_)
          if (!h.lost) next = std::min(next, h.next_heartbeat);
        auto wake = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || heartbeat_wake_; };
        mu_.AwaitWithDeadline(absl::Condition(&wake), next);
        if (closing_) return;
        heartbeat_wake_ = false;
        absl::Time now = absl::Now();
        for (auto& [id, h] : held_) {
          if (h.lost || h.next_heartbeat > now) continue;
          v1::WorkRequest r;
          r.set_request_id(NextRequestIdLocked());
          r.mutable_heartbeat()->set_job_id(id);
          r.mutable_heartbeat()->set_lease_id(h.job.lease_id());
          if (std::optional<std::string> c = h.shared->TakeCheckpoint())
            r.mutable_heartbeat()->set_checkpoint(*c);
          if (std::optional<std::string> p = h.shared->TakeProgress())
            r.mutable_heartbeat()->set_progress(*p);
          heartbeats_[r.request_id()] = id;
          h.next_heartbeat = now + h.lease / 3;
          beats.push_back(std::move(r));
        }
      }
      for (const v1::WorkRequest& r : beats) Write(r);
    }
  }

  WorkerOptions options_;
  std::unique_ptr<Router> router_;

  mutable absl::Mutex mu_;
  std::map<std::string, Handler> handlers_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // no new jobs
  bool closing_ ABSL_GUARDED_BY(mu_) = false;   // threads end
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool heartbeat_wake_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t subscribe_request_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> first_subscribe_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queued_ ABSL_GUARDED_BY(mu_);  // held, not started
  absl::CondVar job_cv_;  // signalled when queued_ grows or closing_ is set
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);                // started, not completed
  std::map<uint64_t, v1::WorkRequest> pending_ ABSL_GUARDED_BY(mu_);  // unanswered ack/fail/release
  std::map<uint64_t, std::string> heartbeats_ ABSL_GUARDED_BY(mu_);   // request id -> job id
  std::vector<v1::AckRequest> acks_ ABSL_GUARDED_BY(mu_);             // not yet sent
  uint64_t ack_request_ ABSL_GUARDED_BY(mu_) = 0;  // the unanswered ack message; 0 = none
  Stats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex write_mu_;  // one Write at a time; guards the current stream
  grpc::ClientReaderWriter<v1::WorkRequest, v1::WorkResponse>* stream_ ABSL_GUARDED_BY(write_mu_) =
      nullptr;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(write_mu_) = nullptr;

  std::vector<std::thread> handler_threads_;
  std::thread heartbeat_thread_;
  std::thread connection_thread_;
};

Worker::Worker(WorkerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Worker::~Worker() {
  if (impl_->running()) impl_->Stop(absl::Seconds(30));
}

void Worker::Handle(std::string queue, Handler handler) {
  impl_->Handle(std::move(queue), std::move(handler));
}

absl::Status Worker::Start() { return impl_->Start(); }
void Worker::Stop(absl::Duration grace) { impl_->Stop(grace); }
void Worker::Wait() { impl_->Wait(); }
Worker::Stats Worker::stats() const { return impl_->stats(); }

}  // namespace jobbroker::client
