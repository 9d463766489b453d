#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace jobbroker::jepsen {

struct ClusterDriverOptions {
  // Nemesis events (nemesis.h) before the run settles; every kind once in each run of ten.
  int nemeses = 12;
  // The kinds drawn from ("--kinds cut-peers,kill-leader" replays one kind of fault many times).
  std::string kinds = "all";
  uint64_t seed = 0;
  // Jobs in all, shared among the producers, spread over the nemesis phase.
  int jobs = 1200;
  int producers = 3;
  int workers = 3;
  // The cluster: 3 nodes, `partitions` partitions (a queue on each), RF 3, min in sync 2, and
  // the nodes' etcd lease TTL in seconds.
  int partitions = 6;
  int lease_ttl = 2;
  // The queues' job lease; workers heartbeat at a quarter of it.
  absl::Duration job_lease = absl::Seconds(2);
  // How long the healed cluster gets to bring every job to an end.
  absl::Duration settle_timeout = absl::Seconds(180);
  // How long the cluster gets to be whole again after a fault (every partition led, its
  // replicas all in sync) before the run counts it as a problem.
  absl::Duration heal_timeout = absl::Seconds(60);
  std::string out_dir;  // empty: a fresh $TMPDIR/jobbroker-jepsen-*
  bool keep = false;    // keep out_dir after a green run too
  // The programs run: this one again (as producer and worker), and the rest of the rig.
  std::string self_exe;
  std::string broker_binary;
  std::string toxiproxy_binary;
  std::string faults_library;  // LD_PRELOADed into every node (disk, sync journal, clock)
  std::string power_loss_binary;
  std::string log_dump_binary;
};

// Runs the scenario of README.md and the checker; prints the summary. Exit code 0 when the
// checker found no violation and the run settled with no problem, 1 otherwise, 2 when the rig
// itself could not run.
int RunClusterDriver(const ClusterDriverOptions& options);

}  // namespace jobbroker::jepsen
