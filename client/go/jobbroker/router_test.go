package jobbroker_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// clusterLookups counts the GetCluster calls a client sends.
type clusterLookups struct{ n atomic.Int64 }

func (l *clusterLookups) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == pb.Admin_GetCluster_FullMethodName {
		l.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func TestConcurrentFirstCallsShareOneLookupOfTheCluster(t *testing.T) {
	var lookups clusterLookups
	c := newClientWith(t, jobbroker.Options{
		Address:     shared.addr,
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(lookups.interceptor)},
	})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.ListQueues(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := lookups.n.Load(); n != 1 {
		t.Fatalf("20 concurrent first calls sent GetCluster %d times, want 1", n)
	}
}

// olderBroker answers ListQueues and nothing else: GetCluster is Unimplemented, as from a
// broker older than cluster mode.
type olderBroker struct {
	pb.UnimplementedAdminServer
}

func (olderBroker) ListQueues(context.Context, *pb.ListQueuesRequest) (*pb.ListQueuesResponse, error) {
	return &pb.ListQueuesResponse{Queues: []*pb.QueueInfo{{Name: "older"}}}, nil
}

func TestABrokerThatDoesNotKnowGetClusterIsUsedAtTheGivenAddressAndAskedOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer()
	pb.RegisterAdminServer(server, olderBroker{})
	go server.Serve(l)
	t.Cleanup(server.Stop)

	var lookups clusterLookups
	c := newClientWith(t, jobbroker.Options{
		Address:     l.Addr().String(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(lookups.interceptor)},
	})
	ctx := testCtx(t)
	for range 3 {
		queues, err := c.ListQueues(ctx)
		if err != nil || len(queues) != 1 || queues[0].GetName() != "older" {
			t.Fatalf("ListQueues = %v, %v; want the older broker's one queue", queues, err)
		}
	}
	if _, err := c.GetCluster(ctx); status.Code(err) != codes.Unimplemented {
		t.Fatalf("GetCluster of the older broker: %v, want Unimplemented", err)
	}
	// One lookup before the first call; the second is the caller's own GetCluster.
	if n := lookups.n.Load(); n != 2 {
		t.Fatalf("GetCluster was sent %d times, want 2", n)
	}
}
