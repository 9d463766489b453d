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
    std::string id = NewJobId(absl::FromUnixMillis(1'700'000'000'000), 0, gen);
    EXPECT_EQ(id.size(), 26u);
    EXPECT_TRUE(seen.insert(id).second);
  }
  EXPECT_LT(NewJobId(absl::FromUnixMillis(1000), 5, gen),
            NewJobId(absl::FromUnixMillis(2000), 0, gen));
}

TEST(IdsTest, JobIdsPackIntoSixteenBytesAndBack) {
  absl::BitGen gen;
  for (int i = 0; i < 1000; ++i) {
    std::string id = NewJobId(absl::FromUnixMillis(1'700'000'000'000 + i), i % kMaxPartitions, gen);
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
  std::optional<PackedJobId> packed = PackJobId(NewJobId(created, 77, gen));
  ASSERT_TRUE(packed.has_value());
  EXPECT_EQ(JobIdTime(*packed), absl::FromUnixMillis(1'700'000'000'123));
}

TEST(IdsTest, AJobIdCarriesItsPartition) {
  absl::BitGen gen;
  for (uint32_t partition : {0u, 1u, 63u, 1000u, kMaxPartitions - 1}) {
    const std::string id = NewJobId(absl::FromUnixMillis(1'700'000'000'000), partition, gen);
    std::optional<PackedJobId> packed = PackJobId(id);
    ASSERT_TRUE(packed.has_value()) << id;
    EXPECT_EQ(JobIdPartition(*packed), partition) << id;
    EXPECT_EQ(PartitionOfJobId(id, kMaxPartitions), partition) << id;
  }
  // Jobs of one partition share the three characters after the time.
  const std::string a = NewJobId(absl::FromUnixMillis(1), 42, gen);
  const std::string b = NewJobId(absl::FromUnixMillis(2), 42, gen);
  EXPECT_EQ(a.substr(10, 3), b.substr(10, 3));
  EXPECT_NE(a.substr(10, 3), NewJobId(absl::FromUnixMillis(1), 43, gen).substr(10, 3));
}

TEST(IdsTest, AnIdFromBeforePartitionsRoutesToTheOnlyPartitionItsStoreHas) {
  // Format-1 ids hold random bits where the partition is now; their stores have one partition.
  const std::string old_id = "01HF3Z8K2QZZZZXYV7W5R4N3M2";
  ASSERT_NE(JobIdPartition(*PackJobId(old_id)), 0u);
  EXPECT_EQ(PartitionOfJobId(old_id, 1), 0u);
  EXPECT_EQ(PartitionOfJobId("not-an-id", 4), std::nullopt);
}

TEST(IdsTest, AQueuesPartitionIsTheFnv1aHashOfItsNameModuloTheCount) {
  // Pinned: clients in other languages route by the same function (docs/architecture.md,
  // "Partitions").
  EXPECT_EQ(PartitionOfQueue("emails", 64), PayloadHash("emails") % 64);
  EXPECT_EQ(PartitionOfQueue("", 64), 14695981039346656037ull % 64);
  EXPECT_EQ(PartitionOfQueue("a", 64), 0xaf63dc4c8601ec8cull % 64);
  EXPECT_EQ(PartitionOfQueue("a", 1), 0u);
  std::set<uint32_t> used;
  for (int i = 0; i < 1000; ++i) used.insert(PartitionOfQueue("queue-" + std::to_string(i), 8));
  EXPECT_EQ(used.size(), 8u);  // a thousand names reach every partition
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
