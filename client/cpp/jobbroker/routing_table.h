#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "jobbroker/v1/admin.pb.h"

namespace jobbroker::client {

// Which broker address a call goes to, from one answer of Admin.GetCluster: the leader of the
// call's partition, found by the queue's name or the job id (partition.h). A value: it never
// changes once built; the client builds a new one when leadership moves. Thread-compatible.
//
// Every lookup answers an address to send to, never nothing: a partition without a leader, a
// leader that is not alive, or a job id of no known form go to AnyAddress(), a live node that
// forwards the call or answers UNAVAILABLE naming the partition. A broker that is not part of
// a cluster (empty cluster_name) is reached only at the address it answered on: its own idea
// of its address may be a listen address such as 0.0.0.0:7070.
class RoutingTable {
 public:
  // A table that knows no cluster: every lookup answers "".
  RoutingTable() = default;
  // From `info`, answered by the broker the client reached at `answered_by`.
  static RoutingTable FromClusterInfo(const v1::ClusterInfo& info, std::string answered_by);
  // For a broker that does not know GetCluster (UNIMPLEMENTED: older than cluster mode): every
  // call goes to `address`.
  static RoutingTable SingleBroker(std::string address);

  // False for a table from an empty ClusterInfo::cluster_name or from SingleBroker.
  bool is_cluster() const { return is_cluster_; }
  bool empty() const { return answered_by_.empty(); }
  uint32_t partition_count() const { return partition_count_; }
  // The partitions the broker said it has, also outside a cluster (a single node started with
  // --partitions 4 refuses a batch that spans them too); 0 when unknown (no table, or a broker
  // that did not answer GetCluster). The producer's coalescer keys batches by it.
  uint32_t broker_partition_count() const { return broker_partition_count_; }
  // Where the table came from.
  const std::string& answered_by() const { return answered_by_; }

  // The address of partition `partition`'s leader; AnyAddress() if it has none (or is out of
  // range).
  std::string AddressOfPartition(uint32_t partition) const;
  // The leader of the partition `queue` lives in.
  std::string AddressOfQueue(std::string_view queue) const;
  // The leader of the partition job `job_id` lives in; AnyAddress() for an id of another form
  // (the broker answers NOT_FOUND or INVALID_ARGUMENT for it).
  std::string AddressOfJob(std::string_view job_id) const;
  // A live node, for calls any node serves: the one that answered, which was reachable.
  std::string AnyAddress() const { return answered_by_; }
  // The addresses of every node listed alive, in the order GetCluster listed them, then those
  // not alive; for refreshing the table when the one that answered is gone. Only answered_by()
  // outside a cluster.
  std::vector<std::string> NodeAddresses() const;
  // The address of the live leader of `queue`'s partition; "" if the table names none (outside
  // a cluster too), where AddressOfQueue answers AnyAddress().
  std::string LeaderOfQueue(std::string_view queue) const;

 private:
  bool is_cluster_ = false;
  uint32_t partition_count_ = 1;
  uint32_t broker_partition_count_ = 0;
  std::string answered_by_;
  // By partition number; "" where the partition has no live leader with a known address.
  std::vector<std::string> leaders_;
  std::vector<std::string> alive_nodes_;
  std::vector<std::string> other_nodes_;
};

// The Work streams of a worker over a cluster (docs/worker-contract.md §5, "One stream per
// leading node"): one group per leader address, then one more for the queues whose partition
// has no leader (address "", sent to any node). A group is equal to another when its address,
// its queues and its share are.
struct StreamGroup {
  std::string address;              // "": any node
  std::vector<std::string> queues;  // sorted
  int max_in_flight = 0;            // the group's share of the worker's

  friend bool operator==(const StreamGroup&, const StreamGroup&) = default;
};

// `queues` (any order; each once) grouped by the leader `table` names for them, sorted by
// address, the leaderless group last, and `max_in_flight` shared out as the broker shares a
// relayed stream's: the i-th of k groups gets max_in_flight / k, plus 1 when
// i < max_in_flight % k, and at least 1 (a worker over k leaders may hold more than
// max_in_flight jobs); 0 stays 0 for every group. Outside a cluster (or with no table): one
// group of every queue, address "" and the whole max_in_flight. A pure function.
std::vector<StreamGroup> GroupQueuesByLeader(const RoutingTable& table,
                                             const std::vector<std::string>& queues,
                                             int max_in_flight);

// Whether a worker holding `groups` (GroupQueuesByLeader's over `table`) fetches the table again
// after each backoff delay and regroups although none of its streams ended
// (docs/worker-contract.md §5): while it has a group for any node. A node that already knows a
// partition's new leader relays that group's stream instead of refusing it, and no leader change
// would end that relay; the next table shows the leader, and the queues move to its own stream.
// False for a table of a broker outside a cluster (or one that does not answer GetCluster),
// whose answer cannot change; true without a table (no node answered GetCluster yet). A pure
// function.
bool RefreshesTableWhileGrouped(const RoutingTable& table, const std::vector<StreamGroup>& groups);

}  // namespace jobbroker::client
