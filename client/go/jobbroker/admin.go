package jobbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// The operator calls: one method per rpc of the Admin service (proto/jobbroker/v1/admin.proto,
// which gives each one's codes). NotFound is an unknown job, queue or schedule; a token
// without the admin role for the queue is PermissionDenied. Calls that only read, and those
// that set a state (UpdateQueuePolicy, PauseQueue, ResumeQueue, PutSchedule), are retried on
// Unavailable; the others are tried once (see Client).

// GetJob returns a job with its state, attempts, result and checkpoint.
func (c *Client) GetJob(ctx context.Context, jobID string) (*pb.Job, error) {
	return c.admin.GetJob(ctx, &pb.GetJobRequest{JobId: jobID})
}

// WatchJob yields the job as it is now, then once per change of its state, attempt, progress,
// snoozes or cancel request; the sequence ends after the job is terminal (COMPLETED, FAILED,
// CANCELLED), or with an error (yielded with a nil job): NotFound for an unknown or deleted
// job, Unavailable when the broker shuts down (watch again), ctx's error. Breaking out of the
// loop ends the watch.
//
//	for job, err := range client.WatchJob(ctx, id) { ... }
func (c *Client) WatchJob(ctx context.Context, jobID string) iter.Seq2[*pb.Job, error] {
	return func(yield func(*pb.Job, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// The job's request goes out after the stream opens: its route goes with the context.
		stream, err := c.admin.WatchJob(withStreamRoute(ctx, route{jobID: jobID}), &pb.WatchJobRequest{JobId: jobID})
		if err != nil {
			yield(nil, err)
			return
		}
		for {
			job, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				if status.Code(err) == codes.Unavailable {
					c.markRoutingStale() // its node may be gone: a new watch goes to the leader
				}
				yield(nil, err)
				return
			}
			if !yield(job, nil) {
				return
			}
		}
	}
}

// ListJobs returns one page of a queue's jobs (req.Queue; req.State, 0 = every state;
// req.PageSize, 0 = 100; req.PageToken, the previous page's NextPageToken; req.NewestFirst;
// req.DedupKey). The last page has an empty NextPageToken.
func (c *Client) ListJobs(ctx context.Context, req *pb.ListJobsRequest) (*pb.ListJobsResponse, error) {
	return c.admin.ListJobs(ctx, req)
}

// CancelJob cancels a job: READY or SCHEDULED ones at once; for an ACTIVE one the worker is
// told (its handler's context is cancelled). FailedPrecondition if the job has ended.
func (c *Client) CancelJob(ctx context.Context, jobID string) (*pb.Job, error) {
	return c.admin.CancelJob(ctx, &pb.CancelJobRequest{JobId: jobID})
}

// RetryJob puts a FAILED or CANCELLED job back to READY with its attempts reset.
// FailedPrecondition for a job in another state.
func (c *Client) RetryJob(ctx context.Context, jobID string) (*pb.Job, error) {
	resp, err := c.admin.RetryJob(ctx, &pb.RetryJobRequest{JobId: jobID})
	if err != nil {
		return nil, err
	}
	return resp.GetJob(), nil
}

// RetryJobs is the bulk redrive: the jobs of req.Queue in req.State (default FAILED) go back to
// READY, oldest ended first, at most req.Limit (0 = 1000); with req.DryRun only counted.
func (c *Client) RetryJobs(ctx context.Context, req *pb.RetryJobRequest) (*pb.RetryJobResponse, error) {
	return c.admin.RetryJob(ctx, req)
}

// DeleteJob removes a job that is not ACTIVE (FailedPrecondition: cancel it first).
func (c *Client) DeleteJob(ctx context.Context, jobID string) error {
	_, err := c.admin.DeleteJob(ctx, &pb.DeleteJobRequest{JobId: jobID})
	return err
}

// ListQueues returns every queue the token may see, by name.
func (c *Client) ListQueues(ctx context.Context) ([]*pb.QueueInfo, error) {
	resp, err := c.admin.ListQueues(ctx, &pb.ListQueuesRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetQueues(), nil
}

// GetQueue returns a queue's effective policy and its job counts by state.
func (c *Client) GetQueue(ctx context.Context, queue string) (*pb.QueueInfo, error) {
	return c.admin.GetQueue(ctx, &pb.GetQueueRequest{Queue: queue})
}

// UpdateQueuePolicy sets the fields set in policy (the others keep their value); the queue is
// created if new. The change is persisted.
func (c *Client) UpdateQueuePolicy(ctx context.Context, queue string, policy *pb.QueuePolicy) (*pb.QueueInfo, error) {
	return c.admin.UpdateQueuePolicy(ctx, &pb.UpdateQueuePolicyRequest{Queue: queue, Policy: policy})
}

// ResetQueuePolicy drops every run-time override of the queue (back to the config file's
// policy), then applies policy (may be nil).
func (c *Client) ResetQueuePolicy(ctx context.Context, queue string, policy *pb.QueuePolicy) (*pb.QueueInfo, error) {
	return c.admin.UpdateQueuePolicy(ctx, &pb.UpdateQueuePolicyRequest{Queue: queue, Policy: policy, Reset_: true})
}

// PauseQueue stops leasing from the queue; enqueues are still accepted.
func (c *Client) PauseQueue(ctx context.Context, queue string) (*pb.QueueInfo, error) {
	return c.admin.PauseQueue(ctx, &pb.PauseQueueRequest{Queue: queue})
}

// ResumeQueue leases from the queue again.
func (c *Client) ResumeQueue(ctx context.Context, queue string) (*pb.QueueInfo, error) {
	return c.admin.ResumeQueue(ctx, &pb.ResumeQueueRequest{Queue: queue})
}

// PurgeQueue removes the queue's jobs in states (every terminal state if none) and returns
// how many. READY and SCHEDULED only when named; ACTIVE is InvalidArgument.
func (c *Client) PurgeQueue(ctx context.Context, queue string, states ...pb.JobState) (int64, error) {
	resp, err := c.admin.PurgeQueue(ctx, &pb.PurgeQueueRequest{Queue: queue, States: states})
	if err != nil {
		return 0, err
	}
	return resp.GetPurged(), nil
}

// GetCluster returns the cluster as the node asked sees it (a single node answers as a cluster
// of one). Any valid token may call it.
func (c *Client) GetCluster(ctx context.Context) (*pb.ClusterInfo, error) {
	return c.admin.GetCluster(ctx, &pb.GetClusterRequest{})
}

// ListWorkers returns the connected workers by worker_id (those of queue only, unless it is
// ""): their streams, queues, running attempts, and the library each says it is (Client).
func (c *Client) ListWorkers(ctx context.Context, queue string) ([]*pb.WorkerInfo, error) {
	resp, err := c.admin.ListWorkers(ctx, &pb.ListWorkersRequest{Queue: queue})
	if err != nil {
		return nil, err
	}
	return resp.GetWorkers(), nil
}

// PutSchedule creates or replaces a recurring schedule (exactly one of Cron and Every; the
// Template says what each run enqueues) and returns it with its output fields (NextRunAt...).
func (c *Client) PutSchedule(ctx context.Context, schedule *pb.Schedule) (*pb.Schedule, error) {
	return c.admin.PutSchedule(ctx, &pb.PutScheduleRequest{Schedule: schedule})
}

// GetSchedule returns one schedule.
func (c *Client) GetSchedule(ctx context.Context, scheduleID string) (*pb.Schedule, error) {
	return c.admin.GetSchedule(ctx, &pb.GetScheduleRequest{ScheduleId: scheduleID})
}

// ListSchedules returns every schedule (those enqueueing into queue only, unless it is ""),
// by schedule_id.
func (c *Client) ListSchedules(ctx context.Context, queue string) ([]*pb.Schedule, error) {
	resp, err := c.admin.ListSchedules(ctx, &pb.ListSchedulesRequest{Queue: queue})
	if err != nil {
		return nil, err
	}
	return resp.GetSchedules(), nil
}

// DeleteSchedule removes a schedule; the jobs it already enqueued stay.
func (c *Client) DeleteSchedule(ctx context.Context, scheduleID string) error {
	_, err := c.admin.DeleteSchedule(ctx, &pb.DeleteScheduleRequest{ScheduleId: scheduleID})
	return err
}

// TriggerSchedule enqueues one run now, outside the timing (also while paused).
func (c *Client) TriggerSchedule(ctx context.Context, scheduleID string) (Enqueued, error) {
	resp, err := c.admin.TriggerSchedule(ctx, &pb.TriggerScheduleRequest{ScheduleId: scheduleID})
	if err != nil {
		return Enqueued{}, err
	}
	return Enqueued{JobID: resp.GetJobId(), Deduplicated: resp.GetDeduplicated()}, nil
}

// JobEndedError is what EnqueueAndWait and WaitJob return for a job that ended FAILED or
// CANCELLED: Job is the job as it ended (State, FailReason, LastError, Attempts).
type JobEndedError struct{ Job *pb.Job }

func (e *JobEndedError) Error() string {
	msg := fmt.Sprintf("jobbroker: job %s ended %v", e.Job.GetId(), e.Job.GetState())
	if e.Job.GetState() == pb.JobState_JOB_STATE_FAILED {
		msg += fmt.Sprintf(" (%v)", e.Job.GetFailReason())
	}
	if e.Job.GetLastError() != "" {
		msg += ": " + e.Job.GetLastError()
	}
	return msg
}

// EnqueueAndWait enqueues a job (through the producer middleware, like Enqueue) and waits until
// it is terminal: it returns the COMPLETED job (its Result is the handler's), or the job with a
// *JobEndedError naming the state when it ended FAILED or CANCELLED. ctx bounds the wait (its
// deadline is the time-out: context.WithTimeout); when it ends first, the error is ctx's and
// the job goes on (cancel it with CancelJob if it should not). The enqueue error, if any, is
// returned as is, with a nil job.
func (c *Client) EnqueueAndWait(ctx context.Context, queue string, payload []byte, opts ...EnqueueOption) (*pb.Job, error) {
	enq, err := c.Enqueue(ctx, queue, payload, opts...)
	if err != nil {
		return nil, err
	}
	return c.WaitJob(ctx, enq.JobID)
}

// WaitJob waits, with Admin.WatchJob (no polling), until the job is terminal; its results are
// those of EnqueueAndWait. A watch the broker ends with Unavailable (it restarted) is opened
// again after a short backoff.
func (c *Client) WaitJob(ctx context.Context, jobID string) (*pb.Job, error) {
	backoff := 100 * time.Millisecond
	for {
		var last *pb.Job
		var watchErr error
		for job, err := range c.WatchJob(ctx, jobID) {
			if err != nil {
				watchErr = err
				break
			}
			last = job
		}
		if last != nil && isTerminal(last.GetState()) {
			if last.GetState() == pb.JobState_JOB_STATE_COMPLETED {
				return last, nil
			}
			return last, &JobEndedError{Job: last}
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if watchErr != nil && status.Code(watchErr) != codes.Unavailable {
			return nil, watchErr
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func isTerminal(s pb.JobState) bool {
	return s == pb.JobState_JOB_STATE_COMPLETED || s == pb.JobState_JOB_STATE_FAILED ||
		s == pb.JobState_JOB_STATE_CANCELLED
}
