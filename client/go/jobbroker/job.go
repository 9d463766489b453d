package jobbroker

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// Job is one attempt of a job, as a Worker hands it to a Handler. Its exported fields are
// read-only; its methods are safe for concurrent use.
type Job struct {
	// The job's id (a ULID).
	ID string
	// The queue it came from.
	Queue string
	// As enqueued. See Text and DecodeJSON.
	Payload []byte
	// As enqueued; never nil.
	Headers map[string]string
	// 1 for the first attempt; Attempt == MaxAttempts is the last chance.
	Attempt int
	// Attempts allowed in total.
	MaxAttempts int
	// The same for every attempt of the job (the dedup key, else the job id): pass it to side
	// effects' providers so that a repeat after a crash is harmless.
	IdempotencyKey string
	// What an earlier attempt saved (with Step, a serialized jobbroker.v1.StepCheckpoint);
	// empty if none.
	Checkpoint []byte
	// When the job was enqueued.
	EnqueuedAt time.Time
	// Fences this attempt; the Worker sends it with every heartbeat, ack and fail.
	LeaseID string
	// When the lease runs out as granted at the push (the Worker's heartbeats extend it).
	LeaseDeadline time.Time
	// When this attempt times out whatever its heartbeats (the handler's ctx is cancelled with
	// ErrTimedOut then); zero if the job has no time-out.
	TimeoutAt time.Time
	// The results of the jobs it depended on (EnqueueRequest.depends_on), by job id; never nil.
	DependencyResults map[string][]byte

	mu     sync.Mutex
	result []byte
	steps  stepState
	// Saves a checkpoint durably and waits for the broker's answer (set by the Worker).
	saveCheckpoint func(ctx context.Context, checkpoint []byte) error
	saveMu         sync.Mutex // one checkpoint save at a time, so saves arrive in order
	// Sends progress (set by the Worker).
	reportProgress func(progress []byte)
}

func newJob(l *pb.LeasedJob) *Job {
	j := &Job{
		ID:             l.GetJobId(),
		Queue:          l.GetQueue(),
		Payload:        l.GetPayload(),
		Headers:        l.GetHeaders(),
		Attempt:        int(l.GetAttempt()),
		MaxAttempts:    int(l.GetMaxAttempts()),
		IdempotencyKey: l.GetIdempotencyKey(),
		Checkpoint:     l.GetCheckpoint(),
		LeaseID:        l.GetLeaseId(),

		DependencyResults: l.GetDependencyResults(),
	}
	if j.Headers == nil {
		j.Headers = map[string]string{}
	}
	if j.DependencyResults == nil {
		j.DependencyResults = map[string][]byte{}
	}
	if l.GetEnqueuedAt() != nil {
		j.EnqueuedAt = l.GetEnqueuedAt().AsTime()
	}
	if l.GetLeaseDeadline() != nil {
		j.LeaseDeadline = l.GetLeaseDeadline().AsTime()
	}
	if l.GetTimeoutAt() != nil {
		j.TimeoutAt = l.GetTimeoutAt().AsTime()
	}
	return j
}

// Text returns the payload as a string.
func (j *Job) Text() string { return string(j.Payload) }

// DecodeJSON decodes the payload, as JSON, into v.
func (j *Job) DecodeJSON(v any) error { return json.Unmarshal(j.Payload, v) }

// SetResult sets the bytes kept with the job when the handler returns nil (at most 4 MiB).
func (j *Job) SetResult(result []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.result = result
}

// SetResultJSON sets the JSON encoding of v as the job's result.
func (j *Job) SetResultJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	j.SetResult(b)
	return nil
}

func (j *Job) getResult() []byte {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.result
}

// SetProgress reports the job's progress (JSON by convention, e.g. {"percent": 40}; at most
// 64 KiB): it goes out at once as a heartbeat, and watchers (Admin.WatchJob, the dashboard) see
// it. It does not wait for the broker. While one report is unanswered, only the newest of the
// values set meanwhile goes out, when that answer comes: the last value always arrives.
func (j *Job) SetProgress(progress []byte) {
	if j.reportProgress != nil {
		j.reportProgress(progress)
	}
}

// SetProgressJSON reports the JSON encoding of v as the job's progress (see SetProgress).
func (j *Job) SetProgressJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	j.SetProgress(b)
	return nil
}
