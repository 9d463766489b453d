#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "jobbroker/version.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace jobbroker::client {

// This library's name and version, in the jobbroker-client metadata and the user agent of its
// calls (the broker's ListWorkers shows it as the worker's client).
inline constexpr char kClientName[] = "jobbroker-cpp/" JOBBROKER_CLIENT_VERSION;

class Router;
class Coalescer;

// TLS for the channel to the broker (its --tls-cert, and --tls-client-ca for mutual TLS). PEM
// text; ReadTlsFiles loads it from files.
struct TlsOptions {
  // The roots that must have signed the broker's certificate. Empty: gRPC's default roots (the
  // system's trust store, or $GRPC_DEFAULT_SSL_ROOTS_FILE_PATH).
  std::string ca_pem;
  // This client's certificate chain and private key, for mutual TLS. Both or neither.
  std::string cert_pem;
  std::string key_pem;
  // The name the broker's certificate must carry when it is not the host of the address (a
  // broker dialled by IP address or through a tunnel). Empty: the address's host.
  std::string server_name;
};

// gRPC keepalive on the channels to the broker: without a frame from the broker for `time`, a
// ping; without its answer within `timeout`, the connection is given up and its calls end
// UNAVAILABLE (a Work stream then reconnects, to another node in a cluster). A broker that froze,
// lost power or sits behind a firewall that drops packets goes unnoticed by TCP: a stream on it
// would wait forever. Pings go on idle connections too. The broker accepts pings as often as
// once a second. `time` zero: no pings.
struct KeepaliveOptions {
  absl::Duration time = absl::Seconds(10);
  absl::Duration timeout = absl::Seconds(5);
};

// TlsOptions from PEM files. `ca_file` may be empty (default roots); `cert_file` and `key_file`
// go together (both or neither). INVALID_ARGUMENT naming a file that cannot be read or holds no
// PEM block, or a certificate without its key.
absl::StatusOr<TlsOptions> ReadTlsFiles(const std::string& ca_file, const std::string& cert_file,
                                        const std::string& key_file);
// One PEM file's text. INVALID_ARGUMENT "PATH: cannot be read" or "PATH: holds no PEM block".
absl::StatusOr<std::string> ReadPemFile(const std::string& path);

// How a Client and a Worker reach the broker: one set of options for both, so a program that
// enqueues and works jobs configures the connection once:
//
//   jobbroker::client::ClientOptions options{
//       .address = "broker-0:7070,broker-1:7070", .tls = *ReadTlsFiles(ca, cert, key),
//       .token = token};
//   jobbroker::client::Client client(options);
//   jobbroker::client::Worker worker(options, {.concurrency = 4});
//
// Every call carries `jobbroker-client: <kClientName>` and, with a token, `authorization:
// Bearer <token>`.
struct ClientOptions {
  // "host:port", or several nodes of one cluster as "h1:p1,h2:p2". Default (when `addresses`
  // is empty too): $JOBBROKER_ADDRESS, which may be such a list, else 127.0.0.1:7070.
  std::string address;
  // More nodes of the same cluster, after those in `address`, tried in order: the client asks
  // the first that answers for the cluster's layout (Admin.GetCluster) and sends each call
  // straight to the leader of its partition; a call that fails UNAVAILABLE makes the next one
  // ask the others. See Client.
  std::vector<std::string> addresses;
  // The default deadline of each unary call attempt (WatchJob and the Work stream have none).
  absl::Duration timeout = absl::Seconds(10);
  // Attempts for calls that are safe to repeat, when the broker is UNAVAILABLE (restarting,
  // draining) or the attempt hit its deadline. Waits 100 ms, 200 ms, 400 ms, ... between them
  // (at most 5 s each). Values below 1 mean 1.
  int max_attempts = 3;
  // Called before each retry's wait with the attempt that failed (1-based), its status and the
  // wait that follows; for logging and metrics. Runs on the calling thread (for a coalesced
  // batch, on the thread of the caller that sends it).
  std::function<void(int attempt, const absl::Status& status, absl::Duration wait)> on_retry;
  // Use this channel instead of dialing `address` (tests, custom credentials); `tls` is then
  // ignored, `token` is still sent. Every call goes through it: no routing to leaders.
  std::shared_ptr<grpc::Channel> channel;
  // TLS to the broker; nullopt: plaintext.
  std::optional<TlsOptions> tls;
  // Bearer token for a broker started with --auth-tokens, sent with every call as the metadata
  // `authorization: Bearer <token>`. Default: $JOBBROKER_TOKEN, else none. Without `tls` it
  // crosses the network in the clear. A token that is not printable ASCII fails every call with
  // INVALID_ARGUMENT (nothing is sent).
  std::string token;
  // Pings that find a broker that stopped answering (see KeepaliveOptions). Not used with
  // `channel`.
  KeepaliveOptions keepalive;

  // Enqueue coalescing (docs/worker-contract.md §10): concurrent Enqueue calls (EnqueueAndWait's
  // too) are merged into EnqueueBatch calls, one batch per partition (and apart for jobs with a
  // dedup key), and each caller still gets its own answer. false: every Enqueue is one unary
  // call, as before. EnqueueBatch is always sent as it is. See Client.
  bool batching = true;
  // A batch is sent once it holds this many jobs: 1 to 1000.
  int batch_max_jobs = 100;
  // ... or once its jobs' payload and header (name and value) bytes reach this: 1 byte to
  // 64 MiB. A job that would carry a batch past it goes into the next one.
  int64_t batch_max_bytes = int64_t{1} << 20;
  // How long a batch that could be sent waits for more jobs; finite, not negative. 0: none, the
  // caller whose job opened it sends it at once (batches then form only while
  // batch_max_in_flight of their key are in flight, which is when merging pays).
  absl::Duration batch_linger = absl::ZeroDuration();
  // Batches of one key in flight at once, at least 1; later jobs wait in the open batch.
  int batch_max_in_flight = 4;
};

// OK, or INVALID_ARGUMENT naming the first option out of its range ("batch_max_jobs must be 1 to
// 1000, not 0"). Client's constructor throws std::invalid_argument with this message for such
// options; call it first to handle the error without exceptions.
absl::Status ValidateClientOptions(const ClientOptions& options);
// OK, or INVALID_ARGUMENT naming the field: a negative time, or a timeout outside 1 ms to 1 h
// while pings are on.
absl::Status ValidateKeepalive(const KeepaliveOptions& keepalive);

// The address ClientOptions{} dials: $JOBBROKER_ADDRESS, else 127.0.0.1:7070. May be a
// comma-separated list.
std::string DefaultAddress();
// The addresses in `text`, a comma-separated list ("h1:p1, h2:p2"); spaces around each and
// empty items are dropped.
std::vector<std::string> SplitAddresses(std::string_view text);

// The token ClientOptions{} sends: $JOBBROKER_TOKEN, else "" (none).
std::string DefaultToken();

// A channel to the broker at `address` (empty: DefaultAddress()) with the settings every
// client here uses: 64 MiB messages, and reconnects that back off from 100 ms to at most 2 s, so
// a broker that restarts is found again within seconds, and `keepalive`'s pings. Over TLS when
// `tls` is set.
std::shared_ptr<grpc::Channel> DialBroker(const std::string& address,
                                          const std::optional<TlsOptions>& tls = std::nullopt,
                                          const KeepaliveOptions& keepalive = {});

// Adds `token` to `ctx` as `authorization: Bearer <token>` (nothing if `token` is empty).
// INVALID_ARGUMENT, without the token in the message, if it is not printable ASCII (a token
// file's trailing newline, say), which gRPC could not send.
absl::Status AddBearerToken(const std::string& token, grpc::ClientContext* ctx);

// Adds what every call of this library carries: `jobbroker-client: <kClientName>`
// (Admin.ListWorkers shows it) and the bearer token as AddBearerToken does, with its error.
absl::Status AddCallMetadata(const std::string& token, grpc::ClientContext* ctx);

// Options of one Enqueue; unset fields take the queue's policy.
struct EnqueueOptions {
  std::map<std::string, std::string> headers;
  int32_t priority = 0;
  std::optional<absl::Duration> delay;
  std::optional<absl::Time> run_at;
  // Makes Enqueue safe to retry: a repeat returns the first job (deduplicated = true).
  std::string dedup_key;
  std::optional<absl::Duration> dedup_ttl;
  int max_attempts = 0;
  std::optional<absl::Duration> lease_duration;
  std::string concurrency_key;
  // Run-time limit of each attempt (heartbeats or not); unset = the queue's.
  std::optional<absl::Duration> timeout;
  // A job not started by then dies FAILED with FAIL_REASON_EXPIRED.
  std::optional<absl::Time> expire_at;
  // Jobs (of the same partition) it waits for: WAITING until all completed; FAILED
  // (DEPENDENCY_FAILED) if one fails. The leased job carries their results.
  std::vector<std::string> depends_on;
  // false: sent at once as a unary Enqueue of its own, never merged with other calls' jobs
  // (ClientOptions::batching off for this call).
  bool batch = true;
};

struct Enqueued {
  std::string job_id;
  bool deduplicated = false;
};

// The rest of an enqueue's chain: the next producer middleware, the last one the call itself.
// One result per job, in order.
using EnqueueHandler =
    std::function<absl::StatusOr<std::vector<Enqueued>>(v1::EnqueueBatchRequest& jobs)>;
// Wraps Client::Enqueue, EnqueueBatch and EnqueueAndWait's enqueue, once per call (before any
// retry): gets the call's jobs (one for Enqueue), which it may change (add headers: a trace
// context, a tenant) but not add or remove, and `next`; returns what the call ends with
// (usually what `next` returned; without calling it, nothing is sent and its own result
// stands). Sidekiq's client middleware, asynq's producer hooks.
using EnqueueMiddleware = std::function<absl::StatusOr<std::vector<Enqueued>>(
    v1::EnqueueBatchRequest& jobs, const EnqueueHandler& next)>;

// What EnqueueAndWait returns for a job that ended FAILED or CANCELLED: ABORTED, with a message
// that names the job, its state and why ("job 01J... ended JOB_STATE_FAILED
// (FAIL_REASON_PERMANENT): bad address"); the job as it ended rides along as the status's
// payload, which EndedJob gives back.
absl::Status JobEndedError(const v1::Job& job);
// The job a JobEndedError carries; nullopt for any other status.
std::optional<v1::Job> EndedJob(const absl::Status& status);

// A producer's and operator's handle on one broker or a cluster. Thread-safe; calls share one
// channel per broker node.
//
// Cluster mode: before its first call the client asks the first address that answers for the
// cluster's layout (Admin.GetCluster), then sends each call to the leader of its partition:
// calls about a queue (Enqueue, GetQueue, ListJobs, UpdateQueuePolicy, Pause, Resume, Purge, the
// queue form of RetryJob) by the queue's partition, calls about a job (GetJob, CancelJob,
// RetryJob, DeleteJob) by the partition its id carries, EnqueueBatch by its first job's queue
// (a batch spanning partitions is the broker's to refuse), and ListQueues, Health and
// GetCluster to any node. A call that fails UNAVAILABLE or DEADLINE_EXCEEDED (a leader moved, a
// node died) makes the next attempt ask for the layout again, from the nodes it knows and the
// given addresses. A broker outside a cluster, or one that does not know GetCluster, gets every
// call: any node forwards a call to its partition's leader, so routing only saves a hop.
//
// Errors come back as absl::Status with the broker's code and message (INVALID_ARGUMENT names
// the bad field, NOT_FOUND, FAILED_PRECONDITION, ALREADY_EXISTS, RESOURCE_EXHAUSTED,
// UNAVAILABLE). Calls that are safe to repeat are retried on UNAVAILABLE and DEADLINE_EXCEEDED
// (reads, policy changes, pause, resume, purge, and Enqueue/EnqueueBatch only when every job has
// a dedup_key: without one a retry after a lost reply would enqueue the job twice). CancelJob,
// RetryJob and DeleteJob are not retried: after a lost reply the repeat would be refused
// (FAILED_PRECONDITION, NOT_FOUND) and hide that the first one worked. Of the Broker calls a
// worker may make without the Work stream, Heartbeat, Ack, Fail and Release are retried (the
// broker answers a repeat for the same lease as it answered the first) and Lease is not (a
// repeat would lease more jobs).
//
// Enqueue coalescing (ClientOptions::batching, on by default; docs/worker-contract.md §10):
// Enqueue (and EnqueueAndWait) hand their job, after the producer middlewares, to the open
// batch of its key: its partition (by the partition count of the cluster table the client
// holds, else its queue) and whether it has a dedup key. A caller whose job finds fewer than
// batch_max_in_flight batches of its key in flight sends the batch at once from its own thread
// (after batch_linger, if set); otherwise the job waits in the open batch, which the thread that
// ends an in-flight batch of the key hands on. A batch is also sent once it holds
// batch_max_jobs jobs or batch_max_bytes bytes. A batch of one is a unary Enqueue, so a lone
// call costs what it did; more go as one EnqueueBatch, in the order of their calls, with the
// earliest of their deadlines. Each caller gets its own job's result. A batch refused whole
// (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ALREADY_EXISTS, FAILED_PRECONDITION, NOT_FOUND,
// OUT_OF_RANGE, PERMISSION_DENIED: nothing applied) is sent again one job per call, so a bad job
// fails only its own call, with the unary call's message; any other error (UNAVAILABLE after the
// retries, which only a batch of dedup-keyed jobs gets, DEADLINE_EXCEEDED, ...) is every
// caller's. Enqueue blocks its caller until its job is answered.
//
// Use() registers producer middleware before the first call; the other methods may then be
// called from any thread.
class Client {
 public:
  // Throws std::invalid_argument (ValidateClientOptions' message) for options out of range.
  explicit Client(ClientOptions options = {});
  // Close(), then the channels close.
  ~Client();
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;

  // Adds a producer middleware around every Enqueue and EnqueueBatch; the first added is the
  // outermost. Call before the first enqueue (not thread-safe with calls under way).
  void Use(EnqueueMiddleware middleware);

  absl::StatusOr<Enqueued> Enqueue(const std::string& queue, const std::string& payload,
                                   const EnqueueOptions& options = {});
  // `batch` false: sent at once as a unary call of its own (EnqueueOptions::batch).
  absl::StatusOr<Enqueued> Enqueue(const v1::EnqueueRequest& request, bool batch = true);
  // All or nothing. Sent as it is: never merged with other calls' jobs, never split.
  absl::StatusOr<std::vector<Enqueued>> EnqueueBatch(const v1::EnqueueBatchRequest& request);

  // Sends the open batches of coalesced enqueues now (cutting batch_linger short) and waits
  // until every batch in flight is answered. Enqueue calls made after it are sent alone, as
  // unary calls. The destructor calls it; call it first to drain from a thread of your choice.
  void Close();

  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Follows a job until it ends (Admin.WatchJob) and returns it in its terminal state. Calls
  // `on_change` (when set) with the job as it is now and after each change of its state, attempt
  // or progress. DEADLINE_EXCEEDED once `timeout` has passed (the job is not touched). A broken
  // connection or a moved leader is not an error: the client watches again, and `on_change` may
  // then see the same state twice. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::Job> WatchJob(const std::string& job_id,
                                   absl::Duration timeout = absl::InfiniteDuration(),
                                   const std::function<void(const v1::Job&)>& on_change = nullptr);
  // Enqueue, then WatchJob: what a producer that needs the result calls (BullMQ's
  // waitUntilFinished, Celery's AsyncResult.get). The COMPLETED job, whose `result` holds what
  // the worker returned; a job that ended FAILED or CANCELLED is JobEndedError (ABORTED naming
  // the state; EndedJob gives the job). DEADLINE_EXCEEDED after `timeout` leaves the job
  // running. Enqueue's own errors as they are.
  absl::StatusOr<v1::Job> EnqueueAndWait(const std::string& queue, const std::string& payload,
                                         const EnqueueOptions& options = {},
                                         absl::Duration timeout = absl::InfiniteDuration());
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id);
  // A FAILED or CANCELLED job back to READY; returns it.
  absl::StatusOr<v1::Job> RetryJob(const std::string& job_id);
  // Either form of RetryJob; with `queue` the bulk redrive (`matched`, `retried`).
  absl::StatusOr<v1::RetryJobResponse> RetryJob(const v1::RetryJobRequest& request);
  // Removes a job that is not ACTIVE.
  absl::Status DeleteJob(const std::string& job_id);
  absl::StatusOr<std::vector<v1::QueueInfo>> ListQueues();
  // The connected workers and what each runs (Admin.ListWorkers); only those of `queue` when
  // it is set. Any node answers for the whole cluster.
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers(const std::string& queue = "");
  // Recurring schedules (Admin.PutSchedule and the rest): created or replaced whole, by
  // schedule_id; each run enqueues schedule.template once. Any node answers the calls by id.
  absl::StatusOr<v1::Schedule> PutSchedule(const v1::Schedule& schedule);
  absl::StatusOr<v1::Schedule> GetSchedule(const std::string& schedule_id);
  absl::StatusOr<std::vector<v1::Schedule>> ListSchedules(const std::string& queue = "");
  absl::Status DeleteSchedule(const std::string& schedule_id);
  // One run now (also while paused); the job it enqueued.
  absl::StatusOr<v1::TriggerScheduleResponse> TriggerSchedule(const std::string& schedule_id);
  absl::StatusOr<v1::QueueInfo> GetQueue(const std::string& queue);
  absl::StatusOr<v1::QueueInfo> UpdateQueuePolicy(const v1::UpdateQueuePolicyRequest& request);
  // Stop (Pause) or restart (Resume) leasing from a queue; returns the queue.
  absl::StatusOr<v1::QueueInfo> PauseQueue(const std::string& queue);
  absl::StatusOr<v1::QueueInfo> ResumeQueue(const std::string& queue);
  // Removes the queue's jobs in `states` (empty: every terminal state); returns how many. After
  // a retry (a lost reply) the count is only the repeat's.
  absl::StatusOr<int64_t> PurgeQueue(const std::string& queue,
                                     const std::vector<v1::JobState>& states = {});
  // OK when the broker answers the standard health check with SERVING (one node of a cluster).
  absl::Status Health();
  // The cluster's nodes, partitions and leaders, as one node sees them. A single broker answers
  // with an empty cluster_name; one older than cluster mode with UNIMPLEMENTED.
  absl::StatusOr<v1::ClusterInfo> GetCluster();

  // The Broker service's unary calls, for a worker that polls instead of holding a Work stream
  // (the Worker class does not use them). Lease waits up to `wait` for a job (long poll; its
  // deadline is the call timeout plus `wait`) and is not retried. The others name the lease
  // Lease handed out and are retried: a repeat for the same lease gets the first one's answer.
  absl::StatusOr<std::vector<v1::LeasedJob>> Lease(const v1::LeaseRequest& request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::Status Ack(const std::string& job_id, const std::string& lease_id,
                   const std::string& result = "");
  absl::StatusOr<v1::FailResponse> Fail(const v1::FailRequest& request);
  absl::Status Release(const std::string& job_id, const std::string& lease_id,
                       absl::Duration delay = absl::ZeroDuration());

  // The channel to the first address given (or ClientOptions::channel).
  const std::shared_ptr<grpc::Channel>& channel() const;
  const ClientOptions& options() const { return options_; }

 private:
  // `jobs` through the middlewares to `send`, the call itself.
  absl::StatusOr<std::vector<Enqueued>> ThroughMiddlewares(const v1::EnqueueBatchRequest& jobs,
                                                           const EnqueueHandler& send);
  // One job as the chain's last step: to the coalescer, or a unary call.
  absl::StatusOr<Enqueued> SendOne(const v1::EnqueueRequest& request, bool batch);
  absl::StatusOr<std::vector<Enqueued>> SendEnqueueBatch(const v1::EnqueueBatchRequest& request);

  ClientOptions options_;
  std::unique_ptr<Router> router_;
  // With ClientOptions::batching; declared after router_, which its sends use, so that it is
  // closed first.
  std::unique_ptr<Coalescer> coalescer_;
  // Around SendEnqueue and SendEnqueueBatch, the first outermost; set before the first call,
  // then only read.
  std::vector<EnqueueMiddleware> enqueue_middlewares_;
};

// Builds the EnqueueRequest that Client::Enqueue(queue, payload, options) sends.
v1::EnqueueRequest MakeEnqueueRequest(const std::string& queue, const std::string& payload,
                                      const EnqueueOptions& options);

}  // namespace jobbroker::client
