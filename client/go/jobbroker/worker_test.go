package jobbroker_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

func TestWorkerAcksWithResult(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	var ids []string
	for i := range 5 {
		enq, err := c.EnqueueJSON(ctx, q, map[string]int{"n": i}, jobbroker.WithHeader("h", fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, enq.JobID)
	}
	var mu sync.Mutex
	running, maxRunning := 0, 0
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{Concurrency: 2, WorkerID: "go-worker"})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		mu.Lock()
		running++
		maxRunning = max(maxRunning, running)
		mu.Unlock()
		defer func() { mu.Lock(); running--; mu.Unlock() }()
		var p struct{ N int }
		if err := job.DecodeJSON(&p); err != nil {
			return jobbroker.Permanent(err)
		}
		if job.Headers["h"] != fmt.Sprint(p.N) || job.Attempt != 1 || job.IdempotencyKey != job.ID {
			return jobbroker.Permanentf("unexpected job %+v", job)
		}
		time.Sleep(100 * time.Millisecond)
		return job.SetResultJSON(p.N * 10)
	})
	stop := runWorker(t, w)
	for i, id := range ids {
		job := waitState(t, c, id, pb.JobState_JOB_STATE_COMPLETED)
		if string(job.GetResult()) != fmt.Sprint(i*10) || job.GetAttempts()[0].GetWorkerId() != "go-worker" {
			t.Fatalf("job %d = %v", i, job)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if maxRunning > 2 {
		t.Fatalf("%d handlers ran at once, concurrency is 2", maxRunning)
	}
}

func TestWorkerHeartbeatsKeepAShortLeaseAlive(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, []byte("slow"))
	if err != nil {
		t.Fatal(err)
	}
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{LeaseDuration: time.Second})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		select {
		case <-time.After(3 * time.Second): // three leases long
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
	if job.GetAttempt() != 1 || len(job.GetAttempts()) != 1 {
		t.Fatalf("job = %v, want completed in 1 attempt", job)
	}
}

func TestWorkerPermanentError(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, []byte("bad address"))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		calls.Add(1)
		return fmt.Errorf("sending: %w", jobbroker.Permanent(errors.New("no such mailbox")))
	})
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_FAILED)
	if job.GetFailReason() != pb.FailReason_FAIL_REASON_PERMANENT || job.GetAttempt() != 1 ||
		job.GetLastError() != "sending: no such mailbox" ||
		job.GetAttempts()[0].GetOutcome() != pb.AttemptOutcome_ATTEMPT_OUTCOME_PERMANENT_ERROR {
		t.Fatalf("job = %v", job)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
}

func TestWorkerRetriesFailedAttempts(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, []byte("flaky"))
	if err != nil {
		t.Fatal(err)
	}
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		switch job.Attempt {
		case 1:
			return errors.New("connection reset")
		case 2:
			return jobbroker.RetryAfter(200*time.Millisecond, errors.New("429 too many requests"))
		}
		return nil
	})
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
	a := job.GetAttempts()
	if job.GetAttempt() != 3 || len(a) != 3 || a[0].GetError() != "connection reset" ||
		a[1].GetError() != "429 too many requests" || a[1].GetOutcome() != pb.AttemptOutcome_ATTEMPT_OUTCOME_ERROR {
		t.Fatalf("job = %v", job)
	}
	// RetryAfter replaced the 0.05 s backoff of the test config.
	if gap := a[2].GetStartedAt().AsTime().Sub(a[1].GetEndedAt().AsTime()); gap < 200*time.Millisecond {
		t.Fatalf("attempt 3 started %v after attempt 2 ended, want at least the 200ms RetryAfter", gap)
	}
}

func TestWorkerPanicFailsTheAttempt(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil, jobbroker.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error { panic("boom") })
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_FAILED)
	if job.GetFailReason() != pb.FailReason_FAIL_REASON_ATTEMPTS_EXHAUSTED || !strings.Contains(job.GetLastError(), "boom") {
		t.Fatalf("job = %v", job)
	}
}

func TestWorkerCancelNoticeCancelsTheHandler(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	cause := make(chan error, 1)
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return context.Cause(ctx)
	})
	runWorker(t, w)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start")
	}
	if _, err := c.CancelJob(ctx, enq.JobID); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-cause:
		if !errors.Is(got, jobbroker.ErrCancelRequested) {
			t.Fatalf("cause = %v, want ErrCancelRequested", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_CANCELLED)
}

func TestWorkerRefusedSubscriptionIsReturned(t *testing.T) {
	c := newClient(t, shared)
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc("not a valid queue name!", func(ctx context.Context, job *jobbroker.Job) error { return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := w.Run(ctx)
	if !jobbroker.IsInvalidArgument(err) {
		t.Fatalf("Run = %v, want InvalidArgument", err)
	}
}

func TestWorkerReconnectsAfterBrokerRestart(t *testing.T) {
	b, restart := restartableBroker(t)
	c := newClient(t, b)
	q := queueFor(t)
	var done sync.Map
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{ReconnectMax: 500 * time.Millisecond})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		done.Store(job.Text(), true)
		return nil
	})
	runWorker(t, w)
	ctx := testCtx(t)
	if _, err := c.Enqueue(ctx, q, []byte("before")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first job", func() bool { _, ok := done.Load("before"); return ok })

	// Restart the broker on the same address: the worker reconnects by itself.
	b = restart(nil)
	// A fresh client: c's connection is in its own reconnect backoff and fails fast meanwhile.
	c2 := newClient(t, b)
	enq, err := c2.Enqueue(ctx, q, []byte("after"))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c2, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
}

// SIGTERM: the running job finishes and is acked, the jobs received but not started go back
// to READY, and the process exits 0.
func TestWorkerSIGTERMDrains(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	logPath := filepath.Join(t.TempDir(), "drain.log")
	var ids []string
	for i := range 3 {
		enq, err := c.Enqueue(ctx, q, []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, enq.JobID)
	}
	worker := startChild(t, "drain", q, logPath)
	waitFor(t, "a job to start", func() bool { return countLines(readLines(t, logPath), "start ") == 1 })
	// Concurrency 1 + prefetch 2: the worker holds all three, one running and two waiting.
	waitFor(t, "the worker to hold all 3 jobs", func() bool {
		info, err := c.GetQueue(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return info.GetActive() == 3
	})
	if err := worker.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := worker.wait(t); code != 0 {
		t.Fatalf("worker exit code %d, want 0", code)
	}
	lines := readLines(t, logPath)
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "end ") || lines[0][len("start "):] != lines[1][len("end "):] ||
		lines[2] != "stats acked=1 failed=0 released=2" {
		t.Fatalf("worker log = %q, want one job started and finished, two released", lines)
	}
	finished := lines[1][len("end "):]
	for _, id := range ids {
		job, err := c.GetJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want := pb.JobState_JOB_STATE_READY
		if id == finished {
			want = pb.JobState_JOB_STATE_COMPLETED
		}
		if job.GetState() != want {
			t.Fatalf("job %s state = %v, want %v", id, job.GetState(), want)
		}
		if id == finished && len(job.GetAttempts()) != 1 {
			t.Fatalf("finished job = %v", job)
		}
	}
}
