#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"

// Forward declarations keep gRPC's and etcd's generated headers out of everything that includes
// this one.
namespace grpc {
class ClientContext;
class Status;
}  // namespace grpc

namespace jobbroker::cluster {

struct GrpcEtcdOptions {
  // etcd's client URLs (`--cluster-etcd URL[,URL…]`): "http://host:port", "https://host:port"
  // (TLS with the files below), or "host:port" (plain). At least one.
  std::vector<std::string> endpoints;
  // Deadline of each unary call and of each KeepAliveOnce. Default 5 s: etcd answers in
  // milliseconds; a call that takes longer meets an etcd without a leader or out of reach, and the
  // caller is better told (kUnavailable) than kept waiting. A LeaseKeeper wants it well below its
  // lease's TTL.
  absl::Duration call_timeout = absl::Seconds(5);
  // How long a call waits for its endpoint to connect before it moves to the next one (within
  // call_timeout). Default 1 s: a loopback or LAN connection takes milliseconds.
  absl::Duration connect_timeout = absl::Seconds(1);
  // TLS (https:// endpoints), PEM files: `ca_file`, the roots that sign etcd's certificate (empty:
  // gRPC's default roots); `cert_file` and `key_file`, a client certificate for etcd's
  // --client-cert-auth (both or neither).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // etcd's own authentication: when `user` is set, every call carries the token that
  // Auth.Authenticate gives for `user` and `password` (fetched at the first call and again when
  // etcd says it is invalid).
  std::string user;
  std::string password;
  // How long a broken watch stream waits before it reconnects (to the next endpoint). Default
  // 100 ms.
  absl::Duration watch_retry_delay = absl::Milliseconds(100);
  // The longest gRPC waits between two attempts to reconnect a channel. Default 1 s (gRPC's own is
  // 120 s: far too long for a lease of 3 s).
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
};

// The Etcd interface over etcd's v3 gRPC API (etcd 3.4: KV, Lease, Watch, Auth), with stubs
// generated at build time from Debian's copy of etcd's .proto files.
//
// Endpoints: calls go to one endpoint until it fails with kUnavailable; then the next is used.
// A read (Get, GetPrefix, KeepAliveOnce, GrantLease: a lease granted twice expires unused) is tried
// on every endpoint before kUnavailable is returned; a write (Put, Delete, Txn, RevokeLease) is
// not retried, since it may have been applied: the caller gets kUnavailable and decides.
//
// Watches: each runs on a thread of its own with one Watch stream. When the stream breaks (etcd
// restarted, an endpoint lost), the thread reconnects after `watch_retry_delay`, on the next
// endpoint, from the last delivered revision + 1, so no event is lost or repeated. A start
// revision that etcd has compacted is reported to the callback as kOutOfRange, and the watch ends.
//
// Thread-safe. The destructor ends every watch (and waits for their threads).
class GrpcEtcd final : public Etcd {
 public:
  // A client of the etcd at `options.endpoints`. Connects lazily: etcd need not be up yet.
  // kInvalidArgument for no endpoint or a malformed URL; kFailedPrecondition if a TLS file cannot
  // be read.
  static absl::StatusOr<std::unique_ptr<GrpcEtcd>> Create(GrpcEtcdOptions options);
  ~GrpcEtcd() override;

  GrpcEtcd(const GrpcEtcd&) = delete;
  GrpcEtcd& operator=(const GrpcEtcd&) = delete;

  absl::StatusOr<LeaseId> GrantLease(absl::Duration ttl) override;
  absl::StatusOr<absl::Duration> KeepAliveOnce(LeaseId lease) override;
  absl::Status RevokeLease(LeaseId lease) override;
  absl::StatusOr<GetResult> Get(const std::string& key) override;
  absl::StatusOr<GetResult> GetPrefix(const std::string& prefix) override;
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              LeaseId lease = 0) override;
  absl::StatusOr<int64_t> Delete(const std::string& key) override;
  absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                const std::vector<TxnOp>& then_ops,
                                const std::vector<TxnOp>& else_ops) override;
  // A start revision of 0 is resolved first (one Range call, so kUnavailable is possible) to the
  // store's revision + 1, so a stream that breaks before its first event still resumes there.
  absl::StatusOr<WatchId> Watch(const std::string& prefix, int64_t start_revision,
                                WatchCallback callback) override;
  absl::Status CancelWatch(WatchId watch) override;

  // Not part of Etcd (the coordinator never compacts): compacts etcd's history below `revision`
  // (physically). kOutOfRange if `revision` is compacted already or in the future.
  absl::Status Compact(int64_t revision);

 private:
  struct Endpoint;
  struct WatchState;

  explicit GrpcEtcd(GrpcEtcdOptions options);

  // Runs `call` on the current endpoint with a fresh context (deadline, auth token); on
  // kUnavailable moves to the next endpoint and, if `retry`, tries there, once per endpoint.
  // `what` names the call for messages ("put key /a").
  template <typename CallFn>
  absl::Status Call(const std::string& what, bool retry, CallFn call);
  // Waits (from `start`, up to connect_timeout) until `endpoint`'s channel is connected;
  // kUnavailable if it is not.
  absl::Status Connect(Endpoint& endpoint, absl::Time start);
  // Sets the auth token on `context` (authenticating first if there is none yet).
  absl::Status Authorize(Endpoint& endpoint, grpc::ClientContext& context);
  absl::Status Authenticate(Endpoint& endpoint);
  absl::StatusOr<GetResult> Range(const std::string& what, const std::string& key,
                                  const std::string& range_end);
  // The watch thread's loop.
  void RunWatch(WatchState& watch);
  size_t current_endpoint() const { return current_.load() % endpoints_.size(); }
  // Moves on from endpoint `failed` (unless another call did so already).
  void NextEndpoint(size_t failed);

  // Constant after construction.
  const GrpcEtcdOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;

  std::atomic<size_t> current_{0};

  // State below is protected by mu_.
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::map<WatchId, std::unique_ptr<WatchState>> watches_ ABSL_GUARDED_BY(mu_);
  WatchId next_watch_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace jobbroker::cluster
