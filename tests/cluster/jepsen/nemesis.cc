#include "tests/cluster/jepsen/nemesis.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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

std::vector<Nemesis> AllNemeses() {
  std::vector<Nemesis> all;
  for (int k = 0; k < kNemesisKinds; ++k) all.push_back(static_cast<Nemesis>(k));
  return all;
}

absl::StatusOr<std::vector<Nemesis>> ParseNemeses(absl::string_view list) {
  if (list.empty() || list == "all") return AllNemeses();
  std::vector<Nemesis> kinds;
  for (absl::string_view word : absl::StrSplit(list, ',')) {
    bool found = false;
    for (Nemesis n : AllNemeses()) {
      if (word != NemesisName(n)) continue;
      if (std::find(kinds.begin(), kinds.end(), n) == kinds.end()) kinds.push_back(n);
      found = true;
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kinds: \"", word, "\" is no nemesis (kill-leader, kill-follower, ",
                       "stop-leader, cut-etcd, cut-peers, kill-etcd-leader, clock-skew, ",
                       "rolling-restart, disk-full, power-loss)"));
    }
  }
  return kinds;
}

std::vector<Nemesis> NemesisSchedule(uint64_t seed, int count, const std::vector<Nemesis>& kinds) {
  std::mt19937_64 rng(seed);
  std::vector<Nemesis> schedule;
  std::vector<Nemesis> round = kinds;
  if (round.empty()) return schedule;
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
