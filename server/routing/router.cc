#include "server/routing/router.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ids.h"

namespace jobbroker::server {

ClusterView SingleNodeView(const std::string& node_id, const std::string& address,
                           uint32_t partitions) {
  ClusterView view;
  view.node_id = node_id;
  view.nodes.push_back({node_id, address, true});
  view.partitions.resize(partitions);
  for (ClusterView::Partition& p : view.partitions) {
    p.leader = node_id;
    p.leader_address = address;
    p.replicas = {node_id};
    p.in_sync = {node_id};
    p.served_here = true;
  }
  return view;
}

std::unique_ptr<Router> Router::SingleNode(std::string node_id, uint32_t partitions) {
  auto view = std::make_shared<const ClusterView>(SingleNodeView(node_id, "", partitions));
  return std::unique_ptr<Router>(
      new Router(/*cluster_mode=*/false, std::move(node_id), partitions, std::move(view), nullptr));
}

std::unique_ptr<Router> Router::Cluster(std::string cluster_name, std::string node_id,
                                        uint32_t partitions,
                                        std::function<bool(uint32_t)> served_now) {
  auto view = std::make_shared<ClusterView>();
  view->cluster_name = std::move(cluster_name);
  view->node_id = node_id;
  view->known = false;
  view->partitions.resize(partitions);
  return std::unique_ptr<Router>(new Router(/*cluster_mode=*/true, std::move(node_id), partitions,
                                            std::move(view), std::move(served_now)));
}

Router::Router(bool cluster_mode, std::string node_id, uint32_t partitions,
               std::shared_ptr<const ClusterView> view, std::function<bool(uint32_t)> served_now)
    : cluster_mode_(cluster_mode),
      served_now_(std::move(served_now)),
      node_id_(std::move(node_id)),
      partitions_(partitions),
      view_(std::move(view)) {}

uint32_t Router::PartitionOfQueue(std::string_view queue) const {
  return core::PartitionOfQueue(queue, partitions_);
}

uint32_t Router::PartitionOfJob(const std::string& job_id) const {
  return core::PartitionOfJobId(job_id, partitions_).value_or(0);
}

bool Router::IsForwarded(const grpc::ServerContextBase& ctx) {
  return ctx.client_metadata().count(kForwardedHeader) > 0;
}

Route Router::RouteOf(uint32_t partition, const grpc::ServerContextBase& ctx) const {
  if (!cluster_mode_) return Route{.partition = partition};
  return RouteOf(partition, IsForwarded(ctx));
}

Route Router::RouteOf(uint32_t partition, bool forwarded) const {
  Route route{.partition = partition};
  if (!cluster_mode_) return route;
  std::shared_ptr<const ClusterView> view = this->view();
  if (partition >= view->partitions.size()) return route;  // the broker refuses it
  const ClusterView::Partition& p = view->partitions[partition];
  if (served_now_ ? served_now_(partition) : p.served_here) return route;
  route.kind = Route::Kind::kUnavailable;
  if (p.leader == node_id_) {
    // Its broker is not rebuilt yet, or it has just stopped leading: its memory may be behind.
    route.why = absl::UnavailableError(absl::StrCat(
        "partition ", partition, ": ", node_id_,
        " leads it but does not serve it at this moment (starting, or handing over); retry"));
    return route;
  }
  if (p.leader.empty() && view->known && p.replicas.empty()) {
    route.why = absl::UnavailableError(absl::StrCat(
        "partition ", partition,
        " is not placed on any node yet: a new cluster places its partitions once "
        "--cluster-initial-nodes (at least --replication-factor) nodes have registered, and ",
        view->nodes.size(), " have; retry"));
    return route;
  }
  if (p.leader.empty()) {
    route.why = absl::UnavailableError(
        view->known ? absl::StrCat("partition ", partition,
                                   " has no leader now: an election is under way; retry")
                    : absl::StrCat("partition ", partition, ": node ", node_id_,
                                   " cannot read the cluster's state from etcd; retry on "
                                   "another node"));
    return route;
  }
  if (forwarded || p.leader_address.empty()) {
    route.why = absl::UnavailableError(absl::StrCat(
        "partition ", partition, " is led by ", p.leader,
        p.leader_address.empty() ? "" : absl::StrCat(" at ", p.leader_address), ", not by ",
        node_id_, forwarded ? " (the call was forwarded here on a stale view)" : "", "; retry"));
    return route;
  }
  route.kind = Route::Kind::kForward;
  route.leader = p.leader;
  route.address = p.leader_dial_address.empty() ? p.leader_address : p.leader_dial_address;
  return route;
}

bool Router::ServedHere(uint32_t partition) const {
  if (!cluster_mode_) return true;
  if (served_now_) return served_now_(partition);
  std::shared_ptr<const ClusterView> view = this->view();
  return partition < view->partitions.size() && view->partitions[partition].served_here;
}

std::shared_ptr<const ClusterView> Router::view() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

void Router::Publish(ClusterView view) {
  auto next = std::make_shared<const ClusterView>(std::move(view));
  std::shared_ptr<const ClusterView> before;
  {
    absl::MutexLock lock(&mu_);
    before = std::exchange(view_, next);
  }
  std::vector<uint32_t> changed;
  for (uint32_t p = 0; p < next->partitions.size(); ++p) {
    const ClusterView::Partition& now = next->partitions[p];
    if (p >= before->partitions.size()) {
      changed.push_back(p);
      continue;
    }
    if (now.RouteChangedFrom(before->partitions[p])) changed.push_back(p);
  }
  if (changed.empty()) return;
  // Called without the lock: a listener may end a stream, whose end unlistens.
  std::vector<Listener> listeners;
  {
    absl::MutexLock lock(&listeners_mu_);
    for (auto& [handle, listener] : listeners_) listeners.push_back(listener);
  }
  for (const Listener& listener : listeners) listener(changed);
}

uint64_t Router::Listen(Listener changed) {
  absl::MutexLock lock(&listeners_mu_);
  const uint64_t handle = next_listener_++;
  listeners_.emplace(handle, std::move(changed));
  return handle;
}

void Router::Unlisten(uint64_t handle) {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.erase(handle);
}

Router::LeaderWatch Router::ListenForLeaderChange(std::vector<uint32_t> partitions,
                                                  const std::shared_ptr<const ClusterView>& seen,
                                                  std::function<void(uint32_t partition)> changed) {
  std::sort(partitions.begin(), partitions.end());
  partitions.erase(std::unique(partitions.begin(), partitions.end()), partitions.end());
  LeaderWatch watch;
  watch.handle =
      Listen([partitions, changed = std::move(changed)](const std::vector<uint32_t>& published) {
        for (uint32_t p : published) {
          if (!std::binary_search(partitions.begin(), partitions.end(), p)) continue;
          changed(p);
          return;
        }
      });
  std::shared_ptr<const ClusterView> now = view();
  for (uint32_t p : partitions) {
    if (p >= seen->partitions.size() || p >= now->partitions.size()) continue;
    if (now->partitions[p].RouteChangedFrom(seen->partitions[p])) {
      watch.changed_since_seen = p;
      break;
    }
  }
  return watch;
}

}  // namespace jobbroker::server
