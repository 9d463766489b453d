#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"

namespace jobbroker::testing {

// An Etcd that passes every call to `target`: the base of a test's etcd that changes a few calls
// (a slow answer, a lost answer, a refusal) and leaves the rest as the target does them.
// Borrows target, which must outlive it. Thread-safe if the target is.
class ForwardingEtcd : public cluster::Etcd {
 public:
  explicit ForwardingEtcd(cluster::Etcd& target) : target_(target) {}

  absl::StatusOr<cluster::LeaseId> GrantLease(absl::Duration ttl) override {
    return target_.GrantLease(ttl);
  }
  absl::StatusOr<absl::Duration> KeepAliveOnce(cluster::LeaseId lease) override {
    return target_.KeepAliveOnce(lease);
  }
  absl::Status RevokeLease(cluster::LeaseId lease) override { return target_.RevokeLease(lease); }
  absl::StatusOr<cluster::GetResult> Get(const std::string& key) override {
    return target_.Get(key);
  }
  absl::StatusOr<cluster::GetResult> GetPrefix(const std::string& prefix) override {
    return target_.GetPrefix(prefix);
  }
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              cluster::LeaseId lease) override {
    return target_.Put(key, value, lease);
  }
  absl::StatusOr<int64_t> Delete(const std::string& key) override { return target_.Delete(key); }
  absl::StatusOr<cluster::TxnResult> Txn(const std::vector<cluster::Compare>& compares,
                                         const std::vector<cluster::TxnOp>& then_ops,
                                         const std::vector<cluster::TxnOp>& else_ops) override {
    return target_.Txn(compares, then_ops, else_ops);
  }
  absl::StatusOr<cluster::WatchId> Watch(const std::string& prefix, int64_t start_revision,
                                         cluster::WatchCallback callback) override {
    return target_.Watch(prefix, start_revision, std::move(callback));
  }
  absl::Status CancelWatch(cluster::WatchId watch) override { return target_.CancelWatch(watch); }

 private:
  cluster::Etcd& target_;
};

}  // namespace jobbroker::testing
