#include "tests/testing/fake_etcd.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "core/status_macros.h"

namespace jobbroker::testing {

using cluster::Compare;
using cluster::GetResult;
using cluster::KeyValue;
using cluster::LeaseId;
using cluster::TxnOp;
using cluster::TxnOpResult;
using cluster::TxnResult;
using cluster::WatchCallback;
using cluster::WatchEvent;
using cluster::WatchId;

// A client of the shared state: every call is the FakeEtcd's, in the client's name.
class FakeEtcd::Client final : public cluster::Etcd {
 public:
  Client(FakeEtcd& fake, std::string name) : fake_(fake), name_(std::move(name)) {}

  absl::StatusOr<LeaseId> GrantLease(absl::Duration ttl) override {
    return fake_.DoGrantLease(name_, ttl);
  }
  absl::StatusOr<absl::Duration> KeepAliveOnce(LeaseId lease) override {
    return fake_.DoKeepAliveOnce(name_, lease);
  }
  absl::Status RevokeLease(LeaseId lease) override { return fake_.DoRevokeLease(name_, lease); }
  absl::StatusOr<GetResult> Get(const std::string& key) override {
    return fake_.DoGet(name_, key, /*prefix=*/false);
  }
  absl::StatusOr<GetResult> GetPrefix(const std::string& prefix) override {
    return fake_.DoGet(name_, prefix, /*prefix=*/true);
  }
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              LeaseId lease) override {
    return fake_.DoPut(name_, key, value, lease);
  }
  absl::StatusOr<int64_t> Delete(const std::string& key) override {
    return fake_.DoDelete(name_, key);
  }
  absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                const std::vector<TxnOp>& then_ops,
                                const std::vector<TxnOp>& else_ops) override {
    return fake_.DoTxn(name_, compares, then_ops, else_ops);
  }
  absl::StatusOr<WatchId> Watch(const std::string& prefix, int64_t start_revision,
                                WatchCallback callback) override {
    return fake_.DoWatch(name_, prefix, start_revision, std::move(callback));
  }
  absl::Status CancelWatch(WatchId watch) override { return fake_.DoCancelWatch(name_, watch); }

 private:
  FakeEtcd& fake_;
  const std::string name_;
};

namespace {

bool Holds(int64_t actual, Compare::Op op, int64_t wanted) {
  switch (op) {
    case Compare::Op::kEqual:
      return actual == wanted;
    case Compare::Op::kNotEqual:
      return actual != wanted;
    case Compare::Op::kLess:
      return actual < wanted;
    case Compare::Op::kGreater:
      return actual > wanted;
  }
  return false;
}

bool Holds(const std::string& actual, Compare::Op op, const std::string& wanted) {
  const int c = actual.compare(wanted);
  return Holds(c < 0 ? -1 : (c > 0 ? 1 : 0), op, 0);
}

// Whether two write ops of one branch touch a common key (etcd: "duplicate key given in txn
// request").
bool Overlap(const TxnOp& a, const TxnOp& b) {
  if (a.type == TxnOp::Type::kGet || b.type == TxnOp::Type::kGet) return false;
  const bool a_range = a.type == TxnOp::Type::kDelete && a.prefix;
  const bool b_range = b.type == TxnOp::Type::kDelete && b.prefix;
  if (a_range && b_range) return false;  // etcd allows overlapping range deletes
  if (a_range) return absl::StartsWith(b.key, a.key);
  if (b_range) return absl::StartsWith(a.key, b.key);
  return a.key == b.key;
}

absl::Status CheckNoDuplicateKeys(const std::vector<TxnOp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    for (size_t j = i + 1; j < ops.size(); ++j) {
      if (Overlap(ops[i], ops[j])) {
        return absl::InvalidArgumentError(
            absl::StrCat("duplicate key given in txn request: ", ops[j].key));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LeaseNotFound(LeaseId lease) {
  return absl::NotFoundError(absl::StrCat("lease ", lease, " not found"));
}

}  // namespace

FakeEtcd::FakeEtcd(const core::Clock& clock) : clock_(clock) {}

FakeEtcd::~FakeEtcd() = default;

std::unique_ptr<cluster::Etcd> FakeEtcd::Connect(std::string name) {
  return std::make_unique<Client>(*this, std::move(name));
}

void FakeEtcd::ExpireLeases() {
  {
    absl::MutexLock lock(&mu_);
    ExpireLeasesLocked();
  }
  DeliverWatchEvents();
}

absl::Status FakeEtcd::Compact(int64_t revision) {
  absl::MutexLock lock(&mu_);
  if (revision <= compact_revision_) {
    return absl::OutOfRangeError(
        absl::StrCat("revision ", revision, " has been compacted (at ", compact_revision_, ")"));
  }
  if (revision > revision_) {
    return absl::OutOfRangeError(
        absl::StrCat("revision ", revision, " is a future revision (now ", revision_, ")"));
  }
  compact_revision_ = revision;
  history_.erase(history_.begin(),
                 std::lower_bound(history_.begin(), history_.end(), revision,
                                  [](const Revision& r, int64_t v) { return r.revision < v; }));
  return absl::OkStatus();
}

void FakeEtcd::FailNextCalls(int calls) {
  absl::MutexLock lock(&mu_);
  fail_next_ = calls;
}

void FakeEtcd::Partition(const std::string& name) {
  absl::MutexLock lock(&mu_);
  partitioned_.insert(name);
}

void FakeEtcd::Heal(const std::string& name) {
  {
    absl::MutexLock lock(&mu_);
    partitioned_.erase(name);
  }
  DeliverWatchEvents();
}

int64_t FakeEtcd::revision() const {
  absl::MutexLock lock(&mu_);
  return revision_;
}

absl::StatusOr<LeaseId> FakeEtcd::GrantLease(absl::Duration ttl) { return DoGrantLease("", ttl); }
absl::StatusOr<absl::Duration> FakeEtcd::KeepAliveOnce(LeaseId lease) {
  return DoKeepAliveOnce("", lease);
}
absl::Status FakeEtcd::RevokeLease(LeaseId lease) { return DoRevokeLease("", lease); }
absl::StatusOr<GetResult> FakeEtcd::Get(const std::string& key) { return DoGet("", key, false); }
absl::StatusOr<GetResult> FakeEtcd::GetPrefix(const std::string& prefix) {
  return DoGet("", prefix, true);
}
absl::StatusOr<int64_t> FakeEtcd::Put(const std::string& key, const std::string& value,
                                      LeaseId lease) {
  return DoPut("", key, value, lease);
}
absl::StatusOr<int64_t> FakeEtcd::Delete(const std::string& key) { return DoDelete("", key); }
absl::StatusOr<TxnResult> FakeEtcd::Txn(const std::vector<Compare>& compares,
                                        const std::vector<TxnOp>& then_ops,
                                        const std::vector<TxnOp>& else_ops) {
  return DoTxn("", compares, then_ops, else_ops);
}
absl::StatusOr<WatchId> FakeEtcd::Watch(const std::string& prefix, int64_t start_revision,
                                        WatchCallback callback) {
  return DoWatch("", prefix, start_revision, std::move(callback));
}
absl::Status FakeEtcd::CancelWatch(WatchId watch) { return DoCancelWatch("", watch); }

absl::StatusOr<LeaseId> FakeEtcd::DoGrantLease(const std::string& client, absl::Duration ttl) {
  LeaseId id;
  {
    absl::MutexLock lock(&mu_);
    BROKER_RETURN_IF_ERROR(CheckReachableLocked(client));
    ExpireLeasesLocked();
    // etcd's TTLs are whole seconds.
    const absl::Duration seconds = absl::Ceil(std::max(ttl, absl::Seconds(1)), absl::Seconds(1));
    id = next_lease_++;
    leases_[id] = Lease{seconds, clock_.Now() + seconds, {}};
  }
  DeliverWatchEvents();
  return id;
}

absl::StatusOr<absl::Duration> FakeEtcd::DoKeepAliveOnce(const std::string& client, LeaseId lease) {
  absl::StatusOr<absl::Duration> result;
  {
    absl::MutexLock lock(&mu_);
    BROKER_RETURN_IF_ERROR(CheckReachableLocked(client));
    ExpireLeasesLocked();
    auto it = leases_.find(lease);
    if (it == leases_.end()) {
      result = LeaseNotFound(lease);
    } else {
      it->second.deadline = clock_.Now() + it->second.ttl;
      result = it->second.ttl;
    }
  }
  DeliverWatchEvents();
  return result;
}

absl::Status FakeEtcd::DoRevokeLease(const std::string& client, LeaseId lease) {
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    BROKER_RETURN_IF_ERROR(CheckReachableLocked(client));
    ExpireLeasesLocked();
    auto it = leases_.find(lease);
    if (it == leases_.end()) {
      result = LeaseNotFound(lease);
    } else {
      const std::set<std::string> keys = it->second.keys;
      for (const std::string& key : keys) DeleteLocked(key);
      CommitLocked();
      leases_.erase(lease);
    }
  }
  DeliverWatchEvents();
  return result;
}

absl::StatusOr<GetResult> FakeEtcd::DoGet(const std::string& client, const std::string& key,
                                          bool prefix) {
  GetResult result;
  {
    absl::MutexLock lock(&mu_);
    BROKER_RETURN_IF_ERROR(CheckReachableLocked(client));
    ExpireLeasesLocked();
    for (const std::string& k : KeysOfLocked(key, prefix)) result.kvs.push_back(kvs_.at(k));
    result.revision = revision_;
  }
  DeliverWatchEvents();
  return result;
}

absl::StatusOr<int64_t> FakeEtcd::DoPut(const std::string& client, const std::string& key,
                                        const std::string& value, LeaseId lease) {
  int64_t revision;
  {
    absl::MutexLock lock(&mu_);
    BROKER_RETURN_IF_ERROR(CheckReachableLocked(client));
    ExpireLeasesLocked();
    if (lease != 0 && !leases_.contains(lease)) return LeaseNotFound(lease);
    PutLocked(key, value, lease);
    CommitLocked();
    revision = revision_;
  }
  DeliverWatchEvents();
  return revision;
}

absl::StatusOr<int64_t> FakeEtcd::DoDelete(const std::string& client, const std::string& key) {
  int64_t revision;
  {
    absl::MutexLock lock(&mu_);
    BROKER_RETURN_IF_ERROR(CheckReachableLocked(client));
    ExpireLeasesLocked();
    if (kvs_.contains(key)) DeleteLocked(key);
    CommitLocked();
    revision = revision_;
  }
  DeliverWatchEvents();
  return revision;
}

absl::StatusOr<TxnResult> FakeEtcd::DoTxn(const std::string& client,
                                          const std::vector<Compare>& compares,
                                          const std::vector<TxnOp>& then_ops,
                                          const std::vector<TxnOp>& else_ops) {
  TxnResult result;
  {
    absl::MutexLock lock(&mu_);
    BROKER_RETURN_IF_ERROR(CheckReachableLocked(client));
    ExpireLeasesLocked();
    BROKER_RETURN_IF_ERROR(CheckNoDuplicateKeys(then_ops));
    BROKER_RETURN_IF_ERROR(CheckNoDuplicateKeys(else_ops));
    result.succeeded = std::all_of(compares.begin(), compares.end(), [this](const Compare& c) {
      mu_.AssertHeld();
      return CompareHoldsLocked(c);
    });
    const std::vector<TxnOp>& ops = result.succeeded ? then_ops : else_ops;
    for (const TxnOp& op : ops) {
      if (op.type == TxnOp::Type::kPut && op.lease != 0 && !leases_.contains(op.lease)) {
        return LeaseNotFound(op.lease);
      }
    }
    for (const TxnOp& op : ops) {
      TxnOpResult& r = result.results.emplace_back();
      r.type = op.type;
      switch (op.type) {
        case TxnOp::Type::kPut:
          PutLocked(op.key, op.value, op.lease);
          break;
        case TxnOp::Type::kGet:
          for (const std::string& k : KeysOfLocked(op.key, op.prefix)) r.kvs.push_back(kvs_.at(k));
          break;
        case TxnOp::Type::kDelete:
          for (const std::string& k : KeysOfLocked(op.key, op.prefix)) {
            DeleteLocked(k);
            ++r.deleted;
          }
          break;
      }
    }
    CommitLocked();
    result.revision = revision_;
  }
  DeliverWatchEvents();
  return result;
}

absl::StatusOr<WatchId> FakeEtcd::DoWatch(const std::string& client, const std::string& prefix,
                                          int64_t start_revision, WatchCallback callback) {
  WatchId id;
  {
    absl::MutexLock lock(&mu_);
    id = next_watch_++;
    Watcher& w = watchers_[id];
    w.client = client;
    w.prefix = prefix;
    w.next_revision = start_revision > 0 ? start_revision : revision_ + 1;
    w.callback = std::make_shared<WatchCallback>(std::move(callback));
  }
  DeliverWatchEvents();
  return id;
}

absl::Status FakeEtcd::DoCancelWatch(const std::string& /*client*/, WatchId watch) {
  absl::MutexLock lock(&mu_);
  auto it = watchers_.find(watch);
  if (it == watchers_.end()) return absl::NotFoundError(absl::StrCat("watch ", watch));
  it->second.done = true;
  it->second.callback.reset();
  // The callback may be running on another thread: wait for it, unless this is that thread.
  while (in_callback_ == watch && delivering_thread_ != std::this_thread::get_id()) {
    delivered_.Wait(&mu_);
  }
  return absl::OkStatus();
}

absl::Status FakeEtcd::CheckReachableLocked(const std::string& client) {
  if (partitioned_.contains(client)) {
    return absl::UnavailableError(
        absl::StrCat("fake etcd: client \"", client, "\" is partitioned"));
  }
  if (fail_next_ > 0) {
    --fail_next_;
    return absl::UnavailableError("fake etcd: injected failure");
  }
  return absl::OkStatus();
}

void FakeEtcd::ExpireLeasesLocked() {
  const absl::Time now = clock_.Now();
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    const std::set<std::string> keys = it->second.keys;
    for (const std::string& key : keys) DeleteLocked(key);
    CommitLocked();
    it = leases_.erase(it);
  }
}

bool FakeEtcd::CompareHoldsLocked(const Compare& compare) const {
  auto it = kvs_.find(compare.key);
  if (it == kvs_.end() && compare.target == Compare::Target::kValue) return false;
  const KeyValue kv = it == kvs_.end() ? KeyValue{} : it->second;
  switch (compare.target) {
    case Compare::Target::kCreateRevision:
      return Holds(kv.create_revision, compare.op, compare.number);
    case Compare::Target::kModRevision:
      return Holds(kv.mod_revision, compare.op, compare.number);
    case Compare::Target::kVersion:
      return Holds(kv.version, compare.op, compare.number);
    case Compare::Target::kValue:
      return Holds(kv.value, compare.op, compare.value);
  }
  return false;
}

std::vector<std::string> FakeEtcd::KeysOfLocked(const std::string& key, bool prefix) const {
  std::vector<std::string> keys;
  if (!prefix) {
    if (kvs_.contains(key)) keys.push_back(key);
    return keys;
  }
  for (auto it = kvs_.lower_bound(key); it != kvs_.end() && absl::StartsWith(it->first, key);
       ++it) {
    keys.push_back(it->first);
  }
  return keys;
}

void FakeEtcd::PutLocked(const std::string& key, const std::string& value, LeaseId lease) {
  const int64_t revision = revision_ + 1;
  auto it = kvs_.find(key);
  std::optional<KeyValue> prev;
  KeyValue kv;
  if (it != kvs_.end()) {
    prev = it->second;
    kv = it->second;
    ++kv.version;
    if (kv.lease != 0 && kv.lease != lease) {
      if (auto l = leases_.find(kv.lease); l != leases_.end()) l->second.keys.erase(key);
    }
  } else {
    kv.key = key;
    kv.create_revision = revision;
    kv.version = 1;
  }
  kv.value = value;
  kv.mod_revision = revision;
  kv.lease = lease;
  if (lease != 0) leases_.at(lease).keys.insert(key);
  kvs_[key] = kv;
  pending_.push_back(WatchEvent{WatchEvent::Type::kPut, std::move(kv), std::move(prev)});
}

void FakeEtcd::DeleteLocked(const std::string& key) {
  auto it = kvs_.find(key);
  if (it == kvs_.end()) return;
  KeyValue prev = std::move(it->second);
  kvs_.erase(it);
  if (prev.lease != 0) {
    if (auto l = leases_.find(prev.lease); l != leases_.end()) l->second.keys.erase(key);
  }
  KeyValue kv;
  kv.key = key;
  kv.mod_revision = revision_ + 1;
  pending_.push_back(WatchEvent{WatchEvent::Type::kDelete, std::move(kv), std::move(prev)});
}

void FakeEtcd::CommitLocked() {
  if (pending_.empty()) return;
  ++revision_;
  history_.push_back(Revision{revision_, std::move(pending_)});
  pending_.clear();
}

void FakeEtcd::DeliverWatchEvents() {
  {
    absl::MutexLock lock(&mu_);
    if (delivering_) return;  // that thread delivers these events too
    delivering_ = true;
    delivering_thread_ = std::this_thread::get_id();
  }
  for (;;) {
    std::shared_ptr<WatchCallback> callback;
    absl::StatusOr<std::vector<WatchEvent>> batch;
    {
      absl::MutexLock lock(&mu_);
      // The watch whose next event is the oldest, so that all of them see revision order.
      WatchId next = 0;
      int64_t next_revision = std::numeric_limits<int64_t>::max();
      for (auto& [id, watcher] : watchers_) {
        Watcher& w = watcher;  // a reference lambdas can capture (clang 14: not a binding)
        if (w.done || partitioned_.contains(w.client)) continue;
        if (w.next_revision >= compact_revision_) {
          auto it = std::lower_bound(history_.begin(), history_.end(), w.next_revision,
                                     [](const Revision& r, int64_t v) { return r.revision < v; });
          while (it != history_.end() &&
                 std::none_of(it->events.begin(), it->events.end(), [&](const WatchEvent& e) {
                   return absl::StartsWith(e.kv.key, w.prefix);
                 })) {
            ++it;
          }
          if (it == history_.end()) {
            w.next_revision = std::max(w.next_revision, revision_ + 1);
            continue;
          }
          w.next_revision = it->revision;
        }
        if (w.next_revision < next_revision) {
          next = id;
          next_revision = w.next_revision;
        }
      }
      if (next == 0) {
        delivering_ = false;
        return;
      }
      Watcher& w = watchers_.at(next);
      if (w.next_revision < compact_revision_) {
        batch = absl::OutOfRangeError(absl::StrCat("watch of \"", w.prefix, "\" from revision ",
                                                   w.next_revision, ": compacted at revision ",
                                                   compact_revision_));
        w.done = true;
      } else {
        auto it = std::lower_bound(history_.begin(), history_.end(), w.next_revision,
                                   [](const Revision& r, int64_t v) { return r.revision < v; });
        std::vector<WatchEvent> events;
        for (const WatchEvent& e : it->events) {
          if (absl::StartsWith(e.kv.key, w.prefix)) events.push_back(e);
        }
        batch = std::move(events);
        w.next_revision = it->revision + 1;
      }
      callback = w.callback;
      in_callback_ = next;
    }
    (*callback)(std::move(batch));
    absl::MutexLock lock(&mu_);
    in_callback_ = 0;
    delivered_.SignalAll();
  }
}

}  // namespace jobbroker::testing
