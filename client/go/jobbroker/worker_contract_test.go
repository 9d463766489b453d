package jobbroker_test

// Tests of the worker contract (docs/worker-contract.md) against the real broker: what a
// handler's end sends, time-outs, snoozes, progress, prefetch order, ack coalescing across a
// reconnect, the end of a graceful stop's grace, a stream reopened during a graceful stop, and the
// client metadata.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

func TestWorkerSnoozeGivesTheJobBackWithoutSpendingAnAttempt(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	attempts := make(chan int, 2)
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		attempts <- job.Attempt
		if calls.Add(1) == 1 {
			return fmt.Errorf("rate limited: %w", jobbroker.Snooze(200*time.Millisecond))
		}
		return nil
	})
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
	a := job.GetAttempts()
	if job.GetSnoozes() != 1 || job.GetAttempt() != 1 || len(a) != 2 ||
		a[0].GetOutcome() != pb.AttemptOutcome_ATTEMPT_OUTCOME_SNOOZED || a[1].GetAttempt() != 1 {
		t.Fatalf("job = %v, want completed by attempt 1 after one snooze", job)
	}
	if a, b := <-attempts, <-attempts; a != 1 || b != 1 {
		t.Fatalf("the handler saw attempts %d and %d, want 1 and 1", a, b)
	}
	if st := w.Stats(); st.Snoozed != 1 || st.Failed != 0 {
		t.Fatalf("stats = %+v, want one snooze and no failure", st)
	}
}

func TestWorkerTimeoutCancelsTheHandlerAndSendsNothing(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil, jobbroker.WithTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cause := make(chan error, 1)
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{LeaseDuration: time.Minute})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		if job.Attempt > 1 {
			return nil
		}
		if job.TimeoutAt.IsZero() {
			return jobbroker.Permanentf("the job has no TimeoutAt")
		}
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return errors.New("stopped by the time-out")
	})
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
	if got := <-cause; !errors.Is(got, jobbroker.ErrTimedOut) {
		t.Fatalf("cause = %v, want ErrTimedOut", got)
	}
	a := job.GetAttempts()
	if job.GetAttempt() != 2 || len(a) != 2 || a[0].GetOutcome() != pb.AttemptOutcome_ATTEMPT_OUTCOME_TIMED_OUT {
		t.Fatalf("job = %v, want attempt 1 TIMED_OUT, completed by attempt 2", job)
	}
	if a[0].GetError() == "stopped by the time-out" {
		t.Fatalf("the handler's error reached the broker after the time-out: %v", a[0])
	}
}

func TestWorkerOperatorCancelFailsTheAttemptAsCancelled(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{LeaseDuration: time.Minute})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		close(started)
		<-ctx.Done()
		return errors.New("the handler's own words")
	})
	runWorker(t, w)
	<-started
	if _, err := c.CancelJob(ctx, enq.JobID); err != nil {
		t.Fatal(err)
	}
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_CANCELLED)
	waitFor(t, "the fail to be recorded", func() bool { return w.Stats().Failed == 1 })
	job, err = c.GetJob(ctx, enq.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if a := job.GetAttempts(); len(a) != 1 || a[0].GetError() != "cancelled" {
		t.Fatalf("attempts = %v, want one failed with \"cancelled\"", a)
	}
}

func TestWorkerReleasesWhatRunsPastTheGrace(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	cause := make(chan error, 1)
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{ShutdownGrace: 200 * time.Millisecond})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return context.Cause(ctx)
	})
	stop := runWorker(t, w)
	<-started
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := <-cause; !errors.Is(got, jobbroker.ErrShutdown) {
		t.Fatalf("cause = %v, want ErrShutdown", got)
	}
	// Run waited for the release's answer: the job is READY already, no attempt spent.
	job, err := c.GetJob(ctx, enq.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != pb.JobState_JOB_STATE_READY || job.GetAttempt() != 0 || job.GetLastError() != "" {
		t.Fatalf("job = %v, want READY with no attempt spent", job)
	}
	if st := w.Stats(); st.Released != 1 || st.Failed != 0 {
		t.Fatalf("stats = %+v, want one release", st)
	}
}

// A stream that ends during a graceful stop's grace is reopened (docs/worker-contract.md §6), so
// that the answers still to come reach the broker: the broker crashes (SIGKILL) while a handler
// runs past the start of the stop and is restarted on the same data and port; the handler then
// returns, and its ack goes out on the reopened stream. The reopened stream subscribes to
// nothing: the job the stop released is not pushed again.
func TestWorkerReopensItsStreamDuringAGracefulStop(t *testing.T) {
	b, restart := restartableBroker(t)
	c := newClient(t, b)
	ctx, q := testCtx(t), queueFor(t)
	var ids []string
	for i := range 2 {
		enq, err := c.Enqueue(ctx, q, []byte(fmt.Sprint(i)), jobbroker.WithLeaseDuration(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, enq.JobID)
	}
	gate := make(chan struct{})
	running := make(chan string, 2)
	const grace = 30 * time.Second
	// Concurrency 1 and prefetch 1: one job runs, the other waits and is released by the stop.
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{
		Concurrency: 1, Prefetch: 1, ShutdownGrace: grace, ReconnectMax: 200 * time.Millisecond})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		running <- job.ID
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	runCtx, cancel := context.WithCancel(context.Background())
	done, returned := make(chan error, 1), make(chan struct{})
	go func() { done <- w.Run(runCtx); close(returned) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-returned:
		case <-time.After(60 * time.Second):
		}
	})
	runningID := <-running
	waitingID := ids[0]
	if waitingID == runningID {
		waitingID = ids[1]
	}
	waitFor(t, "the worker to hold both jobs", func() bool {
		info, err := c.GetQueue(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return info.GetActive() == 2
	})

	stopAt := time.Now()
	cancel()
	// Steps 1 and 2 of the stop done: the job that had not started is READY again.
	waitState(t, c, waitingID, pb.JobState_JOB_STATE_READY)

	b.kill9()
	b = restart(nil)
	close(gate) // the handler returns within the grace; its ack needs a new stream
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(grace):
		t.Fatalf("Run did not return within the grace (%v) of the stop", grace)
	}
	if took := time.Since(stopAt); took >= grace {
		t.Fatalf("Run returned %v after the stop began: it waited out the grace, the ack unanswered", took)
	}
	c2 := newClient(t, b)
	job, err := c2.GetJob(ctx, runningID)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != pb.JobState_JOB_STATE_COMPLETED || job.GetAttempt() != 1 {
		t.Fatalf("job = %v, want completed by attempt 1: its ack reached the broker on the reopened stream", job)
	}
	job, err = c2.GetJob(ctx, waitingID)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != pb.JobState_JOB_STATE_READY || job.GetAttempt() != 0 {
		t.Fatalf("job = %v, want READY with no attempt spent (released by the stop, not pushed again)", job)
	}
	if st := w.Stats(); st.Acked != 1 || st.Released != 1 || st.Reconnects < 1 {
		t.Fatalf("stats = %+v, want 1 ack, 1 release and a reconnect", st)
	}
}

// Progress goes out at once; reported faster than the broker answers, the newest value still
// arrives.
func TestWorkerProgressReachesTheBroker(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		for i := 1; i <= 100; i++ {
			if err := job.SetProgressJSON(map[string]int{"percent": i}); err != nil {
				return err
			}
		}
		<-gate
		return nil
	})
	runWorker(t, w)
	waitFor(t, "progress 100", func() bool {
		job, err := c.GetJob(ctx, enq.JobID)
		if err != nil {
			t.Fatal(err)
		}
		var p struct{ Percent int }
		return json.Unmarshal(job.GetProgress(), &p) == nil && p.Percent == 100
	})
	close(gate)
	waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
}

// Jobs held beyond the concurrency start in the order they were pushed (FIFO here).
func TestWorkerPrefetchedJobsStartInArrivalOrder(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	var reqs []*pb.EnqueueRequest
	for i := range 6 {
		reqs = append(reqs, jobbroker.NewEnqueueRequest(q, []byte(fmt.Sprint(i))))
	}
	enqueued, err := c.EnqueueBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var mu sync.Mutex
	var order []string
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{Concurrency: 1, Prefetch: 5})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		mu.Lock()
		order = append(order, job.Text())
		first := len(order) == 1
		mu.Unlock()
		if first {
			<-gate
		}
		return nil
	})
	runWorker(t, w)
	waitFor(t, "the worker to hold all 6 jobs", func() bool {
		info, err := c.GetQueue(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return info.GetActive() == 6
	})
	close(gate)
	for _, e := range enqueued {
		waitState(t, c, e.JobID, pb.JobState_JOB_STATE_COMPLETED)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != "[0 1 2 3 4 5]" {
		t.Fatalf("handlers started in order %v, want the enqueue order", order)
	}
}

// Acks whose answer the broker never gave go out again, together, as one ack_batch on the new
// stream, and the broker completes every job with its first attempt. The test fixes the timing:
// the broker is frozen (SIGSTOP) before the handlers end, so the first ack goes out on the first
// stream and gets no answer, and the other four coalesce behind it; only then is the stream
// broken (the broker killed, which also throws away the ack it never read) and the broker
// restarted on the same data.
func TestWorkerResendsCoalescedAcksAfterReconnect(t *testing.T) {
	b, restart := restartableBroker(t)
	c := newClient(t, b)
	ctx, q := testCtx(t), queueFor(t)
	const jobs = 5
	var reqs []*pb.EnqueueRequest
	for i := range jobs {
		reqs = append(reqs, jobbroker.NewEnqueueRequest(q, []byte(fmt.Sprint(i)), jobbroker.WithLeaseDuration(time.Minute)))
	}
	enqueued, err := c.EnqueueBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var started atomic.Int32
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{Concurrency: jobs, ReconnectMax: 200 * time.Millisecond})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		started.Add(1)
		<-gate
		job.SetResult([]byte("done " + job.Text()))
		return nil
	})
	stop := runWorker(t, w)
	waitFor(t, "every handler to start", func() bool { return started.Load() == jobs })

	// Frozen, the broker keeps the stream open but answers nothing.
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	close(gate)
	waitFor(t, "every handler to end", func() bool { return w.Stats().Acked == jobs })
	// The first ack that ended went out at once on the open stream; no answer can come, so the
	// other four wait behind it: exactly one ack message so far.
	if st := w.Stats(); st.AckMessages != 1 || st.Reconnects != 0 {
		t.Fatalf("stats = %+v before the stream broke, want 1 ack message and no reconnect", st)
	}
	b.kill9()
	b = restart(nil)
	c2 := newClient(t, b)
	for i, e := range enqueued {
		job := waitState(t, c2, e.JobID, pb.JobState_JOB_STATE_COMPLETED)
		if job.GetAttempt() != 1 || string(job.GetResult()) != fmt.Sprint("done ", i) {
			t.Fatalf("job = %v, want completed by attempt 1", job)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	// Exactly 2: the one that went out on the first stream unanswered, then the five acks (that
	// one again and the four coalesced behind it) as one ack_batch on the new stream. A third
	// would mean the acks were not coalesced on the new stream; one would mean the unanswered
	// ack was not sent again.
	if st := w.Stats(); st.AckMessages != 2 || st.Reconnects < 1 {
		t.Fatalf("stats = %+v, want 2 ack messages for %d acks, after a reconnect", st, jobs)
	}
}

func TestWorkerNamesItsLibraryToTheBroker(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error { return nil })
	runWorker(t, w)
	var client string
	waitFor(t, "the worker in ListWorkers", func() bool {
		resp, err := c.Admin().ListWorkers(ctx, &pb.ListWorkersRequest{Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		for _, info := range resp.GetWorkers() {
			if info.GetStreams() > 0 {
				client = info.GetClient()
				return true
			}
		}
		return false
	})
	if client != "jobbroker-go/"+jobbroker.Version {
		t.Fatalf("ListWorkers shows client %q, want %q", client, "jobbroker-go/"+jobbroker.Version)
	}
}

// A worker frozen past its lease: the broker ends the attempt; the handler hears ErrLeaseLost
// when the process runs again, and the worker sends nothing for that attempt (a late fail
// would be recorded on it).
func TestWorkerLostLeaseCancelsTheHandlerAndSendsNothing(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	logPath := filepath.Join(t.TempDir(), "lost.log")
	enq, err := c.Enqueue(ctx, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	worker := startChild(t, "lost", q, logPath)
	waitFor(t, "attempt 1 to start", func() bool { return countLines(readLines(t, logPath), "start 1") == 1 })
	if err := worker.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "attempt 1's lease to expire", func() bool {
		job, err := c.GetJob(ctx, enq.JobID)
		if err != nil {
			t.Fatal(err)
		}
		a := job.GetAttempts()
		return len(a) > 0 && a[0].GetOutcome() == pb.AttemptOutcome_ATTEMPT_OUTCOME_LEASE_EXPIRED
	})
	if err := worker.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
	waitFor(t, "attempt 1's handler to end", func() bool {
		return countLines(readLines(t, logPath), "cancelled 1 "+jobbroker.ErrLeaseLost.Error()) == 1
	})
	if err := worker.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := worker.wait(t); code != 0 {
		t.Fatalf("worker exit code %d, want 0", code)
	}
	a := job.GetAttempts()
	if job.GetAttempt() != 2 || len(a) != 2 || a[0].GetError() == "ignored the lost lease" {
		t.Fatalf("job = %v, want attempt 1 expired with no error of the handler, attempt 2 completed", job)
	}
}
