#include "client/cpp/cli/cluster_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/cli/table.h"

namespace jobbroker::cli {

std::string FormatCluster(const v1::ClusterInfo& info) {
  std::string out =
      info.cluster_name().empty()
          ? absl::StrCat("single broker (not a cluster), answered by ", info.node_id(), "\n")
          : absl::StrCat("cluster ", info.cluster_name(), ": ", info.partition_count(),
                         " partitions, replication factor ", info.replication_factor(),
                         ", min in-sync ", info.min_in_sync(), "; answered by ", info.node_id(),
                         "\n");

  Table nodes({"NODE", "ADDRESS", "ALIVE"});
  for (const v1::NodeInfo& node : info.nodes()) {
    nodes.AddRow({node.node_id(), node.address(), node.alive() ? "yes" : "no"});
  }
  absl::StrAppend(&out, "\n", nodes.Render());

  Table partitions({"PARTITION", "LEADER", "EPOCH", "REPLICAS", "IN SYNC"});
  partitions.AlignRight(0);
  partitions.AlignRight(2);
  for (const v1::PartitionInfo& p : info.partitions()) {
    const bool led = !p.leader_node_id().empty();
    partitions.AddRow({absl::StrCat(p.partition()), led ? p.leader_node_id() : "-",
                       led ? absl::StrCat(p.epoch()) : "-", absl::StrJoin(p.replicas(), ","),
                       absl::StrJoin(p.in_sync(), ",")});
  }
  absl::StrAppend(&out, "\n", partitions.Render());
  return out;
}

}  // namespace jobbroker::cli
