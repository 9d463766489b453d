package jobbroker_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// refusingBroker is a stand-in Broker service for a failure the real broker shows only in a
// cluster handing a partition over: it pushes one job and answers its first ack Unavailable
// ("retry"), the next OK, on the same stream.
type refusingBroker struct {
	pb.UnimplementedBrokerServer
	mu   sync.Mutex
	acks []string // the lease ids of the acks received, in order
	done chan struct{}
}

func (b *refusingBroker) Work(stream grpc.BidiStreamingServer[pb.WorkRequest, pb.WorkResponse]) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		result := &pb.WorkResult{RequestId: req.GetRequestId()}
		var ack *pb.AckRequest
		switch {
		case req.GetSubscribe() != nil:
			if err := stream.Send(&pb.WorkResponse{Response: &pb.WorkResponse_Result{Result: result}}); err != nil {
				return err
			}
			result = nil
			job := &pb.LeasedJob{JobId: "job-1", LeaseId: "lease-1", Queue: "q", Attempt: 1, MaxAttempts: 3,
				LeaseDeadline: timestamppb.New(time.Now().Add(time.Minute))}
			if err := stream.Send(&pb.WorkResponse{Response: &pb.WorkResponse_Job{Job: job}}); err != nil {
				return err
			}
		case req.GetAck() != nil:
			ack = req.GetAck()
		case req.GetAckBatch() != nil && len(req.GetAckBatch().GetAcks()) == 1:
			ack = req.GetAckBatch().GetAcks()[0]
		}
		if ack != nil {
			b.mu.Lock()
			b.acks = append(b.acks, ack.GetLeaseId())
			first := len(b.acks) == 1
			b.mu.Unlock()
			if first {
				result.Code = int32(codes.Unavailable)
				result.Message = "partition 0: node-2 leads it but does not serve it at this moment; retry"
			} else {
				close(b.done)
			}
		}
		if result != nil {
			if err := stream.Send(&pb.WorkResponse{Response: &pb.WorkResponse_Result{Result: result}}); err != nil {
				return err
			}
		}
	}
}

func TestAnAckRefusedWithUnavailableIsSentAgain(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &refusingBroker{done: make(chan struct{})}
	server := grpc.NewServer()
	pb.RegisterBrokerServer(server, fake)
	go server.Serve(l)
	t.Cleanup(server.Stop)

	c := newClientWith(t, jobbroker.Options{Address: l.Addr().String()})
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{ShutdownGrace: time.Second})
	w.HandleFunc("q", func(ctx context.Context, job *jobbroker.Job) error { return nil })
	runWorker(t, w)
	select {
	case <-fake.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the refused ack was not sent again")
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.acks) != 2 || fake.acks[0] != "lease-1" || fake.acks[1] != "lease-1" {
		t.Fatalf("acks received %v, want the same lease twice", fake.acks)
	}
}
