#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "cluster/replication/messages.h"
#include "cluster/replication/replica.h"
#include "cluster/replication/rocksdb_replica_storage.h"
#include "core/clock.h"
#include "core/store.h"
#include "storage/rocksdb_store.h"

namespace jobbroker::cluster {

struct ReplicatedPartitionOptions {
  ReplicaOptions replica;
  // How long a write waits for its commit (durable on every in-sync member) before it is
  // answered kUnavailable with its outcome unknown. The replica steps down well before this when
  // it loses its lease; this bounds a write stuck behind followers that neither answer nor are
  // dropped from the in-sync set.
  absl::Duration commit_timeout = absl::Seconds(10);
  // Told, on the writing thread, how long each committed write waited for its commit (the
  // followers' fsyncs and the round trips): for the node's metrics. Unset: nobody listens.
  std::function<void(absl::Duration)> on_commit_wait;
};

// One partition of a cluster node, as the core::Store its broker writes through: a write is a
// proposal to the partition's Replica (cluster/replication/replica.h), answered when it is
// committed (durable on every member of the in-sync set, and applied to this node's records).
// Reads go to the node's RocksDbStore, which holds what the replica applied.
//
// The broker may write only while this node leads the partition, in the epoch it last rebuilt
// its memory in: Resume() succeeds only when the replica serves (its epoch-start entry is
// committed) and has applied its whole log, and it records that epoch; every Write of another
// epoch, or while not serving, is refused (kUnavailable naming the partition). So memory built
// from an older epoch's state never writes into a newer one. A node that stops leading has its
// broker halted by the node (ClusterNode); the broker's retries of Resume() rebuild it when it
// leads again.
//
// Threads: the replica is serialised by one mutex. Messages from peers are queued by Deliver and
// received on this object's thread, which also sends what the replica emits (through `send`,
// outside the mutex). Tick runs on the caller's thread (the node's driver, right after its etcd
// read: the view must be newer than the replica's last transaction). Write blocks its caller
// (the partition's commit pipeline) until the outcome; it sends a new batch to the followers
// itself, before this node's fsync of it (Replica::ProposeBatch's send_now). Whoever sends holds
// send_mu_, taken before mu_ is let go, so messages leave in the order the replica made them.
class ReplicatedPartition final : public core::Store {
 public:
  using Send = std::function<void(const ReplicationMessage&)>;

  // What the node reports and acts on.
  struct State {
    Replica::Role role = Replica::Role::kFollower;
    int64_t epoch = 0;  // the epoch it leads, or 0
    bool serving = false;
    int64_t broker_epoch = 0;  // the epoch the broker last rebuilt in (0: never)
    uint64_t commit_seq = 0;
    uint64_t log_end = 0;
    uint64_t applied_seq = 0;
    absl::Status broken;
  };

  // The replica over partition options.replica.partition's records in `store`; etcd and clock
  // are borrowed and must outlive it. Starts the receiving thread.
  static absl::StatusOr<std::unique_ptr<ReplicatedPartition>> Open(
      storage::RocksDbStore* store, Etcd& etcd, const core::Clock& clock,
      ReplicatedPartitionOptions options, Send send);
  // Stop(), then joins the thread.
  ~ReplicatedPartition() override;
  ReplicatedPartition(const ReplicatedPartition&) = delete;
  ReplicatedPartition& operator=(const ReplicatedPartition&) = delete;

  // Ends waiting writes (kUnavailable) and refuses new ones; messages are no longer received.
  void Stop();

  // The driver's step: Replica::Tick with the view just read and the node's lease. Returns the
  // state after it.
  State Tick(const PartitionView& view, const NodeLease& lease);
  // A message from a peer, queued for the receiving thread. Returns at once.
  void Deliver(ReplicationMessage message);
  State state() const;
  // Replica::FollowerLag: while this node leads, the entries each follower lacks.
  std::map<std::string, uint64_t> FollowerLag() const;
  // The partition's broker on this node answers for it now: the replica serves the epoch the
  // broker was rebuilt in (State's serving && epoch == broker_epoch), as of the replica's last
  // step. Lock-free: the router asks it on every call.
  bool served() const { return served_.load(std::memory_order_acquire); }

  // --- core::Store --------------------------------------------------------------------------
  absl::Status Write(absl::Span<const core::Transition> transitions) override;
  // At RF 1 (no other replica) a batch is written without an fsync and Sync() makes it durable,
  // as on a single node; otherwise as Write (a replicated batch is answered once committed).
  absl::Status WriteUnsynced(absl::Span<const core::Transition> transitions) override;
  absl::Status Sync() override;
  absl::StatusOr<core::Job> ReadJob(uint32_t partition, const std::string& id) override;
  absl::Status Recover(uint32_t partition, core::RecoveryVisitor& visitor) override;
  absl::Status Resume() override;

 private:
  ReplicatedPartition(storage::RocksDbStore* store, std::unique_ptr<RocksDbReplicaStorage> storage,
                      Etcd& etcd, const core::Clock& clock, ReplicatedPartitionOptions options,
                      Send send);

  absl::Status WriteWith(absl::Span<const core::Transition> transitions, bool durable);
  void ReceiveLoop();
  // Replica::ProposeBatch's send_now: sends what waits in outbox_, then `messages`.
  void SendNowLocked(std::vector<ReplicationMessage> messages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After every replica call: its outcomes to their waiting writes, its messages to the sender.
  void UpdateServedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  State StateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The refusal of a write or resume while this node does not serve the partition (marked
  // core::NotStorageFailure: the broker says it as it is).
  // `status`, marked core::NotStorageFailure unless the replica's storage failed (it broke).
  absl::Status NotStorageUnlessBrokenLocked(absl::Status status) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotServingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotServingReasonLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  storage::RocksDbStore* const store_;
  const core::Clock& clock_;
  const ReplicatedPartitionOptions options_;
  const Send send_;

  mutable absl::Mutex mu_;
  std::unique_ptr<RocksDbReplicaStorage> storage_ ABSL_GUARDED_BY(mu_);
  Replica replica_ ABSL_GUARDED_BY(mu_);
  int64_t broker_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Writes waiting for their proposal's outcome, by the position of its last entry (seq, epoch).
  std::map<std::pair<uint64_t, int64_t>, std::optional<absl::Status>> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<ReplicationMessage> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<ReplicationMessage> outbox_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Held while sending; taken under mu_ (after it in the lock order).
  absl::Mutex send_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::atomic<bool> served_{false};  // written under mu_ (UpdateServedLocked), read without it
  std::thread receiver_;
};

}  // namespace jobbroker::cluster
