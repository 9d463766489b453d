#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace jobbroker::server {

// The cluster as this node last read it from etcd (or, on a single node, a cluster of one):
// what Admin.GetCluster answers and what the Router decides with. A plain value, published whole.
struct ClusterView {
  struct Node {
    std::string node_id;
    std::string address;  // host:port of its gRPC listener
    bool alive = true;    // registered on a live lease
  };
  struct Partition {
    std::string leader;          // node id; empty: no leader now
    std::string leader_address;  // empty when unknown
    // Where this node dials the leader (--cluster-peer-addresses); empty: leader_address.
    std::string leader_dial_address;
    int64_t epoch = 0;
    std::vector<std::string> replicas;
    std::vector<std::string> in_sync;
    // This node's broker of the partition takes writes now (it leads it, in the epoch its
    // broker was rebuilt in).
    bool served_here = false;

    // Where calls of the partition go changed: its leader, epoch, or whether it is served here.
    // What the Router tells its listeners about, and what ends a Work stream.
    bool RouteChangedFrom(const Partition& was) const {
      return leader != was.leader || epoch != was.epoch || served_here != was.served_here;
    }
  };

  std::string cluster_name;  // empty: a single node
  std::string node_id;       // this node
  uint32_t replication_factor = 1;
  uint32_t min_in_sync = 1;
  // False while this node cannot read etcd: leaders below are as last read.
  bool known = true;
  std::vector<Node> nodes;
  std::vector<Partition> partitions;  // by number
};

}  // namespace jobbroker::server
