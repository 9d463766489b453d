#include "tests/crash/worker.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/crash/channel.h"
#include "tests/crash/checker.h"
#include "tests/crash/line_log.h"

namespace jobbroker::crash {
namespace {

using WorkStream = grpc::ClientReaderWriter<v1::WorkRequest, v1::WorkResponse>;

// An ack or fail the worker owes the broker until the broker answers it.
struct Answer {
  v1::WorkRequest request;  // request_id set when sent
  std::string job_id;
  std::string lease_id;
  int attempt = 0;
  bool is_ack = false;
  bool terminal = false;  // a fail that ends the job
};

// A lease the worker holds: heartbeated until its answer is heard or the broker takes it back.
struct Held {
  std::string job_id;
  int attempt = 0;
  bool lost = false;  // the broker said the lease ran out: do not work it
};

std::string KindOf(const std::string& payload) {
  for (absl::string_view part : absl::StrSplit(payload, ';')) {
    if (absl::ConsumePrefix(&part, "kind=")) return std::string(part);
  }
  return "";
}

class Worker {
 public:
  Worker(const WorkerOptions& options, std::unique_ptr<LineLog> log)
      : options_(options), log_(std::move(log)), brokers_(options.address), rng_(options.seed) {}

  // Runs the session and processing threads until `stop` is signalled; never returns.
  [[noreturn]] void Run(const sigset_t& stop_signals) {
    log_->Write({"START", options_.instance, absl::StrCat(getpid())});
    std::thread session([this] { SessionLoop(); });
    std::thread processor([this] { ProcessLoop(); });
    session.detach();
    processor.detach();
    int sig = 0;
    sigwait(&stop_signals, &sig);
    Drain();
    // Threads blocked in gRPC calls cannot be joined cheaply; every line is already written.
    _exit(0);
  }

 private:
  // Connects, subscribes, sends again what the last stream left unanswered, and reads until the
  // stream breaks; then backs off and starts over.
  void SessionLoop() {
    absl::Duration backoff = absl::Milliseconds(50);
    while (true) {
      grpc::ClientContext ctx;
      std::unique_ptr<WorkStream> stream = brokers_.Current().Work(&ctx);
      uint64_t subscribe_id = 0;
      {
        absl::MutexLock write_lock(&write_mu_);
        std::vector<v1::WorkRequest> resend;
        {
          absl::MutexLock lock(&mu_);
          stream_ = stream.get();
          subscribe_id = next_request_id_++;
          while (!unsent_.empty()) {
            Answer a = std::move(unsent_.front());
            unsent_.pop_front();
            const uint64_t id = next_request_id_++;
            a.request.set_request_id(id);
            resend.push_back(a.request);
            in_flight_.emplace(id, std::move(a));
          }
        }
        v1::WorkRequest subscribe;
        subscribe.set_request_id(subscribe_id);
        v1::SubscribeRequest* sub = subscribe.mutable_subscribe();
        for (const std::string& q : options_.queues) sub->add_queues(q);
        sub->set_worker_id(options_.instance);
        sub->set_max_in_flight(options_.max_in_flight);
        // Batched pushes, as the client libraries take them: the crashes cover that path too.
        sub->set_batch_pushes(true);
        stream->Write(subscribe);
        for (const v1::WorkRequest& r : resend) stream->Write(r);
      }

      bool subscribed = false;
      v1::WorkResponse m;
      while (stream->Read(&m)) {
        if (m.has_result() && m.result().request_id() == subscribe_id) {
          if (m.result().code() == 0) {
            subscribed = true;
            log_->Write({"CONNECT", options_.instance, absl::StrCat(++connections_)});
          } else {
            std::fprintf(stderr, "%s: subscribe refused: %d %s\n", options_.instance.c_str(),
                         m.result().code(), m.result().message().c_str());
            ctx.TryCancel();
          }
          continue;
        }
        Handle(m);
      }
      {
        absl::MutexLock write_lock(&write_mu_);
        absl::MutexLock lock(&mu_);
        stream_ = nullptr;
        // Unanswered on this stream: first in line on the next, in the order they were sent.
        for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it) {
          unsent_.push_front(std::move(it->second));
        }
        in_flight_.clear();
      }
      const grpc::Status status = stream->Finish();
      if (subscribed) {
        log_->Write({"DISCONNECT", options_.instance, absl::StrCat(connections_),
                     absl::StrCat(static_cast<int>(status.error_code()))});
        backoff = absl::Milliseconds(50);
      }
      if (!status.ok()) brokers_.Next();  // a cluster: resubscribe at another node
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(400));
    }
  }

  void Receive(const v1::LeasedJob& job) {
    log_->Write({"RECV", options_.instance, job.job_id(), absl::StrCat(job.attempt()),
                 job.lease_id(), absl::StrCat(connections_)});
    absl::MutexLock lock(&mu_);
    held_[job.lease_id()] = Held{job.job_id(), job.attempt()};
    inbox_.push_back(job);
  }

  void Handle(const v1::WorkResponse& m) {
    if (m.has_job()) return Receive(m.job());
    if (m.has_job_batch()) {
      for (const v1::LeasedJob& job : m.job_batch().jobs()) Receive(job);
      return;
    }
    if (m.has_lease_lost()) {
      const std::string& job_id = m.lease_lost().job_id();
      log_->Write({"LOST", options_.instance, job_id});
      // The message names the job, not the lease: the oldest lease of it is the one that ran out.
      absl::MutexLock lock(&mu_);
      Held* oldest = nullptr;
      for (auto& [lease, held] : held_) {
        if (held.job_id == job_id && !held.lost && (!oldest || held.attempt < oldest->attempt)) {
          oldest = &held;
        }
      }
      if (oldest != nullptr) oldest->lost = true;
      return;
    }
    if (!m.has_result()) return;
    const v1::WorkResult& r = m.result();
    absl::MutexLock lock(&mu_);
    auto it = in_flight_.find(r.request_id());
    if (it == in_flight_.end()) return;  // a heartbeat's answer
    Answer a = std::move(it->second);
    in_flight_.erase(it);
    const std::vector<std::string> lease = {options_.instance, a.job_id, absl::StrCat(a.attempt),
                                            a.lease_id};
    const auto code = static_cast<grpc::StatusCode>(r.code());
    if (code == grpc::StatusCode::OK) {
      if (a.is_ack) {
        log_->Write({"ACK_OK", lease[0], lease[1], lease[2], lease[3]});
      } else {
        log_->Write({"FAIL_OK", lease[0], lease[1], lease[2], lease[3], a.terminal ? "1" : "0"});
      }
      held_.erase(a.lease_id);
    } else if (code == grpc::StatusCode::FAILED_PRECONDITION ||
               code == grpc::StatusCode::NOT_FOUND) {
      log_->Write({a.is_ack ? "ACK_REFUSED" : "FAIL_REFUSED", lease[0], lease[1], lease[2],
                   lease[3], absl::StrCat(r.code())});
      held_.erase(a.lease_id);
    } else {
      // The broker could not decide (e.g. UNAVAILABLE while it shuts down): ask again later.
      log_->Write({"ANSWER_RETRY", lease[0], lease[1], lease[2], lease[3], absl::StrCat(r.code())});
      unsent_.push_back(std::move(a));
    }
  }

  // Works each pushed job in turn and heartbeats the held leases between jobs.
  void ProcessLoop() {
    absl::Time last_heartbeat = absl::Now();
    while (true) {
      std::optional<v1::LeasedJob> job;
      bool lost = false;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !inbox_.empty(); };
        mu_.AwaitWithTimeout(absl::Condition(&ready), options_.heartbeat_interval / 2);
        if (!inbox_.empty()) {
          job = std::move(inbox_.front());
          inbox_.pop_front();
          auto it = held_.find(job->lease_id());
          lost = it != held_.end() && it->second.lost;
          if (lost) held_.erase(it);
        }
      }
      if (job.has_value() && lost) {
        log_->Write({"SKIP", options_.instance, job->job_id(), absl::StrCat(job->attempt()),
                     job->lease_id()});
      } else if (job.has_value()) {
        Work(*job);
      }
      if (absl::Now() - last_heartbeat >= options_.heartbeat_interval) {
        Heartbeat();
        last_heartbeat = absl::Now();
      }
    }
  }

  void Work(const v1::LeasedJob& job) {
    // Long enough that a kill usually finds leases held; short enough to keep up with producers.
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(5, 60)(rng_)));
    const std::string kind = KindOf(job.payload());
    Answer a;
    a.job_id = job.job_id();
    a.lease_id = job.lease_id();
    a.attempt = job.attempt();
    const bool last_attempt = job.attempt() >= job.max_attempts();
    // A hung handler: the lease stays held and heartbeated, and nothing is answered; the
    // broker's run-time limit ends the attempt (LeaseLost), and a later one is acked.
    if (kind == kKindSlow && job.attempt() == 1) return;
    if (kind == kKindOk || ((kind == kKindFlaky || kind == kKindSlow) && job.attempt() > 1)) {
      a.is_ack = true;
      v1::AckRequest* ack = a.request.mutable_ack();
      ack->set_job_id(job.job_id());
      ack->set_lease_id(job.lease_id());
      ack->set_result(absl::StrCat("done by ", options_.instance));
    } else {
      // Anything else fails: an unknown kind permanently, so that the checker sees it.
      const bool permanent = kind != kKindFlaky && kind != kKindExhaust;
      a.terminal = permanent || last_attempt;
      v1::FailRequest* fail = a.request.mutable_fail();
      fail->set_job_id(job.job_id());
      fail->set_lease_id(job.lease_id());
      fail->set_permanent(permanent);
      fail->set_error(permanent ? absl::StrCat("payload kind ", kind, " fails permanently")
                                : absl::StrCat("payload kind ", kind, " fails this attempt"));
    }
    Send(std::move(a));
  }

  void Send(Answer a) {
    absl::MutexLock write_lock(&write_mu_);
    WorkStream* stream;
    v1::WorkRequest request;
    {
      absl::MutexLock lock(&mu_);
      if (stream_ == nullptr) {
        unsent_.push_back(std::move(a));
        return;
      }
      stream = stream_;
      const uint64_t id = next_request_id_++;
      a.request.set_request_id(id);
      request = a.request;
      in_flight_.emplace(id, std::move(a));
    }
    // A failed write leaves the answer in in_flight_: the broken stream's end moves it back.
    stream->Write(request);
  }

  void Heartbeat() {
    absl::MutexLock write_lock(&write_mu_);
    WorkStream* stream;
    std::vector<v1::WorkRequest> beats;
    {
      absl::MutexLock lock(&mu_);
      if (stream_ == nullptr) return;
      stream = stream_;
      for (const auto& [lease, held] : held_) {
        if (held.lost) continue;
        v1::WorkRequest r;
        r.set_request_id(next_request_id_++);
        r.mutable_heartbeat()->set_job_id(held.job_id);
        r.mutable_heartbeat()->set_lease_id(lease);
        beats.push_back(std::move(r));
      }
    }
    for (const v1::WorkRequest& r : beats) stream->Write(r);
  }

  // Stops new pushes and waits (bounded) until everything received is worked and answered.
  void Drain() {
    {
      absl::MutexLock write_lock(&write_mu_);
      WorkStream* stream;
      v1::WorkRequest flow;
      {
        absl::MutexLock lock(&mu_);
        stream = stream_;
        flow.set_request_id(next_request_id_++);
      }
      flow.mutable_flow()->set_max_in_flight(0);
      if (stream != nullptr) stream->Write(flow);
    }
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return inbox_.empty() && in_flight_.empty() && unsent_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(5));
  }

  const WorkerOptions& options_;
  std::unique_ptr<LineLog> log_;
  BrokerRing brokers_;
  std::mt19937_64 rng_;      // processing thread only
  int64_t connections_ = 0;  // session thread only (read by Handle, which it runs)

  // Taken before mu_ by whoever writes to the stream, so that the stream is not ended while
  // a write is under way and writes never overlap.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  WorkStream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<v1::LeasedJob> inbox_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);      // by lease id
  std::map<uint64_t, Answer> in_flight_ ABSL_GUARDED_BY(mu_);  // by request id
  std::deque<Answer> unsent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int RunWorker(const WorkerOptions& options) {
  // Blocked before any thread starts, so that only sigwait in Run sees SIGTERM.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  absl::StatusOr<std::unique_ptr<LineLog>> log = LineLog::Open(options.log_path);
  if (!log.ok() || options.queues.empty() || options.instance.empty()) {
    std::fprintf(
        stderr, "worker: %s\n",
        log.ok() ? "needs --queues and --id" : std::string(log.status().message()).c_str());
    return 2;
  }
  Worker(options, *std::move(log)).Run(stop);
}

}  // namespace jobbroker::crash
