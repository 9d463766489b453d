package jobbroker_test

import (
	"cmp"
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// fakeCluster is two nodes that answer only Admin.GetCluster and Broker.Work (subscriptions
// accepted, nothing pushed), and tell the layout the test sets: a stand-in below the real
// cluster of TestAWorkerHoldsOneStreamPerLeadingNodeAndFollowsALeadersDeath, for a moment a
// real cluster shows only by chance (a table fetched while a partition had no leader, from a
// node that then relays the stream to the new one instead of refusing it).
type fakeCluster struct {
	addresses [2]string

	mu         sync.Mutex
	leaderOfP1 int // the node leading partition 1; -1: none (partition 0 is node 0's)
	lookups    int
	streams    []*fakeStream
}

type fakeStream struct {
	node        int
	queues      []string
	maxInFlight int32
	ended       bool // the worker ended it (half-closed or cancelled)
}

type fakeNode struct {
	pb.UnimplementedAdminServer
	pb.UnimplementedBrokerServer
	cl   *fakeCluster
	node int
}

func startFakeCluster(t *testing.T) *fakeCluster {
	cl := &fakeCluster{leaderOfP1: -1}
	for n := range 2 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cl.addresses[n] = lis.Addr().String()
		srv := grpc.NewServer()
		node := &fakeNode{cl: cl, node: n}
		pb.RegisterAdminServer(srv, node)
		pb.RegisterBrokerServer(srv, node)
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
	}
	return cl
}

func (n *fakeNode) GetCluster(context.Context, *pb.GetClusterRequest) (*pb.ClusterInfo, error) {
	cl := n.cl
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.lookups++
	info := &pb.ClusterInfo{
		ClusterName:    "fake",
		PartitionCount: 2,
		NodeId:         nodeID(n.node),
		Nodes: []*pb.NodeInfo{
			{NodeId: nodeID(0), Address: cl.addresses[0], Alive: true},
			{NodeId: nodeID(1), Address: cl.addresses[1], Alive: true},
		},
		Partitions: []*pb.PartitionInfo{{Partition: 0, LeaderNodeId: nodeID(0), LeaderAddress: cl.addresses[0]}},
	}
	p1 := &pb.PartitionInfo{Partition: 1}
	if cl.leaderOfP1 >= 0 {
		p1.LeaderNodeId, p1.LeaderAddress = nodeID(cl.leaderOfP1), cl.addresses[cl.leaderOfP1]
	}
	info.Partitions = append(info.Partitions, p1)
	return info, nil
}

func nodeID(n int) string { return []string{"n0", "n1"}[n] }

// Work accepts every subscription (a node relaying it would) and pushes nothing.
func (n *fakeNode) Work(stream pb.Broker_WorkServer) error {
	var s *fakeStream
	for {
		req, err := stream.Recv()
		if err != nil {
			if s != nil {
				n.cl.mu.Lock()
				s.ended = true
				n.cl.mu.Unlock()
			}
			return nil
		}
		if sub := req.GetSubscribe(); sub != nil {
			n.cl.mu.Lock()
			s = &fakeStream{node: n.node, queues: sub.GetQueues(), maxInFlight: sub.GetMaxInFlight()}
			n.cl.streams = append(n.cl.streams, s)
			n.cl.mu.Unlock()
			if err := stream.Send(&pb.WorkResponse{Response: &pb.WorkResponse_Result{
				Result: &pb.WorkResult{RequestId: req.GetRequestId()}}}); err != nil {
				return nil
			}
		}
	}
}

// find is the first stream subscribed to exactly queues, on node (-1: any), that is still open
// (ended false) or has ended (ended true).
func (cl *fakeCluster) find(node int, queues []string, ended bool) *fakeStream {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, s := range cl.streams {
		if (node < 0 || s.node == node) && slices.Equal(s.queues, queues) && s.ended == ended {
			return s
		}
	}
	return nil
}

func (cl *fakeCluster) lookupCount() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.lookups
}

// A worker whose table showed a partition without a leader sends that partition's queues on a
// stream to any node, which relays it; no leader change ends that stream. So while it has such
// a group it fetches the table again after each backoff delay (docs/worker-contract.md §5):
// once the table shows the leader, the queues move to a stream on the leader, the relayed
// stream is ended, and the stream whose group did not change keeps running. Then, with no
// group for any node left, it stops asking.
func TestAWorkerMovesQueuesItSentToAnyNodeToTheirLeaderOnceTheTableShowsOne(t *testing.T) {
	cl := startFakeCluster(t)
	var q0, q1 string // a queue of partition 0 (led by node 0) and one of partition 1
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"} {
		switch jobbroker.PartitionOfQueue(name, 2) {
		case 0:
			q0 = cmp.Or(q0, name)
		case 1:
			q1 = cmp.Or(q1, name)
		}
	}
	if q0 == "" || q1 == "" {
		t.Fatal("no queue name found for one of the partitions")
	}
	c, err := jobbroker.New(jobbroker.Options{Addresses: cl.addresses[:]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{Concurrency: 4})
	for _, q := range []string{q0, q1} {
		w.HandleFunc(q, func(context.Context, *jobbroker.Job) error { return nil })
	}
	stop := runWorker(t, w)

	waitFor(t, "a stream on node 0 for "+q0+" and one to any node for "+q1, func() bool {
		return cl.find(0, []string{q0}, false) != nil && cl.find(-1, []string{q1}, false) != nil
	})
	kept, relayed := cl.find(0, []string{q0}, false), cl.find(-1, []string{q1}, false)
	if kept.maxInFlight != 2 || relayed.maxInFlight != 2 {
		t.Errorf("shares of max_in_flight 4 over two groups: %d and %d, want 2 and 2", kept.maxInFlight, relayed.maxInFlight)
	}

	// Partition 1 gets a leader. No stream of the worker ends: only a fetch of the table can
	// tell it.
	cl.mu.Lock()
	cl.leaderOfP1 = 1
	cl.mu.Unlock()
	waitFor(t, "a stream on node 1, partition 1's new leader, for "+q1, func() bool {
		return cl.find(1, []string{q1}, false) != nil
	})
	waitFor(t, "the worker to end the stream it sent to any node", func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return relayed.ended
	})
	cl.mu.Lock()
	keptEnded := kept.ended
	cl.mu.Unlock()
	if keptEnded {
		t.Errorf("the stream of node 0's unchanged group was ended; a regroup keeps it")
	}

	// No group for any node now: no more lookups while no stream ends (a bound on what must
	// not happen, not on how fast anything is).
	before := cl.lookupCount()
	time.Sleep(time.Second)
	if after := cl.lookupCount(); after != before {
		t.Errorf("the worker asked GetCluster %d more times with every queue on its leader's stream, want 0", after-before)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
}
