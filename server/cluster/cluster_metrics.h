#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/routing/router.h"

namespace jobbroker::server {

// A cluster node's gauges, read at scrape time from what its router last learned of the
// cluster (one etcd read per tick) and from its own replicas, so they never drift from the
// truth. Each node reports every partition as it sees it; the leader's series are the ones to
// alert on (deploy/prometheus/alerts.yml aggregates by partition):
//
//   jobbroker_cluster_partition_leader{partition}          1 while this node leads it and serves
//   jobbroker_cluster_partition_epoch{partition}           its leader's epoch (0: none)
//   jobbroker_cluster_partition_replicas{partition}        replicas placed
//   jobbroker_cluster_partition_in_sync_replicas{partition} members of its in-sync set
//   jobbroker_cluster_replica_lag_entries{partition,follower} on the leader: entries a follower
//                                                          lacks
//   jobbroker_cluster_nodes                                nodes registered (alive)
//   jobbroker_cluster_etcd_readable                        1 while the last read of etcd worked
class ClusterCollector final : public prometheus::Collectable {
 public:
  // While this node leads `partition`: the entries each follower lacks, by node id.
  using FollowerLag = std::function<std::map<std::string, uint64_t>(uint32_t partition)>;

  // Borrows `router`: it must outlive the collector.
  ClusterCollector(const Router& router, FollowerLag lag) : router_(router), lag_(std::move(lag)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Router& router_;
  const FollowerLag lag_;
};

}  // namespace jobbroker::server
