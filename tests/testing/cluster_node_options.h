#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/etcd_process.h"

namespace jobbroker::testing {

// How the cluster tests start node `n` of a cluster "test" on `etcd`: node id "node-<n>",
// `partitions` partitions, RF 3 and min_in_sync 2 (a write is on two of three replicas).
inline BrokerProcessOptions ClusterNodeOptions(const EtcdProcess& etcd, int n,
                                               uint32_t partitions) {
  BrokerProcessOptions options;
  options.extra_args = {"--cluster-etcd",
                        etcd.client_url(),
                        "--cluster-name",
                        "test",
                        "--node-id",
                        absl::StrCat("node-", n),
                        "--partitions",
                        absl::StrCat(partitions),
                        "--replication-factor",
                        "3",
                        "--min-in-sync",
                        "2"};
  return options;
}

// A deadline of 5 s on a call to a node: a hang fails the call, a slow machine does not.
template <typename Context>
void WithDeadline(Context& context) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
}

// Admin.GetCluster as `node` answers it; UNAVAILABLE with its message if it does not.
inline absl::StatusOr<v1::ClusterInfo> GetClusterOf(const BrokerProcess& node) {
  auto stub = node.NewAdminStub();
  grpc::ClientContext context;
  WithDeadline(context);
  v1::ClusterInfo info;
  grpc::Status status = stub->GetCluster(&context, v1::GetClusterRequest(), &info);
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  return info;
}

// Admin.GetJob as `node` answers it (forwarded to the leader if need be); UNAVAILABLE with its
// message if it does not.
inline absl::StatusOr<v1::Job> GetJobOf(const BrokerProcess& node, const std::string& id) {
  auto stub = node.NewAdminStub();
  grpc::ClientContext context;
  WithDeadline(context);
  v1::GetJobRequest request;
  request.set_job_id(id);
  v1::Job job;
  grpc::Status status = stub->GetJob(&context, request, &job);
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  return job;
}

// A real etcd and `nodes` real jobbroker nodes of cluster "test" (ClusterNodeOptions), each
// also given `extra_args`; everything in `dir`, stopped by PID when the object dies.
struct TestCluster {
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<EtcdProcess> etcd;
  std::vector<std::unique_ptr<BrokerProcess>> nodes;
};

// Fails with the first process that does not start (its output in the message).
inline absl::StatusOr<TestCluster> StartTestCluster(
    int nodes, uint32_t partitions, const std::vector<std::string>& extra_args = {}) {
  TestCluster cluster;
  auto dir = TempDir::Create();
  if (!dir.ok()) return dir.status();
  cluster.dir = *std::move(dir);
  auto etcd = EtcdProcess::Start(cluster.dir->path() + "/etcd");
  if (!etcd.ok()) return etcd.status();
  cluster.etcd = *std::move(etcd);
  for (int n = 0; n < nodes; ++n) {
    BrokerProcessOptions options = ClusterNodeOptions(*cluster.etcd, n, partitions);
    options.extra_args.insert(options.extra_args.end(), extra_args.begin(), extra_args.end());
    auto node = BrokerProcess::Start(options);
    if (!node.ok()) return node.status();
    cluster.nodes.push_back(*std::move(node));
  }
  return cluster;
}

}  // namespace jobbroker::testing
