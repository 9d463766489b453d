// The queue a streaming reactor writes from: one write at a time, each message written once and
// in order, nothing kept once the client is gone.
#include "server/grpc/outbox.h"

#include <string>

#include "gtest/gtest.h"

namespace jobbroker::server {
namespace {

TEST(OutboxTest, WritesOneMessageAtATimeInOrder) {
  Outbox<std::string> outbox;
  EXPECT_EQ(outbox.NextToWrite(), nullptr);
  EXPECT_TRUE(outbox.drained());
  outbox.Push("a");
  outbox.Push("b");
  const std::string* first = outbox.NextToWrite();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(*first, "a");
  outbox.Push("c");  // from another thread while "a" is written: it must not move "a"
  EXPECT_EQ(*first, "a");
  EXPECT_EQ(outbox.NextToWrite(), nullptr) << "a second write while one is in flight";
  EXPECT_TRUE(outbox.writing());
  EXPECT_FALSE(outbox.drained());
  EXPECT_TRUE(outbox.WriteDone(true));
  const std::string* second = outbox.NextToWrite();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(*second, "b");
  EXPECT_TRUE(outbox.WriteDone(true));
  EXPECT_EQ(*outbox.NextToWrite(), "c");
  EXPECT_TRUE(outbox.WriteDone(true));
  EXPECT_TRUE(outbox.drained());
  EXPECT_EQ(outbox.NextToWrite(), nullptr);
}

TEST(OutboxTest, AFailedWriteDropsWhatWaitsAndTakesNothingMore) {
  Outbox<std::string> outbox;
  outbox.Push("a");
  outbox.Push("b");
  ASSERT_NE(outbox.NextToWrite(), nullptr);
  EXPECT_FALSE(outbox.WriteDone(false));
  EXPECT_EQ(outbox.size(), 0u);
  outbox.Push("late");
  EXPECT_EQ(outbox.size(), 0u);
  EXPECT_EQ(outbox.NextToWrite(), nullptr);
  EXPECT_TRUE(outbox.drained());
}

}  // namespace
}  // namespace jobbroker::server
