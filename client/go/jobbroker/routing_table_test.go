package jobbroker

import (
	"fmt"
	"slices"
	"testing"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// A job id of the broker's form whose partition field is 2 (characters 10 to 12 are "002").
const jobOfPartition2 = "01J0000000002000000000000A"

// threeNodes is a cluster of 4 partitions as GetCluster tells it, asked at "seed:1".
func threeNodes() *pb.ClusterInfo {
	return &pb.ClusterInfo{
		ClusterName:    "jobbroker",
		PartitionCount: 4,
		NodeId:         "n1",
		Nodes: []*pb.NodeInfo{
			{NodeId: "n1", Address: "a:1", Alive: true},
			{NodeId: "n2", Address: "b:1", Alive: false},
			{NodeId: "n3", Address: "c:1", Alive: true},
		},
		Partitions: []*pb.PartitionInfo{
			{Partition: 0, LeaderNodeId: "n1", LeaderAddress: "a:1"},
			{Partition: 1, LeaderNodeId: "n2", LeaderAddress: "b:1"}, // leader not alive
			{Partition: 2, LeaderNodeId: "n3"},                       // address only in nodes
			{Partition: 3},                                           // no leader
		},
	}
}

// queuesOf names n queues that live in partition of count.
func queuesOf(partition, count uint32, n int) []string {
	var names []string
	for i := 0; len(names) < n; i++ {
		if name := fmt.Sprintf("q%d", i); partitionOfQueue(name, count) == partition {
			names = append(names, name)
		}
	}
	return names
}

func TestACallGoesToItsPartitionsLiveLeader(t *testing.T) {
	table := newRoutingTable(threeNodes(), "seed:1")
	if !table.isCluster || table.partitionCount != 4 {
		t.Fatalf("table = %+v, want a cluster of 4 partitions", table)
	}
	if got := table.addressOfQueue(queuesOf(0, 4, 1)[0]); got != "a:1" {
		t.Errorf("queue of partition 0 goes to %q, want its leader a:1", got)
	}
	if got := table.addressOfPartition(2); got != "c:1" {
		t.Errorf("partition 2 goes to %q, want its leader's node address c:1", got)
	}
	if got := table.addressOfJob(jobOfPartition2); got != "c:1" {
		t.Errorf("a job of partition 2 goes to %q, want c:1", got)
	}
}

func TestACallWhoseLeaderIsNotAliveOrMissingGoesToTheNodeThatAnswered(t *testing.T) {
	table := newRoutingTable(threeNodes(), "seed:1")
	for partition, why := range map[uint32]string{1: "leader not alive", 3: "no leader", 9: "out of range"} {
		if got := table.addressOfPartition(partition); got != "seed:1" {
			t.Errorf("partition %d (%s) goes to %q, want the node that answered", partition, why, got)
		}
	}
	if got := table.addressOfJob("not-a-job-id"); got != "seed:1" {
		t.Errorf("an id of another form goes to %q, want the node that answered", got)
	}
	if got := table.addressOf(route{}); got != "seed:1" {
		t.Errorf("a call for any node goes to %q, want the node that answered", got)
	}
}

func TestSeveralQueuesGoToTheirSharedLeaderOrElseToAnyNode(t *testing.T) {
	table := newRoutingTable(threeNodes(), "seed:1")
	inPartition0, q2 := queuesOf(0, 4, 2), queuesOf(2, 4, 1)[0]
	if got := table.addressOf(route{queues: inPartition0}); got != "a:1" {
		t.Errorf("two queues of partition 0 go to %q, want their leader a:1", got)
	}
	if got := table.addressOf(route{queues: []string{inPartition0[0], q2}}); got != "seed:1" {
		t.Errorf("queues of two leaders go to %q, want any node", got)
	}
}

func TestABrokerOutsideAClusterIsReachedWhereItAnswered(t *testing.T) {
	info := threeNodes()
	info.ClusterName = "" // a single broker
	table := newRoutingTable(info, "seed:1")
	if table.isCluster {
		t.Fatal("an empty cluster_name made a cluster")
	}
	if got := table.addressOfQueue("q"); got != "seed:1" {
		t.Errorf("a queue goes to %q, want the address the broker answered at", got)
	}
	if got := table.nodeAddresses(); !slices.Equal(got, []string{"seed:1"}) {
		t.Errorf("nodes to ask = %v, want only the one that answered", got)
	}
}

func TestTheNextTableIsAskedOfLiveNodesFirst(t *testing.T) {
	table := newRoutingTable(threeNodes(), "seed:1")
	if got, want := table.nodeAddresses(), []string{"a:1", "c:1", "b:1"}; !slices.Equal(got, want) {
		t.Errorf("nodes to ask = %v, want %v", got, want)
	}
}

func TestCallsAreRoutedByQueueByJobOrToAnyNode(t *testing.T) {
	for _, c := range []struct {
		request any
		want    route
	}{
		{&pb.EnqueueRequest{Queue: "q"}, queueRoute("q")},
		{&pb.EnqueueBatchRequest{Jobs: []*pb.EnqueueRequest{{Queue: "first"}, {Queue: "second"}}}, queueRoute("first")},
		{&pb.EnqueueBatchRequest{}, route{}},
		{&pb.AckRequest{JobId: "j"}, route{jobID: "j"}},
		{&pb.GetJobRequest{JobId: "j"}, route{jobID: "j"}},
		{&pb.RetryJobRequest{JobId: "j"}, route{jobID: "j"}},
		{&pb.RetryJobRequest{Queue: "q"}, queueRoute("q")},
		{&pb.PauseQueueRequest{Queue: "q"}, queueRoute("q")},
		{&pb.PutScheduleRequest{Schedule: &pb.Schedule{Template: &pb.EnqueueRequest{Queue: "q"}}}, queueRoute("q")},
		{&pb.ListSchedulesRequest{}, route{}},
		{&pb.ListQueuesRequest{}, route{}},
		{&pb.ListWorkersRequest{Queue: "q"}, route{}},
		{&pb.GetClusterRequest{}, route{}},
	} {
		got := routeOfRequest(c.request)
		if got.jobID != c.want.jobID || !slices.Equal(got.queues, c.want.queues) {
			t.Errorf("%T %v routes to %+v, want %+v", c.request, c.request, got, c.want)
		}
	}
}
