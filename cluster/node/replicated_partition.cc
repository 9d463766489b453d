#include "cluster/node/replicated_partition.h"

#include "absl/strings/str_cat.h"

namespace jobbroker::cluster {

absl::StatusOr<std::unique_ptr<ReplicatedPartition>> ReplicatedPartition::Open(
    storage::RocksDbStore* store, Etcd& etcd, const core::Clock& clock,
    ReplicatedPartitionOptions options, Send send) {
  auto storage = RocksDbReplicaStorage::Open(store, options.replica.partition);
  if (!storage.ok()) return storage.status();
  return std::unique_ptr<ReplicatedPartition>(new ReplicatedPartition(
      store, *std::move(storage), etcd, clock, std::move(options), std::move(send)));
}

ReplicatedPartition::ReplicatedPartition(storage::RocksDbStore* store,
                                         std::unique_ptr<RocksDbReplicaStorage> storage, Etcd& etcd,
                                         const core::Clock& clock,
                                         ReplicatedPartitionOptions options, Send send)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      send_(std::move(send)),
      storage_(std::move(storage)),
      replica_(options_.replica, *storage_, etcd) {
  receiver_ = std::thread([this] { ReceiveLoop(); });
}

ReplicatedPartition::~ReplicatedPartition() {
  Stop();
  if (receiver_.joinable()) receiver_.join();
}

void ReplicatedPartition::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  served_.store(false, std::memory_order_release);
}

void ReplicatedPartition::ReceiveLoop() {
  while (true) {
    std::vector<ReplicationMessage> sending;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ReplicatedPartition* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->inbox_.empty() || !self->outbox_.empty();
          },
          this));
      if (stopping_) return;
      std::vector<ReplicationMessage> received;
      received.swap(inbox_);
      for (const ReplicationMessage& message : received) replica_.Receive(clock_.Now(), message);
      CollectLocked();
      sending.swap(outbox_);
      send_mu_.Lock();  // before mu_ is let go: a Write sending after this waits for these
    }
    // Outside mu_: the transport may block briefly on a full stream.
    for (const ReplicationMessage& message : sending) send_(message);
    send_mu_.Unlock();
  }
}

void ReplicatedPartition::SendNowLocked(std::vector<ReplicationMessage> messages) {
  std::vector<ReplicationMessage> sending;
  sending.swap(outbox_);
  for (ReplicationMessage& message : messages) sending.push_back(std::move(message));
  absl::MutexLock send_lock(&send_mu_);
  for (const ReplicationMessage& message : sending) send_(message);
}

void ReplicatedPartition::CollectLocked() {
  for (ProposalOutcome& outcome : replica_.TakeOutcomes()) {
    auto found = waiting_.find({outcome.position.seq, outcome.position.epoch});
    if (found != waiting_.end()) found->second = std::move(outcome.status);
  }
  for (ReplicationMessage& message : replica_.TakeOutbox()) outbox_.push_back(std::move(message));
  UpdateServedLocked();
}

void ReplicatedPartition::UpdateServedLocked() {
  served_.store(!stopping_ && replica_.serving() && replica_.epoch() == broker_epoch_,
                std::memory_order_release);
}

ReplicatedPartition::State ReplicatedPartition::Tick(const PartitionView& view,
                                                     const NodeLease& lease) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return StateLocked();
  replica_.Tick(clock_.Now(), view, lease);
  CollectLocked();
  return StateLocked();
}

void ReplicatedPartition::Deliver(ReplicationMessage message) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  inbox_.push_back(std::move(message));
}

ReplicatedPartition::State ReplicatedPartition::state() const {
  absl::MutexLock lock(&mu_);
  return StateLocked();
}

std::map<std::string, uint64_t> ReplicatedPartition::FollowerLag() const {
  absl::MutexLock lock(&mu_);
  return replica_.FollowerLag();
}

ReplicatedPartition::State ReplicatedPartition::StateLocked() const {
  return State{replica_.role(),         replica_.epoch(),      replica_.serving(),
               broker_epoch_,           replica_.commit_seq(), storage_->log_end(),
               storage_->applied_seq(), replica_.broken()};
}

absl::Status ReplicatedPartition::NotServingLocked() const {
  return core::NotStorageFailure(NotServingReasonLocked());
}

absl::Status ReplicatedPartition::NotServingReasonLocked() const {
  const uint32_t p = options_.replica.partition;
  const std::string& self = options_.replica.node_id;
  if (!replica_.broken().ok()) {
    return absl::UnavailableError(absl::StrCat("partition ", p, ": the replica on ", self,
                                               " stopped: ", replica_.broken().message()));
  }
  if (stopping_) {
    return absl::UnavailableError(absl::StrCat("partition ", p, ": ", self, " is shutting down"));
  }
  if (replica_.role() != Replica::Role::kLeader)
    return absl::UnavailableError(absl::StrCat("partition ", p, ": ", self, " does not lead it"));
  if (!replica_.serving()) {
    return absl::UnavailableError(
        absl::StrCat("partition ", p, ": ", self, " is starting epoch ", replica_.epoch()));
  }
  return absl::UnavailableError(absl::StrCat("partition ", p, ": ", self, " leads epoch ",
                                             replica_.epoch(), " but its broker was built in ",
                                             broker_epoch_, " and must rebuild first"));
}

absl::Status ReplicatedPartition::Write(absl::Span<const core::Transition> transitions) {
  return WriteWith(transitions, /*durable=*/true);
}

absl::Status ReplicatedPartition::WriteUnsynced(absl::Span<const core::Transition> transitions) {
  return WriteWith(transitions, /*durable=*/false);
}

absl::Status ReplicatedPartition::Sync() {
  absl::MutexLock lock(&mu_);
  absl::Status status = replica_.SyncLog();
  CollectLocked();
  return status;
}

absl::Status ReplicatedPartition::WriteWith(absl::Span<const core::Transition> transitions,
                                            bool durable) {
  std::vector<core::Transition> proposal;
  for (const core::Transition& t : transitions)
    if (!t.empty()) proposal.push_back(t);
  absl::MutexLock lock(&mu_);
  // The fence: only the broker rebuilt in the epoch this node leads now may write.
  if (stopping_ || !replica_.serving() || replica_.epoch() != broker_epoch_)
    return NotServingLocked();
  if (proposal.empty()) return absl::OkStatus();
  const absl::Time proposed = clock_.Now();
  absl::StatusOr<LogPosition> position = replica_.ProposeBatch(
      proposed, std::move(proposal),
      [this](std::vector<ReplicationMessage> messages) {
        mu_.AssertHeld();  // called inside ProposeBatch, under this Write's lock
        SendNowLocked(std::move(messages));
      },
      durable);
  if (!position.ok()) {
    CollectLocked();
    // kFailedPrecondition (not the leader) cannot happen under the fence; a refusal here is
    // kUnavailable (too few in sync) or the storage's own error.
    return NotStorageUnlessBrokenLocked(position.status().code() ==
                                                absl::StatusCode::kFailedPrecondition
                                            ? absl::UnavailableError(position.status().message())
                                            : position.status());
  }
  const auto key = std::make_pair(position->seq, position->epoch);
  // Registered before the outcomes are collected: a proposal that committed inside
  // ProposeBatch (no follower to wait for) has its outcome already.
  const std::optional<absl::Status>& outcome = waiting_[key];
  CollectLocked();
  struct Done {
    const std::optional<absl::Status>* outcome;
    const bool* stopping;
    bool operator()() const { return outcome->has_value() || *stopping; }
  };
  Done done{&outcome, &stopping_};
  const bool in_time = mu_.AwaitWithTimeout(absl::Condition(&done), options_.commit_timeout);
  absl::Status result;
  if (outcome.has_value()) {
    result = *outcome;
  } else if (!in_time) {
    result = absl::UnavailableError(absl::StrCat(
        "partition ", options_.replica.partition, ": not committed within ",
        absl::FormatDuration(options_.commit_timeout), "; the outcome of this write is unknown"));
  } else {
    result = absl::UnavailableError(absl::StrCat("partition ", options_.replica.partition, ": ",
                                                 options_.replica.node_id,
                                                 " is shutting down; the outcome is unknown"));
  }
  waiting_.erase(key);
  if (result.ok() && options_.on_commit_wait) options_.on_commit_wait(clock_.Now() - proposed);
  return NotStorageUnlessBrokenLocked(std::move(result));
}

absl::Status ReplicatedPartition::NotStorageUnlessBrokenLocked(absl::Status status) const {
  // Leadership lost, replicas not keeping up, a commit timeout, a shutdown: the broker answers
  // them as they are, and its flush at shutdown does not count them as the store failing.
  if (status.ok() || !replica_.broken().ok()) return status;
  return core::NotStorageFailure(std::move(status));
}

absl::StatusOr<core::Job> ReplicatedPartition::ReadJob(uint32_t partition, const std::string& id) {
  return store_->ReadJob(partition, id);
}

absl::Status ReplicatedPartition::Recover(uint32_t partition, core::RecoveryVisitor& visitor) {
  // Not under mu_: a long read must not hold up replication. Nothing of this partition is
  // applied meanwhile: its broker writes nothing until it has rebuilt, and the replica serves.
  return store_->Recover(partition, visitor);
}

absl::Status ReplicatedPartition::Resume() {
  absl::MutexLock lock(&mu_);
  if (stopping_ || !replica_.serving()) return NotServingLocked();
  // The epoch-start entry commits everything before it, and the leader applies what commits:
  // the records are the partition's whole state unless a write of this epoch is pending.
  if (storage_->applied_seq() != storage_->log_end()) {
    return absl::UnavailableError(absl::StrCat(
        "partition ", options_.replica.partition, ": applied through ", storage_->applied_seq(),
        " of ", storage_->log_end(), "; the broker rebuilds once every entry is applied"));
  }
  broker_epoch_ = replica_.epoch();
  UpdateServedLocked();
  return absl::OkStatus();
}

}  // namespace jobbroker::cluster
