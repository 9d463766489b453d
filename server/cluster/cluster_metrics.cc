#include "server/cluster/cluster_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/observability/metrics.h"

namespace jobbroker::server {

std::vector<prometheus::MetricFamily> ClusterCollector::Collect() const {
  const auto family = GaugeFamily;
  const auto gauge = AddGauge;
  prometheus::MetricFamily leader =
      family("jobbroker_cluster_partition_leader",
             "1 while this node leads the partition and serves it; 0 otherwise.");
  prometheus::MetricFamily epoch = family("jobbroker_cluster_partition_epoch",
                                          "The epoch of the partition's leader (0: no leader).");
  prometheus::MetricFamily replicas =
      family("jobbroker_cluster_partition_replicas", "Replicas placed for the partition.");
  prometheus::MetricFamily in_sync =
      family("jobbroker_cluster_partition_in_sync_replicas",
             "Members of the partition's in-sync set: a write waits for each of them.");
  prometheus::MetricFamily lag =
      family("jobbroker_cluster_replica_lag_entries",
             "On the partition's leader: log entries a follower does not hold yet.");
  prometheus::MetricFamily nodes = family("jobbroker_cluster_nodes", "Nodes registered in etcd.");
  prometheus::MetricFamily readable =
      family("jobbroker_cluster_etcd_readable",
             "1 while this node's last read of the cluster's state from etcd worked.");

  const std::shared_ptr<const ClusterView> view = router_.view();
  for (uint32_t p = 0; p < view->partitions.size(); ++p) {
    const ClusterView::Partition& part = view->partitions[p];
    const std::string name = absl::StrCat(p);
    gauge(leader, {{"partition", name}}, part.served_here ? 1 : 0);
    gauge(epoch, {{"partition", name}}, static_cast<double>(part.epoch));
    gauge(replicas, {{"partition", name}}, static_cast<double>(part.replicas.size()));
    gauge(in_sync, {{"partition", name}}, static_cast<double>(part.in_sync.size()));
    if (!part.served_here || !lag_) continue;
    for (const auto& [follower, entries] : lag_(p))
      gauge(lag, {{"partition", name}, {"follower", follower}}, static_cast<double>(entries));
  }
  gauge(nodes, {}, static_cast<double>(view->nodes.size()));
  gauge(readable, {}, view->known ? 1 : 0);
  std::vector<prometheus::MetricFamily> out;
  for (auto* f : {&leader, &epoch, &replicas, &in_sync, &lag, &nodes, &readable})
    out.push_back(std::move(*f));
  return out;
}

}  // namespace jobbroker::server
