#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace jobbroker::jepsen {

// The faults of ../shared/CLUSTER.md "What done means", one per kind.
enum class Nemesis {
  kKillLeader,      // SIGKILL a partition's leader, restart it after 0-2 s
  kKillFollower,    // SIGKILL a follower of a partition, restart it after 0-2 s
  kStopLeader,      // SIGSTOP a leader for 2 x the lease TTL, then SIGCONT
  kCutEtcd,         // a leader's links to every etcd member go dead, for 2 x TTL + 1 s
  kCutPeers,        // a leader's links to and from the other nodes go dead, for 2 x TTL + 1 s
  kKillEtcdLeader,  // SIGKILL the etcd member that leads etcd, restart it after 1-3 s
  kClockSkew,       // a node restarted with its wall clock 2-10 s off, for 5-10 s, then back
  kRollingRestart,  // SIGTERM every node in turn (leadership handed over), each restarted
  kDiskFull,        // a follower's disk refuses every write for 3-6 s
  kPowerLoss,       // SIGKILL a node and drop what it had not synced, then restart it
};

inline constexpr int kNemesisKinds = 10;

// "kill-leader", "kill-follower", ...: the word the driver log's FAULT lines carry.
const char* NemesisName(Nemesis nemesis);

// Every kind, in enum order.
std::vector<Nemesis> AllNemeses();

// The kinds named in `list` ("cut-peers,kill-leader"; "all" or empty: every kind), or an
// InvalidArgument error naming the word that is no kind.
absl::StatusOr<std::vector<Nemesis>> ParseNemeses(absl::string_view list);

// The order of `count` nemeses for `seed` drawn from `kinds`: each kind once, shuffled, in every
// run of kinds.size() (so a short CI run meets every kind, and a long one meets each as often).
// Deterministic: the same seed and kinds, the same schedule.
std::vector<Nemesis> NemesisSchedule(uint64_t seed, int count,
                                     const std::vector<Nemesis>& kinds = AllNemeses());

}  // namespace jobbroker::jepsen
