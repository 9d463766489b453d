package jobbroker

import (
	"maps"
	"slices"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// routingTable says which broker address a call goes to, from one Admin.GetCluster answer: the
// leader of the call's partition, found from the queue's name or the job id (partition.go). It
// never changes once built; the router builds a new one when leadership moves.
//
// Every lookup answers an address, never nothing: a partition without a leader, a leader that
// is not alive, or a job id of no known form go to anyAddress(), a live node that forwards the
// call or answers Unavailable naming the partition. A broker outside a cluster (empty
// cluster_name) is reached only where it answered: its own idea of its address may be a listen
// address such as 0.0.0.0:7070.
type routingTable struct {
	isCluster      bool
	partitionCount uint32
	// The partition count GetCluster answered, outside a cluster too (a single broker with
	// --partitions): the coalescer keeps jobs of different partitions apart by it. 0 when the
	// broker did not answer GetCluster.
	reportedPartitions uint32
	answeredBy         string
	// By partition number; "" where the partition has no live leader with a known address.
	leaders    []string
	aliveNodes []string
	otherNodes []string // listed not alive
}

// newRoutingTable reads info, answered by the broker reached at answeredBy.
func newRoutingTable(info *pb.ClusterInfo, answeredBy string) *routingTable {
	table := singleBrokerTable(answeredBy)
	table.reportedPartitions = info.GetPartitionCount()
	if info.GetClusterName() == "" {
		return table
	}
	table.isCluster = true
	table.partitionCount = max(1, info.GetPartitionCount())
	nodes := map[string]*pb.NodeInfo{}
	for _, node := range info.GetNodes() {
		nodes[node.GetNodeId()] = node
		switch {
		case node.GetAddress() == "":
		case node.GetAlive():
			table.aliveNodes = append(table.aliveNodes, node.GetAddress())
		default:
			table.otherNodes = append(table.otherNodes, node.GetAddress())
		}
	}
	table.leaders = make([]string, table.partitionCount)
	for _, p := range info.GetPartitions() {
		if p.GetPartition() >= table.partitionCount || p.GetLeaderNodeId() == "" {
			continue
		}
		node, known := nodes[p.GetLeaderNodeId()]
		// A leader listed as not alive is about to lose its partition: any node knows better.
		if known && !node.GetAlive() {
			continue
		}
		address := p.GetLeaderAddress()
		if address == "" && known {
			address = node.GetAddress()
		}
		table.leaders[p.GetPartition()] = address
	}
	return table
}

// singleBrokerTable is the table of a broker that answered GetCluster with an error (older
// than cluster mode, or a token without the admin role): every call goes to address.
func singleBrokerTable(address string) *routingTable {
	return &routingTable{partitionCount: 1, answeredBy: address}
}

// anyAddress is a live node, for the calls any node serves: the one that answered, which was
// reachable.
func (t *routingTable) anyAddress() string { return t.answeredBy }

// addressOfPartition is the address of the partition's leader; anyAddress() if it has none.
func (t *routingTable) addressOfPartition(partition uint32) string {
	if !t.isCluster || int(partition) >= len(t.leaders) || t.leaders[partition] == "" {
		return t.anyAddress()
	}
	return t.leaders[partition]
}

// addressOfQueue is the leader of the partition queue lives in.
func (t *routingTable) addressOfQueue(queue string) string {
	return t.addressOfPartition(partitionOfQueue(queue, t.partitionCount))
}

// addressOfJob is the leader of the partition job jobID lives in; anyAddress() for an id of
// another form (the broker answers NotFound or InvalidArgument for it).
func (t *routingTable) addressOfJob(jobID string) string {
	partition, ok := partitionOfJobID(jobID, t.partitionCount)
	if !ok {
		return t.anyAddress()
	}
	return t.addressOfPartition(partition)
}

// addressOf is where a call for r goes. Several queues (a Worker's) go to the leader of their
// partitions when it is the same node, else to any node, which serves them all.
func (t *routingTable) addressOf(r route) string {
	switch {
	case r.address != "":
		return r.address
	case r.jobID != "":
		return t.addressOfJob(r.jobID)
	case len(r.queues) == 0:
		return t.anyAddress()
	}
	leader := t.addressOfQueue(r.queues[0])
	for _, queue := range r.queues[1:] {
		if t.addressOfQueue(queue) != leader {
			return t.anyAddress()
		}
	}
	return leader
}

// nodeAddresses lists every node listed alive, in GetCluster's order, then those not alive:
// where to ask for the next table when the one that answered is gone. Only answeredBy outside a
// cluster.
func (t *routingTable) nodeAddresses() []string {
	if !t.isCluster {
		return []string{t.answeredBy}
	}
	return append(append([]string{}, t.aliveNodes...), t.otherNodes...)
}

// streamGroup is what one Work stream of a Worker serves (docs/worker-contract.md §5, "One
// stream per leading node"): the queues whose partitions one node leads, subscribed on that
// node, with a share of the worker's max_in_flight. Two groups are the same when all three
// fields are: a regrouping keeps the stream of a group it finds again.
type streamGroup struct {
	address     string   // the leader's; "" = any node (no table, or partitions without a leader)
	queues      []string // sorted
	maxInFlight int
}

func (g streamGroup) equal(o streamGroup) bool {
	return g.address == o.address && g.maxInFlight == o.maxInFlight && slices.Equal(g.queues, o.queues)
}

// groupQueues puts queues in one group per leader address of table, sorted by address; queues
// whose partition has no leader in the table form one more group, last, for any node (which
// relays it, or answers Unavailable until the partition has a leader). Without a table, or
// outside a cluster, every queue is in one group for any node: the one stream of a broker that
// does not say where partitions are.
//
// maxInFlight is shared out as the broker shares a relayed stream's: the i-th of k groups gets
// maxInFlight/k, plus 1 when i < maxInFlight%k, and at least 1 (so a worker over k leaders may
// hold max(maxInFlight, k) jobs); 0 stays 0 everywhere.
func groupQueues(table *routingTable, queues []string, maxInFlight int) []streamGroup {
	sorted := slices.Sorted(slices.Values(queues))
	sorted = slices.Compact(sorted)
	if table == nil || !table.isCluster {
		return []streamGroup{{queues: sorted, maxInFlight: maxInFlight}}
	}
	byLeader := map[string][]string{}
	var leaderless []string
	for _, queue := range sorted {
		partition := partitionOfQueue(queue, table.partitionCount)
		if int(partition) >= len(table.leaders) || table.leaders[partition] == "" {
			leaderless = append(leaderless, queue)
			continue
		}
		byLeader[table.leaders[partition]] = append(byLeader[table.leaders[partition]], queue)
	}
	var groups []streamGroup
	for _, address := range slices.Sorted(maps.Keys(byLeader)) {
		groups = append(groups, streamGroup{address: address, queues: byLeader[address]})
	}
	if len(leaderless) > 0 {
		groups = append(groups, streamGroup{queues: leaderless})
	}
	k := len(groups)
	for i := range groups {
		if maxInFlight <= 0 {
			continue
		}
		share := maxInFlight / k
		if i < maxInFlight%k {
			share++
		}
		groups[i].maxInFlight = max(share, 1)
	}
	return groups
}

// recheckTableFor reports whether a worker grouped by table into groups fetches the table again
// after each backoff delay even though none of its streams ended (docs/worker-contract.md §5):
// while a cluster's table leaves it a group for any node. That node may already know the new
// leader of those queues' partitions and relay the stream instead of refusing it, and no leader
// change would end that relay; the next table shows the leader, and the queues move to its own
// stream. Without a cluster's table (none yet, a single broker, one that refuses GetCluster)
// the one group for any node is all there is: asking again could not move it.
func recheckTableFor(table *routingTable, groups []streamGroup) bool {
	return table != nil && table.isCluster &&
		slices.ContainsFunc(groups, func(g streamGroup) bool { return g.address == "" })
}
