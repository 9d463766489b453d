// Command producer enqueues welcome emails for the example worker.
//
//	go run ./examples/producer -addr 127.0.0.1:7070 -n 3
//
// With TLS and a token: -ca ca.pem, and the token in $JOBBROKER_TOKEN.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"jobbroker.dev/client/go/jobbroker"
)

func main() {
	addr := flag.String("addr", "", "broker address (default $JOBBROKER_ADDRESS, else 127.0.0.1:7070)")
	queue := flag.String("queue", "emails", "queue to enqueue to")
	n := flag.Int("n", 3, "jobs to enqueue")
	ca := flag.String("ca", "", "TLS: the CA certificate (PEM) of the broker's certificate; empty: plaintext")
	flag.Parse()

	// The token, if any, comes from $JOBBROKER_TOKEN (Options.Token sets it in code).
	client, err := jobbroker.New(jobbroker.Options{Address: *addr, CAFile: *ca})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for i := 1; i <= *n; i++ {
		user := fmt.Sprintf("user_%d", i)
		res, err := client.EnqueueJSON(ctx, *queue,
			map[string]string{"email": user + "@example.com", "name": user},
			jobbroker.WithDedupKey("welcome:"+user), // enqueue twice, get one job
			jobbroker.WithMaxAttempts(5))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: job %s (deduplicated=%v)\n", user, res.JobID, res.Deduplicated)
	}
}
