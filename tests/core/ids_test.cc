#include "core/ids.h"

#include <set>

#include "core/job.h"
#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

TEST(IdsTest, JobIdsAreUniqueAndSortByTime) {
  absl::BitGen gen;
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string id = NewJobId(absl::FromUnixMillis(1'700'000'000'000), gen);
    EXPECT_EQ(id.size(), 26u);
    EXPECT_TRUE(seen.insert(id).second);
  }
  EXPECT_LT(NewJobId(absl::FromUnixMillis(1000), gen), NewJobId(absl::FromUnixMillis(2000), gen));
}

TEST(IdsTest, JobIdsPackIntoSixteenBytesAndBack) {
  absl::BitGen gen;
  for (int i = 0; i < 1000; ++i) {
    std::string id = NewJobId(absl::FromUnixMillis(1'700'000'000'000 + i), gen);
    std::optional<PackedJobId> packed = PackJobId(id);
    ASSERT_TRUE(packed.has_value()) << id;
    EXPECT_EQ(UnpackJobId(*packed), id);
  }
  // The largest id NewJobId can write uses all 128 bits.
  const std::string max_id = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ";
  ASSERT_TRUE(PackJobId(max_id).has_value());
  EXPECT_EQ(*PackJobId(max_id), (PackedJobId{~uint64_t{0}, ~uint64_t{0}}));
  EXPECT_EQ(UnpackJobId(*PackJobId(max_id)), max_id);
  EXPECT_EQ(UnpackJobId(PackedJobId{0, 0}), std::string(26, '0'));
}

TEST(IdsTest, APackedIdTellsWhenItsJobWasCreated) {
  absl::BitGen gen;
  const absl::Time created = absl::FromUnixMicros(1'700'000'000'123'456);
  std::optional<PackedJobId> packed = PackJobId(NewJobId(created, gen));
  ASSERT_TRUE(packed.has_value());
  EXPECT_EQ(JobIdTime(*packed), absl::FromUnixMillis(1'700'000'000'123));
}

TEST(IdsTest, OnlyCanonicalJobIdsPack) {
  EXPECT_FALSE(PackJobId("").has_value());
  EXPECT_FALSE(PackJobId("job-1").has_value());
  EXPECT_FALSE(PackJobId(std::string(25, '0')).has_value());
  EXPECT_FALSE(PackJobId(std::string(27, '0')).has_value());
  EXPECT_FALSE(PackJobId("80000000000000000000000000").has_value());  // 130 bits would not fit
  EXPECT_FALSE(PackJobId("0000000000000000000000000U").has_value());  // not in the alphabet
  EXPECT_FALSE(PackJobId("0000000000000000000000000a").has_value());  // lower case: no round trip
}

TEST(IdsTest, LeaseIdsNameTheAttempt) {
  absl::BitGen gen;
  std::string id = NewLeaseId(3, gen);
  EXPECT_EQ(id.substr(0, 2), "3-");
  EXPECT_NE(NewLeaseId(3, gen), id);
}

TEST(JobTest, TruncateUtf8NeverSplitsACharacter) {
  std::string text = "ab\xC3\xA9";  // "abé": é is two bytes
  EXPECT_EQ(TruncateUtf8(text, 3), "ab");
  EXPECT_EQ(TruncateUtf8(text, 4), text);
  EXPECT_EQ(TruncateUtf8(std::string(5000, 'x'), kMaxErrorBytes).size(), kMaxErrorBytes);
}

TEST(JobTest, PayloadHashIsStable) {
  // Persisted in dedup records: it must never change between builds.
  EXPECT_EQ(PayloadHash(""), 14695981039346656037ull);
  EXPECT_EQ(PayloadHash("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_NE(PayloadHash("a"), PayloadHash("b"));
}

}  // namespace
}  // namespace jobbroker::core
