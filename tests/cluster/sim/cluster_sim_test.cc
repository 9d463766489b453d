#include "tests/cluster/sim/cluster_sim.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::testing {
namespace {

using cluster::PlantedBug;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ClusterSimTest, ASeedReplaysTheSameRun) {
  SimOptions options;
  options.seed = 7;
  SimReport first = RunSimulation(options);
  SimReport second = RunSimulation(options);
  EXPECT_EQ(first.fingerprint, second.fingerprint);
  EXPECT_EQ(first.steps, second.steps);
  EXPECT_EQ(first.acked, second.acked);
  options.seed = 8;
  EXPECT_NE(RunSimulation(options).fingerprint, first.fingerprint);
}

TEST(ClusterSimTest, TheProtocolHoldsEveryInvariantAndDoesWork) {
  uint64_t acked = 0, elections = 0, snapshots = 0, faults = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SimOptions options;
    options.seed = seed;
    options.nodes = seed % 2 == 0 ? 3 : 5;
    SimReport report = RunSimulation(options);
    ASSERT_EQ(report.violation, "") << "seed " << seed << " nodes " << options.nodes;
    acked += report.acked;
    elections += report.elections;
    snapshots += report.snapshots;
    faults += report.faults;
  }
  // The runs are not vacuous: they acknowledge writes, fail over, and catch replicas up from
  // snapshots.
  EXPECT_GT(acked, 10'000u);
  EXPECT_GT(elections, 80u);  // more than the first election of each partition
  EXPECT_GT(snapshots, 0u);
  EXPECT_GT(faults, 200u);
}

TEST(ClusterSimTest, TheTraceNamesWhatHappened) {
  SimOptions options;
  options.seed = 3;
  options.trace = true;
  SimReport report = RunSimulation(options);
  EXPECT_THAT(report.trace, HasSubstr(" leads p0 in epoch "));
  EXPECT_THAT(report.trace, HasSubstr("ack op-"));
  EXPECT_THAT(report.trace, HasSubstr("healed"));
}

struct PlantedCase {
  PlantedBug bug;
  const char* invariant;
};

class PlantedBugTest : public ::testing::TestWithParam<PlantedCase> {};

// Each invariant catches the mistake it is about: with the bug planted, some seed among the
// first 300 breaks exactly that invariant first.
TEST_P(PlantedBugTest, IsCaughtByItsInvariant) {
  const PlantedCase& planted = GetParam();
  std::string violation;
  uint64_t seed = 1;
  for (; seed <= 300 && violation.empty(); ++seed) {
    SimOptions options;
    options.seed = seed;
    options.bug = planted.bug;
    violation = RunSimulation(options).violation;
  }
  ASSERT_NE(violation, "") << PlantedBugName(planted.bug) << " went unnoticed over 300 seeds";
  EXPECT_THAT(violation, StartsWith(std::string(planted.invariant) + ":")) << "seed " << seed - 1;
}

INSTANTIATE_TEST_SUITE_P(
    EachInvariant, PlantedBugTest,
    ::testing::Values(PlantedCase{PlantedBug::kAckBeforeCommit, "durability"},
                      PlantedCase{PlantedBug::kShrinkWithoutEtcd, "durability"},
                      PlantedCase{PlantedBug::kIgnoreElectionOutcome, "one-writer"},
                      PlantedCase{PlantedBug::kNoEpochFence, "epochs-increase"},
                      PlantedCase{PlantedBug::kApplyOnReceipt, "apply-committed"}),
    [](const ::testing::TestParamInfo<PlantedCase>& info) {
      std::string name = PlantedBugName(info.param.bug);
      std::string out;
      bool upper = true;
      for (char c : name) {
        if (c == '-') {
          upper = true;
        } else {
          out += upper ? static_cast<char>(c - 'a' + 'A') : c;
          upper = false;
        }
      }
      return out;
    });

}  // namespace
}  // namespace jobbroker::testing
