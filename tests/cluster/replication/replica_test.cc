#include "cluster/replication/replica.h"

#include <memory>
#include <string>
#include <vector>

#include "cluster/replication/etcd_layout.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_etcd.h"
#include "tests/testing/memory_replica_storage.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::cluster {
namespace {

using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::FakeEtcd;
using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::MemoryReplicaStorage;

core::Transition PutJob(const std::string& id) {
  core::Transition t;
  t.put_jobs.push_back(core::Job{.id = id, .queue = "q"});
  return t;
}

// One replica of partition 0, alone in its placement (RF 1), brought to serve.
class LoneReplicaTest : public ::testing::Test {
 protected:
  LoneReplicaTest() : etcd_(clock_), storage_(0) {
    const PartitionKeys keys = KeysOfPartition("t", 0);
    EXPECT_THAT(etcd_.Put(keys.replicas, EncodeReplicas({"n1"})).status(), IsOk());
    EXPECT_THAT(etcd_.Put(keys.sync, EncodeSync({{"n1"}, 0})).status(), IsOk());
    ReplicaOptions options;
    options.cluster_name = "t";
    options.node_id = "n1";
    options.partition = 0;
    options.min_in_sync = 1;
    replica_ = std::make_unique<Replica>(options, storage_, etcd_);
  }

  void Serve() {
    const PartitionKeys keys = KeysOfPartition("t", 0);
    absl::StatusOr<LeaseId> lease = etcd_.GrantLease(absl::Seconds(10));
    ASSERT_THAT(lease.status(), IsOk());
    for (int tick = 0; tick < 20 && !replica_->serving(); ++tick) {
      PartitionView view;
      auto leader = etcd_.Get(keys.leader);
      auto sync = etcd_.Get(keys.sync);
      ASSERT_THAT(leader.status(), IsOk());
      ASSERT_THAT(sync.status(), IsOk());
      view.known = true;
      view.revision = sync->revision;
      if (!leader->kvs.empty()) view.leader = leader->kvs.front();
      if (!sync->kvs.empty()) view.sync = sync->kvs.front();
      view.replicas = {"n1"};
      replica_->Tick(clock_.Now(), view, NodeLease{.id = *lease, .may_serve = true});
      clock_.Advance(absl::Milliseconds(50));
    }
    ASSERT_TRUE(replica_->serving());
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  FakeEtcd etcd_;
  MemoryReplicaStorage storage_;
  std::unique_ptr<Replica> replica_;
};

// SyncLog fsyncs only when the last append was not durable: the commit pipeline
// calls it after each group whose answers went out early, and a group that its own commit made
// durable (every replicated one) needs no second fsync.
TEST_F(LoneReplicaTest, SyncLogAsksTheStorageOnlyAfterAnUnsyncedProposal) {
  Serve();
  const uint64_t before = storage_.sync_calls();

  ASSERT_THAT(
      replica_->ProposeBatch(clock_.Now(), {PutJob("a")}, nullptr, /*durable=*/true).status(),
      IsOk());
  ASSERT_THAT(replica_->SyncLog(), IsOk());
  EXPECT_EQ(storage_.sync_calls(), before) << "a durable proposal leaves nothing to sync";

  ASSERT_THAT(
      replica_->ProposeBatch(clock_.Now(), {PutJob("b")}, nullptr, /*durable=*/false).status(),
      IsOk());
  ASSERT_THAT(replica_->SyncLog(), IsOk());
  EXPECT_EQ(storage_.sync_calls(), before + 1) << "an unsynced one is synced";

  ASSERT_THAT(replica_->SyncLog(), IsOk());
  EXPECT_EQ(storage_.sync_calls(), before + 1) << "and only once";

  ASSERT_THAT(
      replica_->ProposeBatch(clock_.Now(), {PutJob("c")}, nullptr, /*durable=*/false).status(),
      IsOk());
  ASSERT_THAT(
      replica_->ProposeBatch(clock_.Now(), {PutJob("d")}, nullptr, /*durable=*/true).status(),
      IsOk());
  ASSERT_THAT(replica_->SyncLog(), IsOk());
  EXPECT_EQ(storage_.sync_calls(), before + 1)
      << "a durable proposal's fsync covered the unsynced one before it";
}

}  // namespace
}  // namespace jobbroker::cluster
