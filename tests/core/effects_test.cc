// Effects: the durability a change is committed at (the rules are in core/effects.h).
#include "core/effects.h"

#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

QueuePolicy With(Durability d, absl::Duration group_delay = absl::Milliseconds(10)) {
  QueuePolicy p;
  p.durability = d;
  p.group_commit_delay = group_delay;
  return p;
}

TEST(EffectsTest, AChangeThatAsksForNothingIsSync) {
  EXPECT_EQ(Effects{}.level(), Durability::kSync);
}

TEST(EffectsTest, TheStrictestQueueTouchedWins) {
  Effects fx;
  fx.Touch(With(Durability::kNone));
  EXPECT_EQ(fx.level(), Durability::kNone);
  fx.Touch(With(Durability::kGroup));
  EXPECT_EQ(fx.level(), Durability::kGroup);
  fx.Touch(With(Durability::kNone));
  EXPECT_EQ(fx.level(), Durability::kGroup);
}

TEST(EffectsTest, AnOperatorsChangeIsSyncWhateverTheQueue) {
  Effects fx;
  fx.Touch(With(Durability::kNone));
  fx.Require(Durability::kSync);
  EXPECT_EQ(fx.level(), Durability::kSync);
}

TEST(EffectsTest, TheShortestGroupDelayOfTheGroupQueuesTouchedApplies) {
  Effects fx;
  fx.Touch(With(Durability::kGroup, absl::Milliseconds(20)));
  fx.Touch(With(Durability::kGroup, absl::Milliseconds(5)));
  fx.Touch(With(Durability::kSync, absl::Milliseconds(1)));
  EXPECT_EQ(fx.group_delay, absl::Milliseconds(5));
}

}  // namespace
}  // namespace jobbroker::core
