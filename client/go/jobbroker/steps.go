package jobbroker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// What Step knows of a job's steps during one attempt. Guarded by Job.mu.
type stepState struct {
	loaded     bool
	loadErr    error
	checkpoint *pb.StepCheckpoint
	results    map[string][]byte // finished steps: name -> JSON result
	used       map[string]bool   // names Step was called with in this attempt
}

// Step runs fn as the durable step `name` of job, at most once per job (as long as its result
// could be saved): the first time, Step calls fn, saves its result (JSON-encoded) in the job's
// checkpoint, waits until the broker has stored it, and returns it as JSON decodes it into a T.
// When a later attempt of the job (after a crash, a lost lease or an error in a later step)
// reaches the same step, Step returns the saved result, decoded the same way, without calling fn
// again: a first run and a resumed one see the same value.
//
//	user, err := jobbroker.Step(ctx, job, "create-user", func(ctx context.Context) (User, error) {
//		return db.CreateUser(ctx, req)
//	})
//
// An error from fn is returned as is; return it from the handler and the attempt fails and is
// retried later, keeping the steps that finished. If the checkpoint cannot be saved (the lease
// is gone), Step returns an error and the handler should return it. T must survive a JSON round
// trip (exported fields). The checkpoint is a jobbroker.v1.StepCheckpoint, so a job started by
// a worker in another language resumes here and the other way round.
//
// Step panics if name is used twice in one attempt (a programming error; the Worker turns the
// panic into a failed attempt). It returns an error if the job's checkpoint was not written by
// durable steps.
func Step[T any](ctx context.Context, job *Job, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	saved, found, err := job.beginStep(name)
	if err != nil {
		return zero, err
	}
	if found {
		var v T
		if err := json.Unmarshal(saved, &v); err != nil {
			return zero, fmt.Errorf("jobbroker: step %q: cannot decode its saved result %q: %w", name, saved, err)
		}
		return v, nil
	}
	v, err := fn(ctx)
	if err != nil {
		return zero, err
	}
	result, err := json.Marshal(v)
	if err != nil {
		return zero, fmt.Errorf("jobbroker: step %q: cannot encode its result as JSON: %w", name, err)
	}
	if err := job.finishStep(ctx, name, result); err != nil {
		return zero, err
	}
	// Return what a later attempt's replay will return: the value as JSON gives it back (an int
	// in a map[string]any comes back a float64, unexported fields are gone), so a handler
	// cannot behave differently on its first run and on a resumed one.
	var replayed T
	if err := json.Unmarshal(result, &replayed); err != nil {
		return zero, fmt.Errorf("jobbroker: step %q: its result does not decode from its own JSON %q: %w", name, result, err)
	}
	return replayed, nil
}

// beginStep returns the saved result of step name, if there is one, and marks name as used.
func (j *Job) beginStep(name string) (saved []byte, found bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := &j.steps
	if !s.loaded {
		s.loaded = true
		s.checkpoint = &pb.StepCheckpoint{}
		s.results = map[string][]byte{}
		s.used = map[string]bool{}
		if why := loadStepCheckpoint(j.Checkpoint, s.checkpoint, s.results); why != "" {
			s.loadErr = fmt.Errorf("jobbroker: job %s has a checkpoint that is not a jobbroker.v1.StepCheckpoint "+
				"(%s): was it saved by something other than durable steps?", j.ID, why)
		}
	}
	if s.loadErr != nil {
		return nil, false, s.loadErr
	}
	if s.used[name] {
		panic(fmt.Sprintf("jobbroker: step %q used twice in one attempt of job %s: step names must be unique", name, j.ID))
	}
	s.used[name] = true
	saved, found = s.results[name]
	return saved, found, nil
}

// loadStepCheckpoint decodes data into cp and results, or says why data is not a checkpoint
// of durable steps. The rules are those of every language's helper (steps.proto): fields this
// version does not know are ignored, so the message can grow; bytes that hold no step, a step
// without a name or named twice, or a result that is not JSON were written by something else.
func loadStepCheckpoint(data []byte, cp *pb.StepCheckpoint, results map[string][]byte) string {
	if len(data) == 0 {
		return ""
	}
	if err := proto.Unmarshal(data, cp); err != nil {
		return err.Error()
	}
	if len(cp.GetSteps()) == 0 {
		return "it holds no step"
	}
	for _, st := range cp.GetSteps() {
		if _, dup := results[st.GetName()]; dup || st.GetName() == "" {
			return fmt.Sprintf("bad or repeated step name %q", st.GetName())
		}
		if !json.Valid(st.GetResult()) {
			return fmt.Sprintf("step %q has a result that is not JSON", st.GetName())
		}
		results[st.GetName()] = st.GetResult()
	}
	return ""
}

// finishStep adds step name to the checkpoint and saves the whole checkpoint durably.
func (j *Job) finishStep(ctx context.Context, name string, result []byte) error {
	j.saveMu.Lock()
	defer j.saveMu.Unlock()
	j.mu.Lock()
	j.steps.checkpoint.Steps = append(j.steps.checkpoint.Steps, &pb.CompletedStep{Name: name, Result: result})
	j.steps.results[name] = result
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(j.steps.checkpoint)
	j.mu.Unlock()
	if err != nil {
		return fmt.Errorf("jobbroker: step %q: %w", name, err)
	}
	if j.saveCheckpoint == nil {
		return errors.New("jobbroker: Step needs a job handed out by a Worker")
	}
	if err := j.saveCheckpoint(ctx, data); err != nil {
		return fmt.Errorf("jobbroker: step %q finished but its result could not be saved: %w", name, err)
	}
	return nil
}
