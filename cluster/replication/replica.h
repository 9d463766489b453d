#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "cluster/replication/etcd_layout.h"
#include "cluster/replication/messages.h"
#include "cluster/replication/replica_storage.h"
#include "core/store.h"

namespace jobbroker::cluster {

// Bugs the simulator's own tests plant, one at a time, to show that each invariant catches the
// mistake it is about (tests/cluster/sim). Nothing else sets them.
enum class PlantedBug {
  kNone,
  kAckBeforeCommit,        // answer a proposal once the leader has written it
  kIgnoreElectionOutcome,  // lead after losing the election txn, in the winner's epoch
  kNoEpochFence,           // accept batches of any epoch, never raise the floor
  kApplyOnReceipt,         // a follower applies what it receives before it is committed
  kShrinkWithoutEtcd,      // stop waiting for a lagging member without removing it in etcd
};

struct ReplicaOptions {
  std::string cluster_name = "jobbroker";  // etcd key prefix
  std::string node_id;
  uint32_t partition = 0;
  // Writes are refused unless this many members (the leader included) are in the in-sync set.
  size_t min_in_sync = 2;
  // How often a leader tells an idle follower its commit point (and that it is alive).
  absl::Duration heartbeat_every = absl::Milliseconds(100);
  // A follower that has not answered for this long gets the unanswered entries again.
  absl::Duration resend_after = absl::Milliseconds(300);
  // A member that has not caught up with the leader's log end for this long leaves the in-sync
  // set (Kafka's replica.lag.time.max.ms), unless the set would drop below min_in_sync: then
  // writes are refused until it is back, or until another replica has caught up and joined.
  absl::Duration lag_timeout = absl::Seconds(1);
  size_t max_entries_per_message = 256;
  size_t snapshot_records_per_chunk = 256;
  // How many applied entries a replica keeps in its log for followers that fall behind; one
  // further behind gets a snapshot.
  uint64_t log_retention = 10000;
  // Leadership goes back to each partition's preferred replica (the first of its placement), so
  // that leaders stay spread over the nodes after failovers and restarts (Kafka's preferred
  // leader election). A leader that is not the preferred replica hands over once the preferred
  // one has been in the in-sync set and caught up for this long; InfiniteDuration: never.
  absl::Duration hand_back_after = absl::Seconds(5);
  // With no leader, the other in-sync replicas give a live, in-sync preferred replica this long
  // to win the election before they stand themselves.
  absl::Duration defer_to_preferred = absl::Milliseconds(300);
  PlantedBug TEST_planted_bug = PlantedBug::kNone;
};

// What the node read from etcd about this partition just before a Tick (after the previous Tick
// returned, so it sees the replica's own transactions).
struct PartitionView {
  bool known = false;    // false: etcd could not be read this time
  int64_t revision = 0;  // the read's revision
  std::optional<KeyValue> leader;
  std::optional<KeyValue> sync;
  std::vector<std::string> replicas;
  // Nodes not to wait for: handing over before they stop (a SIGTERM), or no longer registered
  // (stopped; dead past the TTL). A leader drops them from its in-sync set at once, as if they
  // lagged, rather than after lag_timeout of stalled writes, and adds none of them back (a node
  // that was caught up when it stopped would otherwise look caught up until the next write).
  std::vector<std::string> leaving;
};

// The node's etcd lease (LeaseKeeper): leader keys are put on it.
struct NodeLease {
  LeaseId id = 0;
  bool may_serve = false;  // LeaseKeeper::MayServe()
  // This node is handing over before it stops: it resigns what it leads (its leader key goes,
  // so another in-sync member takes over at once) and stands in no election; as a follower it
  // still acknowledges, so the next leader's epoch can start with it in the set.
  bool leaving = false;
};

// How a proposal ended: OK once committed; kUnavailable when the replica stopped leading first
// (the outcome is then unknown: a later leader may or may not keep it).
struct ProposalOutcome {
  LogPosition position;
  absl::Status status;
};

// One partition's replica on one node: the replication protocol of CLUSTER.md, as a pure state
// machine. Time comes in as arguments, messages go out through an outbox, etcd is called
// synchronously through the narrow Etcd interface, and the durable state is a ReplicaStorage,
// so the deterministic simulator runs it exactly as a node does.
//
// Follower: accepts an AppendRequest only of an epoch at or above its floor (raising the floor
// first, durably), makes its log equal the leader's (dropping what older epochs left beyond the
// point where they differ), answers once that is durable, and applies entries only up to the
// commit point the leader sent.
//
// Election: when the leader key is gone and this node is in the in-sync set, the replica raises
// its floor above every existing epoch, reads its log end, and puts the leader key on its node
// lease with one transaction guarded by "no leader" and the in-sync set it read; the txn's
// revision is its epoch. It then appends an epoch-start entry; once that is committed (which
// commits everything before it) the partition's state is complete and it serves.
//
// Leader: a batch is committed when it is durable on the leader and on every member of the
// in-sync set (and on members being added); only then is its proposal answered. A member that
// lags leaves the set by a transaction guarded by the leader's epoch before the leader commits
// without it; a member that has caught up is required first and added after. A leader steps
// down when its lease may not serve, when its key is gone, or when a transaction fails its
// guard. A follower too far behind gets a snapshot of the state in chunks.
//
// Balance: leadership returns to the preferred replica (the first of the placement, spread over
// the nodes when the cluster was created): a leader that is not it hands over (refuses new
// proposals, lets the pending ones commit, resigns) once it has been in sync for
// hand_back_after, and the others give it defer_to_preferred to win an election. Both only
// delay; neither changes who may lead (I2) or what is acknowledged.
//
// Not thread-safe: a node serialises the calls of each replica.
class Replica {
 public:
  enum class Role { kFollower, kLeader };

  // Borrows storage and etcd; both must outlive the replica.
  Replica(ReplicaOptions options, ReplicaStorage& storage, Etcd& etcd);

  // Time-driven work: election, leadership checks, in-sync set changes, resends, heartbeats.
  void Tick(absl::Time now, const PartitionView& view, const NodeLease& lease);
  // A message of this partition from another replica.
  void Receive(absl::Time now, const ReplicationMessage& message);

  // Leader: appends `transition` (its partition and seq are set here) as the next entry and
  // returns its position; its outcome comes through TakeOutcomes(). kFailedPrecondition when not
  // the leader (the caller goes to the leader); kUnavailable while the epoch has not started or
  // fewer than min_in_sync members keep up.
  absl::StatusOr<LogPosition> Propose(absl::Time now, core::Transition transition);
  // Propose of several transitions as one proposal: consecutive entries in one storage append
  // (one fsync for a commit pipeline's group), answered together by one outcome, at the
  // position of the last. `transitions` must not be empty.
  //
  // With `send_now`, followers get the batch before it is on this replica's disk: it is appended
  // unsynced, the messages that carry it (and any before them in the outbox) go to send_now on
  // this thread, and only then is the log fsynced, so that the followers' fsyncs run alongside
  // this one's. The commit still needs this replica's fsync (it is done before this returns).
  //
  // Not `durable`: a partition with no other replica (RF 1) writes a batch that commits on its
  // own append without an fsync, and it is answered at once; SyncLog() makes it durable. What a
  // single node's group commit does (CommitPipeline writes unsynced, releases what waits only
  // for the write, then fsyncs). Any other batch is proposed as usual.
  using SendNow = std::function<void(std::vector<ReplicationMessage>)>;
  absl::StatusOr<LogPosition> ProposeBatch(absl::Time now,
                                           std::vector<core::Transition> transitions,
                                           const SendNow& send_now = nullptr, bool durable = true);
  // Makes every earlier append durable (after a proposal that was not). A failure breaks the
  // replica, as any storage failure does. Asks the storage for nothing when every append since
  // the last SyncLog was durable already: a replicated batch is answered once committed, which
  // its own fsyncs made durable, and the commit pipeline's fsync after it would be one more
  // fsync per group for nothing (it covers only the unsynced applies, which the log replays).
  absl::Status SyncLog();

  // Messages to send, in order; the outbox is then empty.
  std::vector<ReplicationMessage> TakeOutbox();
  // Outcomes of proposals since the last call.
  std::vector<ProposalOutcome> TakeOutcomes();

  Role role() const { return leader_ ? Role::kLeader : Role::kFollower; }
  // The epoch this replica leads, or 0.
  int64_t epoch() const { return leader_ ? leader_->epoch : 0; }
  // Leading, and the epoch-start entry is committed.
  bool serving() const { return leader_ && leader_->started; }
  // How far this replica knows the log to be committed.
  uint64_t commit_seq() const { return commit_seq_; }
  // A storage error stopped the replica (it then neither leads nor answers); OK otherwise.
  const absl::Status& broken() const { return broken_; }
  // Leader: how many entries of its log each follower lacks (log end minus what the follower
  // holds durably), by node id. Empty on a follower.
  std::map<std::string, uint64_t> FollowerLag() const;

 private:
  struct Follower {
    uint64_t next = 1;   // the next entry to send
    uint64_t match = 0;  // its log equals ours through here (durably)
    absl::Time caught_up_at;
    absl::Time last_sent = absl::InfinitePast();
    absl::Time last_progress;
    // A snapshot being sent: the chunks, as of `snapshot_at`, and the next one it wants.
    std::optional<LogPosition> snapshot_at;
    std::vector<core::Transition> chunks;
    uint64_t next_chunk = 0;
  };
  struct Leader {
    int64_t epoch = 0;
    uint64_t start_seq = 0;
    bool started = false;
    std::vector<std::string> in_sync;  // as etcd holds it (the leader itself included)
    std::set<std::string> joining;     // required, but not (yet) in etcd's set
    std::set<std::string> dropped;     // kShrinkWithoutEtcd only
    std::map<std::string, Follower> followers;
    std::deque<LogPosition> pending;   // proposals not answered yet, in order
    std::vector<std::string> leaving;  // PartitionView::leaving, as last read
    std::string preferred;             // the first of the placement, as last read
    // Since when the preferred replica (not this one) has been ready to take over.
    std::optional<absl::Time> preferred_ready_since;
    // Handing over to the preferred replica: proposals are refused until the pending ones are
    // answered, then this replica resigns.
    std::optional<absl::Time> handing_back_since;
  };
  struct Staging {
    LogPosition at;
    std::vector<core::Transition> chunks;
  };

  void TickFollower(absl::Time now, const PartitionView& view, const NodeLease& lease);
  void TickLeader(absl::Time now, const PartitionView& view, const NodeLease& lease);
  void RunElection(absl::Time now, const PartitionView& view, const NodeLease& lease);
  void BecomeLeader(absl::Time now, int64_t epoch, LogPosition start,
                    std::vector<std::string> in_sync, const std::vector<std::string>& replicas);
  void StepDown(const std::string& why);
  // Steps down and deletes its leader key (guarded by its epoch): a graceful hand-over.
  void Resign(const std::string& why);
  // Leader: hands the partition back to its preferred replica once that is ready (above).
  void MaybeHandBack(absl::Time now);
  void Break(absl::Status status);
  // storage_.Append (synced), which also clears log_unsynced_: its fsync covers the earlier
  // appends of the same write-ahead log.
  absl::Status AppendSynced(const std::vector<LogEntry>& entries);
  // Raises the floor to `epoch` if it is higher. False if the storage failed.
  bool RaiseFloor(int64_t epoch);

  // The members whose acks a commit needs besides the leader's own.
  std::set<std::string> RequiredFollowers() const;
  // Leader: `node` has not caught up with the log end for longer than lag_timeout.
  bool Lagging(absl::Time now, const std::string& node, uint64_t log_end) const;
  void UpdateInSyncSet(absl::Time now);
  // Puts `members` as the in-sync set, guarded by this leader's epoch. OK if written; kAborted
  // if the guard failed (this replica no longer leads); the etcd error otherwise (unknown).
  absl::Status WriteInSyncSet(const std::vector<std::string>& members);
  void AdvanceCommit();
  void SendAll(absl::Time now, bool heartbeat_due);
  void SendTo(absl::Time now, const std::string& node, Follower& follower, bool heartbeat_due);
  void SendChunk(absl::Time now, const std::string& node, Follower& follower);
  void TrimLog();

  void OnAppendRequest(absl::Time now, const std::string& from, const AppendRequest& request);
  // Follower: applies what it knows to be committed. Called at each tick (and when more than
  // half the log's retention waits), not on every append: the answer to the leader, which a
  // commit waits for, then goes out without an apply before it, and one apply write covers a
  // tick's worth of batches. A follower's state is read only once it leads, and a new leader
  // applies everything committed before it serves.
  void ApplyCommitted();
  void OnSnapshotChunk(absl::Time now, const std::string& from, const SnapshotChunk& chunk);
  void OnAppendResponse(absl::Time now, const std::string& from, const AppendResponse& response);
  void OnSnapshotAck(absl::Time now, const std::string& from, const SnapshotAck& ack);
  // Fences a request of `epoch` from another replica: false (after answering kStaleEpoch) when
  // it is below the floor; steps down if it is above this leader's epoch.
  bool AcceptEpoch(const std::string& from, int64_t epoch);
  void Reply(const std::string& to, AppendResponse response);
  int64_t EpochAtOrZero(uint64_t seq) const;

  // Constant after construction.
  const ReplicaOptions options_;
  const PartitionKeys keys_;
  ReplicaStorage& storage_;
  Etcd& etcd_;

  std::optional<Leader> leader_;
  std::optional<Staging> staging_;
  uint64_t commit_seq_ = 0;
  absl::Time last_heartbeat_ = absl::InfinitePast();
  // Follower: since when etcd has shown the partition without a leader.
  std::optional<absl::Time> leaderless_since_;
  absl::Status broken_;
  // The last append was made without an fsync (ProposeBatch not `durable`, alone), and no sync
  // came after it.
  bool log_unsynced_ = false;
  std::vector<ReplicationMessage> outbox_;
  std::vector<ProposalOutcome> outcomes_;
};

const char* RoleName(Replica::Role role);

}  // namespace jobbroker::cluster
