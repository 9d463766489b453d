#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace jobbroker::cluster {

// An etcd lease id; 0 means "no lease".
using LeaseId = int64_t;

// One key as etcd stores it (mvccpb.KeyValue).
struct KeyValue {
  std::string key;
  std::string value;
  // The revision of the change that created the key (since it last did not exist).
  int64_t create_revision = 0;
  // The revision of the key's last change.
  int64_t mod_revision = 0;
  // Changes since creation: 1 after the creating put; a delete resets it.
  int64_t version = 0;
  // The lease the key is attached to, or 0.
  LeaseId lease = 0;
};

// What Get and GetPrefix read: the keys (in key order) and the store's revision at the read.
struct GetResult {
  int64_t revision = 0;
  std::vector<KeyValue> kvs;
};

// One condition of a Txn (etcdserverpb.Compare), on one key. A missing key has
// create_revision, mod_revision and version 0 and never compares equal to a value.
struct Compare {
  enum class Target { kCreateRevision, kModRevision, kVersion, kValue };
  enum class Op { kEqual, kNotEqual, kLess, kGreater };

  std::string key;
  Target target = Target::kVersion;
  Op op = Op::kEqual;
  int64_t number = 0;  // for the revision and version targets
  std::string value;   // for kValue (compared as bytes)

  static Compare CreateRevision(std::string key, Op op, int64_t revision) {
    return {std::move(key), Target::kCreateRevision, op, revision, ""};
  }
  static Compare ModRevision(std::string key, Op op, int64_t revision) {
    return {std::move(key), Target::kModRevision, op, revision, ""};
  }
  static Compare Version(std::string key, Op op, int64_t version) {
    return {std::move(key), Target::kVersion, op, version, ""};
  }
  static Compare Value(std::string key, Op op, std::string value) {
    return {std::move(key), Target::kValue, op, 0, std::move(value)};
  }
};

// One operation of a Txn's branch (etcdserverpb.RequestOp).
struct TxnOp {
  enum class Type { kPut, kGet, kDelete };

  Type type = Type::kGet;
  std::string key;
  std::string value;    // kPut
  LeaseId lease = 0;    // kPut: attach the key to this lease (0: none)
  bool prefix = false;  // kGet, kDelete: every key that starts with `key`

  static TxnOp Put(std::string key, std::string value, LeaseId lease = 0) {
    return {Type::kPut, std::move(key), std::move(value), lease, false};
  }
  static TxnOp Get(std::string key, bool prefix = false) {
    return {Type::kGet, std::move(key), "", 0, prefix};
  }
  static TxnOp Delete(std::string key, bool prefix = false) {
    return {Type::kDelete, std::move(key), "", 0, prefix};
  }
};

// The result of one TxnOp of the branch that ran.
struct TxnOpResult {
  TxnOp::Type type = TxnOp::Type::kGet;
  std::vector<KeyValue> kvs;  // kGet: the keys read, in key order
  int64_t deleted = 0;        // kDelete: how many keys it deleted
};

struct TxnResult {
  // Whether every compare held (then_ops ran) or not (else_ops ran).
  bool succeeded = false;
  // The store's revision after the txn: when the branch changed anything, the revision of that
  // change, which every key it put has as mod_revision (and as create_revision if it was new).
  // That is the epoch rule of CLUSTER.md: the election txn's revision is the new epoch.
  int64_t revision = 0;
  // One per op of the branch that ran, in order.
  std::vector<TxnOpResult> results;
};

struct WatchEvent {
  enum class Type { kPut, kDelete };

  Type type = Type::kPut;
  // kPut: the key after the change. kDelete: the key and mod_revision = the delete's revision
  // (the other fields are 0 and empty, as etcd gives them).
  KeyValue kv;
  // The key before the change, if it existed (and, for the real etcd, was not compacted).
  std::optional<KeyValue> prev_kv;
};

// A watch's callback. Called with the events of one or more whole revisions, in revision order,
// never an empty batch, never twice for a revision; or, once and last, with an error: kOutOfRange
// when the watch's start revision was compacted (the caller re-reads the keys with GetPrefix and
// watches again from that read's revision + 1). Calls for one watch never overlap.
using WatchCallback = std::function<void(absl::StatusOr<std::vector<WatchEvent>> events)>;

using WatchId = int64_t;

// What the cluster coordinator needs of etcd: leases, single-key reads and writes, prefix reads,
// transactions and prefix watches, each a synchronous call (watches call back). Implemented by
// GrpcEtcd (grpc_etcd.h, over etcd's v3 gRPC API) and by tests/testing/fake_etcd.h (in memory,
// on a fake clock, for tests and the deterministic simulator); tests/cluster/etcd has one
// conformance suite that runs over both.
//
// Every call is linearizable (etcd's default, serializable=false): it sees every change that
// completed before it began. Revisions are the store's: one counter that each change (a put, a
// delete that deleted something, a txn whose branch changed anything) raises by one.
//
// Errors: kUnavailable when etcd cannot be reached or did not answer in time (retryable; for a
// write the outcome is then unknown: it may have been applied, so a retried txn must be guarded
// by its compares); kNotFound for a lease that does not exist (never granted, revoked or
// expired); kInvalidArgument for a request etcd refuses; kOutOfRange for a compacted revision.
// Messages name the key or the lease.
//
// Thread-safe.
class Etcd {
 public:
  virtual ~Etcd() = default;

  // A new lease with a time-to-live of `ttl`, rounded up to whole seconds (etcd may raise it to
  // its minimum, about 2 s with default timeouts).
  virtual absl::StatusOr<LeaseId> GrantLease(absl::Duration ttl) = 0;
  // Renews `lease` once: its time-to-live starts again. Returns that time-to-live. kNotFound when
  // the lease is gone (expired or revoked): every key attached to it is deleted already.
  virtual absl::StatusOr<absl::Duration> KeepAliveOnce(LeaseId lease) = 0;
  // Ends `lease` now and deletes the keys attached to it (one revision). kNotFound if it is gone.
  virtual absl::Status RevokeLease(LeaseId lease) = 0;

  // The key, if it exists: `kvs` then holds it alone; else `kvs` is empty (not an error).
  virtual absl::StatusOr<GetResult> Get(const std::string& key) = 0;
  // Every key starting with `prefix` (an empty prefix: every key), in key order.
  virtual absl::StatusOr<GetResult> GetPrefix(const std::string& prefix) = 0;
  // Sets `key` to `value`, attached to `lease` (0: to none; a key put without a lease is
  // detached from the one it had). Returns the change's revision. kNotFound if the lease is gone.
  virtual absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                                      LeaseId lease = 0) = 0;
  // Deletes `key`. Returns the store's revision after it: the delete's own revision, or, if the
  // key did not exist, the current revision unchanged.
  virtual absl::StatusOr<int64_t> Delete(const std::string& key) = 0;
  // If every one of `compares` holds, runs `then_ops`, else `else_ops`, all at one revision.
  // kNotFound (and nothing changed) if a put names a lease that is gone; kInvalidArgument if a
  // branch puts or deletes one key twice (etcd refuses it whichever branch would run).
  virtual absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                        const std::vector<TxnOp>& then_ops,
                                        const std::vector<TxnOp>& else_ops) = 0;

  // Watches every key starting with `prefix`, from `start_revision` (0: from the next change),
  // including the changes made before this call at or after that revision. `callback` gets every
  // change in revision order, on a thread of the implementation's (GrpcEtcd: the watch's own;
  // the fake: the thread that made the change); the watch survives broken connections without
  // losing or repeating an event (GrpcEtcd resumes at the last delivered revision + 1). The
  // callback must not block for long: it holds up the watch's later events.
  virtual absl::StatusOr<WatchId> Watch(const std::string& prefix, int64_t start_revision,
                                        WatchCallback callback) = 0;
  // Ends the watch: once it returns, its callback is not running and will not be called again
  // (unless it is called from that callback, which then finishes normally). Ending a watch that
  // already ended (or reported an error) is OK; an unknown id is kNotFound.
  virtual absl::Status CancelWatch(WatchId watch) = 0;
};

// The end of the key range of every key that starts with `prefix`, as etcd's range_end wants it:
// the prefix with its last byte below 0xff raised by one and what follows that byte dropped;
// "\0" (every key) for an empty prefix or one of 0xff bytes only.
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace jobbroker::cluster
