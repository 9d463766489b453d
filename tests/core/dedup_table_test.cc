// DedupTable: which job holds a key, and freeing keys whose TTL has passed once their job ended.
#include "core/dedup_table.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

const absl::Time kT = absl::FromUnixSeconds(1000);

DedupEntry Entry(std::string key, std::string job, absl::Time expires) {
  return DedupEntry{"q", std::move(key), std::move(job), expires, 42};
}

TEST(DedupTableTest, APutReplacesTheHolderAndItsExpiry) {
  DedupTable t;
  t.Put(Entry("k", "job-1", kT));
  t.Put(Entry("k", "job-2", kT + absl::Hours(1)));
  ASSERT_NE(t.Find("q", "k"), nullptr);
  EXPECT_EQ(t.Find("q", "k")->job_id, "job-2");
  int budget = 10;
  EXPECT_TRUE(
      t.Expire(kT + absl::Minutes(1), budget, [](const std::string&) { return false; }).empty())
      << "the first put's expiry went with it";
  EXPECT_EQ(t.NextExpiry(), kT + absl::Hours(1));
}

TEST(DedupTableTest, AnExpiredKeyIsFreedOnceItsJobHasEnded) {
  DedupTable t;
  t.Put(Entry("k", "job-1", kT));
  bool running = true;
  int budget = 10;
  EXPECT_TRUE(t.Expire(kT, budget, [&](const std::string&) { return running; }).empty());
  EXPECT_TRUE(t.Contains("q", "k")) << "held while its job runs";
  EXPECT_EQ(t.NextExpiry(), kT + absl::Minutes(1)) << "looked at again a minute later";
  running = false;
  std::vector<DedupTable::Key> freed =
      t.Expire(kT + absl::Minutes(1), budget, [&](const std::string&) { return running; });
  EXPECT_THAT(freed, ::testing::ElementsAre(DedupTable::Key("q", "k")));
  EXPECT_FALSE(t.Contains("q", "k"));
}

TEST(DedupTableTest, ExpireStopsWhenItsBudgetIsSpent) {
  DedupTable t;
  for (int i = 0; i < 5; ++i) t.Put(Entry(std::to_string(i), "j", kT));
  int budget = 2;
  EXPECT_EQ(t.Expire(kT, budget, [](const std::string&) { return false; }).size(), 2u);
  EXPECT_EQ(budget, 0);
  EXPECT_EQ(t.size(), 3u);
}

}  // namespace
}  // namespace jobbroker::core
