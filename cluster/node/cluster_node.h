#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "cluster/etcd/lease_keeper.h"
#include "cluster/node/replicated_partition.h"
#include "cluster/replication/etcd_layout.h"
#include "cluster/transport/peer_transport.h"
#include "core/clock.h"
#include "core/store.h"
#include "node/partitions.h"
#include "storage/rocksdb_store.h"

namespace jobbroker::cluster {

// The cluster as one driver step read it: what the node's router sends calls by.
struct ClusterSnapshot {
  struct Partition {
    std::string leader;  // node id; empty: none now
    int64_t epoch = 0;   // the leader key's create_revision
    std::vector<std::string> replicas;
    std::vector<std::string> in_sync;
    bool served_here = false;  // this node's broker of it takes writes
  };
  bool known = false;                        // false: etcd could not be read; leaders as before
  std::map<std::string, std::string> nodes;  // registered node id -> gRPC address
  std::vector<Partition> partitions;
};

struct ClusterNodeOptions {
  std::string cluster_name = "jobbroker";  // the etcd key prefix
  std::string node_id;                     // unique in the cluster, stable across restarts
  // What the cluster is created with (the first node writes it to <name>/config; every later
  // node must agree): partitions, replicas per partition, and the fewest in-sync replicas a
  // write needs.
  uint32_t partitions = 1;
  uint32_t replication_factor = 3;
  uint32_t min_in_sync = 2;
  // How many nodes must have registered before the partitions are placed (at least
  // replication_factor; 0: replication_factor). Placement happens once, so nodes that come up a
  // moment later get no replicas: a cluster started as three nodes at RF 1 would otherwise put
  // every partition on the first node up. Every node of a new cluster should be given the same.
  uint32_t initial_nodes = 0;
  LeaseKeeperOptions lease;  // the node's etcd lease (its leader keys go with it)
  // A file holding this node's last lease id (in its data dir): revoked at start, so the
  // partitions it led get a new leader at once instead of after the TTL. Empty: none.
  std::string lease_file;
  // How often the node reads its cluster's keys from etcd and ticks every replica with them.
  absl::Duration tick_every = absl::Milliseconds(50);
  // Passed to every replica (node_id, partition, cluster_name and min_in_sync are set here).
  ReplicaOptions replica;
  absl::Duration commit_timeout = absl::Seconds(10);
  PeerTransportOptions transport;  // node_id is set here
  // Peers dialled at another address than the one they registered, by node id (a proxy or NAT
  // between nodes; the Jepsen harness puts a fault-injecting proxy on every link this way).
  std::map<std::string, std::string> peer_addresses;
  // Who may open a replication stream to this node (the peer role's check); unset: anyone.
  PeerTransport::Authorize authorize_peer;
  // Told (on the driver thread) when a partition's replica changes role or epoch, or stops: for
  // the node's log. Unset: nobody listens.
  std::function<void(uint32_t partition, const ReplicatedPartition::State& state)>
      on_partition_change;
  // Told (on the driver thread) after every step: for the node's router. Unset: nobody listens.
  std::function<void(const ClusterSnapshot& cluster)> on_snapshot;
  // Told when the node's lease is lost (and a new one is granted): for the node's log.
  std::function<void(const absl::Status& why)> on_lease_lost;
  // Told (on the driver thread, once per partition) when a replica stops for good: its storage
  // failed (a full or failing disk) or its log broke an invariant. Nothing in the process brings
  // it back; the server exits so that it restarts from what is durable (fail-stop, as Kafka's
  // broker does when its log directory fails), and the partition's other replicas lead
  // meanwhile. Unset: the replica stays stopped and the others drop it from the in-sync set.
  std::function<void(uint32_t partition, const absl::Status& why)> on_replica_failed;
  // ReplicatedPartitionOptions::on_commit_wait of every partition: for the node's metrics.
  std::function<void(absl::Duration)> on_commit_wait;
};

// One node of a cluster (../shared/CLUSTER.md): its etcd lease and registration, the cluster's
// config, a ReplicatedPartition per partition over the node's RocksDbStore, the peer transport,
// and the driver thread that every tick_every reads the cluster's keys from etcd in one
// linearizable read and ticks each replica with them.
//
// Placement (step 3 of the cluster issue): when a partition has no replicas yet and at least
// replication_factor nodes are registered, a node writes its replicas (the registered nodes in
// id order, rotated by the partition number, the first replication_factor of them) and its
// first in-sync set, both in one transaction that only succeeds while neither exists. Moving
// replicas later is the controller's job (not built yet).
//
// The brokers: Attach() hands over the node's Partitions (opened over stores(), every one
// halted). A partition whose replica stops serving the epoch its broker was rebuilt in is halted
// (node::Partitions::HaltWrites); its broker's retries of Store::Resume rebuild it once this
// node leads the partition again (ReplicatedPartition).
//
// Thread-safe.
class ClusterNode {
 public:
  // Checks or creates the cluster's config in etcd and opens the partitions' replicas over
  // `store` (its partition count must equal options.partitions). Borrows etcd, store and clock.
  // kFailedPrecondition when the config in etcd differs; etcd's error when it cannot be reached.
  static absl::StatusOr<std::unique_ptr<ClusterNode>> Start(ClusterNodeOptions options, Etcd& etcd,
                                                            storage::RocksDbStore* store,
                                                            const core::Clock& clock);
  // Stop().
  ~ClusterNode();
  ClusterNode(const ClusterNode&) = delete;
  ClusterNode& operator=(const ClusterNode&) = delete;

  // The stores to open the node's Partitions over (node::Partitions::Open), partition p's at p.
  std::vector<core::Store*> stores();
  // The replication service, for the node's gRPC server (shut down before this object is).
  grpc::Service* peer_service() { return transport_->service(); }

  // Once the node's gRPC server listens at `advertise_address` (host:port, where peers and
  // clients reach it): revokes the lease in options.lease_file, grants a new one, registers the
  // node on it and starts the driver over `partitions` (opened over stores(); borrowed: Stop()
  // before it is destroyed). etcd's error if it cannot be reached; kAlreadyExists if another
  // live node has this node id (waiting up to the TTL for a previous run's key to go).
  absl::Status Attach(node::Partitions* partitions, std::string advertise_address);
  // A graceful stop's first half (SIGTERM): marks the node leaving in etcd, so it resigns every
  // partition it leads (another in-sync member takes each over at once, while this node still
  // acknowledges as a follower) and the leaders drop it from their in-sync sets (no write then
  // waits for it after it stops). Returns once that is so for every partition it holds, or after
  // `timeout` (kDeadlineExceeded naming what is still waiting; a partition whose other replicas
  // are down cannot be handed over). The node keeps serving calls meanwhile, forwarding them
  // to the new leaders. Stop() follows.
  absl::Status HandOver(absl::Duration timeout);
  // Stops the driver and every replica, and revokes the node's lease (its leader keys go at
  // once, so other nodes take over without waiting for the TTL).
  void Stop();

  const ClusterConfig& config() const { return config_; }
  ReplicatedPartition::State partition_state(uint32_t partition) const {
    return replicas_[partition]->state();
  }
  // This node's broker of `partition` answers for it now (ReplicatedPartition::served).
  bool served(uint32_t partition) const { return replicas_[partition]->served(); }
  // While this node leads `partition`: how many entries each follower lacks, by node id.
  std::map<std::string, uint64_t> FollowerLag(uint32_t partition) const {
    return replicas_[partition]->FollowerLag();
  }
  uint32_t partition_count() const { return static_cast<uint32_t>(replicas_.size()); }

 private:
  ClusterNode(ClusterNodeOptions options, Etcd& etcd, const core::Clock& clock);

  absl::Status CheckConfig();
  // Grants a lease (and keeps it), writes the lease file, registers the node on it. `first`
  // (at Attach): kAlreadyExists if another live process holds this node id.
  absl::Status Register(bool first);
  void DriverLoop();
  // One read of the cluster's keys, the placements it lacks, a Tick of every replica.
  void Step();
  // What partition p's broker on this node refuses writes with while it may not write.
  absl::Status NotLeadingCause(uint32_t p, const PartitionView& view,
                               const std::map<std::string, std::string>& nodes,
                               const ReplicatedPartition::State& state) const;
  // While leaving: what still keeps this node from stopping without stalling a partition, or "".
  std::string StillHeld(const std::vector<PartitionView>& views) const;
  // Fills snapshot_ from the step's read (`known`: it succeeded) and the replicas' states.
  void Snapshot(bool known, const std::vector<PartitionView>& views,
                const std::map<std::string, std::string>& nodes);
  // How many registered nodes a new cluster waits for before it places its partitions.
  uint32_t PlacementQuorum() const;
  void PlaceMissing(const std::map<std::string, std::string>& nodes,
                    const std::vector<bool>& placed);

  // Constant after Start.
  const ClusterNodeOptions options_;
  Etcd& etcd_;
  const core::Clock& clock_;
  ClusterConfig config_;
  std::unique_ptr<PeerTransport> transport_;
  std::vector<std::unique_ptr<ReplicatedPartition>> replicas_;

  mutable absl::Mutex mu_;
  std::unique_ptr<LeaseKeeper> keeper_ ABSL_GUARDED_BY(mu_);
  node::Partitions* partitions_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string advertise_address_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;  // HandOver was called
  // What the last step found still held here while leaving_: empty once handed over.
  std::string still_held_ ABSL_GUARDED_BY(mu_) = "not read yet";
  bool handed_over_ ABSL_GUARDED_BY(mu_) = false;
  std::thread driver_;

  // The driver's own (only it reads or writes them).
  std::vector<ReplicatedPartition::State> last_;
  std::map<std::string, std::string> peers_;  // node id -> address given to the transport
  ClusterSnapshot snapshot_;                  // as last published
};

}  // namespace jobbroker::cluster
