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

}  // namespace
}  // namespace jobbroker::server
