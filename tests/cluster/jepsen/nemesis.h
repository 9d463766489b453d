#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// The order of `count` nemeses for `seed`: every kind once, shuffled, in each run of
// kNemesisKinds (so a short CI run meets every kind, and a long one meets each as often).
// Deterministic: the same seed, the same schedule.
std::vector<Nemesis> NemesisSchedule(uint64_t seed, int count);

}  // namespace jobbroker::jepsen
