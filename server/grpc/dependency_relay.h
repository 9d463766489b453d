#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "node/partitions.h"
#include "server/grpc/forwarder.h"
#include "server/routing/router.h"

namespace jobbroker::server {

// Delivers what became of jobs that jobs of other partitions wait for (EnqueueRequest.depends_on
// across partitions): for each partition this node leads, it asks its broker which other
// partitions' jobs it awaits (core::Broker::AwaitedRemoteJobs), watches each where it lives — the
// broker of a partition this node also leads, or Admin.WatchJob on the leader of its partition —
// and hands each outcome (completed with its result, failed, cancelled, or gone) to the waiting
// partition's broker (SettleRemoteJobs), which releases or fails the dependents in one of its
// transitions.
//
// Nothing here is durable, and nothing needs to be: what is awaited is the WAITING jobs' stored
// depends_on, so after a restart or a failover the partition's new leader awaits the same ids and
// its relay watches them again; an outcome is applied at most once because SettleRemoteJobs
// ignores one nobody waits for any more. A watch is push (no polling while a job runs); one that
// breaks is opened again at the next round, every kRound. A remote watch is not trusted to break
// by itself: one whose partition is led elsewhere now (a frozen or cut-off former leader may keep
// it open, silent, for as long as it stays so) is cancelled and opened at the new leader, and one
// open for kRefreshAfter (to twice that, spread) is opened again (a connection that died without a
// word, which gRPC does not notice without keepalive, would otherwise hold the dependents forever).
//
// Thread-safe. Everything borrowed must outlive Stop().
class DependencyRelay {
 public:
  // `forwarder`: null on a single node. `peer_token`: what this node presents to the others'
  // WatchJob when auth is on (--cluster-peer-token-file); empty: nothing.
  DependencyRelay(node::Partitions& partitions, const Router& router, Forwarder* forwarder,
                  std::string peer_token);
  ~DependencyRelay();
  DependencyRelay(const DependencyRelay&) = delete;
  DependencyRelay& operator=(const DependencyRelay&) = delete;

  void Start();
  // Ends every watch and waits (a bounded time) for the remote ones to finish.
  void Stop();

  static constexpr absl::Duration kRound = absl::Milliseconds(250);
  static constexpr absl::Duration kRefreshAfter = absl::Seconds(30);

 private:
  struct Inbox;
  class LocalWatch;
  class RemoteWatch;

  void Loop();
  // Delivers the outcomes that arrived, then opens a watch for every awaited job without one.
  void Round();
  // Cancels the remote watches opened where the awaited job's partition is not led now, or open
  // past their refresh time; each is opened again at a later round.
  void CancelStaleWatches();
  void Watch(uint32_t waiting_partition, const std::string& job_id);

  node::Partitions& partitions_;
  const Router& router_;
  Forwarder* const forwarder_;
  const std::string peer_token_;
  // Shared with the watches, which may outlive the relay's thread by a callback.
  const std::shared_ptr<Inbox> inbox_;
  absl::BitGen gen_;  // the relay's thread only: when each remote watch is refreshed
  std::thread thread_;
};

}  // namespace jobbroker::server
