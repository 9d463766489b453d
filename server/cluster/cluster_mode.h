#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/store.h"
#include "node/partitions.h"
#include "server/auth/authorizer.h"
#include "server/config/flags.h"
#include "server/routing/router.h"
#include "storage/rocksdb_store.h"

namespace grpc {
class Service;
}
namespace prometheus {
class Collectable;
class Registry;
}  // namespace prometheus

namespace jobbroker::server {

// Cluster mode's wiring from the flags (../shared/CLUSTER.md): the etcd client, the node
// (cluster/node/cluster_node.h) and its log lines. In a build without cluster/
// (JOBBROKER_BUILD_CLUSTER=OFF) Start refuses with a message that
// says so, and main.cc needs no #ifdef.
class ClusterMode {
 public:
  // Connects to --cluster-etcd, checks or creates the cluster's config and opens a replica of
  // each partition over `store`. Borrows store and clock. The reason it cannot, naming the flag.
  // `authorizer` (null: auth off) decides who may replicate to this node: a token with the peer
  // role; this node presents --cluster-peer-token-file's token to the others.
  static absl::StatusOr<std::unique_ptr<ClusterMode>> Start(const ServerFlags& flags,
                                                            storage::RocksDbStore& store,
                                                            const core::Clock& clock,
                                                            const Authorizer* authorizer);
  ~ClusterMode();  // Stop()
  ClusterMode(const ClusterMode&) = delete;
  ClusterMode& operator=(const ClusterMode&) = delete;

  // The partitions' stores, for node::Partitions::Open.
  std::vector<core::Store*> stores();
  // Whether this node's broker of a partition answers for it right now, for the Router (valid
  // until this object is destroyed).
  std::function<bool(uint32_t partition)> served_check();
  // The token this node presents to the others (--cluster-peer-token-file); empty without one.
  const std::string& peer_token() const;
  // The replication service, to register on the gRPC server.
  grpc::Service* peer_service();
  // Once the server listens at `grpc_address`: registers the node (at --advertise-address, or
  // there) and starts replicating for `partitions`, publishing what it reads of the cluster to
  // `router` (borrowed until Stop).
  absl::Status Attach(node::Partitions& partitions, const std::string& grpc_address,
                      Router& router);
  // SIGTERM's first step: hands every partition this node leads to another in-sync replica and
  // leaves the in-sync sets, within `timeout` (cluster/node/cluster_node.h, HandOver).
  absl::Status HandOver(absl::Duration timeout);
  // Stops replicating and gives up the node's lease (its partitions fail over at once).
  void Stop();

  // The node's cluster metrics: registers the commit-wait histogram
  // (jobbroker_cluster_commit_wait_seconds) in `registry` and returns the gauges of
  // server/cluster/cluster_metrics.h, read through `router` (borrowed), for /metrics. Valid until
  // this object is destroyed; null in a build without cluster mode.
  prometheus::Collectable* AttachMetrics(prometheus::Registry& registry, const Router& router);

 private:
  struct Parts;
  explicit ClusterMode(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

}  // namespace jobbroker::server
