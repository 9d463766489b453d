// MergeWorkers: one worker seen by several partitions or nodes is one entry.
#include "core/workers.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

using ::testing::ElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

RunningJob Running(const std::string& id, absl::Time started) {
  RunningJob r;
  r.job_id = id;
  r.queue = "q";
  r.started_at = started;
  return r;
}

TEST(MergeWorkersTest, TheSameWorkerFromTwoPlacesIsOneEntryWithEverythingSummed) {
  std::vector<WorkerInfo> into = {WorkerInfo{.worker_id = "w",
                                             .queues = {"b", "a"},
                                             .streams = 1,
                                             .max_in_flight = 2,
                                             .connected_at = kT0 + absl::Seconds(5),
                                             .running = {Running("j2", kT0 + absl::Seconds(2))}}};
  MergeWorkers(into, {WorkerInfo{.worker_id = "w",
                                 .queues = {"a", "c"},
                                 .streams = 1,
                                 .lease_waits = 1,
                                 .max_in_flight = 3,
                                 .connected_at = kT0,
                                 .running = {Running("j1", kT0 + absl::Seconds(1))}}});
  ASSERT_EQ(into.size(), 1u);
  EXPECT_THAT(into[0].queues, ElementsAre("a", "b", "c"));
  EXPECT_EQ(into[0].streams, 2);
  EXPECT_EQ(into[0].lease_waits, 1);
  EXPECT_EQ(into[0].max_in_flight, 5);
  EXPECT_EQ(into[0].connected_at, kT0) << "the oldest connection";
  ASSERT_EQ(into[0].running.size(), 2u);
  EXPECT_EQ(into[0].running[0].job_id, "j1") << "oldest attempt first";
}

TEST(MergeWorkersTest, DifferentWorkersStaySeparateSortedById) {
  std::vector<WorkerInfo> into = {WorkerInfo{.worker_id = "zeta"}};
  MergeWorkers(into, {WorkerInfo{.worker_id = "alpha"}, WorkerInfo{.worker_id = "mid"}});
  std::vector<std::string> ids;
  for (const WorkerInfo& w : into) ids.push_back(w.worker_id);
  EXPECT_THAT(ids, ElementsAre("alpha", "mid", "zeta"));
}

TEST(MergeWorkersTest, AWorkerWithoutAConnectionKeepsTheOthersTime) {
  std::vector<WorkerInfo> into = {WorkerInfo{.worker_id = "w", .connected_at = kT0}};
  MergeWorkers(into, {WorkerInfo{.worker_id = "w"}});
  EXPECT_EQ(into[0].connected_at, kT0);
}

TEST(MergeWorkersTest, TheLatestSeenPlaceWins) {
  std::vector<WorkerInfo> into = {
      WorkerInfo{.worker_id = "w", .origin = {"ipv4:1.1.1.1:1", "a", "node-0"}, .last_seen = kT0}};
  MergeWorkers(into, {WorkerInfo{.worker_id = "w",
                                 .origin = {"ipv4:2.2.2.2:2", "b", "node-1"},
                                 .last_seen = kT0 + absl::Seconds(1)}});
  EXPECT_EQ(into[0].last_seen, kT0 + absl::Seconds(1));
  EXPECT_EQ(into[0].origin.node_id, "node-1");
}

TEST(RecentWorkersTest, ForgetsWorkersNotHeardFromForTenMinutes) {
  RecentWorkers recent;
  recent.Leased("old", "q", WorkerOrigin{}, kT0);
  recent.Leased("new", "q", WorkerOrigin{}, kT0 + absl::Minutes(9));
  recent.Heard("new", kT0 + RecentWorkers::kForgetAfter + absl::Seconds(1));
  EXPECT_EQ(recent.Find("old"), nullptr);
  ASSERT_NE(recent.Find("new"), nullptr);
  EXPECT_EQ(recent.size(), 1u);
}

TEST(RecentWorkersTest, ListsOnlyUnaryLesseesOfTheLastFiveMinutes) {
  RecentWorkers recent;
  recent.Leased("stream", "", WorkerOrigin{}, kT0);  // a subscription
  recent.Leased("poller", "q", WorkerOrigin{}, kT0);
  std::vector<std::string> listed;
  recent.ForEachListed(kT0 + RecentWorkers::kListedFor,
                       [&](const std::string& id, const auto&) { listed.push_back(id); });
  EXPECT_THAT(listed, ElementsAre("poller"));
  listed.clear();
  recent.ForEachListed(kT0 + RecentWorkers::kListedFor + absl::Seconds(1),
                       [&](const std::string& id, const auto&) { listed.push_back(id); });
  EXPECT_THAT(listed, ::testing::IsEmpty());
}

}  // namespace
}  // namespace jobbroker::core
