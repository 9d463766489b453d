package jobbroker_test

import (
	"bytes"
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

// savingBroker is a stand-in Broker service for a step save refused the same way: it pushes one
// job and answers its first checkpoint save (a heartbeat carrying a checkpoint) Unavailable.
// With loseLease it then tells the worker the lease is lost and refuses every later save
// Unavailable too (the partition is still between leaders); otherwise it answers the next save
// OK. It records the saves and the acks and fails it receives.
type savingBroker struct {
	pb.UnimplementedBrokerServer
	loseLease bool
	addr      string
	mu        sync.Mutex
	saves     []*pb.HeartbeatRequest
	answers   []string // "ack" or "fail", in order
}

func (b *savingBroker) Work(stream grpc.BidiStreamingServer[pb.WorkRequest, pb.WorkResponse]) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		result := &pb.WorkResult{RequestId: req.GetRequestId()}
		var notice *pb.WorkResponse
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
		case req.GetHeartbeat().GetCheckpoint() != nil:
			b.mu.Lock()
			b.saves = append(b.saves, req.GetHeartbeat())
			n := len(b.saves)
			b.mu.Unlock()
			if n == 1 || b.loseLease {
				result.Code = int32(codes.Unavailable)
				result.Message = "partition 0: node-2 leads it but does not serve it at this moment; retry"
			}
			if n == 1 && b.loseLease {
				notice = &pb.WorkResponse{Response: &pb.WorkResponse_LeaseLost{LeaseLost: &pb.LeaseLost{JobId: "job-1"}}}
			}
		case req.GetAck() != nil || req.GetAckBatch() != nil:
			b.mu.Lock()
			b.answers = append(b.answers, "ack")
			b.mu.Unlock()
		case req.GetFail() != nil:
			b.mu.Lock()
			b.answers = append(b.answers, "fail")
			b.mu.Unlock()
		}
		if result != nil {
			if err := stream.Send(&pb.WorkResponse{Response: &pb.WorkResponse_Result{Result: result}}); err != nil {
				return err
			}
		}
		if notice != nil {
			if err := stream.Send(notice); err != nil {
				return err
			}
		}
	}
}

func startSavingBroker(t *testing.T, loseLease bool) *savingBroker {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &savingBroker{loseLease: loseLease}
	server := grpc.NewServer()
	pb.RegisterBrokerServer(server, fake)
	go server.Serve(l)
	t.Cleanup(server.Stop)
	fake.addr = l.Addr().String()
	return fake
}

// A durable step's checkpoint save answered Unavailable is sent again with the same lease id;
// the step waits until it is applied and the attempt is acked, not failed.
func TestAStepSaveRefusedWithUnavailableIsSentAgain(t *testing.T) {
	fake := startSavingBroker(t, false)
	c := newClientWith(t, jobbroker.Options{Address: fake.addr})
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{ShutdownGrace: time.Second})
	stepErr := make(chan error, 1)
	w.HandleFunc("q", func(ctx context.Context, job *jobbroker.Job) error {
		n, err := jobbroker.Step(ctx, job, "charge", func(ctx context.Context) (int, error) { return 42, nil })
		if err == nil && n != 42 {
			t.Errorf("step returned %d, want 42", n)
		}
		stepErr <- err
		return err
	})
	runWorker(t, w)
	select {
	case err := <-stepErr:
		if err != nil {
			t.Fatalf("the step failed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the step did not return")
	}
	deadline := time.Now().Add(10 * time.Second)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	for len(fake.answers) == 0 && time.Now().Before(deadline) {
		fake.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		fake.mu.Lock()
	}
	if len(fake.saves) != 2 {
		t.Fatalf("%d checkpoint saves received, want the refused one and its resend", len(fake.saves))
	}
	for _, s := range fake.saves {
		if s.GetLeaseId() != "lease-1" || !bytes.Equal(s.GetCheckpoint(), fake.saves[0].GetCheckpoint()) {
			t.Fatalf("saves %v, want the same checkpoint of lease-1 twice", fake.saves)
		}
	}
	if len(fake.answers) != 1 || fake.answers[0] != "ack" {
		t.Fatalf("answers received %v, want one ack", fake.answers)
	}
}

// If the lease is lost while a refused step save waits to be sent again, the step fails as for
// a stale lease (even under a context the loss does not cancel), and nothing is answered.
func TestAStepSaveRefusedWithUnavailableFailsOnceTheLeaseIsLost(t *testing.T) {
	fake := startSavingBroker(t, true)
	c := newClientWith(t, jobbroker.Options{Address: fake.addr})
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{ShutdownGrace: time.Second})
	stepErr := make(chan error, 1)
	w.HandleFunc("q", func(ctx context.Context, job *jobbroker.Job) error {
		_, err := jobbroker.Step(context.WithoutCancel(ctx), job, "charge",
			func(ctx context.Context) (int, error) { return 42, nil })
		stepErr <- err
		return err
	})
	runWorker(t, w)
	select {
	case err := <-stepErr:
		if !jobbroker.IsFailedPrecondition(err) {
			t.Fatalf("step error = %v, want a stale lease (FailedPrecondition)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the step still waits after its lease was lost")
	}
	time.Sleep(500 * time.Millisecond) // past a resend, were one due
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.answers) != 0 {
		t.Fatalf("answers received %v, want none after a lost lease", fake.answers)
	}
	if len(fake.saves) != 1 {
		t.Fatalf("%d checkpoint saves received, want only the refused one (its lease was lost)", len(fake.saves))
	}
}
