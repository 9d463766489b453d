// The Router (server/routing/router.h) in cluster mode: which node a partition's call goes to.
#include "server/routing/router.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace jobbroker::server {
namespace {

ClusterView TwoPartitionsLedBy(const std::string& leader, const std::string& address) {
  ClusterView view;
  view.cluster_name = "cluster";
  view.node_id = "node-a";
  view.known = true;
  view.partitions.resize(2);
  for (ClusterView::Partition& p : view.partitions) {
    p.leader = leader;
    p.leader_address = address;
    p.epoch = 7;
    p.served_here = leader == "node-a";
  }
  return view;
}

TEST(RouterTest, APartitionLedElsewhereIsForwardedToItsLeaderOnce) {
  std::unique_ptr<Router> router = Router::Cluster("cluster", "node-a", 2);
  router->Publish(TwoPartitionsLedBy("node-b", "10.0.0.2:7070"));
  Route route = router->RouteOf(1, /*forwarded=*/false);
  EXPECT_EQ(route.kind, Route::Kind::kForward);
  EXPECT_EQ(route.leader, "node-b");
  EXPECT_EQ(route.address, "10.0.0.2:7070");
  route = router->RouteOf(1, /*forwarded=*/true);
  EXPECT_EQ(route.kind, Route::Kind::kUnavailable);
  EXPECT_THAT(route.why.message(), ::testing::HasSubstr("partition 1"));
}

TEST(RouterTest, ForwardsGoWhereThisNodeDialsTheLeaderWhenThatDiffers) {
  std::unique_ptr<Router> router = Router::Cluster("cluster", "node-a", 2);
  ClusterView view = TwoPartitionsLedBy("node-b", "10.0.0.2:7070");
  view.partitions[0].leader_dial_address = "127.0.0.1:9000";  // --cluster-peer-addresses
  router->Publish(view);
  EXPECT_EQ(router->RouteOf(0, false).address, "127.0.0.1:9000");
  EXPECT_EQ(router->RouteOf(1, false).address, "10.0.0.2:7070");
  // What GetCluster tells clients stays the address the leader registered.
  EXPECT_EQ(router->view()->partitions[0].leader_address, "10.0.0.2:7070");
}

TEST(RouterTest, APartitionLedHereIsAnsweredHere) {
  std::unique_ptr<Router> router = Router::Cluster("cluster", "node-a", 2);
  router->Publish(TwoPartitionsLedBy("node-a", "10.0.0.1:7070"));
  EXPECT_EQ(router->RouteOf(0, false).kind, Route::Kind::kLocal);
}

// What a relayed call uses to end when its leader changes: a later Publish that moves one of its
// partitions calls back once, with it; one that moves another partition does not; and a change
// published before the listen, after the caller routed, is returned instead of lost.
TEST(RouterTest, AListenerForALeaderChangeHearsOfItsPartitionsAndOfAChangeItCameTooLateFor) {
  std::unique_ptr<Router> router = Router::Cluster("cluster", "node-a", 2);
  router->Publish(TwoPartitionsLedBy("node-b", "10.0.0.2:7070"));
  std::shared_ptr<const ClusterView> seen = router->view();
  std::vector<uint32_t> heard;
  Router::LeaderWatch watch =
      router->ListenForLeaderChange({1}, seen, [&heard](uint32_t p) { heard.push_back(p); });
  EXPECT_FALSE(watch.changed_since_seen.has_value());
  ClusterView view = TwoPartitionsLedBy("node-b", "10.0.0.2:7070");
  view.partitions[0].leader = "node-c";
  view.partitions[0].epoch = 8;
  router->Publish(view);
  EXPECT_THAT(heard, ::testing::IsEmpty()) << "partition 0 is not this listener's";
  view.partitions[1].leader = "node-c";
  view.partitions[1].epoch = 8;
  router->Publish(view);
  EXPECT_THAT(heard, ::testing::ElementsAre(1u));
  router->Unlisten(watch.handle);

  // Routed by `seen`, listening only after partition 1 moved again.
  view.partitions[1].leader = "node-a";
  view.partitions[1].epoch = 9;
  view.partitions[1].served_here = true;
  router->Publish(view);
  Router::LeaderWatch late = router->ListenForLeaderChange({0, 1}, seen, [](uint32_t) {});
  ASSERT_TRUE(late.changed_since_seen.has_value());
  EXPECT_EQ(*late.changed_since_seen, 0u) << "the first partition that changed";
  router->Unlisten(late.handle);
}

// A partition without a leader is refused naming it, and the reason says whether an election is
// under way or the new cluster has not placed it on any node yet (it waits for its first nodes).
TEST(RouterTest, APartitionWithoutALeaderIsRefusedSayingWhy) {
  std::unique_ptr<Router> router = Router::Cluster("cluster", "node-a", 2);
  ClusterView view = TwoPartitionsLedBy("", "");
  view.nodes = {{"node-a", "10.0.0.1:7070", true}};
  view.partitions[0].replicas = {"node-a", "node-b"};
  router->Publish(view);
  Route route = router->RouteOf(0, false);
  EXPECT_EQ(route.kind, Route::Kind::kUnavailable);
  EXPECT_EQ(route.why.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(route.why.message(), ::testing::HasSubstr("partition 0 has no leader now"));
  route = router->RouteOf(1, false);
  EXPECT_EQ(route.kind, Route::Kind::kUnavailable);
  EXPECT_THAT(route.why.message(),
              ::testing::HasSubstr("partition 1 is not placed on any node yet"));
  EXPECT_THAT(route.why.message(), ::testing::HasSubstr("--cluster-initial-nodes"));
  EXPECT_THAT(route.why.message(), ::testing::HasSubstr("and 1 have"));
}

}  // namespace
}  // namespace jobbroker::server
