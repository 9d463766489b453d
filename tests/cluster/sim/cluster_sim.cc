#include "tests/cluster/sim/cluster_sim.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/etcd/lease_keeper.h"
#include "cluster/replication/etcd_layout.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_etcd.h"
#include "tests/testing/forwarding_etcd.h"
#include "tests/testing/memory_replica_storage.h"

namespace jobbroker::testing {
namespace {

using cluster::AppendResponse;
using cluster::LogPosition;
using cluster::Replica;
using cluster::ReplicationMessage;

constexpr absl::Duration kLeaseTtl = absl::Seconds(3);

// The simulation's one source of randomness. mt19937_64's output is fixed by the standard
// (unlike the <random> distributions), so a seed replays the same run everywhere.
class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : engine_() % n; }
  bool Chance(double p) { return static_cast<double>(engine_() >> 11) * 0x1.0p-53 < p; }
  absl::Duration Between(absl::Duration lo, absl::Duration hi) {
    int64_t span = absl::ToInt64Microseconds(hi - lo);
    return lo + absl::Microseconds(static_cast<int64_t>(Below(static_cast<uint64_t>(span) + 1)));
  }

 private:
  std::mt19937_64 engine_;
};

// An etcd client whose writes sometimes lose their answer: applied, but reported kUnavailable
// (what a timeout looks like to the caller).
class LossyEtcd final : public testing::ForwardingEtcd {
 public:
  LossyEtcd(std::unique_ptr<cluster::Etcd> inner, std::function<bool()> lose_answer)
      : ForwardingEtcd(*inner), inner_(std::move(inner)), lose_answer_(std::move(lose_answer)) {}
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              cluster::LeaseId lease) override {
    return MaybeLost(ForwardingEtcd::Put(key, value, lease));
  }
  absl::StatusOr<int64_t> Delete(const std::string& key) override {
    return MaybeLost(ForwardingEtcd::Delete(key));
  }
  absl::StatusOr<cluster::TxnResult> Txn(const std::vector<cluster::Compare>& compares,
                                         const std::vector<cluster::TxnOp>& then_ops,
                                         const std::vector<cluster::TxnOp>& else_ops) override {
    return MaybeLost(ForwardingEtcd::Txn(compares, then_ops, else_ops));
  }

 private:
  // A write's answer as the caller sees it: an applied write may come back kUnavailable.
  template <typename T>
  absl::StatusOr<T> MaybeLost(absl::StatusOr<T> result) {
    if (result.ok() && lose_answer_()) return absl::UnavailableError("answer lost");
    return result;
  }

  // Owned here; the base forwards to it.
  std::unique_ptr<cluster::Etcd> inner_;
  std::function<bool()> lose_answer_;
};

struct Node {
  std::string id;
  bool up = true;
  // Handing over before a graceful stop (NodeLease::leaving); the stop follows.
  bool leaving = false;
  absl::Time crashed_at = absl::InfinitePast();
  absl::Time paused_until = absl::InfinitePast();
  absl::Time cut_from_peers_until = absl::InfinitePast();
  absl::Time cut_from_etcd_until = absl::InfinitePast();
  std::unique_ptr<cluster::Etcd> etcd;
  // What survives a crash: the storages, and the lease id kept "in the data dir".
  std::vector<std::unique_ptr<MemoryReplicaStorage>> storages;
  cluster::LeaseId last_lease = 0;
  // What a crash loses.
  std::unique_ptr<cluster::LeaseKeeper> keeper;
  bool lease_lost = false;
  std::vector<std::unique_ptr<Replica>> replicas;
  std::map<int, cluster::PartitionView> views;  // the last read, by partition
};

struct Event {
  enum class Kind { kDeliver, kTick, kClient, kFault, kRestart, kHealEtcd, kStop };
  Event(Kind kind_in, int node_in = 0, ReplicationMessage message_in = {})
      : kind(kind_in), node(node_in), message(std::move(message_in)) {}
  Kind kind = Kind::kTick;
  int node = 0;
  ReplicationMessage message;
};

// Where an acknowledged or applied batch must be found.
struct Batch {
  LogPosition position;
  std::string op;  // the job id it puts; "" for an epoch-start entry
};

class Simulation {
 public:
  explicit Simulation(const SimOptions& options)
      : options_(options),
        random_(options.seed),
        clock_(absl::FromUnixSeconds(1'700'000'000)),
        etcd_(clock_) {}

  SimReport Run();

 private:
  absl::Time now() const { return clock_.Now(); }
  void Schedule(absl::Duration after, Event event) {
    events_.emplace(now() + after, std::move(event));
  }
  void Trace(const std::string& line) {
    Mix(std::hash<std::string>{}(line));
    if (options_.trace) {
      absl::StrAppend(&report_.trace, absl::FormatDuration(now() - start_), " ", line, "\n");
    }
  }
  void Mix(uint64_t value) { report_.fingerprint = (report_.fingerprint ^ value) * 0x100000001b3; }
  void Violate(const std::string& invariant, const std::string& what) {
    if (!report_.violation.empty()) return;
    report_.violation = absl::StrCat(invariant, ": ", what);
    Trace("VIOLATION " + report_.violation);
  }

  void Setup();
  void StartNode(int n);
  void CrashNode(int n);
  void TickNode(int n);
  void Deliver(int n, const ReplicationMessage& message);
  void Flush(int n);
  // One message of node n's replica of partition p onto the bus.
  void Send(int n, int p, ReplicationMessage message);
  void ClientWrite();
  void InjectFault();
  void Heal();
  cluster::PartitionView ReadView(Node& node, uint32_t p);
  std::vector<std::string> ReplicasOf(uint32_t p) const;

  // Invariants.
  void CheckStep();
  const std::vector<std::string>& InSyncSet(uint32_t p);
  bool Holds(int n, uint32_t p, const LogPosition& position);
  void CheckDurability(uint32_t p, const Batch& batch);
  void CheckApplied(int n, uint32_t p, const Batch& batch);
  void CheckSnapshotState(int n, uint32_t p);
  void CheckSettled();

  const SimOptions options_;
  Random random_;
  FakeClock clock_;
  FakeEtcd etcd_;
  absl::Time start_;
  absl::Time heal_at_;
  int stays_down_ = -1;  // the node left dead at the heal, or -1
  absl::Time end_at_;
  std::vector<Node> nodes_;
  std::multimap<absl::Time, Event> events_;
  double drop_chance_ = 0.01;
  bool lose_etcd_answers_ = true;
  uint64_t next_op_ = 1;
  SimReport report_;

  // Checker state.
  // (p, seq, epoch) of a proposal's last entry -> the op of each of its entries, in order.
  std::map<std::tuple<uint32_t, uint64_t, int64_t>, std::vector<std::string>> ops_at_;
  std::map<uint32_t, std::vector<Batch>> acked_;
  std::map<std::pair<uint32_t, uint64_t>, Batch> applied_at_;  // the reference: first apply
  std::map<std::pair<uint32_t, int64_t>, std::string> writer_of_epoch_;
  std::map<std::pair<int, uint32_t>, int64_t> floor_of_;
  std::map<std::pair<int, uint32_t>, int64_t> accepted_epoch_;
  std::map<int, std::map<uint32_t, int64_t>> led_epoch_;
  std::map<std::pair<int, uint32_t>, uint64_t> removals_seen_;
  std::map<std::pair<int, uint32_t>, uint64_t> snapshots_seen_;
  std::map<uint32_t, std::vector<std::string>> in_sync_seen_;
  std::map<uint32_t, std::pair<int64_t, std::vector<std::string>>> in_sync_cache_;
};

std::vector<std::string> Simulation::ReplicasOf(uint32_t p) const {
  std::vector<std::string> replicas;
  const int count = std::min(options_.replication_factor, options_.nodes);
  for (int k = 0; k < count; ++k) {
    replicas.push_back(nodes_[(p + static_cast<uint32_t>(k)) % nodes_.size()].id);
  }
  return replicas;
}

void Simulation::Setup() {
  start_ = now();
  heal_at_ = start_ + options_.faulty_for;
  end_at_ = heal_at_ + options_.settle_for;
  for (int n = 0; n < options_.nodes; ++n) {
    Node node;
    node.id = absl::StrCat("n", n + 1);
    for (int p = 0; p < options_.partitions; ++p) {
      node.storages.push_back(std::make_unique<MemoryReplicaStorage>(p));
    }
    nodes_.push_back(std::move(node));
  }
  for (int p = 0; p < options_.partitions; ++p) {
    auto keys = cluster::KeysOfPartition("sim", p);
    (void)etcd_.Put(keys.replicas, cluster::EncodeReplicas(ReplicasOf(p)));
    (void)etcd_.Put(keys.sync, cluster::EncodeSync({ReplicasOf(p), 0}));
  }
  for (int n = 0; n < options_.nodes; ++n) {
    Node& node = nodes_[n];
    node.etcd = std::make_unique<LossyEtcd>(etcd_.Connect(node.id), [this] {
      return lose_etcd_answers_ && now() < heal_at_ && random_.Chance(0.02);
    });
    StartNode(n);
  }
  Schedule(absl::Milliseconds(5), {Event::Kind::kClient});
  Schedule(random_.Between(absl::Milliseconds(300), absl::Milliseconds(1200)),
           {Event::Kind::kFault});
}

void Simulation::StartNode(int n) {
  Node& node = nodes_[n];
  node.up = true;
  node.paused_until = absl::InfinitePast();
  node.lease_lost = false;
  node.keeper.reset();
  // A restart revokes the lease it held before, so its partitions need not wait for the TTL.
  if (node.last_lease != 0) (void)node.etcd->RevokeLease(node.last_lease);
  node.replicas.clear();
  node.views.clear();
  for (int p = 0; p < options_.partitions; ++p) {
    cluster::ReplicaOptions replica;
    replica.cluster_name = "sim";
    replica.node_id = node.id;
    replica.partition = p;
    replica.min_in_sync = static_cast<uint32_t>(options_.min_in_sync);
    replica.max_entries_per_message = 16;
    replica.snapshot_records_per_chunk = 16;
    replica.log_retention = 100;
    // Sooner than a node's 5 s, so that the leaders are back on their preferred replicas well
    // within settle_for (checked by CheckSettled).
    replica.hand_back_after = absl::Seconds(1);
    replica.TEST_planted_bug = options_.bug;
    node.replicas.push_back(std::make_unique<Replica>(replica, *node.storages[p], *node.etcd));
  }
  Trace(absl::StrCat(node.id, " starts"));
  Schedule(random_.Between(absl::Milliseconds(1), absl::Milliseconds(20)), {Event::Kind::kTick, n});
}

void Simulation::CrashNode(int n) {
  Node& node = nodes_[n];
  node.up = false;
  node.leaving = false;
  node.crashed_at = now();
  node.keeper.reset();
  node.replicas.clear();
  Trace(absl::StrCat(node.id, " crashes"));
}

cluster::PartitionView Simulation::ReadView(Node& node, uint32_t p) {
  cluster::PartitionView view;
  auto keys = cluster::KeysOfPartition("sim", p);
  auto leader = node.etcd->Get(keys.leader);
  auto sync = node.etcd->Get(keys.sync);
  if (!leader.ok() || !sync.ok()) return view;
  view.known = true;
  view.revision = sync->revision;
  if (!leader->kvs.empty()) view.leader = leader->kvs.front();
  if (!sync->kvs.empty()) view.sync = sync->kvs.front();
  view.replicas = ReplicasOf(p);
  // What a real node reads from the node keys: who is handing over, and who has no lease any
  // more (down for longer than the TTL).
  for (const Node& other : nodes_) {
    if (other.leaving || (!other.up && now() - other.crashed_at >= kLeaseTtl))
      view.leaving.push_back(other.id);
  }
  return view;
}

void Simulation::TickNode(int n) {
  Node& node = nodes_[n];
  if (!node.up) return;
  if (now() < node.paused_until) return;  // the resume schedules the next tick
  if (!node.keeper || node.lease_lost) {
    node.keeper.reset();
    auto lease = node.etcd->GrantLease(kLeaseTtl);
    if (lease.ok()) {
      node.last_lease = *lease;
      node.lease_lost = false;
      cluster::LeaseKeeperOptions keeper;
      keeper.ttl = kLeaseTtl;
      node.keeper =
          std::make_unique<cluster::LeaseKeeper>(*node.etcd, clock_, *lease, now(), keeper,
                                                 [&node](absl::Status) { node.lease_lost = true; });
      Trace(absl::StrCat(node.id, " holds lease ", *lease));
    }
  }
  if (node.keeper) node.keeper->Tick();
  cluster::NodeLease lease;
  if (node.keeper && !node.lease_lost) {
    lease.id = node.keeper->lease();
    lease.may_serve = node.keeper->MayServe();
  }
  lease.leaving = node.leaving;
  for (int p = 0; p < options_.partitions; ++p) {
    // A follower may act on a view that is behind etcd (a real node's watch lags): the
    // transactions' guards, not the view, must keep it safe. A leader's view is always fresh:
    // it must see its own last transaction (PartitionView).
    auto& cached = node.views[p];
    if (node.replicas[p]->role() == Replica::Role::kLeader || !cached.known ||
        random_.Chance(0.5)) {
      cached = ReadView(node, p);
    }
    node.replicas[p]->Tick(now(), cached, lease);
  }
  Flush(n);
  Schedule(random_.Between(absl::Milliseconds(10), absl::Milliseconds(30)),
           {Event::Kind::kTick, n});
}

void Simulation::Flush(int n) {
  Node& node = nodes_[n];
  for (int p = 0; p < options_.partitions; ++p) {
    Replica& replica = *node.replicas[p];
    for (auto& outcome : replica.TakeOutcomes()) {
      if (!outcome.status.ok()) continue;
      auto found =
          ops_at_.find({static_cast<uint32_t>(p), outcome.position.seq, outcome.position.epoch});
      // One outcome answers every entry of its proposal: the last is at outcome.position.
      const std::vector<std::string> ops =
          found == ops_at_.end() ? std::vector<std::string>{""} : found->second;
      for (size_t i = 0; i < ops.size(); ++i) {
        Batch batch{{outcome.position.seq - (ops.size() - 1 - i), outcome.position.epoch}, ops[i]};
        ++report_.acked;
        Trace(absl::StrCat("ack ", batch.op, " p", p, " seq ", batch.position.seq, " epoch ",
                           batch.position.epoch));
        acked_[p].push_back(batch);
        CheckDurability(p, batch);
      }
    }
    for (auto& message : replica.TakeOutbox()) Send(n, p, std::move(message));
  }
}

void Simulation::Send(int n, int p, ReplicationMessage message) {
  Node& node = nodes_[n];
  if (const auto* response = std::get_if<AppendResponse>(&message.body);
      response && response->result == AppendResponse::Result::kMatched) {
    int64_t& accepted = accepted_epoch_[{n, static_cast<uint32_t>(p)}];
    if (response->epoch < accepted) {
      Violate("epochs-increase", absl::StrCat(node.id, " accepted epoch ", response->epoch,
                                              " of partition ", p, " after epoch ", accepted));
    }
    accepted = std::max(accepted, response->epoch);
  }
  // The bus: the link may be cut or lossy; it may repeat, delay and reorder.
  int to = -1;
  for (int k = 0; k < options_.nodes; ++k) {
    if (nodes_[k].id == message.to) to = k;
  }
  if (to < 0) return;
  bool cut = now() < node.cut_from_peers_until || now() < nodes_[to].cut_from_peers_until;
  if (cut || random_.Chance(drop_chance_)) return;
  int copies = random_.Chance(0.01) ? 2 : 1;
  for (int c = 0; c < copies; ++c) {
    absl::Duration delay = random_.Chance(0.05)
                               ? random_.Between(absl::Milliseconds(5), absl::Milliseconds(200))
                               : random_.Between(absl::Microseconds(200), absl::Milliseconds(5));
    Schedule(delay, {Event::Kind::kDeliver, to, message});
  }
}

void Simulation::Deliver(int n, const ReplicationMessage& message) {
  Node& node = nodes_[n];
  if (!node.up) return;
  if (now() < node.paused_until) {  // a stopped process reads its socket when it resumes
    events_.emplace(node.paused_until, Event{Event::Kind::kDeliver, n, message});
    return;
  }
  if (now() < node.cut_from_peers_until) return;
  if (options_.trace_messages) {
    std::string what = std::visit(
        [](const auto& body) -> std::string {
          using Body = std::decay_t<decltype(body)>;
          if constexpr (std::is_same_v<Body, cluster::AppendRequest>) {
            return absl::StrCat("append e", body.epoch, " prev ", body.prev.seq, " n ",
                                body.entries.size(), " commit ", body.commit_seq);
          } else if constexpr (std::is_same_v<Body, cluster::SnapshotChunk>) {
            return absl::StrCat("chunk e", body.epoch, " at ", body.at.seq, " #", body.index,
                                body.last ? " last" : "");
          } else if constexpr (std::is_same_v<Body, cluster::AppendResponse>) {
            return absl::StrCat("response e", body.epoch, " r", static_cast<int>(body.result),
                                " match ", body.match_seq, " retry ", body.retry_from);
          } else {
            return absl::StrCat("chunk-ack e", body.epoch, " next ", body.next_index);
          }
        },
        message.body);
    Trace(absl::StrCat(message.from, "->", message.to, " p", message.partition, " ", what));
  }
  node.replicas[message.partition]->Receive(now(), message);
  Flush(n);
}

void Simulation::ClientWrite() {
  if (now() < end_at_ - absl::Seconds(2)) {
    Schedule(random_.Between(absl::Milliseconds(4), absl::Milliseconds(30)),
             {Event::Kind::kClient});
  }
  uint32_t p = static_cast<uint32_t>(random_.Below(options_.partitions));
  // The client writes to a node that believes it leads (there may be two for a moment).
  std::vector<int> leaders;
  for (int n = 0; n < options_.nodes; ++n) {
    if (nodes_[n].up && now() >= nodes_[n].paused_until &&
        nodes_[n].replicas[p]->role() == Replica::Role::kLeader) {
      leaders.push_back(n);
    }
  }
  if (leaders.empty()) return;
  int n = leaders[random_.Below(leaders.size())];
  // Mostly one transition, as Propose; sometimes a commit group of several, as a node's
  // pipeline proposes them (ProposeBatch: consecutive entries, one outcome for all).
  const size_t count = random_.Below(4) == 0 ? 2 + random_.Below(3) : 1;
  std::vector<std::string> ops;
  std::vector<core::Transition> transitions;
  for (size_t i = 0; i < count; ++i) {
    ops.push_back(absl::StrCat("op-", next_op_++));
    core::Transition transition;
    core::Job job;
    job.id = ops.back();
    job.queue = "q";
    transition.put_jobs.push_back(job);
    transitions.push_back(std::move(transition));
  }
  Replica& replica = *nodes_[n].replicas[p];
  // A node's leader sends a batch before its own fsync (send_now); half the proposals here do.
  Replica::SendNow send_now;
  if (random_.Chance(0.5)) {
    send_now = [this, n, p](std::vector<ReplicationMessage> messages) {
      for (auto& message : messages) Send(n, static_cast<int>(p), std::move(message));
    };
  }
  // And half of them are written unsynced where that is allowed (RF 1), then synced, as a
  // node's commit pipeline does for a batch that workers wait on.
  const bool durable = random_.Chance(0.5);
  auto position = count == 1 && !send_now && durable
                      ? replica.Propose(now(), std::move(transitions.front()))
                      : replica.ProposeBatch(now(), std::move(transitions), send_now, durable);
  if (!durable && position.ok()) (void)replica.SyncLog();
  if (position.ok()) ops_at_[{p, position->seq, position->epoch}] = std::move(ops);
  Flush(n);
}

void Simulation::InjectFault() {
  if (now() >= heal_at_) return;
  Schedule(random_.Between(absl::Milliseconds(200), absl::Milliseconds(1500)),
           {Event::Kind::kFault});
  ++report_.faults;
  int n = static_cast<int>(random_.Below(options_.nodes));
  Node& node = nodes_[n];
  switch (random_.Below(7)) {
    case 0:
      if (!node.up) break;
      CrashNode(n);
      Schedule(random_.Between(absl::Milliseconds(300), absl::Seconds(3)),
               {Event::Kind::kRestart, n});
      break;
    case 1:
      if (!node.up || now() < node.paused_until) break;
      node.paused_until = now() + 2 * kLeaseTtl;  // SIGSTOP for 2×TTL
      Trace(absl::StrCat(node.id, " paused"));
      // After what reached it meanwhile: a resumed process reads its sockets before its timers
      // fire.
      events_.emplace(node.paused_until + absl::Microseconds(1), Event{Event::Kind::kTick, n});
      break;
    case 2:
      node.cut_from_etcd_until = now() + random_.Between(absl::Milliseconds(500), absl::Seconds(5));
      etcd_.Partition(node.id);
      Trace(absl::StrCat(node.id, " cut from etcd"));
      events_.emplace(node.cut_from_etcd_until, Event{Event::Kind::kHealEtcd, n});
      break;
    case 3:
      node.cut_from_peers_until =
          now() + random_.Between(absl::Milliseconds(500), absl::Seconds(3));
      Trace(absl::StrCat(node.id, " cut from its peers"));
      break;
    case 4:
      drop_chance_ = drop_chance_ > 0.1 ? 0.01 : 0.3;
      Trace(absl::StrCat("links drop ", drop_chance_));
      break;
    case 5:
      // A graceful stop (SIGTERM): the node hands over for a while, then stops.
      if (!node.up || node.leaving) break;
      node.leaving = true;
      Trace(absl::StrCat(node.id, " hands over"));
      Schedule(random_.Between(absl::Milliseconds(50), absl::Seconds(1)), {Event::Kind::kStop, n});
      break;
    default: {
      // Kill the leader of a partition: the nemesis that matters most.
      uint32_t p = static_cast<uint32_t>(random_.Below(options_.partitions));
      for (int k = 0; k < options_.nodes; ++k) {
        if (nodes_[k].up && nodes_[k].replicas[p]->role() == Replica::Role::kLeader) {
          CrashNode(k);
          Schedule(random_.Between(absl::Milliseconds(300), absl::Seconds(3)),
                   {Event::Kind::kRestart, k});
          break;
        }
      }
    }
  }
}

void Simulation::Heal() {
  drop_chance_ = 0;
  for (int n = 0; n < options_.nodes; ++n) {
    Node& node = nodes_[n];
    node.leaving = false;  // a stop under way is called off
    node.cut_from_peers_until = absl::InfinitePast();
    if (now() < node.paused_until) {  // SIGCONT
      node.paused_until = now();
      Schedule(absl::Microseconds(1), {Event::Kind::kTick, n});
    }
    if (now() < node.cut_from_etcd_until) {
      node.cut_from_etcd_until = absl::InfinitePast();
      etcd_.Heal(node.id);
    }
  }
  Trace("healed");
}

// ---- Invariants ----

const std::vector<std::string>& Simulation::InSyncSet(uint32_t p) {
  // Read again only when etcd changed: the checker asks for it many times a step.
  auto& cached = in_sync_cache_[p];
  if (cached.first != etcd_.revision()) {
    cached.first = etcd_.revision();
    cached.second.clear();
    auto read = etcd_.Get(cluster::KeysOfPartition("sim", p).sync);
    if (read.ok() && !read->kvs.empty()) {
      auto sync = cluster::DecodeSync(read->kvs.front().value);
      if (sync.ok()) cached.second = sync->members;
    }
  }
  return cached.second;
}

bool Simulation::Holds(int n, uint32_t p, const LogPosition& position) {
  const MemoryReplicaStorage& storage = *nodes_[n].storages[p];
  if (position.seq <= storage.log_base().seq) return storage.applied_seq() >= position.seq;
  auto epoch = storage.EpochAt(position.seq);
  return epoch.ok() && *epoch == position.epoch;
}

void Simulation::CheckDurability(uint32_t p, const Batch& batch) {
  for (const auto& member : InSyncSet(p)) {
    for (int n = 0; n < options_.nodes; ++n) {
      if (nodes_[n].id != member || Holds(n, p, batch.position)) continue;
      Violate("durability", absl::StrCat("acknowledged ", batch.op, " (partition ", p, " seq ",
                                         batch.position.seq, " epoch ", batch.position.epoch,
                                         ") is not on in-sync member ", member));
    }
  }
}

void Simulation::CheckApplied(int n, uint32_t p, const Batch& batch) {
  auto [it, first] = applied_at_.emplace(std::make_pair(p, batch.position.seq), batch);
  if (!first && !(it->second.position == batch.position)) {
    Violate("apply-committed",
            absl::StrCat(nodes_[n].id, " applied seq ", batch.position.seq, " of partition ", p,
                         " from epoch ", batch.position.epoch, "; another replica applied epoch ",
                         it->second.position.epoch, "'s"));
  }
  for (const auto& member : InSyncSet(p)) {
    for (int k = 0; k < options_.nodes; ++k) {
      if (nodes_[k].id != member || Holds(k, p, batch.position)) continue;
      Violate("apply-committed",
              absl::StrCat(nodes_[n].id, " applied seq ", batch.position.seq, " of partition ", p,
                           " that in-sync member ", member, " does not hold: not committed"));
    }
  }
}

void Simulation::CheckSnapshotState(int n, uint32_t p) {
  const MemoryReplicaStorage& storage = *nodes_[n].storages[p];
  size_t expected = 0;
  for (auto it = applied_at_.lower_bound({p, 0});
       it != applied_at_.end() && it->first.first == p && it->first.second <= storage.applied_seq();
       ++it) {
    if (it->second.op.empty()) continue;
    ++expected;
    if (!storage.state().FindJob(it->second.op)) {
      Violate("apply-committed", absl::StrCat(nodes_[n].id, " installed a snapshot of partition ",
                                              p, " without ", it->second.op));
    }
  }
  if (storage.state().job_count() != expected) {
    Violate("apply-committed",
            absl::StrCat(nodes_[n].id, " installed a snapshot of partition ", p, " with ",
                         storage.state().job_count(), " jobs, not the ", expected, " applied"));
  }
}

void Simulation::CheckStep() {
  for (int n = 0; n < options_.nodes; ++n) {
    Node& node = nodes_[n];
    for (int p = 0; p < options_.partitions; ++p) {
      uint32_t partition = static_cast<uint32_t>(p);
      MemoryReplicaStorage& storage = *node.storages[p];
      int64_t& floor = floor_of_[{n, partition}];
      if (storage.epoch_floor() < floor) {
        Violate("epochs-increase", absl::StrCat(node.id, "'s floor of partition ", p,
                                                " went down to ", storage.epoch_floor()));
      }
      floor = storage.epoch_floor();
      // Applied batches: each new one, against the reference and the in-sync set.
      for (auto& applied : storage.TakeApplied()) {
        CheckApplied(n, partition, {applied.position, applied.op});
      }
      uint64_t& snapshots = snapshots_seen_[{n, partition}];
      if (storage.snapshots_installed() != snapshots) {
        snapshots = storage.snapshots_installed();
        ++report_.snapshots;
        Trace(
            absl::StrCat(node.id, " installed a snapshot of p", p, " at ", storage.applied_seq()));
        CheckSnapshotState(n, partition);
      }
      uint64_t& removals = removals_seen_[{n, partition}];
      if (storage.removals() != removals) {
        removals = storage.removals();
        for (const auto& batch : acked_[partition]) CheckDurability(partition, batch);
      }
      if (!node.up) continue;
      const Replica& replica = *node.replicas[p];
      if (replica.role() != Replica::Role::kLeader) continue;
      auto [writer, first] =
          writer_of_epoch_.emplace(std::make_pair(partition, replica.epoch()), node.id);
      if (first) {
        ++report_.elections;
        Trace(absl::StrCat(node.id, " leads p", p, " in epoch ", replica.epoch()));
      } else if (writer->second != node.id) {
        Violate("one-writer", absl::StrCat(node.id, " and ", writer->second, " both lead epoch ",
                                           replica.epoch(), " of partition ", p));
      }
      int64_t& led = led_epoch_[n][partition];
      if (replica.epoch() < led) {
        Violate("epochs-increase", absl::StrCat(node.id, " leads partition ", p, " in epoch ",
                                                replica.epoch(), " after epoch ", led));
      }
      led = std::max(led, replica.epoch());
    }
  }
  for (int p = 0; p < options_.partitions; ++p) {
    const auto& members = InSyncSet(p);
    auto& seen = in_sync_seen_[p];
    if (members == seen) continue;
    seen = members;
    Trace(absl::StrCat("p", p, " in sync: ", absl::StrJoin(members, ",")));
    for (const auto& batch : acked_[p]) CheckDurability(p, batch);
  }
}

void Simulation::CheckSettled() {
  for (int p = 0; p < options_.partitions; ++p) {
    int leader = -1;
    for (int n = 0; n < options_.nodes; ++n) {
      if (nodes_[n].up && nodes_[n].replicas[p]->serving()) {
        if (leader >= 0) {
          Violate("settles", absl::StrCat("partition ", p, " has two serving leaders, ",
                                          nodes_[leader].id, " and ", nodes_[n].id));
        }
        leader = n;
      }
    }
    if (leader < 0) {
      Violate("settles",
              absl::StrCat("partition ", p, " has no serving leader ",
                           absl::FormatDuration(options_.settle_for), " after the faults healed"));
      continue;
    }
    // Balance: with its preferred replica up, the partition is led there again.
    const std::vector<std::string> replicas = ReplicasOf(p);
    if (!replicas.empty() && nodes_[leader].id != replicas.front()) {
      for (int n = 0; n < options_.nodes; ++n) {
        if (nodes_[n].id == replicas.front() && nodes_[n].up && n != stays_down_) {
          Violate("settles",
                  absl::StrCat("partition ", p, " is led by ", nodes_[leader].id,
                               ", not by its preferred replica ", nodes_[n].id, ", which is up"));
        }
      }
    }
    const MemoryReplicaStorage& lead = *nodes_[leader].storages[p];
    for (const auto& batch : acked_[p]) {
      if (!batch.op.empty() && !lead.state().FindJob(batch.op)) {
        Violate("durability", absl::StrCat("acknowledged ", batch.op, " of partition ", p,
                                           " is not in leader ", nodes_[leader].id, "'s state"));
      }
    }
    for (const auto& node : ReplicasOf(p)) {
      for (int n = 0; n < options_.nodes; ++n) {
        if (nodes_[n].id != node || n == stays_down_) continue;
        const MemoryReplicaStorage& replica = *nodes_[n].storages[p];
        if (replica.applied_seq() != lead.applied_seq() ||
            replica.state().job_count() != lead.state().job_count()) {
          Violate("settles",
                  absl::StrCat(node, " applied partition ", p, " through ", replica.applied_seq(),
                               " (", replica.state().job_count(), " jobs), its leader through ",
                               lead.applied_seq(), " (", lead.state().job_count(), " jobs)"));
        }
      }
    }
  }
}

SimReport Simulation::Run() {
  Setup();
  bool healed = false;
  while (!events_.empty() && report_.violation.empty()) {
    auto next = events_.begin();
    if (next->first > end_at_) break;
    if (!healed && next->first >= heal_at_) {
      clock_.Set(heal_at_);
      Heal();
      // Half the runs end with one node dead for good (a machine that never comes back): the
      // others must settle without it, whatever the in-sync sets were when it died. Only where
      // that is promised: with min_in_sync 1 a set may hold just the dead node, and then its
      // partition waits for it (it alone has every acknowledged batch).
      if (options_.min_in_sync >= 2 && random_.Chance(0.5)) {
        stays_down_ = static_cast<int>(random_.Below(options_.nodes));
        if (nodes_[stays_down_].up) CrashNode(stays_down_);
        Trace(absl::StrCat(nodes_[stays_down_].id, " stays down"));
      }
      for (int n = 0; n < options_.nodes; ++n) {
        if (!nodes_[n].up && n != stays_down_) StartNode(n);
      }
      healed = true;
      continue;
    }
    clock_.Set(std::max(now(), next->first));
    Event event = std::move(next->second);
    events_.erase(next);
    ++report_.steps;
    Mix(static_cast<uint64_t>(event.kind) * 31 + static_cast<uint64_t>(event.node));
    etcd_.ExpireLeases();
    switch (event.kind) {
      case Event::Kind::kDeliver:
        Deliver(event.node, event.message);
        break;
      case Event::Kind::kTick:
        TickNode(event.node);
        break;
      case Event::Kind::kClient:
        ClientWrite();
        break;
      case Event::Kind::kFault:
        InjectFault();
        break;
      case Event::Kind::kRestart:
        if (!nodes_[event.node].up && !healed) StartNode(event.node);
        break;
      case Event::Kind::kHealEtcd:
        if (now() >= nodes_[event.node].cut_from_etcd_until) etcd_.Heal(nodes_[event.node].id);
        break;
      case Event::Kind::kStop:
        if (!healed && nodes_[event.node].up && nodes_[event.node].leaving) {
          CrashNode(event.node);
          Schedule(random_.Between(absl::Milliseconds(300), absl::Seconds(3)),
                   {Event::Kind::kRestart, event.node});
        }
        break;
    }
    CheckStep();
  }
  if (report_.violation.empty()) CheckSettled();
  return report_;
}

}  // namespace

SimReport RunSimulation(const SimOptions& options) { return Simulation(options).Run(); }

const char* PlantedBugName(cluster::PlantedBug bug) {
  switch (bug) {
    case cluster::PlantedBug::kNone:
      return "none";
    case cluster::PlantedBug::kAckBeforeCommit:
      return "ack-before-commit";
    case cluster::PlantedBug::kIgnoreElectionOutcome:
      return "ignore-election-outcome";
    case cluster::PlantedBug::kNoEpochFence:
      return "no-epoch-fence";
    case cluster::PlantedBug::kApplyOnReceipt:
      return "apply-on-receipt";
    case cluster::PlantedBug::kShrinkWithoutEtcd:
      return "shrink-without-etcd";
  }
  return "unknown";
}

}  // namespace jobbroker::testing
