package jobbroker_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

func TestEnqueueLeaseHeartbeatAck(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, []byte(`{"to":"a@example.com"}`),
		jobbroker.WithHeader("trace", "t-1"), jobbroker.WithMaxAttempts(4))
	if err != nil {
		t.Fatal(err)
	}
	if enq.JobID == "" || enq.Deduplicated {
		t.Fatalf("Enqueue = %+v", enq)
	}

	jobs, err := c.Lease(ctx, q, jobbroker.LeaseOptions{WorkerID: "go-test", Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 {
		t.Fatalf("leased %d jobs, want 1", len(jobs))
	}
	l := jobs[0]
	if l.GetJobId() != enq.JobID || string(l.GetPayload()) != `{"to":"a@example.com"}` ||
		l.GetHeaders()["trace"] != "t-1" || l.GetAttempt() != 1 || l.GetMaxAttempts() != 4 ||
		l.GetIdempotencyKey() != enq.JobID || l.GetLeaseId() == "" || l.GetQueue() != q {
		t.Fatalf("leased job = %v", l)
	}
	if got := waitState(t, c, enq.JobID, pb.JobState_JOB_STATE_ACTIVE); got.GetAttempts()[0].GetWorkerId() != "go-test" {
		t.Fatalf("attempt worker = %q", got.GetAttempts()[0].GetWorkerId())
	}

	hb, err := c.Heartbeat(ctx, l.GetJobId(), l.GetLeaseId(), jobbroker.HeartbeatOptions{
		ExtendBy: time.Minute, Checkpoint: []byte("half done"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if hb.GetCancelRequested() || !hb.GetLeaseDeadline().AsTime().After(time.Now().Add(30*time.Second)) {
		t.Fatalf("Heartbeat = %v", hb)
	}

	if err := c.Ack(ctx, l.GetJobId(), l.GetLeaseId(), []byte("sent")); err != nil {
		t.Fatal(err)
	}
	// Ack is idempotent per lease.
	if err := c.Ack(ctx, l.GetJobId(), l.GetLeaseId(), []byte("sent")); err != nil {
		t.Fatalf("second Ack: %v", err)
	}
	job, err := c.GetJob(ctx, enq.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != pb.JobState_JOB_STATE_COMPLETED || string(job.GetResult()) != "sent" ||
		string(job.GetCheckpoint()) != "half done" || len(job.GetAttempts()) != 1 ||
		job.GetAttempts()[0].GetOutcome() != pb.AttemptOutcome_ATTEMPT_OUTCOME_COMPLETED {
		t.Fatalf("job after ack = %v", job)
	}
}

func TestFailIsRetriedAsAttemptTwo(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := c.Lease(ctx, q, jobbroker.LeaseOptions{Wait: 5 * time.Second})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("Lease = %v, %v", jobs, err)
	}
	resp, err := c.Fail(ctx, jobs[0].GetJobId(), jobs[0].GetLeaseId(), "smtp timeout", jobbroker.FailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetState() != pb.JobState_JOB_STATE_SCHEDULED || resp.GetNextAttemptAt() == nil {
		t.Fatalf("Fail = %v, want SCHEDULED with a next attempt time", resp)
	}

	again, err := c.Lease(ctx, q, jobbroker.LeaseOptions{Wait: 10 * time.Second})
	if err != nil || len(again) != 1 {
		t.Fatalf("second Lease = %v, %v", again, err)
	}
	if again[0].GetJobId() != enq.JobID || again[0].GetAttempt() != 2 || again[0].GetLeaseId() == jobs[0].GetLeaseId() {
		t.Fatalf("second lease = %v, want attempt 2 of %s", again[0], enq.JobID)
	}
	// The first attempt's lease is stale now.
	err = c.Ack(ctx, jobs[0].GetJobId(), jobs[0].GetLeaseId(), nil)
	if !jobbroker.IsFailedPrecondition(err) {
		t.Fatalf("Ack with the stale lease: %v, want FailedPrecondition", err)
	}
	if err := c.Ack(ctx, again[0].GetJobId(), again[0].GetLeaseId(), nil); err != nil {
		t.Fatal(err)
	}
	job, err := c.GetJob(ctx, enq.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != pb.JobState_JOB_STATE_COMPLETED || job.GetAttempt() != 2 ||
		job.GetAttempts()[0].GetOutcome() != pb.AttemptOutcome_ATTEMPT_OUTCOME_ERROR ||
		job.GetAttempts()[0].GetError() != "smtp timeout" {
		t.Fatalf("job = %v", job)
	}
}

func TestPermanentFailKillsTheJob(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := c.Lease(ctx, q, jobbroker.LeaseOptions{Wait: 5 * time.Second})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("Lease = %v, %v", jobs, err)
	}
	resp, err := c.Fail(ctx, jobs[0].GetJobId(), jobs[0].GetLeaseId(), "no such mailbox", jobbroker.FailOptions{Permanent: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetState() != pb.JobState_JOB_STATE_FAILED {
		t.Fatalf("Fail state = %v, want FAILED", resp.GetState())
	}
	job, err := c.GetJob(ctx, enq.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != pb.JobState_JOB_STATE_FAILED || job.GetFailReason() != pb.FailReason_FAIL_REASON_PERMANENT ||
		job.GetAttempt() != 1 || len(job.GetAttempts()) != 1 || job.GetLastError() != "no such mailbox" {
		t.Fatalf("job = %v", job)
	}
}

func TestDedupKey(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	first, err := c.Enqueue(ctx, q, []byte("welcome"), jobbroker.WithDedupKey("welcome:user_7"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Enqueue(ctx, q, []byte("welcome"), jobbroker.WithDedupKey("welcome:user_7"))
	if err != nil {
		t.Fatal(err)
	}
	if first.Deduplicated || !second.Deduplicated || second.JobID != first.JobID {
		t.Fatalf("first = %+v, second = %+v", first, second)
	}
	// The same key with another payload is a caller bug.
	_, err = c.Enqueue(ctx, q, []byte("other"), jobbroker.WithDedupKey("welcome:user_7"))
	if !jobbroker.IsAlreadyExists(err) || !strings.Contains(err.Error(), first.JobID) {
		t.Fatalf("other payload: %v, want AlreadyExists naming %s", err, first.JobID)
	}
	jobs, err := c.Lease(ctx, q, jobbroker.LeaseOptions{Wait: 5 * time.Second, MaxJobs: 10})
	if err != nil || len(jobs) != 1 || jobs[0].GetIdempotencyKey() != "welcome:user_7" {
		t.Fatalf("Lease = %v, %v; want one job whose idempotency key is the dedup key", jobs, err)
	}
}

func TestInvalidArgumentIsAStatusError(t *testing.T) {
	c, ctx := newClient(t, shared), testCtx(t)
	_, err := c.Enqueue(ctx, "", []byte("x"))
	if status.Code(err) != codes.InvalidArgument || !jobbroker.IsInvalidArgument(err) {
		t.Fatalf("Enqueue to an empty queue: %v, want InvalidArgument", err)
	}
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "queue") {
		t.Fatalf("message %q does not name the field", msg)
	}
	_, err = c.Enqueue(ctx, queueFor(t), nil, jobbroker.WithDelay(time.Second), jobbroker.WithRunAt(time.Now()))
	if !jobbroker.IsInvalidArgument(err) {
		t.Fatalf("delay and run_at: %v, want InvalidArgument", err)
	}
	_, err = c.GetJob(ctx, "01HZZZZZZZZZZZZZZZZZZZZZZZ")
	if !jobbroker.IsNotFound(err) {
		t.Fatalf("GetJob of an unknown job: %v, want NotFound", err)
	}
}

func TestEnqueueOptionsAndBatch(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)

	delayed, err := c.Enqueue(ctx, q, []byte("later"), jobbroker.WithDelay(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	runAt := time.Now().Add(2 * time.Hour).Truncate(time.Millisecond)
	scheduled, err := c.Enqueue(ctx, q, []byte("at"), jobbroker.WithRunAt(runAt),
		jobbroker.WithConcurrencyKey("tenant-1"), jobbroker.WithPriority(3),
		jobbroker.WithDedupKey("k"), jobbroker.WithDedupTTL(time.Minute),
		jobbroker.WithLeaseDuration(10*time.Second), jobbroker.WithHeaders(map[string]string{"a": "1", "b": "2"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{delayed.JobID, scheduled.JobID} {
		job, err := c.GetJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if job.GetState() != pb.JobState_JOB_STATE_SCHEDULED {
			t.Fatalf("job %s state = %v, want SCHEDULED", id, job.GetState())
		}
	}
	job, err := c.GetJob(ctx, scheduled.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if !job.GetRunAt().AsTime().Equal(runAt) || job.GetConcurrencyKey() != "tenant-1" || job.GetPriority() != 3 ||
		job.GetDedupKey() != "k" || job.GetHeaders()["b"] != "2" {
		t.Fatalf("job = %v", job)
	}

	// A batch is all or nothing.
	_, err = c.EnqueueBatch(ctx, []*pb.EnqueueRequest{
		jobbroker.NewEnqueueRequest(q, []byte("ok")),
		jobbroker.NewEnqueueRequest("", []byte("bad")),
	})
	if !jobbroker.IsInvalidArgument(err) {
		t.Fatalf("batch with a bad job: %v, want InvalidArgument", err)
	}
	results, err := c.EnqueueBatch(ctx, []*pb.EnqueueRequest{
		jobbroker.NewEnqueueRequest(q, []byte("low")),
		jobbroker.NewEnqueueRequest(q, []byte("high"), jobbroker.WithPriority(10)),
		jobbroker.NewEnqueueRequest(q, []byte("mid"), jobbroker.WithPriority(5)),
	})
	if err != nil || len(results) != 3 {
		t.Fatalf("EnqueueBatch = %v, %v", results, err)
	}
	// Higher priority first; the refused batch added nothing.
	var order []string
	for len(order) < 3 {
		jobs, err := c.Lease(ctx, q, jobbroker.LeaseOptions{Wait: 5 * time.Second, MaxJobs: 10})
		if err != nil || len(jobs) == 0 {
			t.Fatalf("Lease = %v, %v", jobs, err)
		}
		for _, j := range jobs {
			order = append(order, string(j.GetPayload()))
			if err := c.Release(ctx, j.GetJobId(), j.GetLeaseId()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if strings.Join(order, ",") != "high,mid,low" {
		t.Fatalf("lease order = %v", order)
	}
	released, err := c.GetJob(ctx, results[0].JobID)
	if err != nil {
		t.Fatal(err)
	}
	if released.GetState() != pb.JobState_JOB_STATE_READY {
		t.Fatalf("released job state = %v, want READY", released.GetState())
	}
	info, err := c.GetQueue(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if info.GetCounts()["JOB_STATE_READY"] != 3 || info.GetCounts()["JOB_STATE_SCHEDULED"] != 2 {
		t.Fatalf("queue counts = %v", info.GetCounts())
	}
}

// The repository's VERSION file is the one version of the broker and every client; Go cannot
// read a file outside its module at build time, so this test keeps the constant in step.
func TestVersionMatchesTheRepositoryVersionFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(), "VERSION"))
	if err != nil {
		t.Skipf("no VERSION file: %v", err)
	}
	if want := strings.TrimSpace(string(data)); jobbroker.Version != want {
		t.Fatalf("jobbroker.Version = %q, VERSION says %q", jobbroker.Version, want)
	}
}
