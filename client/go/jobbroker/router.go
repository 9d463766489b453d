package jobbroker

import (
	"context"
	"errors"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// router is the connection under a Client made by New: it sends each call to the node that
// serves it, the leader of the call's partition in a cluster, so that a call takes no extra
// hop through a node that would forward it and does not depend on that node. It keeps the
// addresses the client was given (one connection over them all, as a client outside a cluster
// uses), one connection per node (dialled on first use and kept, with the client's dial options
// and so its TLS), and the routingTable of the latest Admin.GetCluster answer.
//
// The table is fetched before the first call, and again before the next call after markStale
// (a call that failed Unavailable or DeadlineExceeded: a leader moved, a node died), from
// whichever address answers first: the nodes of the last table, then the given addresses,
// those whose connection is failing last. A broker that answers GetCluster with another error
// (Unimplemented from a broker older than cluster mode, PermissionDenied for a token without
// the admin role) means "use the given addresses as before": any node forwards a call to its
// partition's leader. So does a broker outside a cluster. While no address has answered, calls
// go to the given addresses and every call asks again.
//
// Safe for concurrent use. One refresh runs at a time; calls that find the table stale
// meanwhile wait for it, and then use whatever table it left.
type router struct {
	// Constant after construction.
	given     []string
	givenConn *grpc.ClientConn // over every given address, failing over in their order
	dial      []grpc.DialOption

	// State below is protected by mu.
	mu         sync.Mutex
	state      tableState
	table      *routingTable // nil until an address answered GetCluster
	nodes      map[string]*grpc.ClientConn
	refreshing chan struct{} // closed when the refresh under way ends; nil when none is
	closed     bool
}

type tableState int

const (
	tableUnknown tableState = iota // never fetched, or no address answered
	tableFresh
	tableStale
)

// Bounds each GetCluster the router sends when the call it serves has no deadline (a Work
// stream, a watch): a node that accepts connections and never answers must not hold the call.
const clusterLookupTimeout = DefaultDeadline

// route is which node a call is for; the zero value is any node.
type route struct {
	queues []string // the leader of these queues' partitions, if they share one
	jobID  string   // the leader of this job's partition
	// A node named by the caller: a Worker's stream goes to the leader its group was made
	// for, as the table was when it grouped (workGroups), not as a later table says.
	address string
}

func queueRoute(queue string) route { return route{queues: []string{queue}} }

// routeOfRequest routes a unary call by its request, as every client of jobbroker does: by
// queue (enqueue, lease, the queue admin calls, a batch by its first job's queue, a schedule by
// its template's queue), by job id (the lease answers and the job admin calls), otherwise to
// any node (listings, schedules by id, the cluster itself).
func routeOfRequest(request any) route {
	switch r := request.(type) {
	case *pb.EnqueueRequest:
		return queueRoute(r.GetQueue())
	case *pb.EnqueueBatchRequest:
		// A batch is all or nothing within one partition; one whose jobs span partitions is
		// refused by the leader (InvalidArgument naming them).
		if len(r.GetJobs()) > 0 {
			return queueRoute(r.GetJobs()[0].GetQueue())
		}
	case *pb.LeaseRequest:
		return queueRoute(r.GetQueue())
	case *pb.HeartbeatRequest:
		return route{jobID: r.GetJobId()}
	case *pb.AckRequest:
		return route{jobID: r.GetJobId()}
	case *pb.FailRequest:
		return route{jobID: r.GetJobId()}
	case *pb.ReleaseRequest:
		return route{jobID: r.GetJobId()}
	case *pb.GetJobRequest:
		return route{jobID: r.GetJobId()}
	case *pb.CancelJobRequest:
		return route{jobID: r.GetJobId()}
	case *pb.DeleteJobRequest:
		return route{jobID: r.GetJobId()}
	case *pb.RetryJobRequest:
		if r.GetQueue() != "" {
			return queueRoute(r.GetQueue())
		}
		return route{jobID: r.GetJobId()}
	case *pb.ListJobsRequest:
		return queueRoute(r.GetQueue())
	case *pb.GetQueueRequest:
		return queueRoute(r.GetQueue())
	case *pb.UpdateQueuePolicyRequest:
		return queueRoute(r.GetQueue())
	case *pb.PauseQueueRequest:
		return queueRoute(r.GetQueue())
	case *pb.ResumeQueueRequest:
		return queueRoute(r.GetQueue())
	case *pb.PurgeQueueRequest:
		return queueRoute(r.GetQueue())
	case *pb.PutScheduleRequest:
		return queueRoute(r.GetSchedule().GetTemplate().GetQueue())
	case *pb.ListSchedulesRequest:
		if r.GetQueue() != "" {
			return queueRoute(r.GetQueue())
		}
	}
	return route{}
}

type streamRouteKey struct{}

// withStreamRoute marks a stream's context with the node it is for: a stream's request is not
// known when it opens (WatchJob sends it after), and a Work stream serves several queues.
// Streams opened without it go to any node.
func withStreamRoute(ctx context.Context, r route) context.Context {
	return context.WithValue(ctx, streamRouteKey{}, r)
}

func newRouter(given []string, givenConn *grpc.ClientConn, dial []grpc.DialOption) *router {
	r := &router{given: given, givenConn: givenConn, dial: dial, nodes: map[string]*grpc.ClientConn{}}
	if len(given) == 1 {
		r.nodes[given[0]] = givenConn // the one given address is a node's address too
	}
	return r
}

func (r *router) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	err := r.connFor(ctx, routeOfRequest(args)).Invoke(ctx, method, args, reply, opts...)
	r.markStaleAfter(err)
	return err
}

func (r *router) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	streamRoute, _ := ctx.Value(streamRouteKey{}).(route)
	stream, err := r.connFor(ctx, streamRoute).NewStream(ctx, desc, method, opts...)
	r.markStaleAfter(err)
	return stream, err
}

// markStaleAfter makes the next call fetch the table first when err may mean the call went to
// a node that is gone or no longer leads.
func (r *router) markStaleAfter(err error) {
	if code := status.Code(err); code == codes.Unavailable || code == codes.DeadlineExceeded {
		r.markStale()
	}
}

// markStale makes the next call fetch the table first. The Worker calls it when its stream
// ends, so that it reconnects to the queues' leader as it is now.
func (r *router) markStale() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == tableFresh {
		r.state = tableStale
	}
}

// connFor is the connection of the node a call for rt goes to, after fetching the table if it
// is stale.
func (r *router) connFor(ctx context.Context, rt route) *grpc.ClientConn {
	r.refreshIfNeeded(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.table == nil || !r.table.isCluster {
		return r.givenConn
	}
	return r.nodeLocked(r.table.addressOf(rt))
}

func (r *router) needsRefreshLocked() bool {
	if r.closed {
		return false
	}
	switch r.state {
	case tableFresh:
		return false
	case tableStale:
		// One broker outside a cluster, at the one address given: asking it again could only
		// tell the same.
		return r.table.isCluster || len(r.given) > 1
	}
	return true
}

func (r *router) refreshIfNeeded(ctx context.Context) {
	r.mu.Lock()
	if !r.needsRefreshLocked() {
		r.mu.Unlock()
		return
	}
	if done := r.refreshing; done != nil {
		r.mu.Unlock()
		select { // the refresh under way answers for this call too
		case <-done:
		case <-ctx.Done():
		}
		return
	}
	done := make(chan struct{})
	r.refreshing = done
	candidates := r.candidatesLocked()
	r.mu.Unlock()

	table := fetchTable(ctx, candidates)

	r.mu.Lock()
	if table != nil { // else the old table (or none) stays, and stays stale
		r.table, r.state = table, tableFresh
	}
	r.refreshing = nil
	r.mu.Unlock()
	close(done)
}

// partitionCount is the partition count of the last layout an address answered, 0 when none
// did (the coalescer's batch key, coalescer.go).
func (r *router) partitionCount() uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.table == nil {
		return 0
	}
	return r.table.reportedPartitions
}

// addressedConn is a node's connection with the address it was dialled at.
type addressedConn struct {
	address string
	conn    *grpc.ClientConn
}

// candidatesLocked lists whom to ask for the table: the nodes of the last table, then the
// given addresses; those whose last connection attempt failed go last.
func (r *router) candidatesLocked() []addressedConn {
	var addresses []string
	if r.table != nil {
		addresses = r.table.nodeAddresses()
	}
	addresses = append(addresses, r.given...)
	var candidates []addressedConn
	for _, address := range addresses {
		if !slices.ContainsFunc(candidates, func(c addressedConn) bool { return c.address == address }) {
			candidates = append(candidates, addressedConn{address, r.nodeLocked(address)})
		}
	}
	slices.SortStableFunc(candidates, func(a, b addressedConn) int {
		return failingRank(a.conn) - failingRank(b.conn)
	})
	return candidates
}

func failingRank(conn *grpc.ClientConn) int {
	if conn.GetState() == connectivity.TransientFailure {
		return 1
	}
	return 0
}

// fetchTable asks the candidates in turn for GetCluster; nil if none answered before ctx ended.
// ctx carries the call's metadata (the client name and token).
func fetchTable(ctx context.Context, candidates []addressedConn) *routingTable {
	for _, candidate := range candidates {
		info, err := getCluster(ctx, candidate.conn)
		switch code := status.Code(err); {
		case err == nil:
			return newRoutingTable(info, candidate.address)
		case ctx.Err() != nil:
			return nil
		case code == codes.Unavailable || code == codes.DeadlineExceeded:
			continue
		default:
			// It answered but will not say (an older broker, a token without the admin role):
			// it serves every call, forwarding what it does not lead.
			return singleBrokerTable(candidate.address)
		}
	}
	return nil
}

func getCluster(ctx context.Context, conn *grpc.ClientConn) (*pb.ClusterInfo, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, clusterLookupTimeout)
		defer cancel()
	}
	return pb.NewAdminClient(conn).GetCluster(ctx, &pb.GetClusterRequest{})
}

// nodeLocked is the connection to address, dialled now if it is new.
func (r *router) nodeLocked(address string) *grpc.ClientConn {
	if conn, ok := r.nodes[address]; ok {
		return conn
	}
	if r.closed {
		return r.givenConn // closed too: the call reports it
	}
	conn, err := grpc.NewClient(address, r.dial...)
	if err != nil {
		return r.givenConn // an address gRPC cannot parse: the given connection reports it
	}
	r.nodes[address] = conn
	return conn
}

// workGroups fetches the table if it is stale and groups a worker's queues by it (groupQueues);
// recheck is whether the worker fetches it again after each backoff delay while these groups
// run (recheckTableFor). ctx carries the metadata of a call (the client name and token) for
// GetCluster.
func (r *router) workGroups(ctx context.Context, queues []string, maxInFlight int) (groups []streamGroup, recheck bool) {
	r.refreshIfNeeded(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	groups = groupQueues(r.table, queues, maxInFlight)
	return groups, recheckTableFor(r.table, groups)
}

// Close closes every connection the router made.
func (r *router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	errs := []error{}
	if len(r.given) != 1 {
		errs = append(errs, r.givenConn.Close())
	}
	for _, conn := range r.nodes {
		errs = append(errs, conn.Close())
	}
	return errors.Join(errs...)
}
