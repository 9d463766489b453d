#include "core/stream_credit.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

TEST(StreamCreditTest, MembersTakeUpToTheBudgetBetweenThem) {
  StreamCredit credit(2, 3);
  EXPECT_TRUE(credit.TryTake(0));
  EXPECT_TRUE(credit.TryTake(2));
  EXPECT_FALSE(credit.TryTake(1));
  EXPECT_EQ(credit.used(), 2);
}

TEST(StreamCreditTest, AGiveRefillsTheMembersThatStarvedAndOnlyThem) {
  StreamCredit credit(1, 3);
  std::vector<int> refilled;
  for (int m = 0; m < 3; ++m) credit.SetRefill(m, [&refilled, m] { refilled.push_back(m); });
  ASSERT_TRUE(credit.TryTake(0));
  EXPECT_FALSE(credit.TryTake(2));  // starved
  EXPECT_TRUE(credit.Give()) << "someone starved: the caller must refill";
  credit.Refill();
  EXPECT_EQ(refilled, std::vector<int>{2});
  credit.Refill();
  EXPECT_EQ(refilled, std::vector<int>{2}) << "a refill clears the mark";
  ASSERT_TRUE(credit.TryTake(2));
  EXPECT_FALSE(credit.Give()) << "nobody starved";
}

TEST(StreamCreditTest, ASmallerBudgetHoldsBackNewTakesUntilTheStreamIsUnderIt) {
  StreamCredit credit(3, 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(credit.TryTake(0));
  credit.SetMax(1);
  credit.Give();
  EXPECT_FALSE(credit.TryTake(0)) << "2 held, budget 1";
  credit.Give();
  credit.Give();
  EXPECT_TRUE(credit.TryTake(0));
  credit.SetMax(0);  // drained
  credit.Give();
  EXPECT_FALSE(credit.TryTake(0));
}

// Threads as brokers: however they interleave, the budget is never exceeded.
TEST(StreamCreditTest, RacingMembersNeverExceedTheBudget) {
  constexpr int kMembers = 4;
  constexpr int kRounds = 20000;
  StreamCredit credit(2, kMembers);
  std::atomic<int> held{0};
  std::atomic<int> most{0};
  // Whether members starve depends on how the threads overlap: refills only have to be safe.
  for (int m = 0; m < kMembers; ++m) credit.SetRefill(m, [] {});
  std::vector<std::thread> threads;
  for (int m = 0; m < kMembers; ++m) {
    threads.emplace_back([&, m] {
      for (int i = 0; i < kRounds; ++i) {
        if (!credit.TryTake(m)) continue;
        const int now = ++held;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        --held;
        if (credit.Give()) credit.Refill();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), 2);
  EXPECT_EQ(credit.used(), 0);
  EXPECT_TRUE(credit.TryTake(3));
}

}  // namespace
}  // namespace jobbroker::core
