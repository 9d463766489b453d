#include "cluster/replication/replica.h"

#include <algorithm>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace jobbroker::cluster {
namespace {

bool Contains(const std::vector<std::string>& nodes, const std::string& node) {
  return std::find(nodes.begin(), nodes.end(), node) != nodes.end();
}

}  // namespace

const char* RoleName(Replica::Role role) {
  return role == Replica::Role::kLeader ? "leader" : "follower";
}

Replica::Replica(ReplicaOptions options, ReplicaStorage& storage, Etcd& etcd)
    : options_(std::move(options)),
      keys_(KeysOfPartition(options_.cluster_name, options_.partition)),
      storage_(storage),
      etcd_(etcd),
      // What is applied is committed; beyond that this replica learns from a leader.
      commit_seq_(storage.applied_seq()) {}

// ---- Time-driven work ----

void Replica::Tick(absl::Time now, const PartitionView& view, const NodeLease& lease) {
  if (!broken_.ok()) return;
  if (!leader_) ApplyCommitted();
  if (!broken_.ok()) return;
  if (leader_) {
    TickLeader(now, view, lease);
  } else {
    TickFollower(now, view, lease);
  }
}

void Replica::TickFollower(absl::Time now, const PartitionView& view, const NodeLease& lease) {
  if (!view.known) return;
  if (view.leader) {
    leaderless_since_.reset();
    auto leader = DecodeLeader(view.leader->value);
    // A leader key of this node that this replica does not hold (an election txn whose answer
    // was lost, or a leadership from before a restart): delete it, so that the partition does
    // not wait for the lease to expire. Guarded by its create_revision: only that key goes.
    if (leader.ok() && leader->node == options_.node_id) {
      (void)etcd_.Txn({Compare::CreateRevision(keys_.leader, Compare::Op::kEqual,
                                               view.leader->create_revision)},
                      {TxnOp::Delete(keys_.leader)}, {});
    }
    return;
  }
  if (!leaderless_since_) leaderless_since_ = now;
  RunElection(now, view, lease);
}

void Replica::RunElection(absl::Time now, const PartitionView& view, const NodeLease& lease) {
  if (!lease.may_serve || lease.id == 0 || lease.leaving || !view.sync) return;
  auto sync = DecodeSync(view.sync->value);
  if (!sync.ok() || !Contains(sync->members, options_.node_id)) return;  // I2: not eligible
  // A live, in-sync preferred replica goes first, so leadership lands where the placement put
  // it; if it does not stand in time, any eligible replica does.
  if (!view.replicas.empty()) {
    const std::string& preferred = view.replicas.front();
    if (preferred != options_.node_id && Contains(sync->members, preferred) &&
        !Contains(view.leaving, preferred) && leaderless_since_ &&
        now - *leaderless_since_ < options_.defer_to_preferred) {
      return;
    }
  }
  // I4: every epoch that exists is at most the read's revision, and ours will be above it. Raise
  // the floor before reading the log end, so no older leader can add to the log after it.
  if (!RaiseFloor(view.revision + 1)) return;
  LogPosition start{storage_.log_end(), EpochAtOrZero(storage_.log_end())};
  auto result =
      etcd_.Txn({Compare::CreateRevision(keys_.leader, Compare::Op::kEqual, 0),
                 Compare::ModRevision(keys_.sync, Compare::Op::kEqual, view.sync->mod_revision)},
                {TxnOp::Put(keys_.leader, EncodeLeader({options_.node_id, start.seq}), lease.id)},
                {TxnOp::Get(keys_.leader)});
  if (!result.ok()) return;  // unknown: if it was applied, the next Tick deletes the key
  int64_t epoch = result->revision;
  if (!result->succeeded) {
    if (options_.TEST_planted_bug != PlantedBug::kIgnoreElectionOutcome) return;
    // The planted bug: believe the election was won, in the epoch of whoever won it.
    const auto& read = result->results.front().kvs;
    if (read.empty()) return;
    epoch = read.front().create_revision;
  }
  if (!RaiseFloor(epoch)) return;
  BecomeLeader(now, epoch, start, sync->members, view.replicas);
}

void Replica::BecomeLeader(absl::Time now, int64_t epoch, LogPosition start,
                           std::vector<std::string> in_sync,
                           const std::vector<std::string>& replicas) {
  Leader leader;
  leader.epoch = epoch;
  leader.start_seq = start.seq;
  leader.in_sync = std::move(in_sync);
  for (const auto& node : replicas) {
    if (node == options_.node_id) continue;
    Follower& follower = leader.followers[node];
    follower.next = start.seq + 1;
    follower.caught_up_at = now;
    follower.last_progress = now;
  }
  leader_ = std::move(leader);
  staging_.reset();
  leaderless_since_.reset();  // counted afresh once this epoch is over
  // The epoch-start entry: once it is committed, so is everything this replica had before it.
  LogEntry epoch_start{start.seq + 1, epoch, core::Transition{}};
  epoch_start.transition.partition = options_.partition;
  epoch_start.transition.seq = epoch_start.seq;
  if (auto status = AppendSynced({std::move(epoch_start)}); !status.ok()) {
    Break(status);
    return;
  }
  AdvanceCommit();  // a leader without followers to wait for
  SendAll(now, /*heartbeat_due=*/true);
}

void Replica::TickLeader(absl::Time now, const PartitionView& view, const NodeLease& lease) {
  if (!lease.may_serve) {
    StepDown("its node lease may not serve");
    return;
  }
  if (lease.leaving) {
    Resign("its node is handing over before it stops");
    return;
  }
  if (view.known) {
    leader_->leaving = view.leaving;
    if (!view.replicas.empty()) leader_->preferred = view.replicas.front();
    if (!view.leader || view.leader->create_revision != leader_->epoch) {
      StepDown("its leader key is gone");
      return;
    }
    // Only this leader writes the set in its epoch, and the view was read after its last
    // transaction: the view is the truth (it settles a write whose answer was lost).
    if (view.sync) {
      if (auto sync = DecodeSync(view.sync->value); sync.ok()) leader_->in_sync = sync->members;
    }
    for (const auto& node : view.replicas) {
      if (node == options_.node_id || leader_->followers.count(node) > 0) continue;
      Follower& follower = leader_->followers[node];
      follower.next = storage_.log_end() + 1;
      follower.caught_up_at = now;
      follower.last_progress = now;
    }
  }
  for (auto it = leader_->joining.begin(); it != leader_->joining.end();) {
    it = Contains(leader_->in_sync, *it) ? leader_->joining.erase(it) : std::next(it);
  }
  UpdateInSyncSet(now);
  if (!leader_) return;
  AdvanceCommit();
  if (!leader_) return;
  MaybeHandBack(now);
  if (!leader_) return;
  bool heartbeat_due = now - last_heartbeat_ >= options_.heartbeat_every;
  if (heartbeat_due) last_heartbeat_ = now;
  SendAll(now, heartbeat_due);
}

std::set<std::string> Replica::RequiredFollowers() const {
  std::set<std::string> required(leader_->joining);
  for (const auto& member : leader_->in_sync) {
    if (member != options_.node_id && leader_->dropped.count(member) == 0) required.insert(member);
  }
  return required;
}

bool Replica::Lagging(absl::Time now, const std::string& node, uint64_t log_end) const {
  auto it = leader_->followers.find(node);
  return it == leader_->followers.end() ||
         (it->second.match < log_end && now - it->second.caught_up_at > options_.lag_timeout);
}

void Replica::UpdateInSyncSet(absl::Time now) {
  const uint64_t end = storage_.log_end();
  for (const auto& node : RequiredFollowers()) {
    if (!Lagging(now, node, end) && !Contains(leader_->leaving, node)) continue;
    if (!Contains(leader_->in_sync, node)) {
      leader_->joining.erase(node);  // never in etcd's set: nothing to undo there
      continue;
    }
    if (options_.TEST_planted_bug == PlantedBug::kShrinkWithoutEtcd) {
      leader_->dropped.insert(node);
      continue;
    }
    // Never below min_in_sync: writes wait instead (Propose), and every member stays eligible
    // to lead, so the partition comes back if any of them does. A follower that catches up is
    // added meanwhile (below), and then this one can leave.
    if (leader_->in_sync.size() <= options_.min_in_sync) continue;
    std::vector<std::string> members;
    for (const auto& member : leader_->in_sync) {
      if (member != node) members.push_back(member);
    }
    absl::Status written = WriteInSyncSet(members);
    if (absl::IsAborted(written)) {
      StepDown("its in-sync set transaction failed its epoch guard");
      return;
    }
    // I3: only once etcd no longer has it does the leader commit without it.
    if (written.ok()) leader_->in_sync = std::move(members);
  }
  // A follower that has everything committed is required from now on, then added (I3): every
  // batch acknowledged so far is on it, and every later one waits for it. Before the epoch has
  // started this leader does not know what its predecessors acknowledged, only that it is all
  // in its own log up to start_seq: the follower must hold that much. (Adding before the start
  // is what lets a partition start whose set, at min_in_sync, holds a dead member: the new one
  // joins, then the dead one leaves.)
  const uint64_t needed = std::max(commit_seq_, leader_->start_seq);
  for (const auto& [node, follower] : leader_->followers) {
    if (Contains(leader_->in_sync, node) || follower.match < needed) continue;
    if (Contains(leader_->leaving, node)) continue;
    if (now - follower.caught_up_at > options_.lag_timeout) continue;
    leader_->joining.insert(node);
    std::vector<std::string> members = leader_->in_sync;
    members.push_back(node);
    absl::Status written = WriteInSyncSet(members);
    if (absl::IsAborted(written)) {
      StepDown("its in-sync set transaction failed its epoch guard");
      return;
    }
    if (written.ok()) {
      leader_->in_sync = std::move(members);
      leader_->joining.erase(node);
    }
  }
}

absl::Status Replica::WriteInSyncSet(const std::vector<std::string>& members) {
  auto result =
      etcd_.Txn({Compare::CreateRevision(keys_.leader, Compare::Op::kEqual, leader_->epoch)},
                {TxnOp::Put(keys_.sync, EncodeSync({members, leader_->epoch}))}, {});
  if (!result.ok()) return result.status();
  if (!result->succeeded) {
    return absl::AbortedError(
        absl::StrCat("partition ", options_.partition, ": epoch ", leader_->epoch, " is over"));
  }
  return absl::OkStatus();
}

void Replica::StepDown(const std::string& why) {
  if (!leader_) return;
  absl::Status status = absl::UnavailableError(absl::StrCat(
      "partition ", options_.partition, ": ", options_.node_id, " stopped leading epoch ",
      leader_->epoch, " (", why, "); the outcome of this write is unknown"));
  for (const auto& position : leader_->pending) outcomes_.push_back({position, status});
  leader_.reset();
}

void Replica::MaybeHandBack(absl::Time now) {
  Leader& leader = *leader_;
  const std::string& preferred = leader.preferred;
  const bool ready = options_.hand_back_after != absl::InfiniteDuration() && leader.started &&
                     !preferred.empty() && preferred != options_.node_id &&
                     Contains(leader.in_sync, preferred) && !Contains(leader.leaving, preferred) &&
                     !Lagging(now, preferred, storage_.log_end());
  if (!ready) {
    leader.preferred_ready_since.reset();
    leader.handing_back_since.reset();
    return;
  }
  if (!leader.preferred_ready_since) leader.preferred_ready_since = now;
  if (now - *leader.preferred_ready_since < options_.hand_back_after) return;
  if (!leader.handing_back_since) leader.handing_back_since = now;
  if (leader.pending.empty()) {
    Resign(absl::StrCat("handing the partition back to its preferred replica ", preferred));
    return;
  }
  // What is pending did not commit in time (a slow follower): serve again, retry later.
  if (now - *leader.handing_back_since > options_.lag_timeout) {
    leader.handing_back_since.reset();
    leader.preferred_ready_since = now;
  }
}

void Replica::Resign(const std::string& why) {
  const int64_t epoch = leader_->epoch;
  // Stops first, so nothing is acknowledged in this epoch once another replica may lead.
  StepDown(why);
  // Unknown outcome: the key then goes with the node's lease when it stops.
  (void)etcd_.Txn({Compare::CreateRevision(keys_.leader, Compare::Op::kEqual, epoch)},
                  {TxnOp::Delete(keys_.leader)}, {});
}

void Replica::Break(absl::Status status) {
  StepDown("its storage failed");
  broken_ = std::move(status);
}

bool Replica::RaiseFloor(int64_t epoch) {
  if (epoch <= storage_.epoch_floor()) return true;
  if (auto status = storage_.RaiseEpochFloor(epoch); !status.ok()) {
    Break(status);
    return false;
  }
  return true;
}

int64_t Replica::EpochAtOrZero(uint64_t seq) const {
  auto epoch = storage_.EpochAt(seq);
  return epoch.ok() ? *epoch : 0;
}

// ---- Leader: proposals, commit, sending ----

absl::StatusOr<LogPosition> Replica::Propose(absl::Time now, core::Transition transition) {
  std::vector<core::Transition> one;
  one.push_back(std::move(transition));
  return ProposeBatch(now, std::move(one));
}

absl::StatusOr<LogPosition> Replica::ProposeBatch(absl::Time now,
                                                  std::vector<core::Transition> transitions,
                                                  const SendNow& send_now, bool durable) {
  if (transitions.empty()) return absl::InvalidArgumentError("a proposal needs a transition");
  if (!broken_.ok()) return broken_;
  if (!leader_) {
    return absl::FailedPreconditionError(absl::StrCat("partition ", options_.partition, ": ",
                                                      options_.node_id, " is not its leader"));
  }
  if (!leader_->started) {
    return absl::UnavailableError(absl::StrCat("partition ", options_.partition,
                                               ": its leader is starting epoch ", leader_->epoch));
  }
  if (leader_->handing_back_since) {
    return absl::UnavailableError(
        absl::StrCat("partition ", options_.partition, ": ", options_.node_id,
                     " is handing its leadership back to its preferred replica ",
                     leader_->preferred, "; nothing was written"));
  }
  const uint64_t end = storage_.log_end();
  for (const auto& node : RequiredFollowers()) {
    if (Lagging(now, node, end)) {
      return absl::UnavailableError(
          absl::StrCat("partition ", options_.partition, ": in-sync replica ", node,
                       " is not keeping up and the set may not shrink below min_in_sync ",
                       options_.min_in_sync, "; nothing was written"));
    }
  }
  if (leader_->in_sync.size() < options_.min_in_sync) {
    return absl::UnavailableError(absl::StrCat(
        "partition ", options_.partition, ": ", leader_->in_sync.size(),
        " replicas in sync, below min_in_sync ", options_.min_in_sync, "; nothing was written"));
  }
  std::vector<LogEntry> entries;
  entries.reserve(transitions.size());
  uint64_t seq = end;
  for (core::Transition& transition : transitions) {
    ++seq;
    transition.partition = options_.partition;
    transition.seq = seq;
    entries.push_back(LogEntry{seq, leader_->epoch, std::move(transition)});
  }
  const LogPosition position{entries.back().seq, entries.back().epoch};
  if (RequiredFollowers().empty() && commit_seq_ == end && storage_.applied_seq() == end) {
    // Nobody else's ack to wait for (this replica alone in sync, at least min_in_sync): the
    // batch commits with its own append, so it is applied in the same write. Kept in the log
    // only for replicas that may catch up from it.
    // Unsynced only without other replicas: a follower sent the commit index could apply an
    // entry that a power loss here then undoes.
    const bool alone = leader_->followers.empty();
    const bool sync = durable || !alone;
    if (auto status = storage_.AppendCommitted(std::move(entries), /*keep_in_log=*/!alone, sync);
        !status.ok()) {
      Break(status);
      return status;
    }
    // A synced append's fsync covers every earlier one (one write-ahead log, in order).
    log_unsynced_ = !sync;
    commit_seq_ = position.seq;
    if (commit_seq_ > leader_->start_seq) leader_->started = true;
    outcomes_.push_back({position, absl::OkStatus()});
    TrimLog();
    if (leader_) SendAll(now, /*heartbeat_due=*/false);
    return position;
  }
  if (send_now && !leader_->followers.empty()) {
    // Sent before this replica's fsync, which then runs alongside the followers' ones. Should it
    // fail, the batch's outcome is unknown (followers may hold it), as after a failed fsync of
    // a synced append.
    if (auto status = storage_.AppendUnsynced(entries); !status.ok()) {
      Break(status);
      return status;
    }
    SendAll(now, /*heartbeat_due=*/false);
    if (!leader_) return broken_;  // only a failed read of its storage ends it here
    send_now(TakeOutbox());
    if (auto status = storage_.SyncLog(); !status.ok()) {
      Break(status);
      return status;
    }
    log_unsynced_ = false;  // that fsync covered every earlier append too
  } else if (auto status = AppendSynced(entries); !status.ok()) {
    Break(status);
    return status;
  }
  if (options_.TEST_planted_bug == PlantedBug::kAckBeforeCommit) {
    outcomes_.push_back({position, absl::OkStatus()});  // the planted bug: NATS's lazy answer
  } else {
    leader_->pending.push_back(position);
  }
  AdvanceCommit();
  if (leader_) SendAll(now, /*heartbeat_due=*/false);
  return position;
}

absl::Status Replica::AppendSynced(const std::vector<LogEntry>& entries) {
  absl::Status status = storage_.Append(entries);
  if (status.ok()) log_unsynced_ = false;  // its fsync covered every earlier append too
  return status;
}

absl::Status Replica::SyncLog() {
  if (!broken_.ok()) return broken_;
  if (!log_unsynced_) return absl::OkStatus();
  if (auto status = storage_.SyncLog(); !status.ok()) {
    Break(status);
    return status;
  }
  log_unsynced_ = false;
  return absl::OkStatus();
}

void Replica::AdvanceCommit() {
  uint64_t commit = storage_.log_end();
  if (leader_->in_sync.size() < options_.min_in_sync) return;
  for (const auto& node : RequiredFollowers()) {
    auto it = leader_->followers.find(node);
    commit = std::min(commit, it == leader_->followers.end() ? 0 : it->second.match);
  }
  // Raft's rule: count only entries of this epoch; older ones are committed with them.
  if (commit <= commit_seq_ || EpochAtOrZero(commit) != leader_->epoch) return;
  commit_seq_ = commit;
  if (auto status = storage_.ApplyThrough(commit_seq_); !status.ok()) {
    Break(status);
    return;
  }
  if (commit_seq_ > leader_->start_seq) leader_->started = true;
  while (!leader_->pending.empty() && leader_->pending.front().seq <= commit_seq_) {
    outcomes_.push_back({leader_->pending.front(), absl::OkStatus()});
    leader_->pending.pop_front();
  }
  TrimLog();
}

void Replica::TrimLog() {
  const uint64_t applied = storage_.applied_seq();
  const uint64_t base = storage_.log_base().seq;
  // Trimmed in steps of an eighth of the retention, not at every batch: fewer, larger writes.
  const uint64_t step = std::max<uint64_t>(1, options_.log_retention / 8);
  if (applied <= base + options_.log_retention + step) return;
  if (auto status = storage_.TrimThrough(applied - options_.log_retention); !status.ok()) {
    Break(status);
  }
}

void Replica::SendAll(absl::Time now, bool heartbeat_due) {
  for (auto& [node, follower] : leader_->followers) {
    SendTo(now, node, follower, heartbeat_due);
    if (!leader_) return;
  }
}

void Replica::SendTo(absl::Time now, const std::string& node, Follower& follower,
                     bool heartbeat_due) {
  if (follower.snapshot_at) {
    if (now - follower.last_sent >= options_.resend_after) SendChunk(now, node, follower);
    return;
  }
  const uint64_t end = storage_.log_end();
  // Unanswered for too long (dropped, or the follower restarted): send again from its match.
  if (follower.next > follower.match + 1 && now - follower.last_progress >= options_.resend_after) {
    follower.next = follower.match + 1;
    follower.last_progress = now;
  }
  const LogPosition base = storage_.log_base();
  if (follower.next <= base.seq) {
    // It needs entries that are only in the state now: a snapshot of it.
    auto chunks = storage_.SnapshotChunks(options_.snapshot_records_per_chunk);
    if (!chunks.ok()) {
      Break(chunks.status());
      return;
    }
    follower.chunks = std::move(*chunks);
    follower.snapshot_at =
        LogPosition{storage_.applied_seq(), EpochAtOrZero(storage_.applied_seq())};
    follower.next_chunk = 0;
    SendChunk(now, node, follower);
    return;
  }
  if (follower.next > end && !heartbeat_due) return;
  AppendRequest request;
  request.epoch = leader_->epoch;
  request.prev = {follower.next - 1, EpochAtOrZero(follower.next - 1)};
  request.commit_seq = commit_seq_;
  if (follower.next <= end) {
    auto entries = storage_.Read(follower.next, options_.max_entries_per_message);
    if (!entries.ok()) {
      Break(entries.status());
      return;
    }
    request.entries = std::move(*entries);
  }
  follower.next += request.entries.size();
  follower.last_sent = now;
  outbox_.push_back({options_.node_id, node, options_.partition, std::move(request)});
}

void Replica::SendChunk(absl::Time now, const std::string& node, Follower& follower) {
  SnapshotChunk chunk;
  chunk.epoch = leader_->epoch;
  chunk.at = *follower.snapshot_at;
  chunk.index = follower.next_chunk;
  chunk.last = follower.chunks.empty() || chunk.index + 1 >= follower.chunks.size();
  if (chunk.index < follower.chunks.size()) chunk.records = follower.chunks[chunk.index];
  chunk.records.partition = options_.partition;
  follower.last_sent = now;
  outbox_.push_back({options_.node_id, node, options_.partition, std::move(chunk)});
}

// ---- Messages ----

void Replica::Receive(absl::Time now, const ReplicationMessage& message) {
  if (!broken_.ok()) return;
  std::visit(
      [&](const auto& body) {
        using Body = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<Body, AppendRequest>) {
          OnAppendRequest(now, message.from, body);
        } else if constexpr (std::is_same_v<Body, SnapshotChunk>) {
          OnSnapshotChunk(now, message.from, body);
        } else if constexpr (std::is_same_v<Body, AppendResponse>) {
          OnAppendResponse(now, message.from, body);
        } else {
          OnSnapshotAck(now, message.from, body);
        }
      },
      message.body);
}

bool Replica::AcceptEpoch(const std::string& from, int64_t epoch) {
  if (options_.TEST_planted_bug == PlantedBug::kNoEpochFence) {
    if (leader_ && epoch > leader_->epoch) StepDown("a newer epoch leads");
    return !leader_ || epoch != leader_->epoch;
  }
  if (epoch < storage_.epoch_floor()) {
    AppendResponse stale;
    stale.epoch = storage_.epoch_floor();
    stale.result = AppendResponse::Result::kStaleEpoch;
    Reply(from, stale);
    return false;
  }
  if (leader_ && epoch == leader_->epoch) return false;  // our own epoch: never another writer
  if (leader_) StepDown(absl::StrCat("epoch ", epoch, " leads now"));
  return RaiseFloor(epoch);
}

void Replica::Reply(const std::string& to, AppendResponse response) {
  outbox_.push_back({options_.node_id, to, options_.partition, std::move(response)});
}

void Replica::OnAppendRequest(absl::Time /*now*/, const std::string& from,
                              const AppendRequest& request) {
  if (!AcceptEpoch(from, request.epoch)) return;
  AppendResponse response;
  response.epoch = request.epoch;
  const LogPosition base = storage_.log_base();
  const uint64_t applied = storage_.applied_seq();
  // Entries through the base are in the state: committed, so equal to the leader's.
  size_t skip = 0;
  if (request.prev.seq < base.seq) {
    skip = std::min<uint64_t>(request.entries.size(), base.seq - request.prev.seq);
  } else if (request.prev.seq > storage_.log_end() ||
             EpochAtOrZero(request.prev.seq) != request.prev.epoch) {
    // Everything applied is committed and matches; the leader goes on from there.
    response.result = AppendResponse::Result::kMismatch;
    response.retry_from = std::min(applied, storage_.log_end()) + 1;
    Reply(from, response);
    return;
  }
  std::vector<LogEntry> to_append;
  for (size_t i = skip; i < request.entries.size(); ++i) {
    const LogEntry& entry = request.entries[i];
    if (to_append.empty() && entry.seq <= storage_.log_end()) {
      if (EpochAtOrZero(entry.seq) == entry.epoch) continue;
      // I5: what an older epoch left where the leader's log differs goes.
      if (entry.seq <= storage_.applied_seq()) {
        Break(absl::InternalError(absl::StrCat("partition ", options_.partition, ": entry ",
                                               entry.seq, " of epoch ", entry.epoch,
                                               " conflicts with an applied one")));
        return;
      }
      if (auto status = storage_.TruncateAfter(entry.seq - 1); !status.ok()) {
        Break(status);
        return;
      }
    }
    to_append.push_back(entry);
  }
  if (!to_append.empty()) {
    if (auto status = AppendSynced(to_append); !status.ok()) {
      Break(status);
      return;
    }
  }
  response.match_seq = std::max<uint64_t>(request.prev.seq + request.entries.size(), base.seq);
  // What the leader has committed, as far as this log matches it, is known committed here.
  commit_seq_ = std::max(commit_seq_, std::min(request.commit_seq, response.match_seq));
  if (options_.TEST_planted_bug == PlantedBug::kApplyOnReceipt) {
    commit_seq_ = std::max(commit_seq_, storage_.log_end());
    ApplyCommitted();
  } else if (commit_seq_ - storage_.applied_seq() > options_.log_retention / 2) {
    ApplyCommitted();  // else at the next tick: see ApplyCommitted
  }
  if (!broken_.ok()) return;
  Reply(from, response);
}

void Replica::ApplyCommitted() {
  if (commit_seq_ <= storage_.applied_seq()) return;
  if (auto status = storage_.ApplyThrough(std::min(commit_seq_, storage_.log_end()));
      !status.ok()) {
    Break(status);
    return;
  }
  TrimLog();
}

void Replica::OnSnapshotChunk(absl::Time /*now*/, const std::string& from,
                              const SnapshotChunk& chunk) {
  if (!AcceptEpoch(from, chunk.epoch)) return;
  // It has that state already: applied, or in its log as the entry the snapshot ends at (same
  // seq and epoch: its log equals the leader's up to there). Installing it would drop the log
  // above it, and that may hold batches acknowledged with this replica in the in-sync set
  // (a new leader snapshots at what it has applied, which can be below what was acknowledged).
  // The leader goes on from there; what differs above is replaced by appends as usual.
  const bool in_log = chunk.at.seq <= storage_.log_end() && chunk.at.epoch != 0 &&
                      EpochAtOrZero(chunk.at.seq) == chunk.at.epoch;
  if (chunk.at.seq <= storage_.applied_seq() || in_log) {
    AppendResponse response;
    response.epoch = chunk.epoch;
    response.match_seq = chunk.at.seq;
    Reply(from, response);
    return;
  }
  // A new snapshot starts at chunk 0; a repeated chunk 0 of the one being staged is a duplicate.
  if (chunk.index == 0 && (!staging_ || !(staging_->at == chunk.at))) {
    staging_ = Staging{chunk.at, {}};
  }
  if (staging_ && staging_->at == chunk.at && chunk.index == staging_->chunks.size()) {
    staging_->chunks.push_back(chunk.records);
    if (chunk.last) {
      if (auto status = storage_.InstallSnapshot(chunk.at, staging_->chunks); !status.ok()) {
        Break(status);
        return;
      }
      staging_.reset();
      commit_seq_ = std::max(commit_seq_, chunk.at.seq);
      AppendResponse response;
      response.epoch = chunk.epoch;
      response.match_seq = chunk.at.seq;
      Reply(from, response);
      return;
    }
  }
  SnapshotAck ack;
  ack.epoch = chunk.epoch;
  ack.at = chunk.at;
  ack.next_index = staging_ && staging_->at == chunk.at ? staging_->chunks.size() : 0;
  outbox_.push_back({options_.node_id, from, options_.partition, ack});
}

void Replica::OnAppendResponse(absl::Time now, const std::string& from,
                               const AppendResponse& response) {
  if (!leader_) return;
  if (response.result == AppendResponse::Result::kStaleEpoch) {
    if (response.epoch > leader_->epoch) StepDown(absl::StrCat(from, " has seen a newer epoch"));
    return;
  }
  if (response.epoch != leader_->epoch) return;  // an answer to an earlier leader
  auto it = leader_->followers.find(from);
  if (it == leader_->followers.end()) return;
  Follower& follower = it->second;
  if (response.result == AppendResponse::Result::kMismatch) {
    follower.next = std::max(response.retry_from, follower.match + 1);
    follower.last_progress = now;
    SendTo(now, from, follower, /*heartbeat_due=*/false);
    return;
  }
  if (response.match_seq > follower.match) {
    follower.match = response.match_seq;
    follower.last_progress = now;
  }
  if (follower.match >= storage_.log_end()) follower.caught_up_at = now;
  follower.next = std::max(follower.next, follower.match + 1);
  if (follower.snapshot_at && follower.match >= follower.snapshot_at->seq) {
    follower.snapshot_at.reset();
    follower.chunks.clear();
  }
  AdvanceCommit();
  if (!leader_) return;
  SendTo(now, from, leader_->followers[from], /*heartbeat_due=*/false);
}

void Replica::OnSnapshotAck(absl::Time now, const std::string& from, const SnapshotAck& ack) {
  if (!leader_ || ack.epoch != leader_->epoch) return;
  auto it = leader_->followers.find(from);
  if (it == leader_->followers.end()) return;
  Follower& follower = it->second;
  if (!follower.snapshot_at || !(*follower.snapshot_at == ack.at)) return;
  // The follower says what it has: go on from there (a late ack only makes the leader send a
  // chunk again, which the follower ignores and answers with where it is).
  if (ack.next_index > follower.chunks.size()) return;
  follower.next_chunk = ack.next_index;
  follower.last_progress = now;
  SendChunk(now, from, follower);
}

std::map<std::string, uint64_t> Replica::FollowerLag() const {
  std::map<std::string, uint64_t> lag;
  if (!leader_) return lag;
  const uint64_t end = storage_.log_end();
  for (const auto& [node, follower] : leader_->followers)
    lag[node] = end > follower.match ? end - follower.match : 0;
  return lag;
}

std::vector<ReplicationMessage> Replica::TakeOutbox() { return std::exchange(outbox_, {}); }

std::vector<ProposalOutcome> Replica::TakeOutcomes() { return std::exchange(outcomes_, {}); }

}  // namespace jobbroker::cluster
