// Consumers: handles, and which stream holds which ACTIVE job.
#include "core/consumers.h"

#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

class NullSink final : public StreamSink {
 public:
  void PushJob(LeasedJob) override {}
  void LeaseLost(std::string, core::AttemptOutcome) override {}
  void CancelRequested(std::string) override {}
  void End(absl::Status) override {}
};

TEST(ConsumersTest, HandlesAreNeverReused) {
  Consumers c;
  const uint64_t first = c.Add(/*stream=*/false).id;
  c.Erase(first);
  EXPECT_NE(c.Add(/*stream=*/true).id, first);
  EXPECT_EQ(c.Find(first), nullptr);
}

TEST(ConsumersTest, AHoldEndsOnceAndOutlivesNoStream) {
  Consumers c;
  Consumer& stream = c.Add(/*stream=*/true);
  const uint64_t id = stream.id;
  c.Hold(/*job_seq=*/10, id);
  c.Hold(/*job_seq=*/11, id);
  EXPECT_EQ(c.HolderOf(10), &stream);
  EXPECT_EQ(c.EndHold(10), &stream);
  EXPECT_EQ(c.EndHold(10), nullptr) << "ended once";
  c.Erase(id);
  EXPECT_EQ(c.EndHold(11), nullptr) << "the stream ended first";
}

TEST(ConsumersTest, DetachAllHandsOutEveryCallbackAndSink) {
  Consumers c;
  int answered = 0;
  c.Add(/*stream=*/false).done = [&](absl::StatusOr<std::vector<LeasedJob>>) { ++answered; };
  c.Add(/*stream=*/true).sink = std::make_shared<NullSink>();
  std::vector<LeaseDone> waiting;
  std::vector<std::shared_ptr<StreamSink>> streams;
  c.DetachAll(waiting, streams);
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(streams.size(), 1u);
  waiting[0](std::vector<LeasedJob>{});
  EXPECT_EQ(answered, 1);
  EXPECT_EQ(c.Find(1), nullptr);
}

}  // namespace
}  // namespace jobbroker::core
