// ClusterMode in a build without cluster/ (JOBBROKER_BUILD_CLUSTER=OFF): it refuses to start.
#include "server/cluster/cluster_mode.h"

namespace jobbroker::server {

struct ClusterMode::Parts {};

ClusterMode::ClusterMode(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}
ClusterMode::~ClusterMode() = default;

absl::StatusOr<std::unique_ptr<ClusterMode>> ClusterMode::Start(const ServerFlags&,
                                                                storage::RocksDbStore&,
                                                                const core::Clock&,
                                                                const Authorizer*) {
  return absl::FailedPreconditionError(
      "--cluster-etcd: this jobbroker was built without cluster mode "
      "(cmake -DJOBBROKER_BUILD_CLUSTER=ON builds it)");
}

std::vector<core::Store*> ClusterMode::stores() { return {}; }
std::function<bool(uint32_t)> ClusterMode::served_check() { return nullptr; }
grpc::Service* ClusterMode::peer_service() { return nullptr; }
const std::string& ClusterMode::peer_token() const {
  static const std::string none;
  return none;
}
absl::Status ClusterMode::Attach(node::Partitions&, const std::string&, Router&) {
  return absl::FailedPreconditionError("built without cluster mode");
}
absl::Status ClusterMode::HandOver(absl::Duration) {
  return absl::FailedPreconditionError("built without cluster mode");
}
void ClusterMode::Stop() {}
prometheus::Collectable* ClusterMode::AttachMetrics(prometheus::Registry&, const Router&) {
  return nullptr;
}

}  // namespace jobbroker::server
