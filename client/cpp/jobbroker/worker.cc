#include "jobbroker/worker.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <deque>
#include <exception>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <stop_token>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "jobbroker/client.h"
#include "jobbroker/proto_time.h"
#include "jobbroker/router.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "jobbroker/v1/steps.pb.h"

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

// Stream ends after which the worker reconnects (contract §5): the broker went away, shut down
// (OK) or was briefly overloaded. Any other code is the caller's mistake (a bad queue name, a
// token without the right), which retrying would only hide.
bool Reconnectable(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
      return true;
    default:
      return false;
  }
}

bool LeaseGone(int code) {
  return code == grpc::StatusCode::FAILED_PRECONDITION || code == grpc::StatusCode::NOT_FOUND;
}

// An answer to an ack, fail, release or checkpoint save that is not final (contract §4): the
// broker could not apply it now (in a cluster, the partition is between leaders) and says
// "retry". The lease may still be valid, so dropping the request would run the job again.
bool RetryLater(int code) { return code == grpc::StatusCode::UNAVAILABLE; }

// How long a request answered UNAVAILABLE waits before it goes out again on the same stream
// (a stream that ends first sends it on the next one).
constexpr absl::Duration kAnswerRetryDelay = absl::Milliseconds(250);

// Whether `text` is one JSON value (durable steps keep their results as JSON so that every
// language can read them). protobuf's parser is the JSON reader the library already links.
bool IsJson(const std::string& text) {
  google::protobuf::Value value;
  return google::protobuf::util::JsonStringToMessage(text, &value).ok();
}

// Reads a job's checkpoint as durable steps, by the rules of steps.proto: empty is no step yet;
// anything that is not a StepCheckpoint of uniquely named steps with JSON results was written by
// something else, and running steps again over it could repeat their side effects.
absl::StatusOr<v1::StepCheckpoint> ParseStepCheckpoint(const std::string& checkpoint) {
  v1::StepCheckpoint steps;
  if (checkpoint.empty()) return steps;
  auto not_steps = [](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job's checkpoint was not written by durable steps: ", why));
  };
  if (!steps.ParseFromString(checkpoint)) return not_steps("it is not a StepCheckpoint");
  if (steps.steps().empty()) return not_steps("it holds no step");
  std::set<std::string> names;
  for (const v1::CompletedStep& step : steps.steps()) {
    if (step.name().empty()) return not_steps("a step has no name");
    if (!names.insert(step.name()).second)
      return not_steps(absl::StrCat("step \"", step.name(), "\" appears twice"));
    if (!IsJson(step.result()))
      return not_steps(absl::StrCat("the result of step \"", step.name(), "\" is not JSON"));
  }
  return steps;
}

// `options` with the connection settings replaced by `client`'s.
WorkerOptions WithConnectionOf(const ClientOptions& client, WorkerOptions options) {
  options.address = client.address;
  options.addresses = client.addresses;
  options.channel = client.channel;
  options.tls = client.tls;
  options.token = client.token;
  return options;
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

bool IsSnooze(const absl::Status& status) { return status.GetPayload(kSnoozeUrl).has_value(); }

// Why a job's cancellation signal fired; the first reason is the one that decides what the
// worker answers when the handler returns.
enum class CancelReason { kNone, kOperator, kLeaseLost, kTimeout, kStopping };

// What a held job shares between its handler and the worker's threads. The lock order is the
// worker's mutex before this one; `wake_heartbeats` is called with neither held.
struct JobContext::Shared {
  // Constant after construction: asks the heartbeat thread to look at this job now.
  std::function<void()> wake_heartbeats;
  std::stop_source stop;  // thread-safe by itself

  mutable absl::Mutex mu;
  CancelReason cancel_reason ABSL_GUARDED_BY(mu) = CancelReason::kNone;
  std::string result ABSL_GUARDED_BY(mu);
  // The newest checkpoint and progress, each with a version bumped at every change: `sent` is
  // the version on the wire, `saved` the one the broker answered OK. A heartbeat carries what
  // is newer than `sent`; after a reconnect `sent` falls back to `saved`, so nothing is lost.
  std::string checkpoint ABSL_GUARDED_BY(mu);
  uint64_t checkpoint_version ABSL_GUARDED_BY(mu) = 0;
  uint64_t checkpoint_sent ABSL_GUARDED_BY(mu) = 0;
  uint64_t checkpoint_saved ABSL_GUARDED_BY(mu) = 0;
  // Why the broker refused a checkpoint (a lost lease, too large): Step reports it.
  absl::Status checkpoint_error ABSL_GUARDED_BY(mu);
  std::string progress ABSL_GUARDED_BY(mu);
  uint64_t progress_version ABSL_GUARDED_BY(mu) = 0;
  uint64_t progress_sent ABSL_GUARDED_BY(mu) = 0;
  uint64_t progress_saved ABSL_GUARDED_BY(mu) = 0;
  // Durable steps: read from the job's checkpoint at the first Step.
  bool steps_loaded ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<v1::StepCheckpoint> steps ABSL_GUARDED_BY(mu);
  std::set<std::string> steps_called ABSL_GUARDED_BY(mu);  // names used by this attempt

  void Cancel(CancelReason reason) {
    {
      absl::MutexLock lock(&mu);
      if (cancel_reason == CancelReason::kNone) cancel_reason = reason;
    }
    stop.request_stop();
  }
  CancelReason reason() const {
    absl::MutexLock lock(&mu);
    return cancel_reason;
  }
  bool HasUpdateToSend() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return checkpoint_version > checkpoint_sent || progress_version > progress_sent;
  }
};

void JobContext::SetProgress(std::string progress) {
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->progress = std::move(progress);
    ++shared_->progress_version;
  }
  shared_->wake_heartbeats();
}

absl::Time JobContext::enqueued_at() const { return FromProtoTimestamp(job_.enqueued_at()); }

absl::Time JobContext::lease_deadline() const { return FromProtoTimestamp(job_.lease_deadline()); }

absl::Time JobContext::timeout_at() const {
  return IsSet(job_.timeout_at()) ? FromProtoTimestamp(job_.timeout_at()) : absl::InfiniteFuture();
}

void JobContext::SaveCheckpoint(std::string data) {
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->checkpoint = std::move(data);
    ++shared_->checkpoint_version;
  }
  shared_->wake_heartbeats();
}

void JobContext::SetResult(std::string result) {
  absl::MutexLock lock(&shared_->mu);
  shared_->result = std::move(result);
}

bool JobContext::cancelled() const {
  // The time-out also counts before the heartbeat thread fired it: the attempt is over.
  return shared_->stop.stop_requested() || absl::Now() >= timeout_at();
}

std::stop_token JobContext::stop_token() const { return shared_->stop.get_token(); }

bool JobContext::WaitCancelled(absl::Duration duration) const {
  absl::Notification fired;
  std::stop_callback on_stop(shared_->stop.get_token(), [&fired] { fired.Notify(); });
  const absl::Time end = std::min(absl::Now() + duration, timeout_at());
  fired.WaitForNotificationWithDeadline(end);
  return cancelled();
}

absl::StatusOr<std::string> JobContext::Step(
    absl::string_view name, absl::FunctionRef<absl::StatusOr<std::string>()> body) {
  if (name.empty()) return absl::InvalidArgumentError("a step needs a name");
  {
    absl::MutexLock lock(&shared_->mu);
    if (!shared_->steps_loaded) {
      shared_->steps = ParseStepCheckpoint(job_.checkpoint());
      shared_->steps_loaded = true;
    }
    if (!shared_->steps.ok()) return shared_->steps.status();
    if (!shared_->steps_called.insert(std::string(name)).second)
      return absl::InvalidArgumentError(
          absl::StrCat("step \"", name, "\" ran twice in one job: step names must be unique"));
    for (const v1::CompletedStep& done : shared_->steps->steps())
      if (done.name() == name) return done.result();
  }
  absl::StatusOr<std::string> result = body();
  if (!result.ok()) return result.status();
  if (!IsJson(*result))
    return absl::InvalidArgumentError(
        absl::StrCat("the result of step \"", name, "\" is not JSON: ", *result));

  uint64_t version;
  {
    absl::MutexLock lock(&shared_->mu);
    v1::CompletedStep* done = shared_->steps->add_steps();
    done->set_name(std::string(name));
    done->set_result(*result);
    shared_->checkpoint = shared_->steps->SerializeAsString();
    version = ++shared_->checkpoint_version;
  }
  shared_->wake_heartbeats();
  // The step is done only once the broker holds its result: a crash after this returns must
  // not run the body again.
  // (Cancel sets the reason under the same mutex, so the wait wakes for it.)
  absl::MutexLock lock(&shared_->mu);
  auto answered = [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu) {
    return shared_->checkpoint_saved >= version || !shared_->checkpoint_error.ok() ||
           shared_->cancel_reason != CancelReason::kNone;
  };
  shared_->mu.Await(absl::Condition(&answered));
  if (shared_->checkpoint_saved >= version) return *result;
  if (!shared_->checkpoint_error.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("the broker refused the checkpoint of step \"", name,
                     "\": ", shared_->checkpoint_error.message()));
  return absl::CancelledError(
      absl::StrCat("the job was cancelled while step \"", name, "\" was being saved"));
}

class Worker::Impl : public std::enable_shared_from_this<Worker::Impl> {
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

  void Use(Middleware middleware) {
    absl::MutexLock lock(&mu_);
    middlewares_.push_back(std::move(middleware));
  }

  absl::Status Start() {
    {
      absl::MutexLock lock(&mu_);
      if (handlers_.empty())
        return absl::FailedPreconditionError("register a handler with Handle() before Start()");
      if (stopped_ && !started_) return absl::OkStatus();  // stopped before it started
      if (started_) return absl::FailedPreconditionError("the worker has already started");
      started_ = true;
      // Each handler inside the middlewares, once: the first added ends up outermost.
      for (auto& [queue, handler] : handlers_) {
        for (auto m = middlewares_.rbegin(); m != middlewares_.rend(); ++m) {
          handler = [middleware = *m, next = std::move(handler)](JobContext& job) {
            return middleware(job, next);
          };
        }
      }
    }
    // Detached, each holding the worker: a handler that ignores its cancellation may outlive
    // Stop (see there), and the worker must then outlive it.
    {
      absl::MutexLock lock(&mu_);
      live_handler_threads_ = options_.concurrency;
    }
    for (int i = 0; i < options_.concurrency; ++i)
      std::thread([self = shared_from_this()] { self->HandlerLoop(); }).detach();
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
    if (!first.ok() && !Reconnectable(first.code())) {
      Stop(absl::ZeroDuration());
      return first;
    }
    return absl::OkStatus();
  }

  void Stop(absl::Duration grace) {
    {
      absl::MutexLock lock(&mu_);
      if (!started_) {
        // A stop (a SIGTERM, say) that came before Start: Start and Run then do nothing.
        stopping_ = stopped_ = true;
        return;
      }
      if (stopping_) {  // another thread is stopping it: wait for that
        mu_.Await(absl::Condition(&stopped_));
        return;
      }
      stopping_ = true;
    }
    const absl::Time deadline = absl::Now() + grace;
    // 1. No new jobs. 2. Those received but not started go back at once.
    v1::WorkRequest flow;
    flow.mutable_flow()->set_max_in_flight(0);
    Write(flow);
    ReleaseQueued();
    {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return running_.empty() && pending_.empty() && acks_.empty() && ack_retry_.empty();
      };
      // 3. Grace: running handlers finish, their answers go out as usual.
      mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
      // 4. Past the grace: the stragglers' signal fires; their jobs are released whatever they
      // end with.
      for (auto& [lease, h] : held_) h.shared->Cancel(CancelReason::kStopping);
      auto handlers_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&handlers_done), kCancelledHandlersWait);
    }
    // 5. A handler that ignores its signal cannot be stopped: its job is released now, and its
    // own answer dropped when it returns (on its thread, which the worker leaves running).
    AbandonRunning();
    {
      absl::MutexLock lock(&mu_);
      auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return pending_.empty() && acks_.empty() && ack_retry_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&answered), kAnswersAfterGrace);
      closing_ = true;
      job_cv_.SignalAll();
      // Every handler thread not stuck in a handler ends now.
      auto idle_threads_gone = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return live_handler_threads_ == static_cast<int>(running_.size());
      };
      mu_.Await(absl::Condition(&idle_threads_gone));
    }
    heartbeat_thread_.join();
    // 6. Half-close, so the broker ends the stream cleanly; cancel it if it does not in time.
    {
      absl::MutexLock lock(&write_mu_);
      if (stream_ != nullptr) stream_->WritesDone();
    }
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&connection_done_), kHalfCloseTimeout);
    }
    {
      absl::MutexLock lock(&write_mu_);
      if (context_ != nullptr) context_->TryCancel();
    }
    connection_thread_.join();
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

  absl::Status Run() {
    if (absl::Status started = Start(); !started.ok()) return started;
    return AwaitEnd();
  }

  // Until Stop() finished, or the stream ended in a way reconnecting cannot fix: then the
  // worker stops itself (no grace: nothing it sends can reach the broker) and returns why.
  absl::Status AwaitEnd() {
    std::optional<absl::Status> fatal;
    {
      absl::MutexLock lock(&mu_);
      auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped_ || fatal_.has_value();
      };
      mu_.Await(absl::Condition(&ended));
      fatal = fatal_;
    }
    if (fatal.has_value()) {
      std::cerr << "jobbroker worker: stopping: " << *fatal << "\n";
      Stop(absl::ZeroDuration());
      return *fatal;
    }
    return absl::OkStatus();
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
  // How long handlers cancelled at the end of the grace may take to return.
  static constexpr absl::Duration kCancelledHandlersWait = absl::Seconds(1);
  // How long the answers of the last acks, fails and releases may take after that.
  static constexpr absl::Duration kAnswersAfterGrace = absl::Seconds(1);
  // How long a half-closed stream may take to end before the worker cancels it.
  static constexpr absl::Duration kHalfCloseTimeout = absl::Seconds(2);

  // A job this worker holds, by lease id (an attempt: after a lost lease the broker may push
  // the job's next attempt to this worker while the handler of the lost one still runs).
  struct Held {
    v1::LeasedJob job;
    std::shared_ptr<JobContext::Shared> shared;
    absl::Duration lease;  // as granted: deadline - arrival
    absl::Time next_heartbeat;
    absl::Time timeout_at = absl::InfiniteFuture();
    // The broker ended the attempt (lost lease, time-out): no heartbeat, no answer.
    bool ended_by_broker = false;
    // A heartbeat carrying a checkpoint or progress is unanswered: newer ones wait for it.
    bool update_in_flight = false;
    // That heartbeat was answered UNAVAILABLE: its checkpoint and progress go out again at
    // resend_at_ (update_in_flight stays set until then), or on the next stream.
    bool update_refused = false;
    // Released by a stop while its handler still ran: the handler's answer is dropped.
    bool abandoned = false;
  };
  // An unanswered heartbeat: whose, and which checkpoint and progress versions it carries.
  struct SentHeartbeat {
    std::string lease_id;
    uint64_t checkpoint_version = 0;  // 0: none
    uint64_t progress_version = 0;    // 0: none
  };

  // Writes on the current stream; false if there is none (the request stays pending, if it
  // is one, and goes out again after the reconnect).
  bool Write(const v1::WorkRequest& request) {
    absl::MutexLock lock(&write_mu_);
    if (stream_ == nullptr) return false;
    return stream_->Write(request);
  }

  uint64_t NextRequestIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_request_id_++; }

  // The held attempt of `job_id` the broker still counts as running (lease_lost and
  // cancel_requested name the job, not the lease).
  Held* FindLiveLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [lease, h] : held_)
      if (h.job.job_id() == job_id && !h.ended_by_broker) return &h;
    return nullptr;
  }

  // The broker ended the attempt: the handler's signal fires, nothing more goes out for it.
  void EndedByBrokerLocked(Held& h, CancelReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    h.ended_by_broker = true;
    h.shared->Cancel(reason);
    absl::MutexLock lock(&h.shared->mu);
    if (h.shared->checkpoint_error.ok())
      h.shared->checkpoint_error = absl::FailedPreconditionError("the job's lease is gone");
  }

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
    ConnectionLoopUntilClosed();
    absl::MutexLock lock(&mu_);
    connection_done_ = true;
  }

  void ConnectionLoopUntilClosed() {
    absl::Duration backoff = options_.reconnect_initial;
    while (true) {
      const std::shared_ptr<const Router::Node> node = StreamNode();
      auto context = std::make_unique<grpc::ClientContext>();
      if (absl::Status s = AddCallMetadata(options_.token, context.get()); !s.ok()) {
        absl::MutexLock lock(&mu_);
        if (!first_subscribe_.has_value()) first_subscribe_ = s;
        return;  // a token that cannot be sent never will be: Start() reports it
      }
      if (!AwaitConnected(*node)) return;
      std::unique_ptr<grpc::ClientReaderWriter<v1::WorkRequest, v1::WorkResponse>> stream =
          node->broker->Work(context.get());
      {
        // Held across the subscription and the resends, so that every other Write goes after
        // them, and none of the requests made meanwhile is missed by both.
        absl::MutexLock write_lock(&write_mu_);
        std::vector<v1::WorkRequest> first_messages;
        {
          absl::MutexLock lock(&mu_);
          if (closing_) {
            context->TryCancel();
            stream->Finish().ok();
            return;
          }
          first_messages = OpeningMessagesLocked();
        }
        stream_ = stream.get();
        context_ = context.get();
        for (const v1::WorkRequest& r : first_messages) stream->Write(r);
      }

      v1::WorkResponse message;
      bool subscribed = false;
      // A refused subscription ends the stream here, whatever the code: the broker may leave
      // the stream open without pushing anything (contract §5). Below, a code reconnecting can
      // fix (UNAVAILABLE: a queue's partition has no leader yet) reconnects after the backoff;
      // any other ends the run call.
      std::optional<absl::Status> refused;
      while (!refused.has_value() && stream->Read(&message))
        subscribed |= OnMessage(message, refused);
      if (refused.has_value()) context->TryCancel();
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
        const absl::Status ended = refused.value_or(
            absl::Status(static_cast<absl::StatusCode>(end.error_code()), end.error_message()));
        if (!first_subscribe_.has_value()) first_subscribe_ = ended;
        if (closing_) return;
        if (!Reconnectable(ended.code())) {
          fatal_ = ended;
          return;
        }
        ++stats_.reconnects;
        if (subscribed) backoff = options_.reconnect_initial;
        // Sleep the backoff (full jitter), but wake at once for Stop.
        auto closing = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&closing),
                                 backoff * absl::Uniform(bitgen_, 0.0, 1.0)))
          return;
      }
      backoff = std::min(backoff * 2, options_.reconnect_max);
    }
  }

  // Waits until the node's channel is connected, for at most the longest reconnect backoff
  // (then the stream is opened anyway: its failure is the next backoff's cause). gRPC fails a
  // stream opened while the channel backs off from a failed connect at once, and its backoff
  // runs beside the worker's: without this wait, a broker back after a restart could wait for
  // the sum of both. False if the worker is closing.
  bool AwaitConnected(const Router::Node& node) {
    if (node.channel == nullptr) return true;
    grpc::experimental::ChannelResetConnectionBackoff(node.channel.get());
    const absl::Time give_up = absl::Now() + options_.reconnect_max;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (closing_) return false;
      }
      // Short slices, so that Stop is not kept waiting.
      const absl::Time slice = std::min(give_up, absl::Now() + absl::Milliseconds(100));
      if (node.channel->WaitForConnected(absl::ToChronoTime(slice))) return true;
      if (absl::Now() >= give_up) return true;
    }
  }

  // What a new stream starts with: the subscription (unless stopping), then the acks, fails and
  // releases the last stream did not answer or answered UNAVAILABLE (idempotent per lease, so
  // sending them again is safe). Heartbeats are not replayed: every held job's heartbeat, with its
  // unsaved checkpoint and progress, goes out again at once.
  std::vector<v1::WorkRequest> OpeningMessagesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<v1::WorkRequest> out;
    if (!stopping_) {
      v1::WorkRequest& subscribe = out.emplace_back();
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
    // What was answered UNAVAILABLE goes out now rather than after its delay: pending_ holds
    // it still, and the acks of an AckBatch refused item by item go back in front of the line.
    refused_.clear();
    resend_at_ = absl::InfiniteFuture();
    for (const auto& [id, request] : pending_) out.push_back(request);
    RequeueRefusedAcksLocked();
    if (std::optional<v1::WorkRequest> acks = NextAckMessageLocked()) out.push_back(*acks);
    heartbeats_.clear();
    const absl::Time now = absl::Now();
    for (auto& [lease, h] : held_) {
      h.update_in_flight = false;
      h.update_refused = false;
      h.next_heartbeat = now;
      absl::MutexLock lock(&h.shared->mu);
      h.shared->checkpoint_sent = h.shared->checkpoint_saved;
      h.shared->progress_sent = h.shared->progress_saved;
    }
    heartbeat_wake_ = true;
    return out;
  }

  // Returns true for the answer that accepted this stream's subscription; sets `refused` to
  // the answer that refused it (the stream then ends; see ConnectionLoopUntilClosed).
  bool OnMessage(const v1::WorkResponse& m, std::optional<absl::Status>& refused) {
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
            if (!s.ok()) {
              std::cerr << "jobbroker worker: subscribe refused: " << s << "\n";
              refused = s;
            }
          } else if (auto p = pending_.find(r.request_id()); p != pending_.end()) {
            if (RetryLater(r.code())) {
              // Not final: the request stays pending (an ack message stays the one in flight,
              // so the acks ending meanwhile wait for its answer) and goes out again after
              // kAnswerRetryDelay, or on the next stream if this one ends first.
              std::cerr << "jobbroker worker: refused for now, sending it again: " << r.message()
                        << "\n";
              refused_.insert(r.request_id());
              ScheduleResendLocked();
              break;
            }
            // A stale lease's answer is final: the broker already ended that attempt.
            if (r.code() != 0 && !LeaseGone(r.code()))
              std::cerr << "jobbroker worker: " << r.message() << "\n";
            for (const v1::ItemError& e : r.item_errors()) {
              if (RetryLater(e.code()) && p->second.has_ack_batch() && e.index() >= 0 &&
                  e.index() < p->second.ack_batch().acks_size()) {
                // That ack alone was not applied: it goes back in line after the delay.
                std::cerr << "jobbroker worker: ack refused for now, sending it again: "
                          << e.message() << "\n";
                ack_retry_.push_back(p->second.ack_batch().acks(e.index()));
                ScheduleResendLocked();
              } else if (!LeaseGone(e.code())) {
                std::cerr << "jobbroker worker: " << e.message() << "\n";
              }
            }
            pending_.erase(p);
            if (r.request_id() == ack_request_) {
              ack_request_ = 0;
              flush_acks = true;
            }
          } else if (auto hb = heartbeats_.find(r.request_id()); hb != heartbeats_.end()) {
            OnHeartbeatAnswerLocked(hb->second, r);
            heartbeats_.erase(hb);
          }
          break;
        }
        case v1::WorkResponse::kLeaseLost:
          if (Held* h = FindLiveLocked(m.lease_lost().job_id())) {
            EndedByBrokerLocked(*h, m.lease_lost().outcome() == v1::ATTEMPT_OUTCOME_TIMED_OUT
                                        ? CancelReason::kTimeout
                                        : CancelReason::kLeaseLost);
          }
          break;
        case v1::WorkResponse::kCancelRequested:
          if (Held* h = FindLiveLocked(m.cancel_requested().job_id()))
            h->shared->Cancel(CancelReason::kOperator);
          break;
        case v1::WorkResponse::RESPONSE_NOT_SET:
          break;
      }
    }
    for (const v1::WorkRequest& r : to_send) Write(r);
    if (flush_acks) FlushAcks();
    return subscribed;
  }

  void OnHeartbeatAnswerLocked(const SentHeartbeat& sent, const v1::WorkResult& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = held_.find(sent.lease_id);
    if (it == held_.end()) return;
    Held& h = it->second;
    const bool update = sent.checkpoint_version != 0 || sent.progress_version != 0;
    if (update && RetryLater(r.code()) && !h.ended_by_broker) {
      // Not final: the checkpoint and progress go out again after kAnswerRetryDelay (a Step
      // waits for that answer), or on the next stream. A plain heartbeat's next one is due
      // anyway.
      std::cerr << "jobbroker worker: checkpoint of " << h.job.job_id()
                << " refused for now, sending it again: " << r.message() << "\n";
      h.update_refused = true;
      ScheduleResendLocked();
      if (r.cancel_requested()) h.shared->Cancel(CancelReason::kOperator);
      return;
    }
    if (update) {
      h.update_in_flight = false;
      heartbeat_wake_ = true;  // a newer checkpoint or progress may be waiting for this answer
    }
    if (LeaseGone(r.code())) {
      EndedByBrokerLocked(h, CancelReason::kLeaseLost);
      return;
    }
    {
      absl::MutexLock lock(&h.shared->mu);
      if (r.code() != 0) {
        std::cerr << "jobbroker worker: heartbeat of " << h.job.job_id() << ": " << r.message()
                  << "\n";
        if (sent.checkpoint_version != 0)
          h.shared->checkpoint_error =
              absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
      } else {
        h.shared->checkpoint_saved = std::max(h.shared->checkpoint_saved, sent.checkpoint_version);
        h.shared->progress_saved = std::max(h.shared->progress_saved, sent.progress_version);
      }
    }
    if (r.cancel_requested()) h.shared->Cancel(CancelReason::kOperator);
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
    Held& h = held_[job.lease_id()];
    h.job = job;
    h.shared = std::make_shared<JobContext::Shared>();
    h.shared->wake_heartbeats = [this] {
      absl::MutexLock lock(&mu_);
      heartbeat_wake_ = true;
    };
    h.lease = lease;
    h.next_heartbeat = now + lease / 3;
    if (IsSet(job.timeout_at())) h.timeout_at = FromProtoTimestamp(job.timeout_at());
    queued_.push_back(job.lease_id());
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

  void AbandonRunning() {
    std::vector<v1::WorkRequest> releases;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& lease : running_) {
        Held& h = held_.at(lease);
        if (h.abandoned) continue;
        h.abandoned = true;
        if (!h.ended_by_broker) releases.push_back(ReleaseRequestLocked(h.job));
      }
    }
    for (const v1::WorkRequest& r : releases) Write(r);
  }

  void ReleaseQueued() {
    std::vector<v1::WorkRequest> releases;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& lease : queued_) {
        auto h = held_.find(lease);
        if (!h->second.ended_by_broker) releases.push_back(ReleaseRequestLocked(h->second.job));
        held_.erase(h);
      }
      queued_.clear();
    }
    for (const v1::WorkRequest& r : releases) Write(r);
  }

  void HandlerLoop() {
    RunHandlers();
    absl::MutexLock lock(&mu_);
    --live_handler_threads_;
  }

  void RunHandlers() {
    while (true) {
      v1::LeasedJob job;
      std::shared_ptr<JobContext::Shared> shared;
      Handler handler;
      {
        absl::MutexLock lock(&mu_);
        // A condition variable, not Await(Condition): with one waiter per handler thread, every
        // unlock of mu_ would evaluate all their conditions.
        while (queued_.empty() && !closing_) job_cv_.Wait(&mu_);
        if (queued_.empty()) return;
        const std::string lease = queued_.front();
        queued_.pop_front();
        Held& h = held_.at(lease);
        if (h.ended_by_broker) {  // lost or timed out while waiting: nothing to run
          held_.erase(lease);
          continue;
        }
        job = h.job;
        shared = h.shared;
        handler = handlers_.at(job.queue());
        running_.insert(lease);
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
    bool acked = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = held_.find(job.lease_id());
      const bool ended_by_broker = it->second.ended_by_broker ||
                                   absl::Now() >= it->second.timeout_at || it->second.abandoned;
      held_.erase(it);
      running_.erase(job.lease_id());
      const CancelReason reason = shared.reason();
      if (ended_by_broker) {
        // Lost lease or time-out: the broker already ended the attempt and refuses any answer.
        // Abandoned by a stop: released already.
      } else if (reason == CancelReason::kStopping) {
        out.push_back(ReleaseRequestLocked(job));  // the stop's fault, not the job's
      } else {
        // A checkpoint saved since the last heartbeat still reaches the broker before a fail,
        // so the next attempt starts from it (requests on a stream are applied in order).
        if (!outcome.ok()) {
          absl::MutexLock shared_lock(&shared.mu);
          if (shared.checkpoint_version > shared.checkpoint_saved) {
            v1::WorkRequest hb;
            hb.set_request_id(NextRequestIdLocked());
            hb.mutable_heartbeat()->set_job_id(job.job_id());
            hb.mutable_heartbeat()->set_lease_id(job.lease_id());
            hb.mutable_heartbeat()->set_checkpoint(shared.checkpoint);
            out.push_back(std::move(hb));
          }
        }
        absl::Duration snooze;
        if (reason == CancelReason::kOperator && !outcome.ok()) {
          // The broker has the job CANCELLED already; this ends the lease. (A handler that
          // returned OK did the work: its ack still completes the job.)
          out.push_back(FailRequestLocked(job, absl::CancelledError("cancelled")));
        } else if (absl::optional<absl::Cord> delay = outcome.GetPayload(kSnoozeUrl);
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
          acked = true;
        } else {
          out.push_back(FailRequestLocked(job, outcome));
        }
      }
    }
    for (const v1::WorkRequest& r : out) Write(r);
    if (acked) FlushAcks();
  }

  v1::WorkRequest FailRequestLocked(const v1::LeasedJob& job, const absl::Status& outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
    return r;
  }

  // Sends the buffered acks, unless an ack message is still unanswered: then they wait for its
  // answer and go out together as one AckBatch. So an idle worker's ack goes out at once, and a
  // busy one sends one message per broker round trip (group commit from the worker's side).
  void FlushAcks() {
    std::optional<v1::WorkRequest> r;
    {
      absl::MutexLock lock(&mu_);
      r = NextAckMessageLocked();
    }
    // Without a stream the message stays in pending_ and goes out again after the reconnect,
    // where its answer clears ack_request_.
    if (r.has_value()) Write(*r);
  }

  // Puts the waiting acks (up to kMaxAcksPerMessage) in flight as one message, unless one is
  // in flight already; returns it to send.
  std::optional<v1::WorkRequest> NextAckMessageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ack_request_ != 0 || acks_.empty()) return std::nullopt;
    v1::WorkRequest r;
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
    return r;
  }

  // The acks an AckBatch's item errors answered UNAVAILABLE go back in front of the line.
  void RequeueRefusedAcksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ack_retry_.empty()) return;
    acks_.insert(acks_.begin(), std::make_move_iterator(ack_retry_.begin()),
                 std::make_move_iterator(ack_retry_.end()));
    ack_retry_.clear();
  }

  // Arranges for ResendRefused to run kAnswerRetryDelay from now (once for all that is
  // refused until then).
  void ScheduleResendLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (resend_at_ != absl::InfiniteFuture()) return;
    resend_at_ = absl::Now() + kAnswerRetryDelay;
    heartbeat_wake_ = true;  // the heartbeat thread sleeps until resend_at_ from now on
  }

  // Sends again, once resend_at_ has come, what the broker answered UNAVAILABLE: the pending
  // acks, fails and releases (with their request ids), the acks an AckBatch's item errors
  // refused, and (by the heartbeat loop that follows) the refused checkpoints and progress.
  // write_mu_ is held throughout, so no new stream opens in between: what was collected goes
  // out on the stream there is, or (none) stays pending for the next stream's opening.
  void ResendRefused() {
    absl::MutexLock write_lock(&write_mu_);
    std::vector<v1::WorkRequest> out;
    {
      absl::MutexLock lock(&mu_);
      if (closing_ || absl::Now() < resend_at_) return;
      resend_at_ = absl::InfiniteFuture();
      for (uint64_t id : refused_) {
        if (auto p = pending_.find(id); p != pending_.end()) out.push_back(p->second);
      }
      refused_.clear();
      RequeueRefusedAcksLocked();
      if (std::optional<v1::WorkRequest> acks = NextAckMessageLocked()) out.push_back(*acks);
      for (auto& [lease, h] : held_) {
        if (!h.update_refused) continue;
        h.update_refused = false;
        h.update_in_flight = false;
        absl::MutexLock shared_lock(&h.shared->mu);
        h.shared->checkpoint_sent = h.shared->checkpoint_saved;
        h.shared->progress_sent = h.shared->progress_saved;
      }
    }
    if (stream_ == nullptr) return;
    for (const v1::WorkRequest& r : out) stream_->Write(r);
  }

  // Sends each held job's heartbeat every third of its lease, and at once when its handler
  // saved a checkpoint or reported progress (one such update in flight per job); fires the
  // cancellation signal of jobs that reach their time-out; sends again what the broker
  // answered UNAVAILABLE once kAnswerRetryDelay has passed (ResendRefused).
  void HeartbeatLoop() {
    while (true) {
      std::vector<v1::WorkRequest> beats;
      bool resend_due = false;
      {
        absl::MutexLock lock(&mu_);
        absl::Time next = resend_at_;
        for (const auto& [lease, h] : held_) {
          if (h.ended_by_broker) continue;
          next = std::min({next, h.next_heartbeat, h.timeout_at});
        }
        auto wake = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || heartbeat_wake_; };
        mu_.AwaitWithDeadline(absl::Condition(&wake), next);
        if (closing_) return;
        heartbeat_wake_ = false;
        resend_due = absl::Now() >= resend_at_;
      }
      // What was answered UNAVAILABLE, its delay over.
      if (resend_due) ResendRefused();
      {
        absl::MutexLock lock(&mu_);
        if (closing_) return;
        const absl::Time now = absl::Now();
        for (auto& [lease, h] : held_) {
          if (h.ended_by_broker) continue;
          if (now >= h.timeout_at) {
            // The broker ends the attempt TIMED_OUT at this moment too; no need to wait for
            // its lease_lost.
            EndedByBrokerLocked(h, CancelReason::kTimeout);
            continue;
          }
          if (std::optional<v1::WorkRequest> beat = HeartbeatLocked(h, now))
            beats.push_back(*std::move(beat));
        }
      }
      for (const v1::WorkRequest& r : beats) Write(r);
    }
  }

  // The heartbeat `h` needs now, if any.
  std::optional<v1::WorkRequest> HeartbeatLocked(Held& h, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SentHeartbeat sent{.lease_id = h.job.lease_id()};
    v1::WorkRequest r;
    {
      absl::MutexLock lock(&h.shared->mu);
      const bool update = !h.update_in_flight && h.shared->HasUpdateToSend();
      if (!update && h.next_heartbeat > now) return std::nullopt;
      if (update) {
        if (h.shared->checkpoint_version > h.shared->checkpoint_sent) {
          r.mutable_heartbeat()->set_checkpoint(h.shared->checkpoint);
          sent.checkpoint_version = h.shared->checkpoint_sent = h.shared->checkpoint_version;
        }
        if (h.shared->progress_version > h.shared->progress_sent) {
          r.mutable_heartbeat()->set_progress(h.shared->progress);
          sent.progress_version = h.shared->progress_sent = h.shared->progress_version;
        }
        h.update_in_flight = true;
      }
    }
    r.set_request_id(NextRequestIdLocked());
    r.mutable_heartbeat()->set_job_id(h.job.job_id());
    r.mutable_heartbeat()->set_lease_id(h.job.lease_id());
    heartbeats_[r.request_id()] = std::move(sent);
    h.next_heartbeat = now + h.lease / 3;
    return r;
  }

  WorkerOptions options_;
  std::unique_ptr<Router> router_;

  mutable absl::Mutex mu_;
  std::map<std::string, Handler> handlers_ ABSL_GUARDED_BY(mu_);  // wrapped at Start
  std::vector<Middleware> middlewares_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // no new jobs
  bool closing_ ABSL_GUARDED_BY(mu_) = false;   // threads end
  bool connection_done_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool heartbeat_wake_ ABSL_GUARDED_BY(mu_) = false;
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);  // reconnect jitter
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t subscribe_request_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> first_subscribe_ ABSL_GUARDED_BY(mu_);
  // Why the stream ended for good (a code reconnecting cannot fix); the run call returns it.
  std::optional<absl::Status> fatal_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);  // by lease id
  std::deque<std::string> queued_ ABSL_GUARDED_BY(mu_);    // lease ids held, not started
  absl::CondVar job_cv_;  // signalled when queued_ grows or closing_ is set
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);                // lease ids started
  std::map<uint64_t, v1::WorkRequest> pending_ ABSL_GUARDED_BY(mu_);  // unanswered ack/fail/release
  // Request ids in pending_ answered UNAVAILABLE: sent again at resend_at_.
  std::set<uint64_t> refused_ ABSL_GUARDED_BY(mu_);
  // Acks an AckBatch's item errors answered UNAVAILABLE: back in front of acks_ at resend_at_.
  std::vector<v1::AckRequest> ack_retry_ ABSL_GUARDED_BY(mu_);
  // When ResendRefused runs next; InfiniteFuture() if nothing waits for it.
  absl::Time resend_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::map<uint64_t, SentHeartbeat> heartbeats_ ABSL_GUARDED_BY(mu_);  // by request id
  std::vector<v1::AckRequest> acks_ ABSL_GUARDED_BY(mu_);              // not yet sent
  uint64_t ack_request_ ABSL_GUARDED_BY(mu_) = 0;  // the unanswered ack message; 0 = none
  Stats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex write_mu_;  // one Write at a time; guards the current stream
  grpc::ClientReaderWriter<v1::WorkRequest, v1::WorkResponse>* stream_ ABSL_GUARDED_BY(write_mu_) =
      nullptr;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(write_mu_) = nullptr;

  int live_handler_threads_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread heartbeat_thread_;
  std::thread connection_thread_;
};

Worker::Worker(WorkerOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}

Worker::Worker(const ClientOptions& client, WorkerOptions options)
    : Worker(WithConnectionOf(client, std::move(options))) {}

Worker::~Worker() {
  if (impl_->running()) impl_->Stop(absl::Seconds(30));
}

void Worker::Handle(std::string queue, Handler handler) {
  impl_->Handle(std::move(queue), std::move(handler));
}

void Worker::Use(Middleware middleware) { impl_->Use(std::move(middleware)); }

absl::Status Worker::Start() { return impl_->Start(); }
void Worker::Stop(absl::Duration grace) { impl_->Stop(grace); }
void Worker::Wait() { impl_->AwaitEnd().IgnoreError(); }
absl::Status Worker::Run() { return impl_->Run(); }
Worker::Stats Worker::stats() const { return impl_->stats(); }

}  // namespace jobbroker::client
