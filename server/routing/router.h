#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/routing/cluster_view.h"

namespace grpc {
class ServerContextBase;
}

namespace jobbroker::server {

// A single node as a cluster of one at `address`: it leads and serves every partition.
ClusterView SingleNodeView(const std::string& node_id, const std::string& address,
                           uint32_t partitions);

// Where a call for one partition goes.
struct Route {
  enum class Kind {
    kLocal,        // this node's broker answers (it leads the partition, or nobody else does)
    kForward,      // to the partition's leader at `address`
    kUnavailable,  // nowhere now: `why` (UNAVAILABLE, naming the partition)
  };
  Kind kind = Kind::kLocal;
  uint32_t partition = 0;
  std::string leader;   // kForward: the leader's node id
  std::string address;  // kForward: its host:port
  absl::Status why;     // kUnavailable
};

// Decides, for each call, which node answers it (../shared/CLUSTER.md "Any node serves every
// RPC"): the node that leads the call's partition. A single node leads every partition, so every
// call is local and nothing is looked up. In cluster mode the node's driver publishes what it
// read from etcd (Publish), and a call for a partition another node leads goes there.
//
// A call is forwarded at most once: a forwarded call (it carries kForwardedHeader) is answered
// here or refused with UNAVAILABLE, never sent on, so two nodes with stale views cannot bounce a
// call between them; the client's retry meets a settled view.
//
// Thread-safe.
class Router {
 public:
  // The metadata key a forwarded call carries; its value is the forwarding node's id.
  static constexpr char kForwardedHeader[] = "jobbroker-forwarded-by";

  // A single node: it leads every partition. Its view (GetCluster) is SingleNodeView(node_id,
  // "", partitions) until the node publishes it with its address.
  static std::unique_ptr<Router> SingleNode(std::string node_id, uint32_t partitions);
  // Cluster mode: a node of `cluster_name` with `partitions` partitions; until the first Publish
  // no partition has a leader (their calls are UNAVAILABLE). `served_now(p)`: whether this
  // node's broker of partition p answers for it at this moment (the replica's own state, not
  // the view of up to a tick ago: a broker that just stopped leading must not answer a read
  // from memory the new leader has moved past). Null: the view's served_here.
  static std::unique_ptr<Router> Cluster(std::string cluster_name, std::string node_id,
                                         uint32_t partitions,
                                         std::function<bool(uint32_t)> served_now = nullptr);

  bool cluster_mode() const { return cluster_mode_; }
  uint32_t partitions() const { return partitions_; }
  const std::string& node_id() const { return node_id_; }

  uint32_t PartitionOfQueue(std::string_view queue) const;
  // A malformed id routes to partition 0, whose broker answers for it as for any unknown id.
  uint32_t PartitionOfJob(const std::string& job_id) const;

  // Where a call for `partition` goes; `ctx` tells whether it was forwarded here already.
  Route RouteOf(uint32_t partition, const grpc::ServerContextBase& ctx) const;
  Route RouteOf(uint32_t partition, bool forwarded) const;
  // This node's broker answers for `partition` now (always on a single node).
  bool ServedHere(uint32_t partition) const;
  static bool IsForwarded(const grpc::ServerContextBase& ctx);

  // The view last published (single node: the one it was made with). Never null.
  std::shared_ptr<const ClusterView> view() const;

  // Cluster mode, from the node's driver: the cluster as just read (on a single node: its view,
  // once its address is known). Listeners are told, on this
  // thread, which partitions changed leader or epoch (or stopped or started being served here).
  void Publish(ClusterView view);

  // `changed` is called after each Publish that changed some partitions' leadership, with them.
  // Returns a handle for Unlisten.
  using Listener = std::function<void(const std::vector<uint32_t>& changed)>;
  uint64_t Listen(Listener changed);
  // No later Publish calls the listener; one in progress may still call it once, so a listener
  // holds weak references to what it tells.
  void Unlisten(uint64_t handle);

  // For what was routed by the view `seen` and must end when one of `partitions` changes leader
  // (a call relayed from a leader): `changed` is called with the first of them that a later
  // Publish changes. A change published between `seen` and this call told no listener, so it is
  // returned instead (`changed_since_seen`), for the caller to act on once it has kept `handle`
  // (for Unlisten). `changed` holds weak references, as a Listener does.
  struct LeaderWatch {
    uint64_t handle = 0;
    std::optional<uint32_t> changed_since_seen;
  };
  LeaderWatch ListenForLeaderChange(std::vector<uint32_t> partitions,
                                    const std::shared_ptr<const ClusterView>& seen,
                                    std::function<void(uint32_t partition)> changed);

 private:
  Router(bool cluster_mode, std::string node_id, uint32_t partitions,
         std::shared_ptr<const ClusterView> view, std::function<bool(uint32_t)> served_now);

  const bool cluster_mode_;
  const std::function<bool(uint32_t)> served_now_;
  const std::string node_id_;
  const uint32_t partitions_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const ClusterView> view_ ABSL_GUARDED_BY(mu_);

  absl::Mutex listeners_mu_;
  absl::flat_hash_map<uint64_t, Listener> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  uint64_t next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 1;
};

}  // namespace jobbroker::server
