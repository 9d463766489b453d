package jobbroker_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// A 3-step job whose worker process is SIGKILLed during step 3 resumes on another worker
// process at step 3: steps 1 and 2 ran exactly once.
func TestStepsResumeAfterWorkerIsKilled(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	logPath := filepath.Join(t.TempDir(), "steps.log")
	enq, err := c.Enqueue(ctx, q, []byte("ada"))
	if err != nil {
		t.Fatal(err)
	}

	first := startChild(t, "steps", q, logPath, childHangEnv+"=1")
	waitFor(t, "step 3 to start", func() bool { return countLines(readLines(t, logPath), "step3 ") == 1 })
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait(t)

	second := startChild(t, "steps", q, logPath)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := second.wait(t); code != 0 {
		t.Fatalf("second worker exit code %d, want 0", code)
	}

	lines := readLines(t, logPath)
	if countLines(lines, "step1 ") != 1 || countLines(lines, "step2 ") != 1 || countLines(lines, "step3 ") != 2 {
		t.Fatalf("step executions = %q, want step1 and step2 once, step3 twice", lines)
	}
	if lines[3] == lines[2] { // "step3 <pid>": the second run was in the other process
		t.Fatalf("step 3 ran twice in one process: %q", lines)
	}
	var result string
	if err := json.Unmarshal(job.GetResult(), &result); err != nil || result != "welcome u-ada (pro, 42 seats)" {
		t.Fatalf("result = %s (%v)", job.GetResult(), err)
	}
	if len(job.GetAttempts()) != 2 || job.GetAttempts()[0].GetOutcome() != pb.AttemptOutcome_ATTEMPT_OUTCOME_LEASE_EXPIRED {
		t.Fatalf("attempts = %v, want a lease expiry then a completion", job.GetAttempts())
	}
	// The checkpoint is a jobbroker.v1.StepCheckpoint of JSON results, readable by every language.
	var cp pb.StepCheckpoint
	if err := proto.Unmarshal(job.GetCheckpoint(), &cp); err != nil {
		t.Fatal(err)
	}
	var names, results []string
	for _, s := range cp.GetSteps() {
		names = append(names, s.GetName())
		results = append(results, string(s.GetResult()))
	}
	if strings.Join(names, ",") != "create-account,count-seats,send-welcome" ||
		results[0] != `{"UserID":"u-ada","Plan":"pro"}` || results[1] != "42" {
		t.Fatalf("checkpoint steps = %v %v", names, results)
	}
}

// A failing step fails the attempt; the next attempt skips the steps that finished.
func TestStepsResumeAfterAFailedStep(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	var charged, shipped atomic.Int32
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		receipt, err := jobbroker.Step(ctx, job, "charge", func(ctx context.Context) (map[string]int, error) {
			charged.Add(1)
			return map[string]int{"cents": 1999}, nil
		})
		if err != nil {
			return err
		}
		_, err = jobbroker.Step(ctx, job, "ship", func(ctx context.Context) (bool, error) {
			shipped.Add(1)
			if job.Attempt == 1 {
				return false, errors.New("carrier down")
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		return job.SetResultJSON(receipt["cents"])
	})
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
	if charged.Load() != 1 || shipped.Load() != 2 || string(job.GetResult()) != "1999" || job.GetAttempt() != 2 ||
		job.GetAttempts()[0].GetError() != "carrier down" {
		t.Fatalf("charged %d, shipped %d, job = %v", charged.Load(), shipped.Load(), job)
	}
}

// Using one step name twice in an attempt is a programming error: Step panics and the worker
// fails the attempt with the panic's text.
func TestStepNameUsedTwice(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil, jobbroker.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		for range 2 {
			if _, err := jobbroker.Step(ctx, job, "same", func(ctx context.Context) (int, error) {
				calls.Add(1)
				return 1, nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_FAILED)
	if !strings.Contains(job.GetLastError(), `step "same" used twice`) || calls.Load() != 1 {
		t.Fatalf("calls = %d, job = %v", calls.Load(), job)
	}
}

// A checkpoint that durable steps did not write fails the attempt with a clear message.
func TestStepRejectsAForeignCheckpoint(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, nil, jobbroker.WithMaxAttempts(2))
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := c.Lease(ctx, q, jobbroker.LeaseOptions{Wait: 5 * time.Second})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("Lease = %v, %v", jobs, err)
	}
	if _, err := c.Heartbeat(ctx, jobs[0].GetJobId(), jobs[0].GetLeaseId(),
		jobbroker.HeartbeatOptions{Checkpoint: []byte("not a step checkpoint")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fail(ctx, jobs[0].GetJobId(), jobs[0].GetLeaseId(), "first try", jobbroker.FailOptions{}); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		_, err := jobbroker.Step(ctx, job, "one", func(ctx context.Context) (int, error) {
			ran.Store(true)
			return 1, nil
		})
		return err
	})
	runWorker(t, w)
	job := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_FAILED)
	if !strings.Contains(job.GetLastError(), "not a jobbroker.v1.StepCheckpoint") || ran.Load() {
		t.Fatalf("step ran: %v; job = %v", ran.Load(), job)
	}
}
