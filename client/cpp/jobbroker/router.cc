#include "jobbroker/router.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

namespace jobbroker::client {
namespace {

std::vector<std::string> GivenAddresses(const std::vector<std::string>& given) {
  std::vector<std::string> addresses;
  for (const std::string& item : given) {
    for (std::string& a : SplitAddresses(item)) {
      if (std::find(addresses.begin(), addresses.end(), a) == addresses.end()) {
        addresses.push_back(std::move(a));
      }
    }
  }
  if (addresses.empty()) addresses = SplitAddresses(DefaultAddress());
  // $JOBBROKER_ADDRESS of nothing but commas: dial it as it is, so calls say what is wrong.
  if (addresses.empty()) addresses.push_back(DefaultAddress());
  return addresses;
}

std::shared_ptr<const Router::Node> MakeNode(std::string address,
                                             std::shared_ptr<grpc::Channel> channel) {
  auto node = std::make_shared<Router::Node>();
  node->address = std::move(address);
  node->broker = v1::Broker::NewStub(channel);
  node->admin = v1::Admin::NewStub(channel);
  node->channel = std::move(channel);
  return node;
}

bool Unreachable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

Router::Router(Options options)
    : addresses_(GivenAddresses(options.addresses)),
      tls_(std::move(options.tls)),
      keepalive_(options.keepalive),
      token_(std::move(options.token)),
      timeout_(options.timeout),
      fixed_channel_(options.channel != nullptr) {
  absl::MutexLock lock(&mu_);
  first_ = fixed_channel_ ? MakeNode("", std::move(options.channel)) : NodeAtLocked(addresses_[0]);
}

std::shared_ptr<const Router::Node> Router::NodeFor(const Route& route) {
  RefreshIfNeeded();
  absl::MutexLock lock(&mu_);
  if (fixed_channel_ || table_.empty()) return first_;
  std::string address;
  switch (route.kind) {
    case Route::Kind::kAny:
      address = table_.AnyAddress();
      break;
    case Route::Kind::kQueue:
      address = table_.AddressOfQueue(route.key);
      break;
    case Route::Kind::kJob:
      address = table_.AddressOfJob(route.key);
      break;
  }
  return address.empty() ? first_ : NodeAtLocked(address);
}

std::shared_ptr<const Router::Node> Router::NodeAt(const std::string& address) {
  absl::MutexLock lock(&mu_);
  return fixed_channel_ ? first_ : NodeAtLocked(address);
}

void Router::MarkStale() {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kFresh) state_ = State::kStale;
}

uint32_t Router::HeldPartitionCount() const {
  absl::MutexLock lock(&mu_);
  return table_.broker_partition_count();
}

RoutingTable Router::Table() {
  RefreshIfNeeded();
  absl::MutexLock lock(&mu_);
  return table_;
}

bool Router::NeedsRefreshLocked() const {
  if (fixed_channel_) return false;
  switch (state_) {
    case State::kFresh:
      return false;
    case State::kUnknown:
      return true;
    case State::kStale:
      // One broker outside a cluster, at the one address given: asking it again could only
      // tell the same.
      return table_.is_cluster() || addresses_.size() > 1;
  }
  return false;
}

void Router::RefreshIfNeeded() {
  {
    absl::MutexLock lock(&mu_);
    if (!NeedsRefreshLocked()) return;
  }
  absl::MutexLock refreshing(&refresh_mu_);
  std::vector<std::shared_ptr<const Node>> candidates;
  {
    absl::MutexLock lock(&mu_);
    if (!NeedsRefreshLocked()) return;  // another thread's refresh ran while this one waited
    std::vector<std::string> addresses = table_.NodeAddresses();
    addresses.insert(addresses.end(), addresses_.begin(), addresses_.end());
    for (const std::string& address : addresses) {
      std::shared_ptr<const Node> node = NodeAtLocked(address);
      if (std::find(candidates.begin(), candidates.end(), node) == candidates.end()) {
        candidates.push_back(std::move(node));
      }
    }
  }
  // A channel in TRANSIENT_FAILURE failed its last connect: ask the others first.
  std::stable_partition(candidates.begin(), candidates.end(), [](const auto& node) {
    return node->channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_TRANSIENT_FAILURE;
  });
  std::optional<RoutingTable> table = Fetch(candidates);
  if (!table.has_value()) return;  // the old table (or none) stays, and stays stale
  absl::MutexLock lock(&mu_);
  table_ = *std::move(table);
  state_ = State::kFresh;
}

std::optional<RoutingTable> Router::Fetch(
    const std::vector<std::shared_ptr<const Node>>& candidates) {
  for (const std::shared_ptr<const Node>& node : candidates) {
    grpc::ClientContext ctx;
    if (timeout_ != absl::InfiniteDuration()) {
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    }
    // A token that cannot be sent fails every call; the call itself reports it.
    if (!AddCallMetadata(token_, &ctx).ok()) return std::nullopt;
    v1::GetClusterRequest request;
    v1::ClusterInfo info;
    const grpc::Status status = node->admin->GetCluster(&ctx, request, &info);
    if (status.ok()) return RoutingTable::FromClusterInfo(info, node->address);
    if (Unreachable(status.error_code())) continue;
    // It answered but will not say (an older broker, a token without the admin role): it
    // serves every call, forwarding what it does not lead.
    return RoutingTable::SingleBroker(node->address);
  }
  return std::nullopt;
}

std::shared_ptr<const Router::Node> Router::NodeAtLocked(const std::string& address) {
  auto it = nodes_.find(address);
  if (it != nodes_.end()) return it->second;
  std::shared_ptr<const Node> node = MakeNode(address, DialBroker(address, tls_, keepalive_));
  nodes_.emplace(address, node);
  return node;
}

}  // namespace jobbroker::client
