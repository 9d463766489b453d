#include "cluster/replication/etcd_layout.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cluster/replication/cluster_state.pb.h"
#include "google/protobuf/util/json_util.h"

namespace jobbroker::cluster {
namespace {

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;  // "start_seq": 0 reads better than nothing
  options.preserve_proto_field_names = true;
  // Encoding our own well-formed message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

absl::Status FromJson(const std::string& json, const char* kind,
                      google::protobuf::Message* message) {
  auto status = google::protobuf::util::JsonStringToMessage(json, message);
  if (!status.ok()) {
    return absl::DataLossError(
        absl::StrCat("etcd ", kind, " value does not parse: ", status.message().as_string()));
  }
  return absl::OkStatus();
}

}  // namespace

PartitionKeys KeysOfPartition(const std::string& cluster_name, uint32_t partition) {
  std::string base = absl::StrCat(cluster_name, "/partitions/", partition, "/");
  return {base + "leader", base + "sync", base + "replicas"};
}

std::string ConfigKey(const std::string& cluster_name) { return cluster_name + "/config"; }
std::string NodesPrefix(const std::string& cluster_name) { return cluster_name + "/nodes/"; }
std::string NodeKey(const std::string& cluster_name, const std::string& node_id) {
  return NodesPrefix(cluster_name) + node_id;
}
std::string PartitionsPrefix(const std::string& cluster_name) {
  return cluster_name + "/partitions/";
}

std::string EncodeConfig(const ClusterConfig& config) {
  state::ClusterConfig message;
  message.set_partitions(config.partitions);
  message.set_replication_factor(config.replication_factor);
  message.set_min_in_sync(config.min_in_sync);
  return ToJson(message);
}

std::string EncodeNode(const NodeInfo& node) {
  state::NodeInfo message;
  message.set_grpc(node.grpc);
  message.set_leaving(node.leaving);
  return ToJson(message);
}

absl::StatusOr<ClusterConfig> DecodeConfig(const std::string& json) {
  state::ClusterConfig message;
  if (auto status = FromJson(json, "config", &message); !status.ok()) return status;
  return ClusterConfig{message.partitions(), message.replication_factor(), message.min_in_sync()};
}

absl::StatusOr<NodeInfo> DecodeNode(const std::string& json) {
  state::NodeInfo message;
  if (auto status = FromJson(json, "node", &message); !status.ok()) return status;
  return NodeInfo{message.grpc(), message.leaving()};
}

std::string EncodeLeader(const LeaderValue& value) {
  state::PartitionLeader message;
  message.set_node(value.node);
  message.set_start_seq(value.start_seq);
  return ToJson(message);
}

std::string EncodeSync(const SyncValue& value) {
  state::PartitionSync message;
  for (const auto& member : value.members) message.add_members(member);
  message.set_epoch(value.epoch);
  return ToJson(message);
}

std::string EncodeReplicas(const std::vector<std::string>& nodes) {
  state::PartitionReplicas message;
  for (const auto& node : nodes) message.add_nodes(node);
  return ToJson(message);
}

absl::StatusOr<LeaderValue> DecodeLeader(const std::string& json) {
  state::PartitionLeader message;
  if (auto status = FromJson(json, "leader", &message); !status.ok()) return status;
  return LeaderValue{message.node(), message.start_seq()};
}

absl::StatusOr<SyncValue> DecodeSync(const std::string& json) {
  state::PartitionSync message;
  if (auto status = FromJson(json, "sync", &message); !status.ok()) return status;
  return SyncValue{{message.members().begin(), message.members().end()}, message.epoch()};
}

absl::StatusOr<std::vector<std::string>> DecodeReplicas(const std::string& json) {
  state::PartitionReplicas message;
  if (auto status = FromJson(json, "replicas", &message); !status.ok()) return status;
  return std::vector<std::string>(message.nodes().begin(), message.nodes().end());
}

}  // namespace jobbroker::cluster
