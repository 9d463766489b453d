#pragma once

#include <cstdint>

#include "absl/strings/str_cat.h"
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

}  // namespace jobbroker::testing
