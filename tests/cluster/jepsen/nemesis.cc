#include "tests/cluster/jepsen/nemesis.h"

#include <algorithm>
#include <random>

namespace jobbroker::jepsen {

const char* NemesisName(Nemesis nemesis) {
  switch (nemesis) {
    case Nemesis::kKillLeader:
      return "kill-leader";
    case Nemesis::kKillFollower:
      return "kill-follower";
    case Nemesis::kStopLeader:
      return "stop-leader";
    case Nemesis::kCutEtcd:
      return "cut-etcd";
    case Nemesis::kCutPeers:
      return "cut-peers";
    case Nemesis::kKillEtcdLeader:
      return "kill-etcd-leader";
    case Nemesis::kClockSkew:
      return "clock-skew";
    case Nemesis::kRollingRestart:
      return "rolling-restart";
    case Nemesis::kDiskFull:
      return "disk-full";
    case Nemesis::kPowerLoss:
      return "power-loss";
  }
  return "?";
}

std::vector<Nemesis> NemesisSchedule(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::vector<Nemesis> schedule;
  std::vector<Nemesis> round;
  for (int k = 0; k < kNemesisKinds; ++k) round.push_back(static_cast<Nemesis>(k));
  while (static_cast<int>(schedule.size()) < count) {
    std::shuffle(round.begin(), round.end(), rng);
    for (Nemesis n : round) {
      if (static_cast<int>(schedule.size()) == count) break;
      schedule.push_back(n);
    }
  }
  return schedule;
}

}  // namespace jobbroker::jepsen
