// Runs the cluster simulation over a range of seeds, or one seed with its trace.
//   cluster_sim --seeds 0-9999              every seed; stops at the first violation
//   cluster_sim --seed 1234 --trace         replays one seed, printing what happened
//   cluster_sim --seed 1234 --messages      the same, with every message delivered
//   cluster_sim --seeds 0-999 --bug apply-on-receipt   a planted bug (expect a violation)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/cluster/sim/cluster_sim.h"

namespace {

bool ParseBug(const std::string& name, jobbroker::cluster::PlantedBug* bug) {
  using jobbroker::cluster::PlantedBug;
  for (PlantedBug candidate :
       {PlantedBug::kNone, PlantedBug::kAckBeforeCommit, PlantedBug::kIgnoreElectionOutcome,
        PlantedBug::kNoEpochFence, PlantedBug::kApplyOnReceipt, PlantedBug::kShrinkWithoutEtcd}) {
    if (name == jobbroker::testing::PlantedBugName(candidate)) {
      *bug = candidate;
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t first = 0, last = 99;
  jobbroker::testing::SimOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value = i + 1 < argc ? argv[i + 1] : "";
    if (arg == "--seeds") {
      auto dash = value.find('-');
      first = std::strtoull(value.substr(0, dash).c_str(), nullptr, 10);
      last = dash == std::string::npos ? first
                                       : std::strtoull(value.substr(dash + 1).c_str(), nullptr, 10);
      ++i;
    } else if (arg == "--seed") {
      first = last = std::strtoull(value.c_str(), nullptr, 10);
      ++i;
    } else if (arg == "--trace") {
      options.trace = true;
    } else if (arg == "--messages") {
      options.trace = options.trace_messages = true;
    } else if (arg == "--nodes") {
      options.nodes = std::atoi(value.c_str());
      ++i;
    } else if (arg == "--partitions") {
      options.partitions = std::atoi(value.c_str());
      ++i;
    } else if (arg == "--replicas") {
      options.replication_factor = std::atoi(value.c_str());
      ++i;
    } else if (arg == "--min-in-sync") {
      options.min_in_sync = std::atoi(value.c_str());
      ++i;
    } else if (arg == "--bug" && ParseBug(value, &options.bug)) {
      ++i;
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--seeds A-B | --seed N] [--trace | --messages] [--nodes N] [--partitions P] "
          "[--replicas R] [--min-in-sync M] [--bug NAME]\n",
          argv[0]);
      return 2;
    }
  }
  auto started = std::chrono::steady_clock::now();
  uint64_t steps = 0, acked = 0, elections = 0, faults = 0, snapshots = 0, seeds = 0;
  for (uint64_t seed = first; seed <= last; ++seed) {
    options.seed = seed;
    auto report = jobbroker::testing::RunSimulation(options);
    ++seeds;
    steps += report.steps;
    acked += report.acked;
    elections += report.elections;
    faults += report.faults;
    snapshots += report.snapshots;
    if (options.trace) std::fputs(report.trace.c_str(), stdout);
    if (!report.violation.empty()) {
      std::printf("seed %llu: %s\nreplay: %s --seed %llu --trace%s%s\n",
                  static_cast<unsigned long long>(seed), report.violation.c_str(), argv[0],
                  static_cast<unsigned long long>(seed),
                  options.bug == jobbroker::cluster::PlantedBug::kNone ? "" : " --bug ",
                  options.bug == jobbroker::cluster::PlantedBug::kNone
                      ? ""
                      : jobbroker::testing::PlantedBugName(options.bug));
      return 1;
    }
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "seeds %llu-%llu: %llu passed in %.1f s (%.2f ms a seed); %llu steps, %llu faults, %llu "
      "elections, %llu snapshots, %llu acknowledged batches; every invariant held\n",
      static_cast<unsigned long long>(first), static_cast<unsigned long long>(last),
      static_cast<unsigned long long>(seeds), seconds, 1000 * seconds / static_cast<double>(seeds),
      static_cast<unsigned long long>(steps), static_cast<unsigned long long>(faults),
      static_cast<unsigned long long>(elections), static_cast<unsigned long long>(snapshots),
      static_cast<unsigned long long>(acked));
  return 0;
}
