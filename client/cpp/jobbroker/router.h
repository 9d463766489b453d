#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "jobbroker/client.h"
#include "jobbroker/routing_table.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"

namespace grpc {
class Channel;
}

namespace jobbroker::client {

// What the Client and the Worker share to reach a cluster's nodes: the addresses they were
// given, one channel per node (dialled on first use and kept), and the RoutingTable from the
// latest Admin.GetCluster answer. Internal to the client library.
//
// The table is fetched before the first call, and again before the next call after
// MarkStale() (a call that failed UNAVAILABLE or DEADLINE_EXCEEDED: a leader moved, a node
// died), from whichever address answers first: the nodes of the last table, then the given
// addresses, those whose channel is failing last. A broker that answers GetCluster with an
// error (UNIMPLEMENTED from a broker older than cluster mode, PERMISSION_DENIED for a token
// without the admin role) is used for every call: any node forwards calls to the partition's
// leader. While no address has answered yet, calls go to the first given address and every
// call asks again. A single broker outside a cluster, reached at one address, is asked once.
//
// With a fixed channel (ClientOptions::channel) there is no routing: every call uses it.
//
// Thread-safe. One refresh runs at a time; calls that find the table stale meanwhile wait for
// it.
class Router {
 public:
  struct Options {
    // The given addresses, in order; empty: DefaultAddress() (which may be a list too).
    std::vector<std::string> addresses;
    std::optional<TlsOptions> tls;
    std::string token;
    // Deadline of each GetCluster attempt.
    absl::Duration timeout = absl::Seconds(10);
    std::shared_ptr<grpc::Channel> channel;
    KeepaliveOptions keepalive;

    // What ClientOptions and WorkerOptions give: `address` (may be a list) first, then
    // `addresses`.
    static Options From(const std::string& address, const std::vector<std::string>& addresses,
                        const std::optional<TlsOptions>& tls, const std::string& token,
                        absl::Duration timeout, std::shared_ptr<grpc::Channel> channel,
                        const KeepaliveOptions& keepalive) {
      Options options;
      if (!address.empty()) options.addresses.push_back(address);
      options.addresses.insert(options.addresses.end(), addresses.begin(), addresses.end());
      options.tls = tls;
      options.token = token;
      options.timeout = timeout;
      options.channel = std::move(channel);
      options.keepalive = keepalive;
      return options;
    }
  };

  // One node's channel and stubs; stays valid after the table changes.
  struct Node {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Broker::Stub> broker;
    std::unique_ptr<v1::Admin::Stub> admin;
  };

  // Which node a call is for.
  struct Route {
    enum class Kind { kAny, kQueue, kJob };
    Kind kind = Kind::kAny;
    std::string key;  // the queue's name or the job id

    static Route Any() { return {}; }
    static Route Queue(std::string queue) { return {Kind::kQueue, std::move(queue)}; }
    static Route Job(std::string job_id) { return {Kind::kJob, std::move(job_id)}; }
  };

  explicit Router(Options options);
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // The node to send a call for `route` to, after fetching the table if it is stale.
  std::shared_ptr<const Node> NodeFor(const Route& route) ABSL_LOCKS_EXCLUDED(mu_, refresh_mu_);
  // The node at `address` (dialled now if new), or the fixed channel's.
  std::shared_ptr<const Node> NodeAt(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // After a call failed in a way that may mean it went to the wrong node (UNAVAILABLE,
  // DEADLINE_EXCEEDED): the next NodeFor fetches the table first.
  void MarkStale() ABSL_LOCKS_EXCLUDED(mu_);
  // The table as it is now, after fetching it if it is stale; empty with a fixed channel.
  RoutingTable Table() ABSL_LOCKS_EXCLUDED(mu_, refresh_mu_);

  // The partition count of the table held now (RoutingTable::broker_partition_count), without
  // fetching one: 0 before the first answer and with a fixed channel. Cheap: the coalescer asks
  // it for every enqueue.
  uint32_t HeldPartitionCount() const ABSL_LOCKS_EXCLUDED(mu_);

  // The first given address (or the fixed channel's node).
  std::shared_ptr<const Node> first() const { return first_; }
  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  enum class State { kUnknown, kFresh, kStale };

  void RefreshIfNeeded() ABSL_LOCKS_EXCLUDED(mu_, refresh_mu_);
  bool NeedsRefreshLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GetCluster from the first candidate that answers; the new table, or nullopt if none did.
  std::optional<RoutingTable> Fetch(const std::vector<std::shared_ptr<const Node>>& candidates)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(refresh_mu_);
  std::shared_ptr<const Node> NodeAtLocked(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::vector<std::string> addresses_;
  const std::optional<TlsOptions> tls_;
  const KeepaliveOptions keepalive_;
  const std::string token_;
  const absl::Duration timeout_;
  const bool fixed_channel_;
  std::shared_ptr<const Node> first_;

  absl::Mutex refresh_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // held while GetCluster is under way

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kUnknown;
  RoutingTable table_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const Node>> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::client
