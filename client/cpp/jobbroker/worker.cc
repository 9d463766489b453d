#include "jobbroker/worker.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <exception>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <stop_token>
#include <thread>
#include <utility>
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
#include "jobbroker/routing_table.h"
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
  options.keepalive = client.keepalive;
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
    router_ = std::make_unique<Router>(
        Router::Options::From(options_.address, options_.addresses, options_.tls, options_.token,
                              kGetClusterTimeout, options_.channel, options_.keepalive));
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
    if (absl::Status valid = ValidateKeepalive(options_.keepalive); !valid.ok()) return valid;
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
    {
      v1::WorkRequest flow;
      flow.mutable_flow()->set_max_in_flight(0);
      absl::MutexLock lock(&write_mu_);
      for (const auto& [id, writer] : writers_) writer->Write(flow);
    }
    ReleaseQueued();
    {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return running_.empty() && pending_.empty() && NoAcksLocked() && ack_retry_.empty();
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
        return pending_.empty() && NoAcksLocked() && ack_retry_.empty();
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
    // 6. Half-close every stream, so the broker ends them cleanly; cancel those that do not end
    // in time. (No stream opens any more: the connection thread saw closing_. Until then a
    // stream that ended was reopened, unsubscribed, for the answers still to come.)
    {
      absl::MutexLock lock(&write_mu_);
      half_closed_ = true;
      for (const auto& [id, writer] : writers_) writer->WritesDone();
    }
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&connection_done_), kHalfCloseTimeout);
      for (const auto& [id, stream] : streams_) stream->context.TryCancel();
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
    // The stream that pushed it: its answers go there while it is open.
    uint64_t stream = 0;
  };
  // An unanswered heartbeat: whose, and which checkpoint and progress versions it carries.
  struct SentHeartbeat {
    std::string lease_id;
    uint64_t checkpoint_version = 0;  // 0: none
    uint64_t progress_version = 0;    // 0: none
    uint64_t stream = 0;              // the stream it went out on
  };
  // An unanswered ack, fail or release (or ack message): sent again on another stream when the
  // one it went out on ends (idempotent per lease).
  struct Pending {
    v1::WorkRequest request;
    uint64_t stream = 0;   // the job's stream (for an ack message, the one it was made for)
    std::string queue;     // the job's queue; "" for an ack message
    uint64_t sent_on = 0;  // 0: on no stream yet (the next stream to open sends it)
  };
  // A request to write, and the stream to write it on (0: none is open; it waits).
  struct Out {
    v1::WorkRequest request;
    uint64_t stream = 0;
  };
  // One Work stream, for one group (docs/worker-contract.md §5): made by the connection thread,
  // run by its own thread (StreamLoop), which the connection thread joins once it ended.
  struct Stream {
    uint64_t id = 0;
    StreamGroup group;
    // Thread-safe by itself: cancelled by the regrouping and by Stop, also before the call
    // started (gRPC then cancels it as it starts).
    grpc::ClientContext context;
    std::thread thread;
    // Below: guarded by the worker's mu_.
    uint64_t subscribe_request = 0;
    uint64_t ack_request = 0;  // the unanswered ack message made for it; 0 = none
    bool retired = false;      // ended by the regrouping: its end calls for none
    bool ended = false;        // its thread is done: join it
  };

  // Writes on `out.stream` if it is still open; else nothing (a pending request then goes out
  // again from the stream's end, or from the next stream to open: see CloseStreamLocked).
  void Write(const Out& out) {
    absl::MutexLock lock(&write_mu_);
    WriteLocked(out);
  }
  void WriteLocked(const Out& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    if (half_closed_) return;
    if (auto w = writers_.find(out.stream); w != writers_.end()) w->second->Write(out.request);
  }

  // Where an answer for a job pushed by `stream` of `queue` goes (contract §5): that stream
  // while it is open, else an open one serving the queue, else any open one (a node routes a
  // job's answer to its leader by job id); 0 if none is open.
  uint64_t TargetLocked(uint64_t stream, const std::string& queue) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (open_.empty()) return 0;
    if (open_.contains(stream)) return stream;
    for (uint64_t id : open_) {
      const std::vector<std::string>& queues = streams_.at(id)->group.queues;
      if (std::binary_search(queues.begin(), queues.end(), queue)) return id;
    }
    return *open_.begin();
  }

  // Makes `r` pending (answered by its request id) and aims it at its target stream.
  Out PendingLocked(v1::WorkRequest r, uint64_t stream, const std::string& queue)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t target = TargetLocked(stream, queue);
    pending_[r.request_id()] = Pending{r, stream, queue, target};
    return Out{std::move(r), target};
  }

  bool NoAcksLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [stream, acks] : acks_)
      if (!acks.empty()) return false;
    return true;
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

  void ConnectionLoop() {
    ConnectionLoopUntilClosed();
    absl::MutexLock lock(&mu_);
    connection_done_ = true;
  }

  // No stream opens any more: the stop reached its step 6, or a stream ended in a way
  // reconnecting cannot fix. (A stop before that still reopens streams, contract §6: the
  // answers of the handlers finishing in its grace need one.)
  bool ClosedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closing_ || fatal_.has_value();
  }

  // Runs the streams (contract §5, "One stream per leading node"): groups the handled queues
  // by the table's leaders and opens one stream per group; when one ends, waits the backoff,
  // fetches the table again and groups anew (a leader change is this regrouping): the streams
  // whose group is still wanted keep running, the others are ended, the missing ones opened.
  // While a group goes to any node (a partition without a leader in the table), the table is
  // fetched again after each backoff delay too, and the worker regroups, until no such group is
  // left or the stop's step 6 begins. Without a table (no answer to GetCluster) the single group is
  // every queue, to any node: one stream, as the router moves through the addresses. A graceful
  // stop goes on regrouping until its step 6 (contract §6): the streams it opens do not subscribe
  // (nothing is pushed on them), they carry the acks, fails, releases and heartbeats of the jobs
  // still held.
  void ConnectionLoopUntilClosed() {
    std::vector<std::string> queues;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [queue, handler] : handlers_) queues.push_back(queue);
    }
    const int max_in_flight = options_.concurrency + options_.prefetch;
    absl::Duration backoff = options_.reconnect_initial;
    while (true) {
      const RoutingTable table = router_->Table();
      const std::vector<StreamGroup> groups = GroupQueuesByLeader(table, queues, max_in_flight);
      // While a group goes to any node, the table is fetched again after each backoff delay
      // even if no stream ends (contract §5): a node that knows the partition's new leader
      // relays that stream, and nothing would end the relay. (Not with a fixed channel: there
      // is no table to fetch.)
      const bool refresh = options_.channel == nullptr && RefreshesTableWhileGrouped(table, groups);
      bool stream_ended = true;
      {
        absl::MutexLock lock(&mu_);
        if (ClosedLocked()) break;
        std::vector<StreamGroup> missing = groups;
        for (auto& [id, stream] : streams_) {
          if (stream->retired || stream->ended) continue;
          auto kept = std::find(missing.begin(), missing.end(), stream->group);
          if (kept != missing.end()) {
            missing.erase(kept);
          } else {
            // Its queues are led elsewhere now. The jobs it pushed keep their leases (they
            // are replicated): their answers go on the other streams.
            stream->retired = true;
            stream->context.TryCancel();
          }
        }
        for (StreamGroup& group : missing) {
          auto stream = std::make_shared<Stream>();
          stream->id = next_stream_id_++;
          stream->group = std::move(group);
          streams_[stream->id] = stream;
          stream->thread = std::thread([this, stream] { StreamLoop(*stream); });
        }
        // Until a stream ends by itself (not one the regrouping ended), or the stop's step 6.
        auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (ClosedLocked()) return true;
          for (const auto& [id, stream] : streams_)
            if (stream->ended && !stream->retired) return true;
          return false;
        };
        if (refresh) {
          // Full jitter, as the reconnect's sleep below; the stop's step 6 wakes it at once.
          stream_ended = mu_.AwaitWithTimeout(absl::Condition(&woken),
                                              backoff * absl::Uniform(bitgen_, 0.0, 1.0));
        } else {
          mu_.Await(absl::Condition(&woken));
        }
        if (ClosedLocked()) break;
      }
      JoinEndedStreams();
      // A node may have died or stopped leading the queues: ask where they are now.
      router_->MarkStale();
      if (!stream_ended) {
        // The backoff delay of a group for any node passed: regroup over the new table (the
        // streams whose group stays keep running). The delay grows as a reconnect's does, and
        // a subscription does not bring it back to the start: a relayed stream subscribes.
        backoff = std::min(backoff * 2, options_.reconnect_max);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        ++stats_.reconnects;
        if (subscribed_since_backoff_) backoff = options_.reconnect_initial;
        subscribed_since_backoff_ = false;
        // Sleep the backoff (full jitter), but wake at once for the stop's step 6.
        auto closed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ClosedLocked(); };
        if (mu_.AwaitWithTimeout(absl::Condition(&closed),
                                 backoff * absl::Uniform(bitgen_, 0.0, 1.0)))
          break;
      }
      backoff = std::min(backoff * 2, options_.reconnect_max);
    }
    // Closing: Stop half-closes the streams (and cancels them after kHalfCloseTimeout). A
    // stream that ended in a way reconnecting cannot fix: the others end now (during a stop
    // they stay for its answers, until its step 6).
    {
      absl::MutexLock lock(&mu_);
      if (!closing_ && !stopping_) {
        for (const auto& [id, stream] : streams_) stream->context.TryCancel();
      }
      auto all_ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (const auto& [id, stream] : streams_)
          if (!stream->ended) return false;
        return true;
      };
      mu_.Await(absl::Condition(&all_ended));
    }
    JoinEndedStreams();
  }

  void JoinEndedStreams() {
    std::vector<std::shared_ptr<Stream>> ended;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = streams_.begin(); it != streams_.end();) {
        if (it->second->ended) {
          ended.push_back(it->second);
          it = streams_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const std::shared_ptr<Stream>& stream : ended) stream->thread.join();
  }

  // The thread of one stream: runs it, then tells the connection thread it ended.
  void StreamLoop(Stream& stream) {
    const absl::Status ended = RunStream(stream);
    absl::MutexLock lock(&mu_);
    if (!first_subscribe_.has_value()) first_subscribe_ = ended;
    // A code reconnecting cannot fix ends the run call, from any stream.
    if (!closing_ && !stream.retired && !Reconnectable(ended.code()) && !fatal_.has_value())
      fatal_ = ended;
    stream.ended = true;
  }

  // Opens `stream` on its group's node, reads it until it ends, and returns how it ended.
  absl::Status RunStream(Stream& stream) {
    const std::shared_ptr<const Router::Node> node = stream.group.address.empty()
                                                         ? router_->NodeFor(Router::Route::Any())
                                                         : router_->NodeAt(stream.group.address);
    // A token that cannot be sent never will be: Start() reports it.
    if (absl::Status s = AddCallMetadata(options_.token, &stream.context); !s.ok()) return s;
    if (!AwaitConnected(*node, stream)) return absl::CancelledError("the worker is closing");
    std::unique_ptr<grpc::ClientReaderWriter<v1::WorkRequest, v1::WorkResponse>> rw =
        node->broker->Work(&stream.context);
    {
      // Held across the subscription and the resends, so that every other Write goes after
      // them, and none of the requests made meanwhile is missed by both.
      absl::MutexLock write_lock(&write_mu_);
      std::vector<v1::WorkRequest> first_messages;
      {
        absl::MutexLock lock(&mu_);
        if (ClosedLocked() || stream.retired) {
          stream.context.TryCancel();
          rw->Finish().ok();
          return absl::CancelledError("the worker is closing or regrouping");
        }
        first_messages = OpeningMessagesLocked(stream);
      }
      writers_[stream.id] = rw.get();
      for (const v1::WorkRequest& r : first_messages) rw->Write(r);
    }

    v1::WorkResponse message;
    // A refused subscription ends the stream here, whatever the code: the broker may leave
    // the stream open without pushing anything (contract §5). A code reconnecting can fix
    // (UNAVAILABLE: a queue's partition has no leader yet) regroups after the backoff; any
    // other ends the run call.
    std::optional<absl::Status> refused;
    while (!refused.has_value() && rw->Read(&message)) OnMessage(stream, message, refused);
    if (refused.has_value()) stream.context.TryCancel();
    {
      // No Write is under way on it once this is held. What it left unanswered goes out on
      // the other streams now.
      absl::MutexLock write_lock(&write_mu_);
      writers_.erase(stream.id);
      std::vector<Out> moved;
      {
        absl::MutexLock lock(&mu_);
        moved = CloseStreamLocked(stream);
      }
      for (const Out& out : moved) WriteLocked(out);
    }
    grpc::Status end = rw->Finish();
    return refused.value_or(
        absl::Status(static_cast<absl::StatusCode>(end.error_code()), end.error_message()));
  }

  // Waits until the node's channel is connected, for at most the longest reconnect backoff
  // (then the stream is opened anyway: its failure is the next backoff's cause). gRPC fails a
  // stream opened while the channel backs off from a failed connect at once, and its backoff
  // runs beside the worker's: without this wait, a broker back after a restart could wait for
  // the sum of both. False if the worker is closing or the regrouping ended the stream.
  bool AwaitConnected(const Router::Node& node, const Stream& stream) {
    if (node.channel == nullptr) return true;
    grpc::experimental::ChannelResetConnectionBackoff(node.channel.get());
    const absl::Time give_up = absl::Now() + options_.reconnect_max;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (ClosedLocked() || stream.retired) return false;
      }
      // Short slices, so that Stop is not kept waiting.
      const absl::Time slice = std::min(give_up, absl::Now() + absl::Milliseconds(100));
      if (node.channel->WaitForConnected(absl::ToChronoTime(slice))) return true;
      if (absl::Now() >= give_up) return true;
    }
  }

  // What a new stream starts with: the subscription to its group's queues with its share of
  // max_in_flight (none while stopping: a stream reopened then is for the answers still to
  // come, and takes no job, contract §6), then the acks, fails and releases no open stream
  // carries (sent on none yet,
  // or on a stream that ended; idempotent per lease, so sending them again is safe), and the
  // acks that waited for a stream. Heartbeats are not replayed: those of jobs whose stream
  // ended were reset then, and go out now that a stream is open.
  std::vector<v1::WorkRequest> OpeningMessagesLocked(Stream& stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<v1::WorkRequest> out;
    open_.insert(stream.id);
    if (!stopping_) {
      v1::WorkRequest& subscribe = out.emplace_back();
      subscribe.set_request_id(NextRequestIdLocked());
      stream.subscribe_request = subscribe.request_id();
      v1::SubscribeRequest* s = subscribe.mutable_subscribe();
      for (const std::string& queue : stream.group.queues) s->add_queues(queue);
      s->set_worker_id(options_.worker_id);
      s->set_max_in_flight(stream.group.max_in_flight);
      s->set_batch_pushes(true);
      if (options_.lease_duration > absl::ZeroDuration())
        *s->mutable_lease_duration() = ToProtoDuration(options_.lease_duration);
    }
    for (auto& [id, p] : pending_) {
      if (p.sent_on != 0 && open_.contains(p.sent_on)) continue;
      p.sent_on = stream.id;
      refused_.erase(id);  // goes out now rather than after its delay
      out.push_back(p.request);
    }
    if (auto waiting = acks_.find(0); waiting != acks_.end()) {
      std::vector<v1::AckRequest>& mine = acks_[stream.id];
      mine.insert(mine.end(), std::make_move_iterator(waiting->second.begin()),
                  std::make_move_iterator(waiting->second.end()));
      acks_.erase(0);
    }
    if (std::optional<Out> acks = NextAckMessageLocked(stream.id)) out.push_back(acks->request);
    heartbeat_wake_ = true;  // heartbeats that waited for a stream
    return out;
  }

  // `stream` ended: what went out on it unanswered is aimed at another open stream (returned,
  // to write), or waits for the next one; its unsent acks follow; its unanswered heartbeats are
  // forgotten, their jobs' checkpoints and progress to go out again with the next heartbeat,
  // which is due at once.
  std::vector<Out> CloseStreamLocked(Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    open_.erase(stream.id);
    std::vector<Out> out;
    if (closing_) return out;
    for (auto& [id, p] : pending_) {
      if (p.sent_on != stream.id) continue;
      p.sent_on = TargetLocked(p.stream, p.queue);
      refused_.erase(id);
      if (p.sent_on != 0) out.push_back(Out{p.request, p.sent_on});
    }
    stream.ack_request = 0;
    if (auto left = acks_.find(stream.id); left != acks_.end()) {
      std::vector<v1::AckRequest> acks = std::move(left->second);
      acks_.erase(left);
      const uint64_t target = TargetLocked(stream.id, "");
      std::vector<v1::AckRequest>& there = acks_[target];
      there.insert(there.end(), std::make_move_iterator(acks.begin()),
                   std::make_move_iterator(acks.end()));
      if (std::optional<Out> r = NextAckMessageLocked(target)) out.push_back(*std::move(r));
    }
    const absl::Time now = absl::Now();
    for (auto it = heartbeats_.begin(); it != heartbeats_.end();) {
      if (it->second.stream != stream.id) {
        ++it;
        continue;
      }
      if (auto h = held_.find(it->second.lease_id); h != held_.end()) {
        h->second.update_in_flight = false;
        h->second.update_refused = false;
        h->second.next_heartbeat = now;
        absl::MutexLock lock(&h->second.shared->mu);
        h->second.shared->checkpoint_sent = h->second.shared->checkpoint_saved;
        h->second.shared->progress_sent = h->second.shared->progress_saved;
      }
      it = heartbeats_.erase(it);
    }
    heartbeat_wake_ = true;
    return out;
  }

  // One message of `stream`; sets `refused` to the answer that refused its subscription (the
  // stream then ends; see RunStream).
  void OnMessage(Stream& stream, const v1::WorkResponse& m, std::optional<absl::Status>& refused) {
    std::vector<Out> to_send;
    bool flush_acks = false;  // its ack message in flight was answered: send what waited
    {
      absl::MutexLock lock(&mu_);
      switch (m.response_case()) {
        case v1::WorkResponse::kJob:
          AcceptLocked(m.job(), absl::Now(), stream.id, to_send);
          break;
        case v1::WorkResponse::kJobBatch: {
          const absl::Time now = absl::Now();
          for (const v1::LeasedJob& job : m.job_batch().jobs())
            AcceptLocked(job, now, stream.id, to_send);
          break;
        }
        case v1::WorkResponse::kResult: {
          const v1::WorkResult& r = m.result();
          if (stream.subscribe_request != 0 && r.request_id() == stream.subscribe_request) {
            absl::Status s(static_cast<absl::StatusCode>(r.code()), r.message());
            if (!first_subscribe_.has_value()) first_subscribe_ = s;
            if (s.ok()) subscribed_since_backoff_ = true;
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
              const v1::WorkRequest& sent = p->second.request;
              if (RetryLater(e.code()) && sent.has_ack_batch() && e.index() >= 0 &&
                  e.index() < sent.ack_batch().acks_size()) {
                // That ack alone was not applied: it goes back in line after the delay.
                std::cerr << "jobbroker worker: ack refused for now, sending it again: "
                          << e.message() << "\n";
                ack_retry_.emplace_back(stream.id, sent.ack_batch().acks(e.index()));
                ScheduleResendLocked();
              } else if (!LeaseGone(e.code())) {
                std::cerr << "jobbroker worker: " << e.message() << "\n";
              }
            }
            pending_.erase(p);
            if (r.request_id() == stream.ack_request) {
              stream.ack_request = 0;
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
    for (const Out& r : to_send) Write(r);
    if (flush_acks) FlushAcks(stream.id);
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
  void AcceptLocked(const v1::LeasedJob& job, absl::Time now, uint64_t stream,
                    std::vector<Out>& to_send) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Heartbeats follow the lease as granted; the floor guards against clock skew.
    absl::Duration lease =
        std::max(FromProtoTimestamp(job.lease_deadline()) - now, absl::Milliseconds(300));
    if (stopping_) {  // pushed before our flow 0 arrived: give it straight back
      to_send.push_back(ReleaseRequestLocked(job, stream));
      return;
    }
    Held& h = held_[job.lease_id()];
    h.job = job;
    h.stream = stream;
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

  Out ReleaseRequestLocked(const v1::LeasedJob& job, uint64_t stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::WorkRequest r;
    r.set_request_id(NextRequestIdLocked());
    r.mutable_release()->set_job_id(job.job_id());
    r.mutable_release()->set_lease_id(job.lease_id());
    ++stats_.released;
    return PendingLocked(std::move(r), stream, job.queue());
  }

  void AbandonRunning() {
    std::vector<Out> releases;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& lease : running_) {
        Held& h = held_.at(lease);
        if (h.abandoned) continue;
        h.abandoned = true;
        if (!h.ended_by_broker) releases.push_back(ReleaseRequestLocked(h.job, h.stream));
      }
    }
    for (const Out& r : releases) Write(r);
  }

  void ReleaseQueued() {
    std::vector<Out> releases;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& lease : queued_) {
        auto h = held_.find(lease);
        if (!h->second.ended_by_broker)
          releases.push_back(ReleaseRequestLocked(h->second.job, h->second.stream));
        held_.erase(h);
      }
      queued_.clear();
    }
    for (const Out& r : releases) Write(r);
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
    std::vector<Out> out;
    uint64_t acked_on = 0;  // the stream whose acks to flush
    bool acked = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = held_.find(job.lease_id());
      const bool ended_by_broker = it->second.ended_by_broker ||
                                   absl::Now() >= it->second.timeout_at || it->second.abandoned;
      const uint64_t stream = it->second.stream;
      held_.erase(it);
      running_.erase(job.lease_id());
      const CancelReason reason = shared.reason();
      if (ended_by_broker) {
        // Lost lease or time-out: the broker already ended the attempt and refuses any answer.
        // Abandoned by a stop: released already.
      } else if (reason == CancelReason::kStopping) {
        out.push_back(ReleaseRequestLocked(job, stream));  // the stop's fault, not the job's
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
            out.push_back(Out{std::move(hb), TargetLocked(stream, job.queue())});
          }
        }
        absl::Duration snooze;
        if (reason == CancelReason::kOperator && !outcome.ok()) {
          // The broker has the job CANCELLED already; this ends the lease. (A handler that
          // returned OK did the work: its ack still completes the job.)
          out.push_back(FailRequestLocked(job, stream, absl::CancelledError("cancelled")));
        } else if (absl::optional<absl::Cord> delay = outcome.GetPayload(kSnoozeUrl);
                   delay.has_value() && absl::ParseDuration(std::string(*delay), &snooze)) {
          v1::WorkRequest r;
          r.set_request_id(NextRequestIdLocked());
          r.mutable_release()->set_job_id(job.job_id());
          r.mutable_release()->set_lease_id(job.lease_id());
          *r.mutable_release()->mutable_delay() = ToProtoDuration(snooze);
          ++stats_.snoozed;
          out.push_back(PendingLocked(std::move(r), stream, job.queue()));
        } else if (outcome.ok()) {
          acked_on = TargetLocked(stream, job.queue());
          v1::AckRequest& ack = acks_[acked_on].emplace_back();
          ack.set_job_id(job.job_id());
          ack.set_lease_id(job.lease_id());
          absl::MutexLock shared_lock(&shared.mu);
          ack.set_result(shared.result);
          ++stats_.acked;
          acked = true;
        } else {
          out.push_back(FailRequestLocked(job, stream, outcome));
        }
      }
    }
    for (const Out& r : out) Write(r);
    if (acked) FlushAcks(acked_on);
  }

  Out FailRequestLocked(const v1::LeasedJob& job, uint64_t stream, const absl::Status& outcome)
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
    return PendingLocked(std::move(r), stream, job.queue());
  }

  // Sends `stream`'s buffered acks, unless an ack message of its is still unanswered: then
  // they wait for its answer and go out together as one AckBatch. So an idle worker's ack goes
  // out at once, and a busy one sends one message per broker round trip and stream (group
  // commit from the worker's side).
  void FlushAcks(uint64_t stream) {
    std::optional<Out> r;
    {
      absl::MutexLock lock(&mu_);
      r = NextAckMessageLocked(stream);
    }
    // If the stream ends first, the message stays in pending_ and goes out on another.
    if (r.has_value()) Write(*r);
  }

  // Puts `stream`'s waiting acks (up to kMaxAcksPerMessage) in flight as one message, unless
  // one is in flight already or the stream is not open (0: the acks wait for a stream);
  // returns it to send.
  std::optional<Out> NextAckMessageLocked(uint64_t stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!open_.contains(stream)) return std::nullopt;
    Stream& s = *streams_.at(stream);
    auto waiting = acks_.find(stream);
    if (s.ack_request != 0 || waiting == acks_.end() || waiting->second.empty())
      return std::nullopt;
    std::vector<v1::AckRequest>& acks = waiting->second;
    v1::WorkRequest r;
    r.set_request_id(NextRequestIdLocked());
    const size_t n = std::min(acks.size(), static_cast<size_t>(kMaxAcksPerMessage));
    if (n == 1) {
      *r.mutable_ack() = std::move(acks.front());
    } else {
      for (size_t i = 0; i < n; ++i) *r.mutable_ack_batch()->add_acks() = std::move(acks[i]);
    }
    acks.erase(acks.begin(), acks.begin() + static_cast<std::ptrdiff_t>(n));
    s.ack_request = r.request_id();
    return PendingLocked(std::move(r), stream, "");
  }

  // The acks an AckBatch's item errors answered UNAVAILABLE go back in front of the line of
  // the stream that refused them, or of another open one.
  void RequeueRefusedAcksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = ack_retry_.rbegin(); it != ack_retry_.rend(); ++it) {
      std::vector<v1::AckRequest>& acks = acks_[TargetLocked(it->first, "")];
      acks.insert(acks.begin(), std::move(it->second));
    }
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
  // out on the streams there are, or (none) stays pending for the next stream's opening.
  void ResendRefused() {
    absl::MutexLock write_lock(&write_mu_);
    std::vector<Out> out;
    {
      absl::MutexLock lock(&mu_);
      if (closing_ || absl::Now() < resend_at_) return;
      resend_at_ = absl::InfiniteFuture();
      for (uint64_t id : refused_) {
        auto p = pending_.find(id);
        if (p == pending_.end()) continue;
        p->second.sent_on = TargetLocked(p->second.stream, p->second.queue);
        out.push_back(Out{p->second.request, p->second.sent_on});
      }
      refused_.clear();
      RequeueRefusedAcksLocked();
      for (uint64_t stream : open_) {
        if (std::optional<Out> acks = NextAckMessageLocked(stream)) out.push_back(*acks);
      }
      for (auto& [lease, h] : held_) {
        if (!h.update_refused) continue;
        h.update_refused = false;
        h.update_in_flight = false;
        absl::MutexLock shared_lock(&h.shared->mu);
        h.shared->checkpoint_sent = h.shared->checkpoint_saved;
        h.shared->progress_sent = h.shared->progress_saved;
      }
    }
    for (const Out& r : out) WriteLocked(r);
  }

  // Sends each held job's heartbeat every third of its lease, and at once when its handler
  // saved a checkpoint or reported progress (one such update in flight per job); fires the
  // cancellation signal of jobs that reach their time-out; sends again what the broker
  // answered UNAVAILABLE once kAnswerRetryDelay has passed (ResendRefused).
  void HeartbeatLoop() {
    while (true) {
      std::vector<Out> beats;
      bool resend_due = false;
      {
        absl::MutexLock lock(&mu_);
        absl::Time next = resend_at_;
        for (const auto& [lease, h] : held_) {
          if (h.ended_by_broker) continue;
          // Without an open stream, heartbeats wait for the next (which wakes this thread).
          next = std::min({next, open_.empty() ? h.timeout_at : h.next_heartbeat, h.timeout_at});
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
          if (std::optional<Out> beat = HeartbeatLocked(h, now)) beats.push_back(*std::move(beat));
        }
      }
      for (const Out& r : beats) Write(r);
    }
  }

  // The heartbeat `h` needs now, if any, and the stream to send it on (none while no stream is
  // open: it stays due).
  std::optional<Out> HeartbeatLocked(Held& h, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t target = TargetLocked(h.stream, h.job.queue());
    if (target == 0) return std::nullopt;
    SentHeartbeat sent{.lease_id = h.job.lease_id(), .stream = target};
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
    return Out{std::move(r), target};
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
  // A stream's subscription was accepted since the backoff last grew: back to its start.
  bool subscribed_since_backoff_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_stream_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The streams whose thread has not been joined, by id (in the order they were made).
  std::map<uint64_t, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  // Those open for writing (writers_ has them too).
  std::set<uint64_t> open_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> first_subscribe_ ABSL_GUARDED_BY(mu_);
  // Why the stream ended for good (a code reconnecting cannot fix); the run call returns it.
  std::optional<absl::Status> fatal_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);  // by lease id
  std::deque<std::string> queued_ ABSL_GUARDED_BY(mu_);    // lease ids held, not started
  absl::CondVar job_cv_;  // signalled when queued_ grows or closing_ is set
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);        // lease ids started
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);  // unanswered ack/fail/release
  // Request ids in pending_ answered UNAVAILABLE: sent again at resend_at_.
  std::set<uint64_t> refused_ ABSL_GUARDED_BY(mu_);
  // Acks an AckBatch's item errors answered UNAVAILABLE, with the stream that answered: back in
  // front of acks_ at resend_at_.
  std::vector<std::pair<uint64_t, v1::AckRequest>> ack_retry_ ABSL_GUARDED_BY(mu_);
  // When ResendRefused runs next; InfiniteFuture() if nothing waits for it.
  absl::Time resend_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::map<uint64_t, SentHeartbeat> heartbeats_ ABSL_GUARDED_BY(mu_);  // by request id
  // Acks not yet sent, by the stream they are to go on (0: none was open).
  std::map<uint64_t, std::vector<v1::AckRequest>> acks_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one Write at a time; guards writers_
  // The open streams, by id.
  std::map<uint64_t, grpc::ClientReaderWriter<v1::WorkRequest, v1::WorkResponse>*> writers_
      ABSL_GUARDED_BY(write_mu_);
  bool half_closed_ ABSL_GUARDED_BY(write_mu_) = false;  // by Stop: nothing more is written

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
