#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "cluster/replication/replica.h"

namespace jobbroker::testing {

struct SimOptions {
  uint64_t seed = 1;
  int nodes = 3;
  int partitions = 2;
  // Each partition's replicas (at most `nodes`) and the fewest in sync a write needs. With
  // min_in_sync 1 a leader alone in its set commits batches on its own append.
  int replication_factor = 3;
  int min_in_sync = 2;
  // Faults are injected for this long, then healed, and the cluster must settle within
  // `settle_for`: one serving leader per partition, every replica equal to it.
  absl::Duration faulty_for = absl::Seconds(6);
  absl::Duration settle_for = absl::Seconds(6);
  cluster::PlantedBug bug = cluster::PlantedBug::kNone;
  bool trace = false;           // keep a line per notable event (for replaying a seed)
  bool trace_messages = false;  // and one per message delivered
};

struct SimReport {
  // Empty if every invariant held; else the first violation, naming the invariant.
  std::string violation;
  uint64_t steps = 0;
  uint64_t acked = 0;
  uint64_t elections = 0;
  uint64_t faults = 0;
  uint64_t snapshots = 0;
  // A hash of every step: two runs of one seed must give the same.
  uint64_t fingerprint = 0;
  std::string trace;
};

// The deterministic simulation of cluster mode's replication (issue 20, step 3): nodes running
// cluster::Replica for each partition over MemoryReplicaStorage (state in a MemoryStore), one
// FakeEtcd with a client per node, LeaseKeepers, a message bus that drops, repeats, delays and
// reorders, and faults (crash and restart, pause, cut from etcd, cut from peers, lost etcd
// answers, lossy links), all on one fake clock and one random stream drawn from `seed`.
// Invariants are checked after every step:
//   durability       every acknowledged batch is held by every member of the in-sync set in etcd
//   one-writer       no two nodes lead one epoch of a partition
//   epochs-increase  a replica's floor, the epochs it accepts and the epochs a node leads only rise
//   apply-committed  an applied batch is held by the whole in-sync set, and no two replicas
//                    apply different batches at one seq
//   settles          (at the end) one serving leader per partition, its preferred replica
//                    when that is up, every replica applied the same state, every acknowledged
//                    batch in it
SimReport RunSimulation(const SimOptions& options);

const char* PlantedBugName(cluster::PlantedBug bug);

}  // namespace jobbroker::testing
