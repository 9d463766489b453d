#include "cluster/node/cluster_node.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace jobbroker::cluster {
namespace {

// Where a key under <name>/partitions/ belongs: "<p>/<kind>" gives its partition and kind.
bool ParsePartitionKey(const std::string& rest, uint32_t* partition, std::string* kind) {
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) return false;
  *kind = rest.substr(slash + 1);
  return absl::SimpleAtoi(absl::string_view(rest).substr(0, slash), partition);
}

std::string ConfigText(const ClusterConfig& c) {
  return absl::StrCat("partitions=", c.partitions, " replication_factor=", c.replication_factor,
                      " min_in_sync=", c.min_in_sync);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterNode>> ClusterNode::Start(ClusterNodeOptions options,
                                                                Etcd& etcd,
                                                                storage::RocksDbStore* store,
                                                                const core::Clock& clock) {
  if (options.node_id.empty()) return absl::InvalidArgumentError("node_id must be set");
  if (options.node_id.find('/') != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("node_id ", options.node_id, " holds a '/'"));
  if (options.replication_factor < 1 || options.min_in_sync < 1 ||
      options.min_in_sync > options.replication_factor) {
    return absl::InvalidArgumentError(absl::StrCat("min_in_sync is ", options.min_in_sync,
                                                   "; it must be 1 to replication_factor (",
                                                   options.replication_factor, ")"));
  }
  if (store->partitions() != options.partitions) {
    return absl::FailedPreconditionError(absl::StrCat("the data dir holds ", store->partitions(),
                                                      " partitions; the cluster has ",
                                                      options.partitions));
  }
  std::unique_ptr<ClusterNode> node(new ClusterNode(std::move(options), etcd, clock));
  if (auto s = node->CheckConfig(); !s.ok()) return s;

  PeerTransportOptions transport = node->options_.transport;
  transport.node_id = node->options_.node_id;
  ClusterNode* self = node.get();
  node->transport_ = std::make_unique<PeerTransport>(
      std::move(transport),
      [self](ReplicationMessage message) {
        // A frame naming a partition this node does not have is dropped: a peer of another
        // config (refused at its start) or a damaged frame; the protocol resends what matters.
        if (message.partition < self->replicas_.size())
          self->replicas_[message.partition]->Deliver(std::move(message));
      },
      node->options_.authorize_peer);
  for (uint32_t p = 0; p < node->config_.partitions; ++p) {
    ReplicatedPartitionOptions own;
    own.replica = node->options_.replica;
    own.replica.cluster_name = node->options_.cluster_name;
    own.replica.node_id = node->options_.node_id;
    own.replica.partition = p;
    own.replica.min_in_sync = node->config_.min_in_sync;
    own.commit_timeout = node->options_.commit_timeout;
    own.on_commit_wait = node->options_.on_commit_wait;
    PeerTransport* sender = node->transport_.get();
    auto replica = ReplicatedPartition::Open(
        store, etcd, clock, std::move(own),
        [sender](const ReplicationMessage& message) { sender->Send(message); });
    if (!replica.ok()) return replica.status();
    node->replicas_.push_back(*std::move(replica));
  }
  node->last_.resize(node->replicas_.size());
  return node;
}

ClusterNode::ClusterNode(ClusterNodeOptions options, Etcd& etcd, const core::Clock& clock)
    : options_(std::move(options)), etcd_(etcd), clock_(clock) {}

ClusterNode::~ClusterNode() { Stop(); }

std::vector<core::Store*> ClusterNode::stores() {
  std::vector<core::Store*> stores;
  for (auto& replica : replicas_) stores.push_back(replica.get());
  return stores;
}

absl::Status ClusterNode::CheckConfig() {
  const ClusterConfig mine{options_.partitions, options_.replication_factor, options_.min_in_sync};
  const std::string key = ConfigKey(options_.cluster_name);
  auto txn = etcd_.Txn({Compare::CreateRevision(key, Compare::Op::kEqual, 0)},
                       {TxnOp::Put(key, EncodeConfig(mine))}, {TxnOp::Get(key)});
  if (!txn.ok()) {
    return absl::Status(txn.status().code(),
                        absl::StrCat("etcd: ", key, ": ", txn.status().message()));
  }
  if (txn->succeeded) {
    config_ = mine;
    return absl::OkStatus();
  }
  if (txn->results.empty() || txn->results[0].kvs.empty())
    return absl::UnavailableError(absl::StrCat("etcd: ", key, " vanished while read"));
  auto stored = DecodeConfig(txn->results[0].kvs[0].value);
  if (!stored.ok()) return stored.status();
  if (!(*stored == mine)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cluster ", options_.cluster_name, " was created with ", ConfigText(*stored),
                     "; this node was started with ", ConfigText(mine)));
  }
  config_ = *stored;
  return absl::OkStatus();
}

absl::Status ClusterNode::Register(bool first) {
  // The previous run's lease: its leader keys would stand until the TTL ran out.
  if (!options_.lease_file.empty()) {
    std::ifstream in(options_.lease_file);
    LeaseId old = 0;
    if (in >> old && old != 0) {
      absl::Status revoked = etcd_.RevokeLease(old);
      if (!revoked.ok() && revoked.code() != absl::StatusCode::kNotFound) return revoked;
    }
  }
  if (first) {
    // A node key left now is another live process's with this id (or this node's previous
    // run's, if its lease file is gone: that one vanishes within the TTL). Two processes with
    // one id would each take the other's partitions for their own.
    const std::string key = NodeKey(options_.cluster_name, options_.node_id);
    const absl::Time give_up = absl::Now() + options_.lease.ttl + absl::Seconds(1);
    while (true) {
      absl::StatusOr<GetResult> existing = etcd_.Get(key);
      if (!existing.ok()) return existing.status();
      if (existing->kvs.empty()) break;
      if (absl::Now() >= give_up) {
        auto info = DecodeNode(existing->kvs.front().value);
        return absl::AlreadyExistsError(
            absl::StrCat("node id ", options_.node_id, " is registered by another live node",
                         info.ok() ? absl::StrCat(" at ", info->grpc) : "",
                         ": every node needs its own --node-id"));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  const absl::Time asked = clock_.Now();
  absl::StatusOr<LeaseId> lease = etcd_.GrantLease(options_.lease.ttl);
  if (!lease.ok()) return lease.status();
  if (!options_.lease_file.empty()) {
    std::ofstream out(options_.lease_file, std::ios::trunc);
    out << *lease << "\n";
    out.flush();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", options_.lease_file));
  }
  NodeInfo info;
  {
    absl::MutexLock lock(&mu_);
    info = {advertise_address_, leaving_};
  }
  absl::StatusOr<int64_t> put =
      etcd_.Put(NodeKey(options_.cluster_name, options_.node_id), EncodeNode(info), *lease);
  if (!put.ok()) return put.status();
  auto keeper = std::make_unique<LeaseKeeper>(etcd_, clock_, *lease, asked, options_.lease,
                                              [this](absl::Status why) {
                                                if (options_.on_lease_lost)
                                                  options_.on_lease_lost(why);
                                              });
  keeper->Start();
  absl::MutexLock lock(&mu_);
  if (keeper_) keeper_->Stop();
  keeper_ = std::move(keeper);
  return absl::OkStatus();
}

absl::Status ClusterNode::Attach(node::Partitions* partitions, std::string advertise_address) {
  if (advertise_address.empty()) return absl::InvalidArgumentError("advertise_address must be set");
  {
    absl::MutexLock lock(&mu_);
    advertise_address_ = std::move(advertise_address);
  }
  if (auto s = Register(/*first=*/true); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  partitions_ = partitions;
  for (uint32_t p = 0; p < partitions->count(); ++p) {
    partitions->HaltWrites(p, core::NotStorageFailure(absl::UnavailableError(
                                  absl::StrCat("partition ", p, " has no leader yet"))));
  }
  driver_ = std::thread([this] { DriverLoop(); });
  return absl::OkStatus();
}

absl::Status ClusterNode::HandOver(absl::Duration timeout) {
  NodeInfo info;
  LeaseId lease = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || partitions_ == nullptr) return absl::FailedPreconditionError("not attached");
    leaving_ = true;
    handed_over_ = false;
    info = {advertise_address_, true};
    if (keeper_ != nullptr && keeper_->lost().ok()) lease = keeper_->lease();
  }
  // The other nodes learn it from this key; this node's replicas from the driver's next step.
  if (lease != 0) {
    absl::StatusOr<int64_t> put =
        etcd_.Put(NodeKey(options_.cluster_name, options_.node_id), EncodeNode(info), lease);
    if (!put.ok()) return put.status();
  }
  absl::MutexLock lock(&mu_);
  if (mu_.AwaitWithTimeout(absl::Condition(&handed_over_), timeout)) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(options_.node_id, " did not hand over within ",
                                                  absl::FormatDuration(timeout), ": ",
                                                  still_held_));
}

std::string ClusterNode::StillHeld(const std::vector<PartitionView>& views) const {
  for (uint32_t p = 0; p < views.size(); ++p) {
    const PartitionView& view = views[p];
    if (std::find(view.replicas.begin(), view.replicas.end(), options_.node_id) ==
        view.replicas.end())
      continue;
    if (last_[p].role == Replica::Role::kLeader)
      return absl::StrCat("partition ", p, ": it still leads it");
    std::optional<LeaderValue> leader;
    if (view.leader) {
      if (auto decoded = DecodeLeader(view.leader->value); decoded.ok()) leader = *decoded;
    }
    if (leader && leader->node == options_.node_id)
      return absl::StrCat("partition ", p, ": its leader key is still this node's");
    std::vector<std::string> in_sync;
    if (view.sync) {
      if (auto sync = DecodeSync(view.sync->value); sync.ok()) in_sync = sync->members;
    }
    const bool member =
        std::find(in_sync.begin(), in_sync.end(), options_.node_id) != in_sync.end();
    // Another member can take over: wait until one has.
    if (!leader && in_sync.size() > (member ? 1u : 0u))
      return absl::StrCat("partition ", p, ": no other node leads it yet");
    // A set at min_in_sync keeps this node: writes will wait for it to come back.
    if (member && in_sync.size() > config_.min_in_sync)
      return absl::StrCat("partition ", p, ": it is still in the in-sync set");
  }
  return "";
}

void ClusterNode::Stop() {
  std::unique_ptr<LeaseKeeper> keeper;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    keeper = std::move(keeper_);
  }
  if (driver_.joinable()) driver_.join();
  for (auto& replica : replicas_) replica->Stop();
  if (keeper) {
    keeper->Stop();
    // Best effort: a node that cannot reach etcd lets its keys expire with the TTL.
    etcd_.RevokeLease(keeper->lease()).IgnoreError();
  }
}

void ClusterNode::DriverLoop() {
  while (true) {
    const absl::Time started = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    Step();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&stopping_), started + options_.tick_every);
    if (stopping_) return;
  }
}

void ClusterNode::Step() {
  // A lost lease takes this node's leader keys with it; a new one lets it lead again.
  bool lost = false;
  {
    absl::MutexLock lock(&mu_);
    lost = keeper_ == nullptr || !keeper_->lost().ok();
  }
  // If etcd is out of reach, the replicas are ticked below without a lease, so none leads.
  if (lost) Register(/*first=*/false).IgnoreError();
  NodeLease lease;
  bool leaving = false;
  {
    absl::MutexLock lock(&mu_);
    if (keeper_ != nullptr && keeper_->lost().ok()) {
      lease.id = keeper_->lease();
      lease.may_serve = keeper_->MayServe();
    }
    lease.leaving = leaving = leaving_;
  }

  // One linearizable read of the whole cluster, after every replica's last Tick returned: each
  // replica sees its own last transaction (PartitionView).
  const size_t count = replicas_.size();
  std::vector<PartitionView> views(count);
  std::map<std::string, std::string> nodes;  // id -> grpc address
  std::vector<bool> placed(count, false);
  std::vector<std::string> leaving_nodes;
  absl::StatusOr<GetResult> read = etcd_.GetPrefix(options_.cluster_name + "/");
  if (read.ok()) {
    const std::string partitions_prefix = PartitionsPrefix(options_.cluster_name);
    const std::string nodes_prefix = NodesPrefix(options_.cluster_name);
    for (auto& view : views) {
      view.known = true;
      view.revision = read->revision;
    }
    for (const KeyValue& kv : read->kvs) {
      const std::string& key = kv.key;
      if (key.starts_with(nodes_prefix)) {
        auto info = DecodeNode(kv.value);
        if (!info.ok()) continue;
        const std::string id = key.substr(nodes_prefix.size());
        nodes[id] = info->grpc;
        if (info->leaving) leaving_nodes.push_back(id);
        continue;
      }
      if (!key.starts_with(partitions_prefix)) continue;
      uint32_t p = 0;
      std::string kind;
      if (!ParsePartitionKey(key.substr(partitions_prefix.size()), &p, &kind) || p >= count)
        continue;
      if (kind == "leader") {
        views[p].leader = kv;
      } else if (kind == "sync") {
        views[p].sync = kv;
      } else if (kind == "replicas") {
        auto replicas = DecodeReplicas(kv.value);
        if (replicas.ok()) {
          views[p].replicas = *std::move(replicas);
          placed[p] = true;
        }
      }
    }
    for (const auto& [id, registered] : nodes) {
      if (id == options_.node_id) continue;
      auto dialled = options_.peer_addresses.find(id);
      const std::string& address =
          dialled == options_.peer_addresses.end() ? registered : dialled->second;
      auto [it, added] = peers_.emplace(id, address);
      if (added || it->second != address) {
        it->second = address;
        transport_->SetPeer(id, address);
      }
    }
    // Not to be waited for: nodes handing over, and replicas with no live registration (stopped,
    // or dead for longer than the TTL).
    for (auto& view : views) {
      view.leaving = leaving_nodes;
      for (const std::string& replica : view.replicas) {
        if (nodes.count(replica) == 0) view.leaving.push_back(replica);
      }
    }
    if (std::find(placed.begin(), placed.end(), false) != placed.end()) {
      PlaceMissing(nodes, placed);
      // Placed now, or by another node: the next step reads it, and its replicas act then.
    }
  }

  node::Partitions* partitions = nullptr;
  {
    absl::MutexLock lock(&mu_);
    partitions = partitions_;
  }
  for (uint32_t p = 0; p < count; ++p) {
    const ReplicatedPartition::State before = last_[p];
    const ReplicatedPartition::State after = replicas_[p]->Tick(views[p], lease);
    last_[p] = after;
    // A broker may write only while this node serves the epoch it was rebuilt in. Otherwise it
    // is halted (at once when this node stops leading, so what waits fails now; the store's
    // fence would refuse it anyway), and kept halted with a refusal that says who leads.
    auto current = [](const ReplicatedPartition::State& state) {
      return state.serving && state.epoch == state.broker_epoch;
    };
    // Read again just before: a Resume since the Tick (the epoch start committed on the
    // receiving thread) made the broker current, and it must not be halted for nothing.
    if (partitions != nullptr && !current(after) && !current(replicas_[p]->state()))
      partitions->HaltWrites(p, NotLeadingCause(p, views[p], nodes, after));
    if (options_.on_partition_change &&
        (before.role != after.role || before.epoch != after.epoch ||
         before.serving != after.serving || before.broken.ok() != after.broken.ok())) {
      options_.on_partition_change(p, after);
    }
    // After the role change is told: the log then says what the replica was doing.
    if (options_.on_replica_failed && !after.broken.ok() && before.broken.ok())
      options_.on_replica_failed(p, after.broken);
  }
  if (options_.on_snapshot) {
    Snapshot(read.ok(), views, nodes);
    options_.on_snapshot(snapshot_);
  }
  if (leaving && read.ok()) {
    std::string held = StillHeld(views);
    absl::MutexLock lock(&mu_);
    handed_over_ = held.empty();
    still_held_ = std::move(held);
  }
}

void ClusterNode::Snapshot(bool known, const std::vector<PartitionView>& views,
                           const std::map<std::string, std::string>& nodes) {
  snapshot_.known = known;
  snapshot_.partitions.resize(replicas_.size());
  if (known) snapshot_.nodes = nodes;
  for (uint32_t p = 0; p < replicas_.size(); ++p) {
    ClusterSnapshot::Partition& out = snapshot_.partitions[p];
    const ReplicatedPartition::State state = replicas_[p]->state();
    out.served_here = state.serving && state.epoch == state.broker_epoch;
    if (!known) continue;  // the leaders as last read: calls still go there, or fail there
    const PartitionView& view = views[p];
    out.leader.clear();
    out.epoch = 0;
    if (view.leader) {
      if (auto leader = DecodeLeader(view.leader->value); leader.ok()) {
        out.leader = leader->node;
        out.epoch = view.leader->create_revision;
      }
    }
    out.replicas = view.replicas;
    out.in_sync.clear();
    if (view.sync) {
      if (auto sync = DecodeSync(view.sync->value); sync.ok()) out.in_sync = sync->members;
    }
  }
}

absl::Status ClusterNode::NotLeadingCause(uint32_t p, const PartitionView& view,
                                          const std::map<std::string, std::string>& nodes,
                                          const ReplicatedPartition::State& state) const {
  std::string why;
  std::optional<LeaderValue> leader;
  if (view.leader) {
    if (auto decoded = DecodeLeader(view.leader->value); decoded.ok()) leader = *decoded;
  }
  if (!state.broken.ok()) {
    why = absl::StrCat("partition ", p, ": its replica on ", options_.node_id,
                       " stopped: ", state.broken.message());
  } else if (!view.known) {
    why = absl::StrCat("partition ", p, ": ", options_.node_id,
                       " cannot read the cluster's state from etcd");
  } else if (view.replicas.empty()) {
    why = absl::StrCat("partition ", p, " is not placed on any node yet: the cluster places ",
                       "its partitions once ", PlacementQuorum(), " nodes have registered, and ",
                       nodes.size(), " have");
  } else if (!leader) {
    why = absl::StrCat("partition ", p, " has no leader yet: an election is under way");
  } else if (leader->node == options_.node_id) {
    why = absl::StrCat("partition ", p, ": ", options_.node_id, " is starting to lead it");
  } else {
    auto address = nodes.find(leader->node);
    why = absl::StrCat("partition ", p, " is led by ", leader->node,
                       address == nodes.end() ? "" : absl::StrCat(" at ", address->second),
                       ", not by ", options_.node_id, "; send its writes there");
  }
  return core::NotStorageFailure(absl::UnavailableError(why));
}

uint32_t ClusterNode::PlacementQuorum() const {
  return std::max(config_.replication_factor, options_.initial_nodes);
}

void ClusterNode::PlaceMissing(const std::map<std::string, std::string>& nodes,
                               const std::vector<bool>& placed) {
  // Wait for enough nodes: the replicas of a partition go on distinct nodes, and the cluster's
  // first nodes share the partitions.
  if (nodes.size() < PlacementQuorum()) return;
  std::vector<std::string> ids;
  for (const auto& [id, address] : nodes) ids.push_back(id);  // in id order (std::map)
  for (uint32_t p = 0; p < placed.size(); ++p) {
    if (placed[p]) continue;
    std::vector<std::string> replicas;
    for (uint32_t i = 0; i < config_.replication_factor; ++i)
      replicas.push_back(ids[(p + i) % ids.size()]);
    const PartitionKeys keys = KeysOfPartition(options_.cluster_name, p);
    // Only while neither exists: two nodes placing at once write one placement.
    etcd_
        .Txn({Compare::Version(keys.replicas, Compare::Op::kEqual, 0),
              Compare::Version(keys.sync, Compare::Op::kEqual, 0)},
             {TxnOp::Put(keys.replicas, EncodeReplicas(replicas)),
              TxnOp::Put(keys.sync, EncodeSync({replicas, 0}))},
             {})
        .status()
        .IgnoreError();  // unreachable etcd: tried again next step
  }
}

}  // namespace jobbroker::cluster
