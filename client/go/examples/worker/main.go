// Command worker is a runnable jobbroker worker: it sends (prints) welcome emails from the
// "emails" queue, with a durable step per side effect, and stops gracefully on SIGTERM/Ctrl-C.
//
//	go run ./examples/worker -addr 127.0.0.1:7070
//
// With TLS and a token (docs/security.md): -ca names the CA the broker's certificate chains to,
// and the token comes from $JOBBROKER_TOKEN:
//
//	JOBBROKER_TOKEN=... go run ./examples/worker -addr broker.internal:7070 -ca ca.pem
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"jobbroker.dev/client/go/jobbroker"
)

type signup struct {
	Email string `json:"email"`
	Name  string `json:"name"`
}

func main() {
	addr := flag.String("addr", "", "broker address (default $JOBBROKER_ADDRESS, else 127.0.0.1:7070)")
	queue := flag.String("queue", "emails", "queue to work")
	concurrency := flag.Int("concurrency", 4, "jobs at once")
	ca := flag.String("ca", "", "TLS: the CA certificate (PEM) of the broker's certificate; empty: plaintext")
	flag.Parse()

	// The token, if any, comes from $JOBBROKER_TOKEN (Options.Token sets it in code).
	client, err := jobbroker.New(jobbroker.Options{Address: *addr, CAFile: *ca})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{Concurrency: *concurrency})
	w.HandleFunc(*queue, func(ctx context.Context, job *jobbroker.Job) error {
		var s signup
		if err := job.DecodeJSON(&s); err != nil {
			return jobbroker.Permanent(fmt.Errorf("bad payload: %w", err)) // no retry can fix it
		}
		// Each step runs once per job, even if this process dies and another worker resumes.
		greeting, err := jobbroker.Step(ctx, job, "render", func(ctx context.Context) (string, error) {
			return fmt.Sprintf("Welcome, %s!", s.Name), nil
		})
		if err != nil {
			return err
		}
		_, err = jobbroker.Step(ctx, job, "send", func(ctx context.Context) (bool, error) {
			// A real provider gets job.IdempotencyKey, so a repeat after a crash is harmless.
			log.Printf("to=%s key=%s attempt=%d/%d: %s", s.Email, job.IdempotencyKey, job.Attempt, job.MaxAttempts, greeting)
			return true, nil
		})
		return err
	})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil { // returns after draining once ctx is cancelled
		log.Fatal(err)
	}
}
