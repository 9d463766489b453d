#pragma once

#include <string>

#include "jobbroker/v1/admin.pb.h"

namespace jobbroker::cli {

// The `cluster` command's view of Admin.GetCluster: one line with the cluster's name and
// settings and the node that answered, then a table of nodes (id, address, alive) and one of
// partitions (number, leader, epoch, replicas, in-sync set). "-" where a partition has no leader.
// Ends in '\n'.
std::string FormatCluster(const v1::ClusterInfo& info);

}  // namespace jobbroker::cli
