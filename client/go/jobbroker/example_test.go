package jobbroker_test

// Examples are compiled by go test (they have no Output comment, so they do not run): they
// keep the README's snippets honest.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"jobbroker.dev/client/go/jobbroker"
	"jobbroker.dev/client/go/jobbrokerv1"
)

func ExampleClient_Enqueue() {
	ctx := context.Background()
	client, err := jobbroker.NewClient("127.0.0.1:7070")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	res, err := client.EnqueueJSON(ctx, "emails", map[string]string{"to": "ada@example.com"},
		jobbroker.WithDedupKey("welcome:ada"),
		jobbroker.WithDelay(10*time.Second),
		jobbroker.WithMaxAttempts(5),
		jobbroker.WithHeader("trace-id", "abc123"))
	switch {
	case status.Code(err) == codes.InvalidArgument:
		log.Fatalf("bad request: %v", status.Convert(err).Message())
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println(res.JobID, res.Deduplicated)
}

func ExampleClient_EnqueueBatch() {
	ctx := context.Background()
	client, err := jobbroker.NewClient("")
	if err != nil {
		log.Fatal(err)
	}
	results, err := client.EnqueueBatch(ctx, []*jobbrokerv1.EnqueueRequest{
		jobbroker.NewEnqueueRequest("emails", []byte("a")),
		jobbroker.NewEnqueueRequest("emails", []byte("b"), jobbroker.WithPriority(10)),
	})
	if err != nil {
		log.Fatal(err)
	}
	_, err = client.Enqueue(ctx, "", nil)
	if status.Code(err) == codes.InvalidArgument { // or jobbroker.IsInvalidArgument(err)
		log.Print(status.Convert(err).Message()) // names the field: queue
	}
	fmt.Println(len(results))
}

func ExampleWorker() {
	client, err := jobbroker.NewClient("") // $JOBBROKER_ADDRESS, else 127.0.0.1:7070
	if err != nil {
		log.Fatal(err)
	}
	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{Concurrency: 4})
	w.HandleFunc("emails", func(ctx context.Context, job *jobbroker.Job) error {
		var msg struct{ To string }
		if err := job.DecodeJSON(&msg); err != nil {
			return jobbroker.Permanent(err) // dies at once: FAILED, FAIL_REASON_PERMANENT
		}
		return sendEmail(ctx, msg.To, job.IdempotencyKey) // error: retried with backoff
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil { // returns nil after a graceful drain
		log.Fatal(err)
	}
}

func ExampleStep() {
	handler := func(ctx context.Context, job *jobbroker.Job) error {
		orderID, err := jobbroker.Step(ctx, job, "create-order", func(ctx context.Context) (string, error) {
			return createOrder(ctx, job.Payload)
		})
		if err != nil {
			return err
		}
		// After a crash here, the next attempt gets orderID back without creating another order.
		_, err = jobbroker.Step(ctx, job, "charge", func(ctx context.Context) (bool, error) {
			return true, charge(ctx, orderID, job.IdempotencyKey)
		})
		return err
	}
	_ = handler
}

func ExampleRetryAfter() {
	_ = func(ctx context.Context, job *jobbroker.Job) error {
		err := sendEmail(ctx, "ada@example.com", job.IdempotencyKey)
		if errors.Is(err, errRateLimited) {
			return jobbroker.RetryAfter(30*time.Second, err) // instead of the queue's backoff
		}
		return err
	}
}

func ExampleSnooze() {
	_ = func(ctx context.Context, job *jobbroker.Job) error {
		if !exportWindowOpen() {
			return jobbroker.Snooze(10 * time.Minute) // later, without spending an attempt
		}
		return nil
	}
}

func ExampleJob_SetProgressJSON() {
	_ = func(ctx context.Context, job *jobbroker.Job) error {
		for i, row := range []string{"a", "b", "c"} {
			if err := importRow(ctx, row); err != nil {
				return err
			}
			// Sent at once; Admin.WatchJob and the dashboard show it.
			if err := job.SetProgressJSON(map[string]int{"percent": (i + 1) * 100 / 3}); err != nil {
				return err
			}
		}
		return nil
	}
}

var errRateLimited = errors.New("429 too many requests")

func sendEmail(ctx context.Context, to, idempotencyKey string) error   { return nil }
func createOrder(ctx context.Context, payload []byte) (string, error)  { return "order-1", nil }
func charge(ctx context.Context, orderID, idempotencyKey string) error { return nil }
func exportWindowOpen() bool                                           { return true }
func importRow(ctx context.Context, row string) error                  { return nil }

func ExampleNew() {
	client, err := jobbroker.New(jobbroker.Options{
		Addresses: []string{"10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"},
		CAFile:    "/etc/jobbroker/ca.pem",
		CertFile:  "/etc/jobbroker/client.pem",
		KeyFile:   "/etc/jobbroker/client.key",
		Token:     os.Getenv("BILLING_TOKEN"), // "" = $JOBBROKER_TOKEN
	})
	if err != nil {
		log.Fatal(err) // bad options only: New does not connect
	}
	defer client.Close()
}

func ExampleClient_EnqueueAndWait() {
	client, err := jobbroker.NewClient("")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // the wait's time-out
	defer cancel()
	job, err := client.EnqueueAndWait(ctx, "thumbnails", []byte(`{"image":"a.png"}`))
	var ended *jobbroker.JobEndedError
	switch {
	case err == nil:
		fmt.Printf("result: %s\n", job.GetResult())
	case errors.As(err, &ended):
		log.Printf("the job failed: %v", err) // names the state: JOB_STATE_FAILED or JOB_STATE_CANCELLED
	default:
		log.Fatal(err) // the enqueue failed, or ctx ended first
	}
}

func ExampleWorker_Use() {
	client, err := jobbroker.NewClient("")
	if err != nil {
		log.Fatal(err)
	}
	logged := func(next jobbroker.Handler) jobbroker.Handler {
		return jobbroker.HandlerFunc(func(ctx context.Context, job *jobbroker.Job) error {
			start := time.Now()
			err := next.ProcessJob(ctx, job)
			log.Printf("%s %s took %v: %v", job.Queue, job.ID, time.Since(start), err)
			return err
		})
	}
	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{})
	w.Use(logged) // the first added is the outermost
	w.HandleFunc("emails", func(ctx context.Context, job *jobbroker.Job) error { return nil })
}
