#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "jobbroker/client.h"
#include "jobbroker/v1/broker.pb.h"

namespace grpc {
class Channel;
}

namespace jobbroker::client {

// What a handler sees of the job it runs, and its calls to the worker (progress, checkpoints,
// durable steps) and cancellation signal. Thread-safe.
class JobContext {
 public:
  const std::string& job_id() const { return job_.job_id(); }
  const std::string& queue() const { return job_.queue(); }
  const std::string& payload() const { return job_.payload(); }
  const google::protobuf::Map<std::string, std::string>& headers() const { return job_.headers(); }
  // 1 for the first attempt; attempt() == max_attempts() is the last chance.
  int attempt() const { return job_.attempt(); }
  int max_attempts() const { return job_.max_attempts(); }
  // When the job was enqueued.
  absl::Time enqueued_at() const;
  // The lease's end as the broker granted it when it pushed the job (heartbeats, which the
  // worker sends by itself, move it on).
  absl::Time lease_deadline() const;
  // The results of the jobs this one depended on, by job id (empty for a job without any).
  const google::protobuf::Map<std::string, std::string>& dependency_results() const {
    return job_.dependency_results();
  }
  // The same for every attempt of the job: pass it to side effects' providers so that a repeat
  // (after a crash between the side effect and the ack) is harmless.
  const std::string& idempotency_key() const { return job_.idempotency_key(); }
  // What an earlier attempt saved with SaveCheckpoint (or Step); empty if none.
  const std::string& checkpoint() const { return job_.checkpoint(); }

  // Saves progress. It goes out at once as a heartbeat, is kept durably with the job, and is
  // handed to every later attempt. A handler that uses Step must not call this: the checkpoint
  // then holds the steps (a jobbroker.v1.StepCheckpoint), and anything else breaks them.
  void SaveCheckpoint(std::string data);
  // Reports how far the job is (JSON by convention, e.g. {"percent": 40}). It goes out at once
  // as a heartbeat; while one is unanswered, the newest value waits for its answer (values in
  // between are dropped). Kept as Job.progress; reaches watchers and the dashboard. At most
  // 64 KiB.
  void SetProgress(std::string progress);
  // Kept with the completed job when the handler returns OK.
  void SetResult(std::string result);
  // When this attempt's run-time limit ends it (the broker then fails it TIMED_OUT);
  // absl::InfiniteFuture() if it has none.
  absl::Time timeout_at() const;

  // Cancellation. The signal fires when an operator cancelled the job, its lease was lost, its
  // run-time limit (timeout_at) passed, or the worker is stopping past its grace period: stop
  // soon. What the handler returns then no longer decides the job: the worker sends `fail`
  // "cancelled" for an operator cancel, nothing for a lost lease or a time-out (the broker has
  // ended the attempt), and `release` at the end of a graceful stop's grace. The worker cannot
  // stop a handler that ignores the signal: it holds its handler thread until it returns.
  bool cancelled() const;
  // The same signal as a std::stop_token, for std::stop_callback and std::condition_variable_any.
  std::stop_token stop_token() const;
  // Sleeps for `duration` or until the signal fires, whichever is first. True if it fired.
  bool WaitCancelled(absl::Duration duration) const;

  // A durable step: runs `body` once per job across attempts and workers. Its result (JSON
  // text, "null" for none) is saved in the job's checkpoint, and the save answered by the
  // broker, before Step returns it; a later attempt that reaches the same `name` gets the saved
  // result back without running `body`. The checkpoint is a jobbroker.v1.StepCheckpoint with
  // UTF-8 JSON results, so a job started by a worker in another language resumes here.
  // Errors: `body`'s own error (not saved, so the next attempt runs it again); INVALID_ARGUMENT
  // for an empty name, a name used twice in one job, or a result that is not JSON;
  // FAILED_PRECONDITION if the job's checkpoint was not written by steps (the attempt should
  // fail rather than run steps again) or the broker refused the save; CANCELLED if the signal
  // fired while the save was under way. Return the error from the handler: the attempt fails.
  absl::StatusOr<std::string> Step(absl::string_view name,
                                   absl::FunctionRef<absl::StatusOr<std::string>()> body);

  // Internal: made by the Worker.
  struct Shared;
  JobContext(v1::LeasedJob job, std::shared_ptr<Shared> shared)
      : job_(std::move(job)), shared_(std::move(shared)) {}

 private:
  const v1::LeasedJob job_;
  std::shared_ptr<Shared> shared_;
};

// A handler runs one attempt. OK acks the job; any other status fails the attempt with the
// status's message (retried after the queue's backoff), except the ones below. An exception
// out of a handler fails the attempt the same way; it never ends the worker.
using Handler = std::function<absl::Status(JobContext&)>;

// Wraps the handlers: gets the job and the rest of the chain, `next`, and returns what the
// attempt ends with (usually what `next` returned; without calling it, its own result stands).
// Logging, metrics, tracing.
using Middleware = std::function<absl::Status(JobContext& job, const Handler& next)>;

// Fails the job with no retry: it dies with FAIL_REASON_PERMANENT (a bad address, a
// validation error: something another attempt cannot fix).
absl::Status PermanentError(absl::string_view message);
// Fails the attempt and asks for the next one after `delay`, instead of the computed backoff
// (a provider's Retry-After).
absl::Status RetryAfter(absl::Duration delay, absl::string_view message);
// Gives the job back to run again after `delay` without spending an attempt (a snooze: not
// ready yet, try later). The queue's max_snoozes bounds how often.
absl::Status Snooze(absl::Duration delay);
// Whether `status` is one Snooze made (for middleware: a snooze is not a failure).
bool IsSnooze(const absl::Status& status);

// What a Worker runs and how. The connection (address, addresses, channel, tls, token) is the
// ClientOptions' own: give a ClientOptions to Worker(ClientOptions, WorkerOptions) to share it
// with a Client; the fields of the same name here are for the one-argument constructor.
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
  // Pings that find a broker that stopped answering: the stream then ends and reconnects (see
  // KeepaliveOptions in client.h). Start refuses a bad one. Not used with `channel`.
  KeepaliveOptions keepalive;
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

// Runs handlers for jobs pushed over Broker.Work streams (one per leading node in a cluster,
// see below): one handler per queue,
// `concurrency` jobs at a time, heartbeats while they run (and while `prefetch` more wait), ack
// or fail when they return (acks coalesced: one ack message in flight, those that end meanwhile
// go out together as one AckBatch), answers not yet answered sent again after a reconnect,
// acks, fails, releases and checkpoints the broker answered UNAVAILABLE ("retry": a partition
// between leaders) sent again after 250 ms (or on the next stream), reconnects with backoff
// when the broker restarts, and stops gracefully. The behaviour is
// docs/worker-contract.md's; tests/interop/cpp/conformance_worker.cc drives it through
// tests/interop/conformance.py.
//
// `concurrency` is a hard bound. A handler whose cancellation fired (operator cancel, lost
// lease, time-out) but that keeps running holds its handler thread until it returns: the worker
// cannot stop code that ignores the signal, and starts no other handler beside it. A worker
// whose threads are all stuck shows so in Admin.ListWorkers.
//
//   jobbroker::client::Worker worker({.concurrency = 4});
//   worker.Handle("emails", [](jobbroker::client::JobContext& job) {
//     return SendEmail(job.payload(), job.idempotency_key());
//   });
//   worker.Start();
//   ...
//   worker.Stop();  // or Run(), with Stop called from another thread
//
// In a cluster (docs/worker-contract.md §5, "One stream per leading node") the worker holds one
// Work stream per node that leads a handled queue's partition (Admin.GetCluster tells which),
// each subscribed to that node's queues with its share of concurrency + prefetch (the i-th of
// k streams gets max / k, plus 1 when i < max % k, at least 1), and one more to any node for
// queues whose partition has no leader; `concurrency` stays one pool. A job's answers go on the
// stream that pushed it while it is open, else on another. When a stream ends, the worker waits
// the backoff, asks for the layout again and regroups: streams still wanted keep running, the
// others end, the missing ones open (a leader that moved or died). While it holds a stream to
// any node, it asks for the layout again after each backoff delay (growing to reconnect_max) and
// regroups: a node that knows the new leader relays that stream rather than end it, and the
// next layout moves its queues to the leader's own stream. Without an answer to GetCluster it
// holds one stream, on the first address that answers.
//
// Thread-safe. Handlers run on the worker's threads.
class Worker {
 public:
  explicit Worker(WorkerOptions options = {});
  // The connection from `client` (address, addresses, channel, tls, token: the options a
  // Client takes), the rest from `options`, whose connection fields are ignored.
  Worker(const ClientOptions& client, WorkerOptions options);
  ~Worker();  // Stop() with the default grace if still running
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Registers the handler of `queue`; the worker subscribes to the queues that have one. Call
  // before Start.
  void Handle(std::string queue, Handler handler);
  // Adds a middleware around every handler; the first added is the outermost. Call before
  // Start.
  void Use(Middleware middleware);

  // Connects and starts taking jobs. Returns the broker's refusal of the subscription (e.g.
  // INVALID_ARGUMENT for a bad queue name) or FAILED_PRECONDITION if no handler is registered;
  // a broker that cannot be reached is not an error: the worker keeps reconnecting.
  absl::Status Start();

  // Graceful stop: takes no new jobs (flow 0), gives back (Release) the ones received but not
  // started and any pushed later, lets running handlers finish for up to `grace`, then fires
  // the stragglers' cancellation signal; their jobs are released whatever they end with (no
  // attempt spent: the stop was not the job's fault). A straggler gets 1 s to return; one that
  // has not by then has its job released anyway and is left running on its thread (its answer
  // is dropped; what it uses must outlive it). Then waits up to 1 s for the answers of what was
  // sent, half-closes the streams (cancelled after 2 s) and returns. A stream that ends before
  // that half-close (the broker restarted, a leader moved) is reopened after the reconnect
  // backoff, as while running but without a subscription, so that the acks, fails and releases
  // still to come reach the broker; if none can be reopened in time, they are dropped when the
  // waits above are over (the stop takes no longer for it). The library takes no
  // signals: a main() that wants SIGTERM to stop the worker calls Stop from its own signal
  // handling thread (client/cpp/examples/email_worker.cc).
  // Called before Start, it makes Start and Run return OK at once without connecting.
  void Stop(absl::Duration grace = absl::Seconds(30));

  // Blocks until Stop() has finished (for a main() whose signal handler calls Stop), or the
  // worker stopped itself as Run() describes.
  void Wait();

  // Start(), then blocks until the worker stopped. OK after Stop() (from another thread, e.g.
  // one that waits for SIGTERM). Start()'s errors; or, once running, the code of a stream that
  // ended in a way reconnecting cannot fix (INVALID_ARGUMENT for a bad queue name,
  // UNAUTHENTICATED, PERMISSION_DENIED: the caller's mistake, which retrying would hide): the
  // worker then stops at once, without grace, and returns it. A stream that ends UNAVAILABLE,
  // UNKNOWN, INTERNAL, DEADLINE_EXCEEDED, CANCELLED, ABORTED, RESOURCE_EXHAUSTED or OK (the
  // broker shut down) is reopened after the reconnect backoff instead. So is a stream whose
  // subscription the broker answered with an error but left open (UNAVAILABLE: a queue's
  // partition has no leader yet): the worker ends it itself.
  absl::Status Run();

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
  // Shared with the handler threads: one stuck in a handler that ignores its cancellation
  // outlives Stop (and this object), and keeps what it uses alive.
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobbroker::client
