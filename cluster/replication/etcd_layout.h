#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace jobbroker::cluster {

// Where cluster mode keeps a partition's coordination state in etcd, and how each value is
// encoded (JSON; cluster_state.proto). Never job data.
struct PartitionKeys {
  std::string leader;    // <name>/partitions/<p>/leader
  std::string sync;      // <name>/partitions/<p>/sync
  std::string replicas;  // <name>/partitions/<p>/replicas
};
PartitionKeys KeysOfPartition(const std::string& cluster_name, uint32_t partition);

struct LeaderValue {
  std::string node;
  uint64_t start_seq = 0;
};
struct SyncValue {
  std::vector<std::string> members;
  int64_t epoch = 0;  // who wrote it: 0 for the set the cluster was created with
};

// <name>/config and <name>/nodes/<id>, and the prefix every node key starts with.
std::string ConfigKey(const std::string& cluster_name);
std::string NodeKey(const std::string& cluster_name, const std::string& node_id);
std::string NodesPrefix(const std::string& cluster_name);
std::string PartitionsPrefix(const std::string& cluster_name);

struct ClusterConfig {
  uint32_t partitions = 0;
  uint32_t replication_factor = 0;
  uint32_t min_in_sync = 0;
  bool operator==(const ClusterConfig&) const = default;
};
struct NodeInfo {
  std::string grpc;      // host:port
  bool leaving = false;  // handing over before it stops (NodeLease::leaving)
};

std::string EncodeConfig(const ClusterConfig& config);
std::string EncodeNode(const NodeInfo& node);
absl::StatusOr<ClusterConfig> DecodeConfig(const std::string& json);
absl::StatusOr<NodeInfo> DecodeNode(const std::string& json);

std::string EncodeLeader(const LeaderValue& value);
std::string EncodeSync(const SyncValue& value);
std::string EncodeReplicas(const std::vector<std::string>& nodes);
// kDataLoss naming the key's kind when the value does not parse.
absl::StatusOr<LeaderValue> DecodeLeader(const std::string& json);
absl::StatusOr<SyncValue> DecodeSync(const std::string& json);
absl::StatusOr<std::vector<std::string>> DecodeReplicas(const std::string& json);

}  // namespace jobbroker::cluster
