// client/cpp/jobbroker/partition.h computes where queues and job ids live without linking
// core/; it must agree with core/ids.cc, which the broker places them by, on every input.
#include "jobbroker/partition.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ids.h"
#include "gtest/gtest.h"

namespace jobbroker::client {
namespace {

// Random queue names: mostly printable, some with any byte, of 0 to 64 bytes.
std::string RandomQueueName(absl::BitGen& gen) {
  std::string name(absl::Uniform<size_t>(gen, 0, 65), '\0');
  const bool any_byte = absl::Bernoulli(gen, 0.2);
  for (char& c : name) {
    c = static_cast<char>(any_byte ? absl::Uniform<int>(gen, 0, 256)
                                   : absl::Uniform<int>(gen, 0x20, 0x7f));
  }
  return name;
}

TEST(PartitionTest, QueuesLandInTheSamePartitionAsCoreSays) {
  absl::BitGen gen;
  const uint32_t counts[] = {0, 1, 2, 3, 7, 64, 1000, core::kMaxPartitions, 4294967295u};
  for (int i = 0; i < 20000; ++i) {
    const std::string queue = RandomQueueName(gen);
    for (uint32_t count : counts) {
      ASSERT_EQ(PartitionOfQueue(queue, count), core::PartitionOfQueue(queue, count))
          << "queue \"" << queue << "\" among " << count;
    }
    const uint32_t count = absl::Uniform<uint32_t>(gen, 1, 5000);
    ASSERT_EQ(PartitionOfQueue(queue, count), core::PartitionOfQueue(queue, count))
        << "queue \"" << queue << "\" among " << count;
  }
}

TEST(PartitionTest, QueuePartitionsArePinnedToFnv1a64) {
  // The published FNV-1a 64 values of "a" (0xaf63dc4c8601ec8c) and "foobar"
  // (0x85944171f73967e8) modulo the count: a change of the hash fails here even if core changed
  // with it, since clients in other languages compute the same numbers.
  EXPECT_EQ(PartitionOfQueue("a", 64), 12u);
  EXPECT_EQ(PartitionOfQueue("a", 1000), 996u);
  EXPECT_EQ(PartitionOfQueue("foobar", 64), 40u);
  EXPECT_EQ(PartitionOfQueue("foobar", 1000), 968u);
  EXPECT_EQ(PartitionOfQueue("foobar", 1), 0u);
  EXPECT_EQ(PartitionOfQueue("foobar", 0), 0u);
}

TEST(PartitionTest, JobIdsNameThePartitionCoreGaveThem) {
  absl::BitGen gen;
  for (int i = 0; i < 20000; ++i) {
    const uint32_t partition = absl::Uniform<uint32_t>(gen, 0, core::kMaxPartitions);
    const absl::Time now = absl::FromUnixMillis(absl::Uniform<int64_t>(gen, 0, int64_t{1} << 48));
    const std::string id = core::NewJobId(now, partition, gen);
    for (uint32_t count : {0u, 1u, 2u, 3u, 64u, 1000u, core::kMaxPartitions,
                           absl::Uniform<uint32_t>(gen, 1, 100000)}) {
      ASSERT_EQ(PartitionOfJobId(id, count), core::PartitionOfJobId(id, count))
          << id << " among " << count;
    }
    ASSERT_EQ(PartitionOfJobId(id, core::kMaxPartitions), partition) << id;
  }
  const std::string now_id = core::NewJobId(absl::Now(), 5, gen);
  EXPECT_EQ(PartitionOfJobId(now_id, 64), 5u);
}

TEST(PartitionTest, StringsThatAreNotJobIdsHaveNoPartitionLikeInCore) {
  absl::BitGen gen;
  const std::string id = core::NewJobId(absl::Now(), 3, gen);
  // Each a job id with one thing wrong.
  const std::string not_ids[] = {
      "",
      "no-such-job",
      id.substr(1),
      absl::StrCat(id, "0"),
      absl::StrCat("8", id.substr(1)),                     // 131 bits
      absl::StrCat(id.substr(0, 11), "I", id.substr(12)),  // not in the alphabet
      absl::StrCat(id.substr(0, 11), "a", id.substr(12)),  // lower case
      absl::StrCat(id.substr(0, 20), "U", id.substr(21)),
  };
  for (const std::string& s : not_ids) {
    EXPECT_FALSE(PartitionOfJobId(s, 64).has_value()) << s;
    EXPECT_EQ(PartitionOfJobId(s, 64), core::PartitionOfJobId(s, 64)) << s;
    EXPECT_EQ(PartitionOfJobId(s, 1), core::PartitionOfJobId(s, 1)) << s;
  }
  // Random 26-character strings, each character from the alphabet or, now and then, not: valid
  // or not, both agree.
  constexpr char kAlphabet[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  constexpr char kOthers[] = "ILOUailou-_ ~";
  for (int i = 0; i < 20000; ++i) {
    std::string s(26, '0');
    for (char& c : s) {
      c = absl::Bernoulli(gen, 0.995) ? kAlphabet[absl::Uniform<size_t>(gen, 0, 32)]
                                      : kOthers[absl::Uniform<size_t>(gen, 0, sizeof kOthers - 1)];
    }
    const uint32_t count = absl::Uniform<uint32_t>(gen, 1, 100000);
    ASSERT_EQ(PartitionOfJobId(s, count), core::PartitionOfJobId(s, count)) << s;
  }
}

// tests/client/partition_vectors.tsv is what the clients in other languages test their routing
// against: each of its lines must be what core answers.
TEST(PartitionTest, TheVectorsFileOfTheOtherClientsIsWhatCoreSays) {
  const std::filesystem::path file =
      std::filesystem::path(__FILE__).parent_path() / "partition_vectors.tsv";
  std::ifstream in(file);
  ASSERT_TRUE(in) << "cannot read " << file;
  int queues = 0, jobs = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> f = absl::StrSplit(line, '\t');
    ASSERT_EQ(f.size(), 4u) << line;
    uint32_t count = 0;
    ASSERT_TRUE(absl::SimpleAtoi(f[2], &count)) << line;
    if (f[0] == "queue") {
      ++queues;
      EXPECT_EQ(f[3], absl::StrCat(core::PartitionOfQueue(f[1], count))) << line;
    } else {
      ASSERT_EQ(f[0], "job") << line;
      ++jobs;
      const std::optional<uint32_t> partition = core::PartitionOfJobId(f[1], count);
      EXPECT_EQ(f[3], partition.has_value() ? absl::StrCat(*partition) : "none") << line;
    }
  }
  EXPECT_GT(queues, 100);
  EXPECT_GT(jobs, 100);
}

}  // namespace
}  // namespace jobbroker::client
