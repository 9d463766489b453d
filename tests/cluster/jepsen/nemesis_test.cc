// The nemesis schedule (nemesis.h): a short run meets every fault, and a seed replays it.
#include "tests/cluster/jepsen/nemesis.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::jepsen {
namespace {

TEST(NemesisScheduleTest, EveryRunOfTenHoldsEveryKindOnce) {
  const std::vector<Nemesis> schedule = NemesisSchedule(42, 35);
  ASSERT_EQ(schedule.size(), 35u);
  for (size_t first = 0; first + kNemesisKinds <= schedule.size(); first += kNemesisKinds) {
    std::set<Nemesis> kinds(schedule.begin() + first, schedule.begin() + first + kNemesisKinds);
    EXPECT_EQ(kinds.size(), static_cast<size_t>(kNemesisKinds)) << "run from " << first;
  }
}

TEST(NemesisScheduleTest, TheSameSeedGivesTheSameScheduleAndAnotherSeedAnother) {
  EXPECT_EQ(NemesisSchedule(7, 20), NemesisSchedule(7, 20));
  EXPECT_NE(NemesisSchedule(7, 20), NemesisSchedule(8, 20));
}

TEST(NemesisScheduleTest, ChosenKindsAloneEachOnceInEveryRoundOfThem) {
  absl::StatusOr<std::vector<Nemesis>> kinds = ParseNemeses("cut-peers,kill-leader");
  ASSERT_TRUE(kinds.ok()) << kinds.status();
  const std::vector<Nemesis> schedule = NemesisSchedule(3, 6, *kinds);
  ASSERT_EQ(schedule.size(), 6u);
  for (size_t first = 0; first < schedule.size(); first += 2) {
    EXPECT_THAT(std::vector<Nemesis>(schedule.begin() + first, schedule.begin() + first + 2),
                ::testing::UnorderedElementsAre(Nemesis::kCutPeers, Nemesis::kKillLeader));
  }
}

TEST(NemesisScheduleTest, AWordThatIsNoKindIsRefusedByName) {
  absl::StatusOr<std::vector<Nemesis>> kinds = ParseNemeses("cut-peers,unplug");
  ASSERT_FALSE(kinds.ok());
  EXPECT_EQ(kinds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(kinds.status().message()), ::testing::HasSubstr("\"unplug\""));
  EXPECT_EQ(ParseNemeses("all")->size(), static_cast<size_t>(kNemesisKinds));
  EXPECT_EQ(ParseNemeses("")->size(), static_cast<size_t>(kNemesisKinds));
}

TEST(NemesisScheduleTest, EveryKindHasItsOwnName) {
  std::set<std::string> names;
  for (int k = 0; k < kNemesisKinds; ++k) names.insert(NemesisName(static_cast<Nemesis>(k)));
  EXPECT_EQ(names.size(), static_cast<size_t>(kNemesisKinds));
  EXPECT_EQ(names.count("?"), 0u);
}

}  // namespace
}  // namespace jobbroker::jepsen
