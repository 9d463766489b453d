#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "jobbroker/v1/admin.pb.h"

namespace grpc {
class Server;
}

namespace jobbroker::testing {

class FakeCluster;

// One node of a FakeCluster: a gRPC server on a free loopback port serving Broker and Admin,
// which records every call it gets and answers it without doing anything (Enqueue returns a
// fresh id of the queue's partition; GetJob a job with that id). GetCluster answers the
// cluster's layout as it is when asked. Work accepts a subscription, then pushes each job queued
// with PushJob to a stream subscribed to its queue, and answers acks. Thread-safe.
class FakeClusterNode {
 public:
  ~FakeClusterNode();

  const std::string& id() const { return id_; }
  const std::string& address() const { return address_; }

  // Every call received, in order, as "Method key": "Enqueue emails", "GetJob <id>",
  // "GetCluster", "Work emails,reports" (a subscription), "Ack <id>".
  std::vector<std::string> Calls() const;
  // How many calls of `method` it received.
  int Count(const std::string& method) const;
  void ClearCalls();

  // While true, every call but GetCluster fails UNAVAILABLE, as a node that leads nothing any
  // more would (a Work stream already open is answered as before).
  void SetRefusing(bool refusing);
  // GetCluster answers UNIMPLEMENTED, as a broker older than cluster mode does.
  void SetGetClusterUnimplemented(bool unimplemented);
  // Ends every stream and stops listening: connects to its address are refused.
  void Stop();
  // The next Work stream subscribed to `queue` gets a job of it with this id.
  void PushJob(const std::string& queue, const std::string& job_id);

 private:
  friend class FakeCluster;
  class Services;
  FakeClusterNode(FakeCluster* cluster, std::string id);
  void Record(std::string call);

  FakeCluster* const cluster_;
  const std::string id_;
  std::string address_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;

  mutable absl::Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
  bool refusing_ ABSL_GUARDED_BY(mu_) = false;
  bool get_cluster_unimplemented_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<std::string, std::string>> to_push_ ABSL_GUARDED_BY(mu_);
};

// Nodes "node-0" … and a layout of `partitions` partitions, partition p led by node p % nodes,
// which GetCluster reports; for testing clients' routing without a real cluster. Thread-safe.
class FakeCluster {
 public:
  // `cluster_name` empty: each node answers as a single broker outside a cluster would.
  FakeCluster(int nodes, uint32_t partitions, std::string cluster_name = "fake");
  ~FakeCluster();

  FakeClusterNode& node(int n) { return *nodes_[n]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  uint32_t partitions() const { return partitions_; }
  // All nodes' addresses, in order.
  std::vector<std::string> addresses() const;

  // Partition `partition` is led by node `n` (-1: by none) from now on.
  void SetLeader(uint32_t partition, int n);
  // Node `n` is listed as alive or not.
  void SetAlive(int n, bool alive);
  // The node that leads `partition` now, or -1.
  int LeaderOf(uint32_t partition) const;
  // GetCluster's answer, given by node `answering`.
  v1::ClusterInfo Info(int answering) const;

 private:
  const uint32_t partitions_;
  const std::string cluster_name_;
  std::vector<std::unique_ptr<FakeClusterNode>> nodes_;

  mutable absl::Mutex mu_;
  std::vector<int> leaders_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> alive_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::testing
