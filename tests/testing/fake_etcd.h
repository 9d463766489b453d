#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "core/clock.h"

namespace jobbroker::testing {

// An in-memory etcd for tests and the deterministic cluster simulator: one mutex, one revision
// counter, the history of every change since the last Compact (so watches can start in the
// past), leases that expire on an injected clock. It passes the same conformance suite as the
// real etcd (tests/cluster/etcd/etcd_conformance_test.cc).
//
// Linearizable: every call runs whole under one mutex. Time moves only with the clock: a lease
// expires when the clock has passed its deadline and then either ExpireLeases() or any call is
// made (every call expires what is due first), deleting its keys in one revision per lease.
//
// Watch callbacks run on the thread that made the change (or called Watch, for the changes a
// watch starts behind, or Heal), after the change and outside the mutex, one revision per call,
// every watch in global revision order; so a single-threaded simulator is deterministic. If
// another thread is already delivering events, that thread delivers the new ones too, and the
// change returns first. A callback may call the fake (a change it makes is delivered after it
// returns), but the caller of a change must not hold a lock its own callbacks take.
//
// Clients: the FakeEtcd is itself a client (named ""); Connect(name) makes more, which share the
// state, so each simulated node can have its own and be cut off alone. Faults: FailNextCalls(n)
// makes the next n calls of any client kUnavailable (without effect); Partition(name) makes
// every call of that client kUnavailable and holds back its watches' events until Heal(name),
// which delivers what was held back (or the compaction error), as a resumed real watch would.
// Watch and CancelWatch never fail for either fault: like GrpcEtcd's, a cut-off watch waits.
//
// Thread-safe. Clients made by Connect must not outlive the FakeEtcd.
class FakeEtcd final : public cluster::Etcd {
 public:
  explicit FakeEtcd(const core::Clock& clock);
  ~FakeEtcd() override;

  FakeEtcd(const FakeEtcd&) = delete;
  FakeEtcd& operator=(const FakeEtcd&) = delete;

  // A client of the same store, named `name` for Partition and Heal.
  std::unique_ptr<cluster::Etcd> Connect(std::string name);

  // Expires every lease whose deadline the clock has passed: its keys are deleted (one revision
  // per lease) and the watches told.
  void ExpireLeases();
  // Forgets the history below `revision`: a watch that needs an older revision gets kOutOfRange.
  // kOutOfRange if `revision` is already compacted or is above the current revision.
  absl::Status Compact(int64_t revision);
  // The next `calls` calls, of any client, fail with kUnavailable and change nothing.
  void FailNextCalls(int calls);
  // Every call of client `name` fails with kUnavailable, and its watches receive nothing, until
  // Heal(name).
  void Partition(const std::string& name);
  void Heal(const std::string& name);
  // The store's current revision.
  int64_t revision() const;

  // cluster::Etcd, as client "".
  absl::StatusOr<cluster::LeaseId> GrantLease(absl::Duration ttl) override;
  absl::StatusOr<absl::Duration> KeepAliveOnce(cluster::LeaseId lease) override;
  absl::Status RevokeLease(cluster::LeaseId lease) override;
  absl::StatusOr<cluster::GetResult> Get(const std::string& key) override;
  absl::StatusOr<cluster::GetResult> GetPrefix(const std::string& prefix) override;
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              cluster::LeaseId lease = 0) override;
  absl::StatusOr<int64_t> Delete(const std::string& key) override;
  absl::StatusOr<cluster::TxnResult> Txn(const std::vector<cluster::Compare>& compares,
                                         const std::vector<cluster::TxnOp>& then_ops,
                                         const std::vector<cluster::TxnOp>& else_ops) override;
  absl::StatusOr<cluster::WatchId> Watch(const std::string& prefix, int64_t start_revision,
                                         cluster::WatchCallback callback) override;
  absl::Status CancelWatch(cluster::WatchId watch) override;

 private:
  class Client;
  struct Lease {
    absl::Duration ttl;
    absl::Time deadline;
    std::set<std::string> keys;
  };
  // The events of one revision.
  struct Revision {
    int64_t revision = 0;
    std::vector<cluster::WatchEvent> events;
  };
  struct Watcher {
    std::string client;
    std::string prefix;
    // The first revision not yet delivered (or skipped as not matching).
    int64_t next_revision = 0;
    std::shared_ptr<cluster::WatchCallback> callback;
    // Set once it reported an error or was cancelled.
    bool done = false;
  };

  // The Etcd calls of client `client`.
  absl::StatusOr<cluster::LeaseId> DoGrantLease(const std::string& client, absl::Duration ttl);
  absl::StatusOr<absl::Duration> DoKeepAliveOnce(const std::string& client, cluster::LeaseId lease);
  absl::Status DoRevokeLease(const std::string& client, cluster::LeaseId lease);
  absl::StatusOr<cluster::GetResult> DoGet(const std::string& client, const std::string& key,
                                           bool prefix);
  absl::StatusOr<int64_t> DoPut(const std::string& client, const std::string& key,
                                const std::string& value, cluster::LeaseId lease);
  absl::StatusOr<int64_t> DoDelete(const std::string& client, const std::string& key);
  absl::StatusOr<cluster::TxnResult> DoTxn(const std::string& client,
                                           const std::vector<cluster::Compare>& compares,
                                           const std::vector<cluster::TxnOp>& then_ops,
                                           const std::vector<cluster::TxnOp>& else_ops);
  absl::StatusOr<cluster::WatchId> DoWatch(const std::string& client, const std::string& prefix,
                                           int64_t start_revision, cluster::WatchCallback callback);
  absl::Status DoCancelWatch(const std::string& client, cluster::WatchId watch);

  // kUnavailable if `client` is partitioned or a FailNextCalls call is due (counting it).
  absl::Status CheckReachableLocked(const std::string& client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CompareHoldsLocked(const cluster::Compare& compare) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The keys a get or delete op covers, in key order.
  std::vector<std::string> KeysOfLocked(const std::string& key, bool prefix) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The writes below go into `pending_` and become revision_ + 1 at CommitLocked.
  void PutLocked(const std::string& key, const std::string& value, cluster::LeaseId lease)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeleteLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the pending change: raises the revision if it changed anything and records its events.
  void CommitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers every event the watches have not had yet, unless another thread is doing so.
  void DeliverWatchEvents() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const core::Clock& clock_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1;  // a new etcd is at revision 1
  int64_t compact_revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, cluster::KeyValue> kvs_ ABSL_GUARDED_BY(mu_);
  std::map<cluster::LeaseId, Lease> leases_ ABSL_GUARDED_BY(mu_);
  cluster::LeaseId next_lease_ ABSL_GUARDED_BY(mu_) = 0x694d'0000'0001;
  // Every revision above compact_revision_ (all of them before a Compact), oldest first.
  std::vector<Revision> history_ ABSL_GUARDED_BY(mu_);
  // The events of the change being made, not yet in history_.
  std::vector<cluster::WatchEvent> pending_ ABSL_GUARDED_BY(mu_);
  std::map<cluster::WatchId, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  cluster::WatchId next_watch_ ABSL_GUARDED_BY(mu_) = 1;
  std::set<std::string> partitioned_ ABSL_GUARDED_BY(mu_);
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether a thread is in DeliverWatchEvents, which one, and whose callback it is running.
  // CancelWatch waits on delivered_ for the callback it cancels to return.
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id delivering_thread_ ABSL_GUARDED_BY(mu_);
  cluster::WatchId in_callback_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar delivered_;
};

}  // namespace jobbroker::testing
