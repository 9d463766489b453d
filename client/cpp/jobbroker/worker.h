#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "jobbroker/client.h"
#include "jobbroker/v1/broker.pb.h"

namespace grpc {
class Channel;
}

namespace jobbroker::client {

// What a handler sees of the job it runs. Thread-safe.
class JobContext {
 public:
  const std::string& job_id() const { return job_.job_id(); }
  const std::string& queue() const { return job_.queue(); }
  const std::string& payload() const { return job_.payload(); }
  const google::protobuf::Map<std::string, std::string>& headers() const { return job_.headers(); }
  // 1 for the first attempt; attempt() == max_attempts() is the last chance.
  int attempt() const { return job_.attempt(); }
  int max_attempts() const { return job_.max_attempts(); }
  // The same for every attempt of the job: pass it to side effects' providers so that a repeat
  // (after a crash between the side effect and the ack) is harmless.
  const std::string& idempotency_key() const { return job_.idempotency_key(); }
  // What an earlier attempt saved with SaveCheckpoint; empty if none.
  const std::string& checkpoint() const { return job_.checkpoint(); }

  // Saves progress. It travels with the next heartbeat, is kept durably with the job, and is
  // handed to every later attempt.
  void SaveCheckpoint(std::string data);
  // Reports how far the job is (JSON by convention, e.g. {"percent": 40}); it travels with the
  // next heartbeat, is kept as Job.progress, and reaches watchers and the dashboard. At most
  // 64 KiB.
  void SetProgress(std::string progress);
  // Kept with the completed job when the handler returns OK.
  void SetResult(std::string result);
  // When this attempt's run-time limit ends it (the broker then fails it TIMED_OUT);
  // absl::InfiniteFuture() if it has none.
  absl::Time timeout_at() const;
  // True once an operator cancelled the job, its lease was lost, its run-time limit passed, or
  // the worker is stopping past its grace period: stop soon (what the handler returns then is
  // still reported, and refused by the broker if the attempt has already ended).
  bool cancelled() const;

  // Internal: made by the Worker.
  struct Shared;
  JobContext(v1::LeasedJob job, std::shared_ptr<Shared> shared)
      : job_(std::move(job)), shared_(std::move(shared)) {}

 private:
  const v1::LeasedJob job_;
  std::shared_ptr<Shared> shared_;
};

// A handler runs one attempt. OK acks the job; any other status fails the attempt with the
// status's message (retried after the queue's backoff), except the two below.
using Handler = std::function<absl::Status(JobContext&)>;

// Fails the job with no retry: it dies with FAIL_REASON_PERMANENT (a bad address, a
// validation error: something another attempt cannot fix).
absl::Status PermanentError(absl::string_view message);
// Fails the attempt and asks for the next one after `delay`, instead of the computed backoff
// (a provider's Retry-After).
absl::Status RetryAfter(absl::Duration delay, absl::string_view message);
// Gives the job back to run again after `delay` without spending an attempt (a snooze: not
// ready yet, try later). The queue's max_snoozes bounds how often.
absl::Status Snooze(absl::Duration delay);

struct WorkerOptions {
  // "host:port", or several nodes of one cluster as "h1:p1,h2:p2"; default (when `addresses`
  // is empty too) $JOBBROKER_ADDRESS, else 127.0.0.1:7070.
  std::string address;
  // More nodes of the same cluster, after those in `address` (see Worker).
  std::vector<std::string> addresses;
  // Use this channel instead of dialing `address` (`tls` is then ignored; no routing).
  std::shared_ptr<grpc::Channel> channel;
  // TLS to the broker; nullopt: plaintext (see client.h).
  std::optional<TlsOptions> tls;
  // Bearer token sent on the Work stream (a token with the worker role on every handled
  // queue). Default: $JOBBROKER_TOKEN, else none.
  std::string token;
  // Names this worker in attempt histories; default "<hostname>-<pid>".
  std::string worker_id;
  // Jobs run at once (handler threads).
  int concurrency = 1;
  // Jobs held ready beyond `concurrency`, so a freed handler thread need not wait for the next
  // push. They hold leases while they wait; a graceful stop gives them back unstarted.
  int prefetch = 0;
  // Lease asked for each job; zero = the job's, else the queue's. Heartbeats go out at a third
  // of it, so a hung or dead worker loses its jobs after one lease.
  absl::Duration lease_duration = absl::ZeroDuration();
  // Reconnect backoff after the broker went away: doubles from `reconnect_initial` up to
  // `reconnect_max`.
  absl::Duration reconnect_initial = absl::Milliseconds(100);
  absl::Duration reconnect_max = absl::Seconds(5);
};

// Runs handlers for jobs pushed over one Broker.Work stream: `concurrency` jobs at a time,
// heartbeats while they run, ack or fail when they return, reconnects with backoff when the
// broker restarts, and stops gracefully.
//
//   jobbroker::client::Worker worker({.concurrency = 4});
//   worker.Handle("emails", [](jobbroker::client::JobContext& job) {
//     return SendEmail(job.payload(), job.idempotency_key());
//   });
//   worker.Start();
//   ...
//   worker.Stop();  // or wait in Run()
//
// In a cluster the stream goes straight to the leader when every handled queue's partition has
// the same leader (Admin.GetCluster tells which); otherwise to any node, which serves the
// queues of every partition through it. After the stream ends the worker asks for the cluster's
// layout again and connects to the leader it names (a leader that moved or died).
//
// Thread-safe. Handlers run on the worker's threads.
class Worker {
 public:
  explicit Worker(WorkerOptions options = {});
  ~Worker();  // Stop() with the default grace if still running
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Registers the handler of `queue`. Call before Start.
  void Handle(std::string queue, Handler handler);

  // Connects and starts taking jobs. Returns the broker's refusal of the subscription (e.g.
  // INVALID_ARGUMENT for a bad queue name) or FAILED_PRECONDITION if no handler is registered;
  // a broker that cannot be reached is not an error: the worker keeps reconnecting.
  absl::Status Start();

  // Graceful stop: takes no new jobs, gives back (Release) the ones received but not started,
  // lets running handlers finish for up to `grace`, then marks the stragglers cancelled and
  // waits for them to return (their leases run out if they never do). Returns once every
  // handler returned and every ack was answered or the grace period is over.
  void Stop(absl::Duration grace = absl::Seconds(30));

  // Blocks until Stop() has finished (for a main() whose signal handler calls Stop).
  void Wait();

  // Attempts this worker finished, by outcome (for tests and logs).
  struct Stats {
    int64_t acked = 0;
    int64_t failed = 0;
    int64_t released = 0;
    int64_t snoozed = 0;
    int64_t reconnects = 0;
  };
  Stats stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace jobbroker::client
