// The queue a streaming reactor writes from: one write at a time, each message written once and
// in order; once the client is gone, what was not written is handed back as unsent.
#include "server/grpc/outbox.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

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

TEST(OutboxTest, AFailedWriteMakesItsMessageAndWhatWaitsUnsentAndTakesNothingMore) {
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
  EXPECT_THAT(outbox.TakeUnsent(), ElementsAre("a", "b", "late"));
  EXPECT_THAT(outbox.TakeUnsent(), IsEmpty()) << "taken once";
}

TEST(OutboxTest, ClosingKeepsTheWriteInFlightAndMakesTheRestUnsent) {
  Outbox<std::string> outbox;
  outbox.Push("a");
  outbox.Push("b");
  outbox.Push("c");
  const std::string* writing = outbox.NextToWrite();
  ASSERT_NE(writing, nullptr);
  outbox.Close();
  EXPECT_EQ(*writing, "a") << "the message being written stays in place";
  EXPECT_THAT(outbox.TakeUnsent(), ElementsAre("b", "c"));
  EXPECT_TRUE(outbox.WriteDone(true));
  outbox.Push("late");
  EXPECT_EQ(outbox.NextToWrite(), nullptr);
  EXPECT_THAT(outbox.TakeUnsent(), ElementsAre("late"));
}

TEST(OutboxTest, AWriteInFlightThatFailsAfterCloseIsUnsentToo) {
  Outbox<std::string> outbox;
  outbox.Push("a");
  outbox.Push("b");
  ASSERT_NE(outbox.NextToWrite(), nullptr);
  outbox.Close();
  EXPECT_FALSE(outbox.WriteDone(false));
  EXPECT_THAT(outbox.TakeUnsent(), UnorderedElementsAre("a", "b"));
}

}  // namespace
}  // namespace jobbroker::server
