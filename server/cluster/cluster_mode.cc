#include "server/cluster/cluster_mode.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/etcd/await_etcd.h"
#include "cluster/etcd/grpc_etcd.h"
#include "cluster/node/cluster_node.h"
#include "cluster/replication/etcd_layout.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/cluster/cluster_metrics.h"
#include "server/observability/log.h"

namespace jobbroker::server {

struct ClusterMode::Parts {
  std::string node_id;
  std::string peer_token;  // --cluster-peer-token-file's, or empty
  std::string advertise_address;
  // Set by Attach; the driver's snapshots go to it from then on.
  std::atomic<Router*> router{nullptr};
  std::unique_ptr<cluster::GrpcEtcd> etcd;
  std::unique_ptr<cluster::ClusterNode> node;
  // Set by AttachMetrics; commit waits are observed from then on.
  std::atomic<prometheus::Histogram*> commit_wait{nullptr};
  std::unique_ptr<ClusterCollector> collector;
};

ClusterMode::ClusterMode(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

ClusterMode::~ClusterMode() { Stop(); }

namespace {

// The exit code of a node whose replica failed for good (sysexits' EX_IOERR: nearly always a
// full or failing disk): a supervisor restarts it, and it rejoins from what it had synced.
constexpr int kExitReplicaFailed = 74;

// The token in --cluster-peer-token-file (surrounding whitespace dropped), checked against this
// node's own --auth-tokens: the other nodes hold the same table. Messages never hold the token.
absl::StatusOr<std::string> ReadPeerToken(const std::string& path, const Authorizer* authorizer) {
  std::ifstream in(path);
  if (!in)
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster-peer-token-file ", path, ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster-peer-token-file ", path, ": is empty"));
  if (authorizer != nullptr) {
    const std::string bearer = "Bearer " + token;
    absl::StatusOr<const TokenEntry*> entry = authorizer->Authenticate({bearer});
    absl::Status allowed =
        entry.ok() ? Authorizer::AllowRole(**entry, Role::kPeer) : entry.status();
    if (!allowed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cluster-peer-token-file ", path,
                       ": the other nodes would refuse it: ", allowed.message()));
    }
  }
  return token;
}

// Waits up to --cluster-etcd-wait for etcd's first answer (cluster/etcd/await_etcd.h), logging
// the wait every 5 s. SIGTERM ends the wait with the process (server/stop_signals.h: a node
// that serves nothing yet has nothing to hand over or drain).
absl::Status AwaitEtcd(cluster::Etcd& etcd, const ServerFlags& flags, const core::Clock& clock) {
  cluster::AwaitEtcdOptions options;
  options.patience = absl::Seconds(flags.cluster_etcd_wait);
  cluster::AwaitEtcdHooks hooks;
  hooks.sleep = [](absl::Duration pause) { absl::SleepFor(pause); };
  hooks.on_waiting = [&flags](const absl::Status& why, absl::Duration waited) {
    Log::Write(LogLevel::kWarn, "waiting_for_etcd",
               {{"etcd", flags.cluster_etcd},
                {"waited_ms", absl::StrCat(absl::ToInt64Milliseconds(waited))},
                {"gives_up_after_s", absl::StrCat(flags.cluster_etcd_wait)},
                {"reason", std::string(why.message())}});
  };
  absl::Status up =
      cluster::AwaitEtcd(etcd, cluster::ConfigKey(flags.cluster_name), clock, options, hooks);
  if (up.ok()) return up;
  return absl::Status(up.code(),
                      absl::StrCat("--cluster-etcd: ", up.message(), " (--cluster-etcd-wait ",
                                   flags.cluster_etcd_wait, ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterMode>> ClusterMode::Start(const ServerFlags& flags,
                                                                storage::RocksDbStore& store,
                                                                const core::Clock& clock,
                                                                const Authorizer* authorizer) {
  auto parts = std::make_unique<Parts>();
  parts->node_id = flags.node_id;
  parts->advertise_address = flags.advertise_address;
  cluster::GrpcEtcdOptions etcd_options;
  for (absl::string_view url : absl::StrSplit(flags.cluster_etcd, ',', absl::SkipEmpty()))
    etcd_options.endpoints.emplace_back(url);
  // Well below the lease's TTL: the driver's read must not outlast the time a leader may serve.
  etcd_options.call_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<cluster::GrpcEtcd>> etcd =
      cluster::GrpcEtcd::Create(std::move(etcd_options));
  if (!etcd.ok())
    return absl::InvalidArgumentError(absl::StrCat("--cluster-etcd: ", etcd.status().message()));
  parts->etcd = *std::move(etcd);
  if (absl::Status up = AwaitEtcd(*parts->etcd, flags, clock); !up.ok()) return up;

  cluster::ClusterNodeOptions options;
  options.cluster_name = flags.cluster_name;
  options.node_id = flags.node_id;
  options.partitions = store.partitions();
  options.replication_factor = static_cast<uint32_t>(flags.replication_factor);
  options.min_in_sync = static_cast<uint32_t>(flags.min_in_sync);
  options.initial_nodes = static_cast<uint32_t>(flags.cluster_initial_nodes);
  options.lease.ttl = absl::Seconds(flags.cluster_lease_ttl);
  options.peer_addresses = flags.cluster_peer_addresses;
  options.transport.keepalive_time = absl::Seconds(flags.keepalive_time);
  options.transport.keepalive_timeout = absl::Seconds(flags.keepalive_timeout);
  options.lease_file = (std::filesystem::path(flags.data_dir) / "cluster-lease").string();
  if (!flags.cluster_peer_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadPeerToken(flags.cluster_peer_token_file, authorizer);
    if (!token.ok()) return token.status();
    parts->peer_token = *token;
    options.transport.peer_token = *std::move(token);
  }
  if (authorizer != nullptr) {
    // Only a peer's token replicates: a client's token, whatever its roles, is refused.
    options.authorize_peer = [authorizer](const grpc::CallbackServerContext& ctx) {
      std::vector<absl::string_view> values;
      auto [begin, end] = ctx.client_metadata().equal_range("authorization");
      for (auto it = begin; it != end; ++it)
        values.emplace_back(it->second.data(), it->second.size());
      absl::StatusOr<const TokenEntry*> caller = authorizer->Authenticate(values);
      if (!caller.ok()) return caller.status();
      return Authorizer::AllowRole(**caller, Role::kPeer);
    };
  }
  options.on_partition_change =
      [node = flags.node_id](uint32_t partition, const cluster::ReplicatedPartition::State& state) {
        Log::Write(state.broken.ok() ? LogLevel::kInfo : LogLevel::kError, "partition_role",
                   {{"partition", absl::StrCat(partition)},
                    {"node", node},
                    {"role", cluster::RoleName(state.role)},
                    {"epoch", absl::StrCat(state.epoch)},
                    {"serving", state.serving ? "true" : "false"},
                    {"log_end", absl::StrCat(state.log_end)},
                    {"broken", std::string(state.broken.message())}});
      };
  Parts* raw = parts.get();
  options.on_snapshot = [raw, name = flags.cluster_name, dialled = flags.cluster_peer_addresses](
                            const cluster::ClusterSnapshot& cluster) {
    Router* router = raw->router.load();
    if (router == nullptr) return;
    ClusterView view;
    view.cluster_name = name;
    view.node_id = raw->node_id;
    if (raw->node != nullptr) {
      view.replication_factor = raw->node->config().replication_factor;
      view.min_in_sync = raw->node->config().min_in_sync;
    }
    view.known = cluster.known;
    for (const auto& [id, address] : cluster.nodes) view.nodes.push_back({id, address, true});
    view.partitions.reserve(cluster.partitions.size());
    for (const cluster::ClusterSnapshot::Partition& p : cluster.partitions) {
      ClusterView::Partition& out = view.partitions.emplace_back();
      out.leader = p.leader;
      if (auto at = cluster.nodes.find(p.leader); at != cluster.nodes.end())
        out.leader_address = at->second;
      // Forwarded calls and relayed streams go where this node dials the leader.
      if (auto at = dialled.find(p.leader); at != dialled.end())
        out.leader_dial_address = at->second;
      out.epoch = p.epoch;
      out.replicas = p.replicas;
      out.in_sync = p.in_sync;
      out.served_here = p.served_here;
    }
    router->Publish(std::move(view));
  };
  options.on_replica_failed = [](uint32_t partition, const absl::Status& why) {
    Log::Write(LogLevel::kError, "replica_failed",
               {{"partition", absl::StrCat(partition)},
                {"reason", std::string(why.message())},
                {"effect",
                 "the node exits (code 74) and rejoins from its synced data when "
                 "restarted; the partition's other replicas serve meanwhile"}});
    // At once, as a crash would: everything acknowledged is durable on the in-sync replicas,
    // and a graceful stop could hang on the storage that just failed.
    std::_Exit(kExitReplicaFailed);
  };
  options.on_commit_wait = [raw](absl::Duration waited) {
    if (prometheus::Histogram* h = raw->commit_wait.load(std::memory_order_acquire))
      h->Observe(absl::ToDoubleSeconds(waited));
  };
  options.on_lease_lost = [](const absl::Status& why) {
    Log::Write(LogLevel::kWarn, "cluster_lease_lost", {{"reason", std::string(why.message())}});
  };
  absl::StatusOr<std::unique_ptr<cluster::ClusterNode>> node =
      cluster::ClusterNode::Start(std::move(options), *parts->etcd, &store, clock);
  if (!node.ok()) {
    return absl::Status(node.status().code(),
                        absl::StrCat("cluster mode: ", node.status().message()));
  }
  parts->node = *std::move(node);
  return std::unique_ptr<ClusterMode>(new ClusterMode(std::move(parts)));
}

std::vector<core::Store*> ClusterMode::stores() { return parts_->node->stores(); }

std::function<bool(uint32_t)> ClusterMode::served_check() {
  cluster::ClusterNode* node = parts_->node.get();
  return [node](uint32_t partition) { return node->served(partition); };
}

grpc::Service* ClusterMode::peer_service() { return parts_->node->peer_service(); }

const std::string& ClusterMode::peer_token() const { return parts_->peer_token; }

absl::Status ClusterMode::Attach(node::Partitions& partitions, const std::string& grpc_address,
                                 Router& router) {
  parts_->router.store(&router);
  const std::string advertised =
      parts_->advertise_address.empty() ? grpc_address : parts_->advertise_address;
  absl::Status attached = parts_->node->Attach(&partitions, advertised);
  if (attached.ok()) {
    const cluster::ClusterConfig& config = parts_->node->config();
    Log::Write(LogLevel::kInfo, "cluster_joined",
               {{"advertised", advertised},
                {"partitions", absl::StrCat(config.partitions)},
                {"replication_factor", absl::StrCat(config.replication_factor)},
                {"min_in_sync", absl::StrCat(config.min_in_sync)}});
  }
  return attached;
}

absl::Status ClusterMode::HandOver(absl::Duration timeout) {
  return parts_->node->HandOver(timeout);
}

void ClusterMode::Stop() {
  if (parts_ != nullptr && parts_->node != nullptr) parts_->node->Stop();
  if (parts_ != nullptr) parts_->router.store(nullptr);
}

prometheus::Collectable* ClusterMode::AttachMetrics(prometheus::Registry& registry,
                                                    const Router& router) {
  prometheus::Histogram& commit_wait =
      prometheus::BuildHistogram()
          .Name("jobbroker_cluster_commit_wait_seconds")
          .Help(
              "How long a write this node leads waited for its in-sync followers (their "
              "fsyncs and the round trips) before it was acknowledged.")
          .Register(registry)
          .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                           0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  parts_->commit_wait.store(&commit_wait, std::memory_order_release);
  cluster::ClusterNode* node = parts_->node.get();
  parts_->collector = std::make_unique<ClusterCollector>(
      router, [node](uint32_t partition) { return node->FollowerLag(partition); });
  return parts_->collector.get();
}

}  // namespace jobbroker::server
