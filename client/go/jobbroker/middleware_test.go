package jobbroker_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

func TestWorkerMiddlewareRunsFirstAddedOutermostAndMayAnswerForTheHandler(t *testing.T) {
	c, ctx, q := newClient(t, shared), testCtx(t), queueFor(t)
	var mu sync.Mutex
	var calls []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, s)
	}
	named := func(name string) jobbroker.MiddlewareFunc {
		return func(next jobbroker.Handler) jobbroker.Handler {
			return jobbroker.HandlerFunc(func(ctx context.Context, job *jobbroker.Job) error {
				record(name + " before")
				err := next.ProcessJob(ctx, job)
				record(name + " after")
				return err
			})
		}
	}
	// Refuses jobs whose payload is "blocked" without calling the handler.
	gate := func(next jobbroker.Handler) jobbroker.Handler {
		return jobbroker.HandlerFunc(func(ctx context.Context, job *jobbroker.Job) error {
			if job.Text() == "blocked" {
				return jobbroker.Permanentf("blocked by middleware")
			}
			return next.ProcessJob(ctx, job)
		})
	}
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		record("handler " + job.Text())
		return nil
	})
	w.Use(named("first"), named("second"))
	w.Use(gate)
	runWorker(t, w)

	if _, err := c.EnqueueAndWait(ctx, q, []byte("x")); err != nil {
		t.Fatal(err)
	}
	want := []string{"first before", "second before", "handler x", "second after", "first after"}
	mu.Lock()
	got := slices.Clone(calls)
	calls = nil
	mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}

	job, err := c.EnqueueAndWait(ctx, q, []byte("blocked"))
	var ended *jobbroker.JobEndedError
	if !errors.As(err, &ended) || job.GetLastError() != "blocked by middleware" {
		t.Fatalf("a job the middleware refused = %v, %v", job, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(calls, "handler blocked") {
		t.Fatalf("the handler ran although the middleware answered: %v", calls)
	}
}

func TestProducerMiddlewareWrapsEnqueueAndMayAddHeaders(t *testing.T) {
	var seen [][]string // the queues of each call, as the middleware saw them
	var order []string
	stamp := func(name string) jobbroker.EnqueueMiddleware {
		return func(next jobbroker.EnqueueFunc) jobbroker.EnqueueFunc {
			return func(ctx context.Context, jobs []*pb.EnqueueRequest) ([]jobbroker.Enqueued, error) {
				order = append(order, name)
				var queues []string
				for _, j := range jobs {
					queues = append(queues, j.GetQueue())
					if j.Headers == nil {
						j.Headers = map[string]string{}
					}
					j.Headers["stamped-by"] += name
				}
				if name == "outer" {
					seen = append(seen, queues)
				}
				return next(ctx, jobs)
			}
		}
	}
	c := newClientWith(t, jobbroker.Options{
		Address:           shared.addr,
		EnqueueMiddleware: []jobbroker.EnqueueMiddleware{stamp("outer"), stamp("inner")},
	})
	ctx, q := testCtx(t), queueFor(t)
	one, err := c.Enqueue(ctx, q, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.EnqueueBatch(ctx, []*pb.EnqueueRequest{
		jobbroker.NewEnqueueRequest(q, []byte("b")), jobbroker.NewEnqueueRequest(q, []byte("c")),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{one.JobID, batch[0].JobID, batch[1].JobID} {
		job, err := c.GetJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got := job.GetHeaders()["stamped-by"]; got != "outerinner" {
			t.Fatalf("job %s header stamped-by = %q, want %q (outer first)", id, got, "outerinner")
		}
	}
	if !slices.Equal(order, []string{"outer", "inner", "outer", "inner"}) || len(seen) != 2 || len(seen[1]) != 2 {
		t.Fatalf("middleware calls %v, batches seen %v", order, seen)
	}
}
