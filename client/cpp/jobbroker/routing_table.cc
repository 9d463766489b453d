#include "jobbroker/routing_table.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "jobbroker/partition.h"

namespace jobbroker::client {

RoutingTable RoutingTable::FromClusterInfo(const v1::ClusterInfo& info, std::string answered_by) {
  RoutingTable table = SingleBroker(std::move(answered_by));
  table.broker_partition_count_ = std::max<uint32_t>(1, info.partition_count());
  if (info.cluster_name().empty()) return table;
  table.is_cluster_ = true;
  table.partition_count_ = std::max<uint32_t>(1, info.partition_count());
  std::map<std::string, const v1::NodeInfo*> nodes;
  for (const v1::NodeInfo& node : info.nodes()) {
    nodes[node.node_id()] = &node;
    if (node.address().empty()) continue;
    (node.alive() ? table.alive_nodes_ : table.other_nodes_).push_back(node.address());
  }
  table.leaders_.assign(table.partition_count_, "");
  for (const v1::PartitionInfo& p : info.partitions()) {
    if (p.partition() >= table.partition_count_ || p.leader_node_id().empty()) continue;
    auto node = nodes.find(p.leader_node_id());
    // A leader listed as not alive is about to lose its partition: any node knows better.
    if (node != nodes.end() && !node->second->alive()) continue;
    std::string address = p.leader_address();
    if (address.empty() && node != nodes.end()) address = node->second->address();
    table.leaders_[p.partition()] = std::move(address);
  }
  return table;
}

RoutingTable RoutingTable::SingleBroker(std::string address) {
  RoutingTable table;
  table.answered_by_ = std::move(address);
  return table;
}

std::string RoutingTable::AddressOfPartition(uint32_t partition) const {
  if (!is_cluster_ || partition >= leaders_.size() || leaders_[partition].empty()) {
    return AnyAddress();
  }
  return leaders_[partition];
}

std::string RoutingTable::AddressOfQueue(std::string_view queue) const {
  if (!is_cluster_) return AnyAddress();
  return AddressOfPartition(PartitionOfQueue(queue, partition_count_));
}

std::string RoutingTable::AddressOfJob(std::string_view job_id) const {
  if (!is_cluster_) return AnyAddress();
  std::optional<uint32_t> partition = PartitionOfJobId(job_id, partition_count_);
  return partition.has_value() ? AddressOfPartition(*partition) : AnyAddress();
}

std::vector<std::string> RoutingTable::NodeAddresses() const {
  if (!is_cluster_) return empty() ? std::vector<std::string>{} : std::vector{answered_by_};
  std::vector<std::string> all = alive_nodes_;
  all.insert(all.end(), other_nodes_.begin(), other_nodes_.end());
  return all;
}

std::string RoutingTable::LeaderOfQueue(std::string_view queue) const {
  if (!is_cluster_) return "";
  const uint32_t partition = PartitionOfQueue(queue, partition_count_);
  return partition < leaders_.size() ? leaders_[partition] : "";
}

std::vector<StreamGroup> GroupQueuesByLeader(const RoutingTable& table,
                                             const std::vector<std::string>& queues,
                                             int max_in_flight) {
  // By address; "" (no leader) is put last below.
  std::map<std::string, std::vector<std::string>> by_address;
  for (const std::string& queue : queues) by_address[table.LeaderOfQueue(queue)].push_back(queue);
  std::vector<StreamGroup> groups;
  for (auto& [address, group_queues] : by_address) {
    if (address.empty()) continue;
    groups.push_back({address, std::move(group_queues), 0});
  }
  if (auto leaderless = by_address.find(""); leaderless != by_address.end()) {
    groups.push_back({"", std::move(leaderless->second), 0});
  }
  const int k = static_cast<int>(groups.size());
  for (int i = 0; i < k; ++i) {
    StreamGroup& group = groups[i];
    std::sort(group.queues.begin(), group.queues.end());
    if (max_in_flight <= 0) continue;  // the broker reads 0 as 1 anyway
    group.max_in_flight = std::max(1, max_in_flight / k + (i < max_in_flight % k ? 1 : 0));
  }
  return groups;
}

bool RefreshesTableWhileGrouped(const RoutingTable& table, const std::vector<StreamGroup>& groups) {
  if (!table.is_cluster() && !table.empty()) return false;
  return std::any_of(groups.begin(), groups.end(),
                     [](const StreamGroup& group) { return group.address.empty(); });
}

}  // namespace jobbroker::client
