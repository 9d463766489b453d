package jobbroker_test

// Tests of the operator calls and EnqueueAndWait against the real broker.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

func TestEnqueueAndWaitReturnsTheCompletedJobOrAnErrorNamingTheState(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		if job.Text() == "bad" {
			return jobbroker.Permanentf("cannot do %q", job.Text())
		}
		job.SetResult(append([]byte("did "), job.Payload...))
		return nil
	})
	runWorker(t, w)

	job, err := c.EnqueueAndWait(ctx, q, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != pb.JobState_JOB_STATE_COMPLETED || string(job.GetResult()) != "did good" {
		t.Fatalf("job = %v", job)
	}

	job, err = c.EnqueueAndWait(ctx, q, []byte("bad"))
	var ended *jobbroker.JobEndedError
	if !errors.As(err, &ended) || job.GetState() != pb.JobState_JOB_STATE_FAILED ||
		ended.Job.GetFailReason() != pb.FailReason_FAIL_REASON_PERMANENT {
		t.Fatalf("EnqueueAndWait of a failing job = %v, %v", job, err)
	}
	if want := "JOB_STATE_FAILED"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
}

func TestEnqueueAndWaitReportsACancelledJob(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	type result struct {
		job *pb.Job
		err error
	}
	done := make(chan result, 1)
	// No worker: the job waits, delayed, until it is cancelled.
	go func() {
		job, err := c.EnqueueAndWait(ctx, q, []byte("x"), jobbroker.WithDedupKey("to-cancel"), jobbroker.WithDelay(time.Hour))
		done <- result{job, err}
	}()
	var id string
	waitFor(t, "the job to be enqueued", func() bool {
		resp, err := c.ListJobs(ctx, &pb.ListJobsRequest{Queue: q, DedupKey: "to-cancel"})
		if err == nil && len(resp.GetJobs()) == 1 {
			id = resp.GetJobs()[0].GetId()
		}
		return id != ""
	})
	if _, err := c.CancelJob(ctx, id); err != nil {
		t.Fatal(err)
	}
	r := <-done
	var ended *jobbroker.JobEndedError
	if !errors.As(r.err, &ended) || r.job.GetState() != pb.JobState_JOB_STATE_CANCELLED || !strings.Contains(r.err.Error(), "JOB_STATE_CANCELLED") {
		t.Fatalf("EnqueueAndWait of a cancelled job = %v, %v", r.job, r.err)
	}
}

func TestEnqueueAndWaitGivesUpWhenItsContextEnds(t *testing.T) {
	c, q := newClient(t, shared), queueFor(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	job, err := c.EnqueueAndWait(ctx, q, []byte("nobody works this queue"))
	if !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("EnqueueAndWait past its time-out = %v, %v; want DeadlineExceeded", job, err)
	}
}

func TestWatchJobYieldsEachChangeUntilTheEnd(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		jobs, err := c.Lease(ctx, q, jobbroker.LeaseOptions{Wait: 5 * time.Second})
		if err == nil && len(jobs) == 1 {
			c.Ack(ctx, jobs[0].GetJobId(), jobs[0].GetLeaseId(), []byte("r"))
		}
	}()
	var states []pb.JobState
	for job, err := range c.WatchJob(ctx, enq.JobID) {
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, job.GetState())
	}
	if len(states) == 0 || states[len(states)-1] != pb.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("watched states %v, want them to end COMPLETED", states)
	}
}

func TestScheduleRoundTrip(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	id := "go-test-" + q
	put, err := c.PutSchedule(ctx, &pb.Schedule{
		ScheduleId: id,
		Every:      durationpb.New(time.Hour),
		Template:   jobbroker.NewEnqueueRequest(q, []byte("tick"), jobbroker.WithPriority(3)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if put.GetNextRunAt() == nil || put.GetCreatedAt() == nil {
		t.Fatalf("PutSchedule = %v, want its output fields", put)
	}
	got, err := c.GetSchedule(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.GetTemplate(), put.GetTemplate()) || got.GetEvery().AsDuration() != time.Hour {
		t.Fatalf("GetSchedule = %v, want %v", got, put)
	}
	listed, err := c.ListSchedules(ctx, q)
	if err != nil || len(listed) != 1 || listed[0].GetScheduleId() != id {
		t.Fatalf("ListSchedules = %v, %v", listed, err)
	}
	run, err := c.TriggerSchedule(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	job, err := c.GetJob(ctx, run.JobID)
	if err != nil || job.GetQueue() != q || string(job.GetPayload()) != "tick" || job.GetPriority() != 3 {
		t.Fatalf("the triggered run's job = %v, %v", job, err)
	}
	if err := c.DeleteSchedule(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSchedule(ctx, id); !jobbroker.IsNotFound(err) {
		t.Fatalf("GetSchedule after DeleteSchedule: %v, want NotFound", err)
	}
}

func TestQueueAndJobAdminCalls(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	first, err := c.Enqueue(ctx, q, []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, q, []byte("2")); err != nil {
		t.Fatal(err)
	}

	queues, err := c.ListQueues(ctx)
	if err != nil || !slices.ContainsFunc(queues, func(i *pb.QueueInfo) bool { return i.GetName() == q }) {
		t.Fatalf("ListQueues = %v, %v; want %s in it", queues, err, q)
	}
	info, err := c.UpdateQueuePolicy(ctx, q, &pb.QueuePolicy{MaxSnoozes: proto.Int32(7)})
	if err != nil || info.GetPolicy().GetMaxSnoozes() != 7 {
		t.Fatalf("UpdateQueuePolicy = %v, %v", info, err)
	}
	if info, err := c.PauseQueue(ctx, q); err != nil || !info.GetPolicy().GetPaused() {
		t.Fatalf("PauseQueue = %v, %v", info, err)
	}
	if info, err := c.ResumeQueue(ctx, q); err != nil || info.GetPolicy().GetPaused() {
		t.Fatalf("ResumeQueue = %v, %v", info, err)
	}
	if info, err := c.GetQueue(ctx, q); err != nil || info.GetCounts()["JOB_STATE_READY"] != 2 {
		t.Fatalf("GetQueue = %v, %v", info, err)
	}
	page, err := c.ListJobs(ctx, &pb.ListJobsRequest{Queue: q, PageSize: 1})
	if err != nil || len(page.GetJobs()) != 1 || page.GetJobs()[0].GetId() != first.JobID || page.GetNextPageToken() == "" {
		t.Fatalf("ListJobs page 1 = %v, %v", page, err)
	}

	if _, err := c.CancelJob(ctx, first.JobID); err != nil {
		t.Fatal(err)
	}
	dry, err := c.RetryJobs(ctx, &pb.RetryJobRequest{Queue: q, State: pb.JobState_JOB_STATE_CANCELLED, DryRun: true})
	if err != nil || dry.GetMatched() != 1 || dry.GetRetried() != 0 {
		t.Fatalf("RetryJobs dry run = %v, %v", dry, err)
	}
	if job, err := c.RetryJob(ctx, first.JobID); err != nil || job.GetState() != pb.JobState_JOB_STATE_READY {
		t.Fatalf("RetryJob = %v, %v", job, err)
	}
	if _, err := c.CancelJob(ctx, first.JobID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteJob(ctx, first.JobID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetJob(ctx, first.JobID); !jobbroker.IsNotFound(err) {
		t.Fatalf("GetJob after DeleteJob: %v, want NotFound", err)
	}
	if n, err := c.PurgeQueue(ctx, q, pb.JobState_JOB_STATE_READY); err != nil || n != 1 {
		t.Fatalf("PurgeQueue(READY) = %d, %v; want 1", n, err)
	}

	cluster, err := c.GetCluster(ctx)
	if err != nil || cluster.GetPartitionCount() < 1 || len(cluster.GetPartitions()) != int(cluster.GetPartitionCount()) {
		t.Fatalf("GetCluster = %v, %v", cluster, err)
	}
}

func TestListWorkersShowsARunningWorker(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{WorkerID: "listed-" + q, Concurrency: 2})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error { return nil })
	runWorker(t, w)
	var got *pb.WorkerInfo
	waitFor(t, "the worker in ListWorkers", func() bool {
		workers, err := c.ListWorkers(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(workers) == 1 {
			got = workers[0]
		}
		return got != nil && got.GetStreams() == 1
	})
	if got.GetWorkerId() != "listed-"+q || !slices.Equal(got.GetQueues(), []string{q}) ||
		got.GetMaxInFlight() != 2 || got.GetClient() != jobbroker.ClientName {
		t.Fatalf("ListWorkers = %v", got)
	}
}

func TestEnqueueOptionsCoverExpiryAndDependencies(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	parent, err := c.Enqueue(ctx, q, []byte("parent"))
	if err != nil {
		t.Fatal(err)
	}
	expireAt := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	child, err := c.Enqueue(ctx, q, []byte("child"), jobbroker.WithDependsOn(parent.JobID), jobbroker.WithExpireAt(expireAt))
	if err != nil {
		t.Fatal(err)
	}
	job, err := c.GetJob(ctx, child.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != pb.JobState_JOB_STATE_WAITING || !job.GetExpireAt().AsTime().Equal(expireAt) {
		t.Fatalf("child = %v, want WAITING with its expiry", job)
	}
	batch, err := c.EnqueueBatch(ctx, []*pb.EnqueueRequest{
		jobbroker.NewEnqueueRequest(q, []byte("a")),
		jobbroker.NewEnqueueRequest(q, []byte("b"), jobbroker.WithDependsOnIndex(0)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if job, err := c.GetJob(ctx, batch[1].JobID); err != nil || job.GetState() != pb.JobState_JOB_STATE_WAITING {
		t.Fatalf("batch[1] = %v, %v; want WAITING", job, err)
	}
}
