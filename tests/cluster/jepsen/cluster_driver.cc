#include "tests/cluster/jepsen/cluster_driver.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/ids.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "tests/cluster/jepsen/etcd_cluster.h"
#include "tests/cluster/jepsen/nemesis.h"
#include "tests/cluster/jepsen/toxiproxy.h"
#include "tests/crash/channel.h"
#include "tests/crash/checker.h"
#include "tests/crash/final_state.h"
#include "tests/crash/fleet.h"
#include "tests/crash/line_log.h"
#include "tests/crash/verdict.h"
#include "tests/testing/child_process.h"
#include "tests/testing/process_util.h"

namespace jobbroker::jepsen {
namespace {

using crash::CrashLogs;
using crash::LineLog;
using testing::ChildProcess;
using testing::ReadWholeFile;

constexpr int kNodes = 3;
constexpr int kEtcdMembers = 3;
constexpr char kServingPrefix[] = "jobbroker: serving ";
constexpr absl::Duration kNodeStartTimeout = absl::Seconds(60);
constexpr absl::Duration kTick = absl::Milliseconds(20);
// Producers spread their jobs over the nemesis phase, a nemesis taking about this long.
constexpr absl::Duration kNemesisLength = absl::Seconds(8);
// Worker chaos, as in the crash harness: a kill or a stop every 1.5-4.5 s.
constexpr absl::Duration kWorkerEventMin = absl::Milliseconds(1500);
constexpr absl::Duration kWorkerEventMax = absl::Milliseconds(4500);

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), "s"); }
std::string NodeId(int i) { return absl::StrCat("node-", i); }

// One line of the summary's nemesis table: how long the cluster took to be whole again.
struct Healing {
  std::string kind;
  double seconds = 0;
};

class ClusterDriver {
 public:
  explicit ClusterDriver(const ClusterDriverOptions& options)
      : options_(options), rng_(options.seed) {}

  int Run() {
    const absl::Time start = absl::Now();
    if (absl::Status s = Setup(); !s.ok()) return Abort(s);
    std::printf(
        "cluster harness: seed %llu, %d nemeses, %d jobs, %d producers, %d workers, %d nodes, "
        "%d etcd members, %d partitions, lease TTL %ds\n",
        static_cast<unsigned long long>(options_.seed), options_.nemeses, options_.jobs,
        options_.producers, options_.workers, kNodes, kEtcdMembers, options_.partitions,
        options_.lease_ttl);
    std::printf("  replay: tests/cluster/jepsen/run.sh --seed %llu --nemeses %d --jobs %d%s\n",
                static_cast<unsigned long long>(options_.seed), options_.nemeses, options_.jobs,
                options_.kinds == "all" ? "" : absl::StrCat(" --kinds ", options_.kinds).c_str());
    std::printf("  logs in %s\n", out_.c_str());
    std::fflush(stdout);
    if (absl::Status s = StartRig(); !s.ok()) return Abort(s);
    // A schedule running every second through the nemeses (crash/checker.h): each run once, and
    // no gap but across a fault. Retried while its partition has no leader yet.
    for (const absl::Time until = absl::Now() + absl::Seconds(30);;) {
      absl::Status put = crash::PutEverySecondSchedule(LiveAddress());
      if (put.ok()) break;
      if (absl::Now() > until) return Abort(put);
      absl::SleepFor(absl::Milliseconds(200));
    }
    fleet_ = std::make_unique<crash::Fleet>(
        crash::FleetOptions{.self_exe = options_.self_exe,
                            .out_dir = out_,
                            .queues = queues_,
                            .job_lease = options_.job_lease,
                            .worker_dead_max = absl::Seconds(1),
                            // Every node, starting at a different one for each child.
                            .address = [this](int index) { return Addresses(index); }},
        *log_, rng_, problems_);
    if (absl::Status s = fleet_->StartWorkers(options_.workers); !s.ok()) return Abort(s);
    // Producers spread their jobs over the nemesis phase, as long as it is expected to take.
    const absl::Duration spread = kNemesisLength * options_.nemeses;
    producers_done_by_ = absl::Now() + spread;
    if (absl::Status s = fleet_->StartProducers(options_.producers, options_.jobs, spread); !s.ok())
      return Abort(s);
    if (absl::Status s = NemesisPhase(); !s.ok()) return Abort(s);
    const absl::Time nemesis_end = absl::Now();
    if (absl::Status s = Settle(); !s.ok()) return Abort(s);
    const absl::Time settled = absl::Now();
    return Finish(start, nemesis_end, settled);
  }

 private:
  struct Node {
    int index = 0;
    std::string id;
    int port = 0;
    std::string address;  // where clients reach it: no proxy
    std::string data_dir;
    std::string full_marker;  // faults: while it exists, the node's disk is full
    std::string journal;      // faults: what the node synced
    std::string etcd_urls;    // through this node's proxies to each etcd member
    std::string peer_addresses;
    int generation = 0;
    std::unique_ptr<ChildProcess> process;
    bool stopped = false;
    bool may_exit = false;  // a disk-full nemesis: exiting on the full disk is its right
  };

  absl::Status Setup() {
    out_ = options_.out_dir;
    if (out_.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string tmpl =
          absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/jobbroker-jepsen-XXXXXX");
      if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
      out_ = tmpl;
    }
    std::error_code ec;
    std::filesystem::create_directories(out_, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", out_, ": ", ec.message()));
    for (const std::string& program : {options_.broker_binary, options_.toxiproxy_binary,
                                       options_.power_loss_binary, options_.log_dump_binary}) {
      if (access(program.c_str(), X_OK) != 0) {
        return absl::FailedPreconditionError(absl::StrCat(program, " is not executable"));
      }
    }
    if (access(options_.faults_library.c_str(), R_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(options_.faults_library, " is missing: build jobbroker_faults"));
    }
    // As the crash harness: retries 0.2 s apart without jitter, attempts enough that no job
    // meant to succeed dies of lost leases alone, and retention that keeps every ended job.
    config_path_ = absl::StrCat(out_, "/config.json");
    std::ofstream config(config_path_);
    config << R"({"defaultPolicy": {"leaseDuration": ")" << Seconds(options_.job_lease)
           << R"(", "retry": {"maxAttempts": 60, "initialBackoff": "0.2s", )"
           << R"("backoffMultiplier": 1, "maxBackoff": "0.2s", "jitter": "JITTER_NONE"}, )"
           << R"("completedRetention": {"maxCount": "0", "maxAge": "0s"}, )"
           << R"("failedRetention": {"maxCount": "0", "maxAge": "0s"}}})"
           << "\n";
    config.close();
    if (!config) return absl::InternalError(absl::StrCat("cannot write ", config_path_));
    // One queue per partition: the first name of the form jepsen.<n> that lands in it.
    const uint32_t partitions = static_cast<uint32_t>(options_.partitions);
    queue_of_partition_.assign(partitions, "");
    for (int n = 0, found = 0; found < options_.partitions; ++n) {
      const std::string name = absl::StrCat("jepsen.", n);
      const uint32_t p = core::PartitionOfQueue(name, partitions);
      if (!queue_of_partition_[p].empty()) continue;
      queue_of_partition_[p] = name;
      partition_of_queue_[name] = p;
      ++found;
    }
    queues_ = absl::StrJoin(queue_of_partition_, ",");
    auto log = LineLog::Open(absl::StrCat(out_, "/driver.log"));
    if (!log.ok()) return log.status();
    log_ = *std::move(log);
    log_->Write({"SEED", absl::StrCat(options_.seed)});
    return absl::OkStatus();
  }

  absl::StatusOr<int> Port() {
    for (int i = 0; i < 50; ++i) {
      absl::StatusOr<int> port = testing::PortBelowEphemeralRange();
      if (!port.ok()) return port;
      if (ports_.insert(*port).second) return port;
    }
    return absl::UnavailableError("no distinct free port");
  }

  std::string LinkToNode(int from, int to) const { return absl::StrCat("n", from, "-n", to); }
  std::string LinkToEtcd(int from, int member) const {
    return absl::StrCat("n", from, "-etcd", member);
  }

  // etcd, Toxiproxy with a proxy on every link (node to node, node to etcd member), the nodes.
  absl::Status StartRig() {
    std::vector<int> client_ports, peer_ports;
    for (int k = 0; k < kEtcdMembers; ++k) {
      auto client = Port();
      auto peer = Port();
      if (!client.ok()) return client.status();
      if (!peer.ok()) return peer.status();
      client_ports.push_back(*client);
      peer_ports.push_back(*peer);
    }
    auto etcd = EtcdCluster::Start(out_, client_ports, peer_ports);
    if (!etcd.ok()) return etcd.status();
    etcd_ = *std::move(etcd);

    auto api = Port();
    if (!api.ok()) return api.status();
    auto proxy = Toxiproxy::Start(options_.toxiproxy_binary, *api, out_ + "/toxiproxy.log");
    if (!proxy.ok()) return proxy.status();
    proxy_ = *std::move(proxy);

    for (int i = 0; i < kNodes; ++i) {
      Node& n = nodes_.emplace_back();
      n.index = i;
      n.id = NodeId(i);
      auto port = Port();
      if (!port.ok()) return port.status();
      n.port = *port;
      n.address = absl::StrCat("127.0.0.1:", n.port);
      n.data_dir = absl::StrCat(out_, "/", n.id, "/data");
      n.full_marker = absl::StrCat(out_, "/", n.id, "/disk-full");
      n.journal = absl::StrCat(out_, "/", n.id, "/synced.journal");
      std::error_code ec;
      std::filesystem::create_directories(n.data_dir, ec);
      if (ec) return absl::InternalError(absl::StrCat("mkdir ", n.data_dir, ": ", ec.message()));
    }
    for (Node& n : nodes_) {
      std::vector<std::string> urls, peers;
      for (int k = 0; k < kEtcdMembers; ++k) {
        auto port = Port();
        if (!port.ok()) return port.status();
        const std::string listen = absl::StrCat("127.0.0.1:", *port);
        if (auto s = proxy_->Create(LinkToEtcd(n.index, k), listen, etcd_->client_address(k));
            !s.ok())
          return s;
        urls.push_back("http://" + listen);
      }
      for (const Node& peer : nodes_) {
        if (peer.index == n.index) continue;
        auto port = Port();
        if (!port.ok()) return port.status();
        const std::string listen = absl::StrCat("127.0.0.1:", *port);
        if (auto s = proxy_->Create(LinkToNode(n.index, peer.index), listen, peer.address); !s.ok())
          return s;
        peers.push_back(absl::StrCat(peer.id, "=", listen));
      }
      n.etcd_urls = absl::StrJoin(urls, ",");
      n.peer_addresses = absl::StrJoin(peers, ",");
    }
    for (Node& n : nodes_) {
      if (absl::Status s = StartNode(n); !s.ok()) return s;
    }
    return AwaitWhole("start");
  }

  // Starts node `n` on its port and data dir, with the faults shim preloaded (its wall clock
  // `skew_seconds` off, if not 0), and waits until it serves.
  absl::Status StartNode(Node& n, int skew_seconds = 0) {
    ++n.generation;
    const std::string output = absl::StrCat(out_, "/", n.id, ".", n.generation, ".log");
    std::vector<std::string> argv = {"/usr/bin/env", "LD_PRELOAD=" + options_.faults_library};
    // Only the wall clock: a machine whose NTP is off still has a steady monotonic clock.
    if (skew_seconds != 0)
      argv.push_back(absl::StrCat("JOBBROKER_FAULTS_CLOCK_SKEW=", skew_seconds));
    argv.push_back("JOBBROKER_FAULTS_ROOT=" + n.data_dir);
    argv.push_back("JOBBROKER_FAULTS_FULL=" + n.full_marker);
    argv.push_back("JOBBROKER_FAULTS_JOURNAL=" + n.journal);
    for (const std::string& arg : {options_.broker_binary,
                                   std::string("--listen"),
                                   n.address,
                                   std::string("--http-listen"),
                                   std::string("127.0.0.1:0"),
                                   std::string("--data-dir"),
                                   n.data_dir,
                                   std::string("--config"),
                                   config_path_,
                                   std::string("--cluster-etcd"),
                                   n.etcd_urls,
                                   std::string("--cluster-name"),
                                   std::string("jepsen"),
                                   std::string("--node-id"),
                                   n.id,
                                   std::string("--partitions"),
                                   absl::StrCat(options_.partitions),
                                   std::string("--replication-factor"),
                                   std::string("3"),
                                   std::string("--min-in-sync"),
                                   std::string("2"),
                                   std::string("--cluster-lease-ttl"),
                                   absl::StrCat(options_.lease_ttl),
                                   std::string("--cluster-peer-addresses"),
                                   n.peer_addresses}) {
      argv.push_back(arg);
    }
    auto process = ChildProcess::Start(argv, output);
    if (!process.ok()) return process.status();
    n.process = *std::move(process);
    n.stopped = false;
    const absl::Time deadline = absl::Now() + kNodeStartTimeout;
    while (!absl::StrContains(ReadWholeFile(output), kServingPrefix)) {
      if (!n.process->Running()) {
        return absl::UnavailableError(absl::StrCat(n.id, " generation ", n.generation,
                                                   " exited with code ", n.process->exit_code(),
                                                   " before serving; see ", output));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(n.id, " did not serve within ",
                                                        absl::FormatDuration(kNodeStartTimeout),
                                                        "; see ", output));
      }
      Tend();
      absl::SleepFor(absl::Milliseconds(20));
    }
    log_->Write({"NODE_UP", n.id, absl::StrCat(n.process->pid())});
    return absl::OkStatus();
  }

  void KillNode(Node& n) {
    if (n.process == nullptr) return;
    const pid_t pid = n.process->pid();
    n.process->Kill9();
    n.process.reset();
    log_->Write({"NODE_KILL", n.id, absl::StrCat(pid)});
  }

  // SIGTERM (the node hands its leadership over first) and the exit, which must be 0.
  void StopNode(Node& n, const std::string& why) {
    if (n.process == nullptr) return;
    const int code = n.process->Stop(absl::Seconds(30)).value_or(-1);
    n.process.reset();
    log_->Write({"NODE_STOP", n.id, absl::StrCat(code)});
    if (code != 0) {
      problems_.push_back(absl::StrCat(n.id, " exited with code ", code, " on SIGTERM (", why,
                                       "); see ", out_, "/", n.id, ".", n.generation, ".log"));
    }
  }

  // A node that runs (any node answers every call: it forwards to the leaders).
  std::string LiveAddress() const {
    for (const Node& n : nodes_) {
      if (n.process != nullptr && !n.stopped && n.process->Running()) return n.address;
    }
    return nodes_[0].address;
  }

  // Where clients reach the cluster: every node, starting at a different one for each child.
  std::string Addresses(int first) const {
    std::vector<std::string> list;
    for (int i = 0; i < kNodes; ++i) list.push_back(nodes_[(first + i) % kNodes].address);
    return absl::StrJoin(list, ",");
  }

  // The cluster as a node that answers sees it.
  absl::StatusOr<v1::ClusterInfo> GetCluster() {
    for (const Node& n : nodes_) {
      if (n.process == nullptr || n.stopped) continue;
      auto admin = v1::Admin::NewStub(crash::DialBroker(n.address));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      v1::ClusterInfo info;
      if (admin->GetCluster(&ctx, v1::GetClusterRequest(), &info).ok()) return info;
    }
    return absl::UnavailableError("no node answers GetCluster");
  }

  // Whole: every node alive, every partition led, with all its replicas in sync.
  static bool Whole(const v1::ClusterInfo& info) {
    int alive = 0;
    for (const v1::NodeInfo& n : info.nodes()) alive += n.alive() ? 1 : 0;
    if (alive < kNodes) return false;
    for (const v1::PartitionInfo& p : info.partitions()) {
      if (p.leader_node_id().empty() || p.in_sync_size() < kNodes) return false;
    }
    return info.partitions_size() > 0;
  }

  // Waits (tending workers) until the cluster is whole; a problem after heal_timeout.
  absl::Status AwaitWhole(const std::string& after) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + options_.heal_timeout;
    std::string last = "no answer";
    while (absl::Now() < deadline) {
      ReviveNodes();  // one that dies while the cluster heals is a problem, and started again
      absl::StatusOr<v1::ClusterInfo> info = GetCluster();
      if (info.ok()) {
        if (Whole(*info)) {
          healings_.push_back({after, absl::ToDoubleSeconds(absl::Now() - start)});
          return absl::OkStatus();
        }
        last = info->ShortDebugString();
      }
      Wait(absl::Milliseconds(100));
    }
    problems_.push_back(absl::StrCat("the cluster was not whole ",
                                     absl::FormatDuration(options_.heal_timeout), " after ", after,
                                     ": ", last));
    return after == "start" ? absl::UnavailableError(problems_.back()) : absl::OkStatus();
  }

  absl::Duration Uniform(absl::Duration lo, absl::Duration hi) {
    const double f = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    return lo + (hi - lo) * f;
  }
  template <typename T>
  const T& Pick(const std::vector<T>& from) {
    return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng_)];
  }
  uint64_t ChildSeed() { return rng_(); }

  // Worker chaos and bookkeeping, between the nemesis's steps: continue stopped workers and
  // restart dead ones whose time is up, kill or stop one now and then (unless `calm`).
  void Tend(bool calm = false) {
    const absl::Time now = absl::Now();
    if (fleet_ == nullptr) return;  // nodes starting before the clients
    fleet_->ReapProducers();
    ReapNodes();
    if (absl::Status s = fleet_->TendWorkers(calm); !s.ok()) problems_.push_back(s.ToString());
    if (calm || now < next_worker_event_) return;
    next_worker_event_ = now + Uniform(kWorkerEventMin, kWorkerEventMax);
    if (absl::Status s = fleet_->WorkerEvent(); !s.ok()) problems_.push_back(s.ToString());
  }

  void Wait(absl::Duration d) {
    const absl::Time until = absl::Now() + d;
    while (absl::Now() < until) {
      Tend();
      absl::SleepFor(std::min(kTick, until - absl::Now()));
    }
  }

  // A node that exited by itself (not killed or stopped by a nemesis) is a problem: a crash, or
  // a refusal to go on. Its slot is emptied; ReviveNodes starts it again.
  void ReapNodes() {
    for (Node& n : nodes_) {
      if (n.process == nullptr || n.stopped || n.may_exit || n.process->Running()) continue;
      problems_.push_back(absl::StrCat(n.id, " exited on its own with code ",
                                       n.process->exit_code(), "; see ", out_, "/", n.id, ".",
                                       n.generation, ".log"));
      log_->Write({"NODE_EXIT", n.id, absl::StrCat(n.process->exit_code())});
      n.process.reset();
    }
  }

  // Starts every node whose slot is empty.
  void ReviveNodes() {
    ReapNodes();
    for (Node& n : nodes_) {
      if (n.process == nullptr) (void)Restart(n);
    }
  }

  // --- nemeses -------------------------------------------------------------------------------

  // A partition, and its leader and followers as the cluster reports them now.
  struct Placement {
    uint32_t partition = 0;
    int leader = -1;
    std::vector<int> followers;
  };

  int IndexOf(const std::string& node_id) const {
    for (const Node& n : nodes_) {
      if (n.id == node_id) return n.index;
    }
    return -1;
  }

  Placement PickPartition() {
    Placement out;
    out.partition = std::uniform_int_distribution<uint32_t>(
        0, static_cast<uint32_t>(options_.partitions - 1))(rng_);
    absl::StatusOr<v1::ClusterInfo> info = GetCluster();
    if (info.ok()) {
      for (const v1::PartitionInfo& p : info->partitions()) {
        if (p.partition() != out.partition) continue;
        out.leader = IndexOf(p.leader_node_id());
        for (const std::string& r : p.replicas()) {
          if (int i = IndexOf(r); i >= 0 && i != out.leader) out.followers.push_back(i);
        }
      }
    }
    if (out.leader < 0) out.leader = std::uniform_int_distribution<int>(0, kNodes - 1)(rng_);
    if (out.followers.empty()) {
      for (int i = 0; i < kNodes; ++i) {
        if (i != out.leader) out.followers.push_back(i);
      }
    }
    return out;
  }

  absl::Status Restart(Node& n, int skew_seconds = 0) {
    absl::Status s = StartNode(n, skew_seconds);
    if (!s.ok()) problems_.push_back(absl::StrCat("restarting ", n.id, ": ", s.message()));
    return s;
  }

  absl::Status SetLinks(const std::vector<std::string>& links, bool enabled) {
    for (const std::string& link : links) {
      if (absl::Status s = proxy_->SetEnabled(link, enabled); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Applies one nemesis and heals it; returns once the cluster is whole again (or the heal
  // timeout passed, a problem). FAULT is written before the fault, HEAL after the healing.
  absl::Status Inject(int id, Nemesis nemesis) {
    const absl::Duration ttl = absl::Seconds(options_.lease_ttl);
    const Placement at = PickPartition();
    Node& leader = nodes_[at.leader];
    Node& follower = nodes_[Pick(at.followers)];
    Node& any = nodes_[std::uniform_int_distribution<int>(0, kNodes - 1)(rng_)];
    std::string target;
    switch (nemesis) {
      case Nemesis::kKillLeader:
      case Nemesis::kStopLeader:
      case Nemesis::kCutEtcd:
      case Nemesis::kCutPeers:
        target = absl::StrCat(leader.id, "/p", at.partition);
        break;
      case Nemesis::kKillFollower:
      case Nemesis::kDiskFull:
        target = absl::StrCat(follower.id, "/p", at.partition);
        break;
      case Nemesis::kClockSkew:
      case Nemesis::kPowerLoss:
        target = any.id;
        break;
      case Nemesis::kRollingRestart:
        target = "all";
        break;
      case Nemesis::kKillEtcdLeader: {
        absl::StatusOr<int> member = etcd_->Leader();
        target = absl::StrCat("etcd-", member.ok() ? *member : 0);
        break;
      }
    }
    const std::string kind = NemesisName(nemesis);
    log_->Write({"FAULT", absl::StrCat(id), kind, target});
    std::printf("  nemesis %d: %s %s\n", id, kind.c_str(), target.c_str());
    std::fflush(stdout);
    if (nemesis == Nemesis::kKillLeader) {
      leader_kills_.push_back({absl::Now(), at.partition});
    }
    switch (nemesis) {
      case Nemesis::kKillLeader:
      case Nemesis::kKillFollower: {
        Node& victim = nemesis == Nemesis::kKillLeader ? leader : follower;
        KillNode(victim);
        Wait(Uniform(absl::ZeroDuration(), absl::Seconds(2)));
        (void)Restart(victim);
        break;
      }
      case Nemesis::kStopLeader:
        if (leader.process != nullptr && leader.process->Pause().ok()) {
          leader.stopped = true;
          log_->Write({"NODE_PAUSE", leader.id, absl::StrCat(leader.process->pid())});
          Wait(2 * ttl);
          (void)leader.process->Continue();
          leader.stopped = false;
          log_->Write({"NODE_CONT", leader.id, absl::StrCat(leader.process->pid())});
        }
        break;
      case Nemesis::kCutEtcd: {
        std::vector<std::string> links;
        for (int k = 0; k < kEtcdMembers; ++k) links.push_back(LinkToEtcd(leader.index, k));
        if (absl::Status s = SetLinks(links, false); !s.ok()) return s;
        Wait(2 * ttl + absl::Seconds(1));
        if (absl::Status s = SetLinks(links, true); !s.ok()) return s;
        break;
      }
      case Nemesis::kCutPeers: {
        std::vector<std::string> links;
        for (const Node& other : nodes_) {
          if (other.index == leader.index) continue;
          links.push_back(LinkToNode(leader.index, other.index));
          links.push_back(LinkToNode(other.index, leader.index));
        }
        if (absl::Status s = SetLinks(links, false); !s.ok()) return s;
        Wait(2 * ttl + absl::Seconds(1));
        if (absl::Status s = SetLinks(links, true); !s.ok()) return s;
        break;
      }
      case Nemesis::kKillEtcdLeader: {
        absl::StatusOr<int> member = etcd_->Leader();
        const int k = member.ok() ? *member : 0;
        etcd_->Kill9(k);
        log_->Write({"ETCD_KILL", absl::StrCat("etcd-", k), absl::StrCat(k)});
        Wait(Uniform(absl::Seconds(1), absl::Seconds(3)));
        if (absl::Status s = etcd_->Restart(k); !s.ok()) {
          problems_.push_back(absl::StrCat("restarting etcd-", k, ": ", s.message()));
        }
        break;
      }
      case Nemesis::kClockSkew: {
        int skew = std::uniform_int_distribution<int>(2, 10)(rng_);
        if (std::uniform_int_distribution<int>(0, 1)(rng_) == 0) skew = -skew;
        StopNode(any, "clock skew");
        if (Restart(any, skew).ok()) {
          log_->Write({"NODE_SKEW", any.id, absl::StrCat(skew)});
          Wait(Uniform(absl::Seconds(5), absl::Seconds(10)));
          StopNode(any, "clock skew ends");
          (void)Restart(any);
        }
        break;
      }
      case Nemesis::kRollingRestart:
        for (Node& n : nodes_) {
          StopNode(n, "rolling restart");
          if (!Restart(n).ok()) break;
          if (absl::Status s = AwaitWhole("rolling-restart step"); !s.ok()) return s;
        }
        break;
      case Nemesis::kDiskFull: {
        follower.may_exit = true;
        std::ofstream(follower.full_marker).put('\n');
        Wait(Uniform(absl::Seconds(3), absl::Seconds(6)));
        std::error_code ec;
        std::filesystem::remove(follower.full_marker, ec);
        // A node that stopped on the failed writes comes back once the disk has room; one that
        // is still up must recover by itself (AwaitWhole below).
        if (follower.process != nullptr && !follower.process->Running()) {
          log_->Write({"NODE_EXIT", follower.id, absl::StrCat(follower.process->exit_code())});
          follower.process.reset();
          disk_full_exits_++;
          (void)Restart(follower);
        }
        follower.may_exit = false;
        break;
      }
      case Nemesis::kPowerLoss: {
        KillNode(any);
        auto dropped = testing::RunCommand(
            out_, {options_.power_loss_binary, "--root", any.data_dir, "--journal", any.journal});
        if (!dropped.ok() || dropped->exit_code != 0) {
          return absl::InternalError(absl::StrCat(
              "faults_power_loss on ", any.data_dir, ": ",
              dropped.ok() ? dropped->output : std::string(dropped.status().message())));
        }
        log_->Write({"POWER_LOSS", any.id, "0"});
        power_loss_output_.push_back(dropped->output);
        Wait(Uniform(absl::ZeroDuration(), absl::Seconds(1)));
        (void)Restart(any);
        break;
      }
    }
    // A node that died of the fault without being killed by it is a problem, then restarted.
    ReviveNodes();
    if (absl::Status s = AwaitWhole(kind); !s.ok()) return s;
    log_->Write({"HEAL", absl::StrCat(id)});
    ++nemeses_by_kind_[kind];
    return absl::OkStatus();
  }

  absl::Status NemesisPhase() {
    next_worker_event_ = absl::Now() + Uniform(kWorkerEventMin, kWorkerEventMax);
    absl::StatusOr<std::vector<Nemesis>> kinds = ParseNemeses(options_.kinds);
    if (!kinds.ok()) return kinds.status();
    const std::vector<Nemesis> schedule = NemesisSchedule(ChildSeed(), options_.nemeses, *kinds);
    for (size_t i = 0; i < schedule.size(); ++i) {
      Wait(Uniform(absl::Milliseconds(500), absl::Seconds(2)));
      if (absl::Status s = Inject(static_cast<int>(i + 1), schedule[i]); !s.ok()) return s;
    }
    Tend(/*calm=*/true);
    return absl::OkStatus();
  }

  absl::Status Settle() {
    // The producers' spread is a guess at the nemesis phase's length; when the faults took
    // longer (a long run on a busy machine), they still have jobs to send on their schedule.
    const absl::Time deadline = std::max(absl::Now(), producers_done_by_) + options_.settle_timeout;
    while (!fleet_->ReapProducers()) {
      Tend(true);
      ReviveNodes();
      if (absl::Now() > deadline) {
        problems_.push_back("producers still running after the settle timeout");
        fleet_->KillProducers();
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    // Its tend never fails: a node or worker that does not come back is a problem, not an end.
    fleet_
        ->AwaitSettled(
            deadline, ReadLogs(/*with_nodes=*/false).enqueues.size(),
            [this] {
              Tend(true);
              ReviveNodes();
              return absl::OkStatus();
            },
            [this] { return LiveAddress(); })
        .IgnoreError();
    fleet_->StopWorkers();
    return absl::OkStatus();
  }

  std::vector<std::string> Files(absl::string_view prefix, absl::string_view suffix) const {
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(out_)) {
      const std::string name = entry.path().filename().string();
      if (absl::StartsWith(name, prefix) && absl::EndsWith(name, suffix)) {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    return files;
  }

  // The clients' and the driver's logs; once the nodes have stopped (with_nodes), also the
  // nodes' own logs and their replication-log dumps, the evidence of who wrote each epoch.
  CrashLogs ReadLogs(bool with_nodes) const {
    CrashLogs logs;
    for (const std::string& name : fleet_->producer_names()) {
      ParseProducerLog(name, ReadWholeFile(absl::StrCat(out_, "/producer-", name, ".log")), logs);
    }
    for (const std::string& f : Files("worker-", ".log")) ParseWorkerLog(ReadWholeFile(f), logs);
    ParseDriverLog(ReadWholeFile(absl::StrCat(out_, "/driver.log")), logs);
    if (!with_nodes) return logs;
    for (const Node& n : nodes_) {
      for (const std::string& f : Files(n.id + ".", ".log"))
        ParseNodeLog(n.id, ReadWholeFile(f), logs);
      ParseReplicaLogDump(n.id, ReadWholeFile(absl::StrCat(out_, "/", n.id, ".dump")), logs);
    }
    return logs;
  }

  // Leader kill -> the first acknowledged enqueue on a queue of that partition, from the
  // producers' logs (they enqueue on every partition all through the nemesis phase).
  std::vector<double> FailoverSeconds(const CrashLogs& logs) const {
    std::vector<double> out;
    for (const auto& [killed, partition] : leader_kills_) {
      const int64_t from = absl::ToUnixMicros(killed);
      int64_t first = -1;
      for (const crash::EnqueueRecord& e : logs.enqueues) {
        auto p = partition_of_queue_.find(e.queue);
        if (p == partition_of_queue_.end() || p->second != partition || e.ts <= from) continue;
        if (first < 0 || e.ts < first) first = e.ts;
      }
      if (first >= 0) out.push_back(static_cast<double>(first - from) / 1e6);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  int Finish(absl::Time start, absl::Time nemesis_end, absl::Time settled) {
    CrashLogs logs = ReadLogs(/*with_nodes=*/false);
    std::set<std::string> ids;
    for (const crash::EnqueueRecord& e : logs.enqueues) ids.insert(e.job_id);
    ReviveNodes();
    absl::StatusOr<crash::FinalState> final_state = crash::FetchFinalState(LiveAddress(), ids);
    if (!final_state.ok()) return Abort(final_state.status());
    for (const std::string& gap : final_state->list_gaps) {
      problems_.push_back(absl::StrCat("admin views disagree: ", gap));
    }
    for (Node& n : nodes_) StopNode(n, "end of run");
    etcd_->Stop();
    for (const Node& n : nodes_) {
      auto dump = testing::RunCommand(out_, {options_.log_dump_binary, "--data-dir", n.data_dir},
                                      "", absl::Seconds(120));
      if (!dump.ok() || dump->exit_code != 0) {
        problems_.push_back(
            absl::StrCat("replica_log_dump of ", n.id, ": ",
                         dump.ok() ? dump->output : std::string(dump.status().message())));
        continue;
      }
      std::ofstream(absl::StrCat(out_, "/", n.id, ".dump")) << dump->output;
    }
    logs = ReadLogs(/*with_nodes=*/true);
    const crash::Report report = Check(logs, final_state->jobs);

    const std::vector<double> failover = FailoverSeconds(logs);
    std::vector<double> heal;
    for (const Healing& h : healings_) heal.push_back(h.seconds);
    std::sort(heal.begin(), heal.end());
    auto quantile = [](const std::vector<double>& v, double q) {
      return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
    };
    std::vector<std::string> kinds;
    int total = 0;
    for (const auto& [kind, n] : nemeses_by_kind_) {
      kinds.push_back(absl::StrCat(kind, " ", n));
      total += n;
    }
    std::printf("\ncluster harness summary (seed %llu)\n",
                static_cast<unsigned long long>(options_.seed));
    std::printf(
        "%s", report
                  .SummaryTable(
                      {{"nemesis events healed", absl::StrCat(total)},
                       {"nemeses by kind", absl::StrJoin(kinds, ", ")},
                       {"leader kill -> first ack on its partition (p50 / max, s)",
                        absl::StrFormat("%.2f / %.2f over %d kills", quantile(failover, 0.5),
                                        failover.empty() ? 0.0 : failover.back(),
                                        static_cast<int>(failover.size()))},
                       {"fault healed -> cluster whole (p50 / max, s)",
                        absl::StrFormat("%.2f / %.2f", quantile(heal, 0.5),
                                        heal.empty() ? 0.0 : heal.back())},
                       {"disk-full nemeses the follower exited on", absl::StrCat(disk_full_exits_)},
                       {"wall time: nemeses / settle / total",
                        absl::StrFormat("%.1fs / %.1fs / %.1fs",
                                        absl::ToDoubleSeconds(nemesis_end - start),
                                        absl::ToDoubleSeconds(settled - nemesis_end),
                                        absl::ToDoubleSeconds(absl::Now() - start))}})
                  .c_str());
    return crash::Verdict(report, problems_, options_.seed, out_, options_.keep);
  }

  int Abort(const absl::Status& s) {
    std::fprintf(stderr, "cluster harness could not run (seed %llu): %s\nlogs kept in %s\n",
                 static_cast<unsigned long long>(options_.seed), std::string(s.message()).c_str(),
                 out_.c_str());
    if (!problems_.empty())
      std::fprintf(stderr, "problems so far:\n%s\n", absl::StrJoin(problems_, "\n").c_str());
    return 2;
  }

  const ClusterDriverOptions& options_;
  std::mt19937_64 rng_;
  std::string out_;
  std::string config_path_;
  std::vector<std::string> queue_of_partition_;
  std::map<std::string, uint32_t> partition_of_queue_;
  std::string queues_;
  std::set<int> ports_;
  std::unique_ptr<LineLog> log_;
  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<Toxiproxy> proxy_;
  std::vector<Node> nodes_;
  absl::Time next_worker_event_ = absl::InfiniteFuture();
  absl::Time producers_done_by_ = absl::InfinitePast();  // when their spread ends
  std::vector<std::pair<absl::Time, uint32_t>> leader_kills_;
  std::vector<Healing> healings_;
  std::map<std::string, int> nemeses_by_kind_;
  std::vector<std::string> power_loss_output_;
  int disk_full_exits_ = 0;
  std::vector<std::string> problems_;
  std::unique_ptr<crash::Fleet> fleet_;  // after what it borrows
};

}  // namespace

int RunClusterDriver(const ClusterDriverOptions& options) { return ClusterDriver(options).Run(); }

}  // namespace jobbroker::jepsen
