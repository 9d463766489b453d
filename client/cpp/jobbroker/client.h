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

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace jobbroker::client {

// This library's name and version, in the jobbroker-client metadata and the user agent of its
// calls (the broker's ListWorkers shows it as the worker's client).
inline constexpr char kClientName[] = "jobbroker-cpp/0.1.0";

class Router;

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

// TlsOptions from PEM files. `ca_file` may be empty (default roots); `cert_file` and `key_file`
// go together (both or neither). INVALID_ARGUMENT naming a file that cannot be read or holds no
// PEM block, or a certificate without its key.
absl::StatusOr<TlsOptions> ReadTlsFiles(const std::string& ca_file, const std::string& cert_file,
                                        const std::string& key_file);
// One PEM file's text. INVALID_ARGUMENT "PATH: cannot be read" or "PATH: holds no PEM block".
absl::StatusOr<std::string> ReadPemFile(const std::string& path);

struct ClientOptions {
  // "host:port", or several nodes of one cluster as "h1:p1,h2:p2". Default (when `addresses`
  // is empty too): $JOBBROKER_ADDRESS, which may be such a list, else 127.0.0.1:7070.
  std::string address;
  // More nodes of the same cluster, after those in `address`. The client asks the first that
  // answers for the cluster's layout (Admin.GetCluster) and sends each call straight to the
  // leader of its partition; see Client.
  std::vector<std::string> addresses;
  // Deadline of each call attempt.
  absl::Duration timeout = absl::Seconds(10);
  // Attempts for calls that are safe to repeat, when the broker is UNAVAILABLE (restarting,
  // draining) or the attempt hit its deadline. Waits 100 ms, 200 ms, 400 ms, ... between them
  // (at most 5 s each). Values below 1 mean 1.
  int max_attempts = 5;
  // Called before each retry's wait with the attempt that failed (1-based), its status and the
  // wait that follows; for logging and metrics. Runs on the calling thread.
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
};

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
// a broker that restarts is found again within seconds. Over TLS when `tls` is set.
std::shared_ptr<grpc::Channel> DialBroker(const std::string& address,
                                          const std::optional<TlsOptions>& tls = std::nullopt);

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
};

struct Enqueued {
  std::string job_id;
  bool deduplicated = false;
};

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
// (FAILED_PRECONDITION, NOT_FOUND) and hide that the first one worked.
class Client {
 public:
  explicit Client(ClientOptions options = {});
  ~Client();
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;

  absl::StatusOr<Enqueued> Enqueue(const std::string& queue, const std::string& payload,
                                   const EnqueueOptions& options = {});
  absl::StatusOr<Enqueued> Enqueue(const v1::EnqueueRequest& request);
  // All or nothing.
  absl::StatusOr<std::vector<Enqueued>> EnqueueBatch(const v1::EnqueueBatchRequest& request);

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
  // waitUntilFinished, Celery's AsyncResult.get). The job's `result` holds what the worker
  // returned. DEADLINE_EXCEEDED after `timeout` leaves the job running.
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

  // The channel to the first address given (or ClientOptions::channel).
  const std::shared_ptr<grpc::Channel>& channel() const;
  const ClientOptions& options() const { return options_; }

 private:
  ClientOptions options_;
  std::unique_ptr<Router> router_;
};

// Builds the EnqueueRequest that Client::Enqueue(queue, payload, options) sends.
v1::EnqueueRequest MakeEnqueueRequest(const std::string& queue, const std::string& payload,
                                      const EnqueueOptions& options);

}  // namespace jobbroker::client
