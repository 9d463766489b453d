// Command go_e2e is the end-to-end bench of the Go worker helper: the workload of
// `jobbroker-bench stream --workers 1 --in-flight K --concurrency C --producer-batch B --jobs N`.
//
// Producers (C goroutines) enqueue N jobs of -payload-bytes bytes in EnqueueBatch calls of B,
// C calls in flight, while one jobbroker.Worker handles them with a no-op handler at
// concurrency K. The run is timed from the first enqueue to the answer to the last ack (the
// worker's graceful stop waits for it), as jobbroker-bench's stream mode is. Prints one text
// line on stderr and one JSON line on stdout, with the fields of bench/workers/python_e2e.py
// (mode "stream-go").
//
// bench/workers/run.sh builds it (go build, this directory's module: the client through a
// replace of ../../../client/go) and runs it:
//
//	go_e2e --address 127.0.0.1:7070 --jobs 20000
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// Stop producing after this many failed calls instead of spinning on errors (as jobbroker-bench).
const maxErrors = 100

// report has python_e2e.py's JSON fields, in its order.
type report struct {
	Mode          string  `json:"mode"`
	Address       string  `json:"address"`
	Concurrency   int     `json:"concurrency"`
	Workers       int     `json:"workers"`
	Jobs          int64   `json:"jobs"`
	Done          int64   `json:"done"`
	PayloadBytes  int     `json:"payload_bytes"`
	Seconds       float64 `json:"seconds"`
	JobsPerSec    float64 `json:"jobs_per_sec"`
	InFlight      int     `json:"in_flight"`
	ProducerBatch int     `json:"producer_batch"`
	LatencyOf     string  `json:"latency_of"`
	P50Ms         float64 `json:"p50_ms"`
	P90Ms         float64 `json:"p90_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MaxMs         float64 `json:"max_ms"`
	Errors        int64   `json:"errors"`
	TimedOut      bool    `json:"timed_out"`
	FirstError    string  `json:"first_error"`
	AckMessages   int64   `json:"ack_messages"`
	AcksRefused   int64   `json:"acks_refused"`
	Runtime       string  `json:"runtime"`
}

// percentileMs is jobbroker-bench's percentile: the sample at index min(n-1, p/100*n), in ms.
func percentileMs(sortedMicros []int64, p float64) float64 {
	if len(sortedMicros) == 0 {
		return 0
	}
	i := min(len(sortedMicros)-1, int(p/100*float64(len(sortedMicros))))
	return float64(sortedMicros[i]) / 1000
}

// round to n decimals, as python_e2e.py's round() does for seconds and jobs_per_sec.
func round(x float64, n int) float64 {
	scale := 1.0
	for range n {
		scale *= 10
	}
	return float64(int64(x*scale+0.5)) / scale
}

func main() {
	address := flag.String("address", "127.0.0.1:7070", "broker HOST:PORT")
	jobs := flag.Int64("jobs", 20000, "jobs to produce and handle")
	inFlight := flag.Int("in-flight", 64, "the worker's concurrency")
	concurrency := flag.Int("concurrency", 4, "EnqueueBatch calls in flight")
	producerBatch := flag.Int("producer-batch", 100, "jobs per EnqueueBatch")
	payloadBytes := flag.Int("payload-bytes", 100, "bytes per job")
	queue := flag.String("queue", "", "default: a fresh name per run")
	timeout := flag.Float64("timeout", 300, "give up after this many seconds")
	flag.Parse()
	if *queue == "" {
		*queue = fmt.Sprintf("bench-stream-go-%d-%d", os.Getpid(), time.Now().UnixMilli())
	}

	r, err := run(*address, *queue, *jobs, *inFlight, *concurrency, *producerBatch, *payloadBytes,
		time.Duration(*timeout*float64(time.Second)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_e2e:", err)
		os.Exit(1)
	}
	timedOut := ""
	if r.TimedOut {
		timedOut = " TIMED_OUT"
	}
	fmt.Fprintf(os.Stderr,
		"%s in_flight=%d jobs=%d done=%d seconds=%.3f jobs_per_sec=%.1f ack_messages=%d errors=%d%s\n",
		r.Mode, r.InFlight, r.Jobs, r.Done, r.Seconds, r.JobsPerSec, r.AckMessages, r.Errors, timedOut)
	line, _ := json.Marshal(r)
	fmt.Println(string(line))
	if r.Done < r.Jobs || r.Errors != 0 {
		os.Exit(1)
	}
}

func run(address, queue string, jobs int64, inFlight, concurrency, producerBatch, payloadBytes int,
	timeout time.Duration) (*report, error) {
	deadline := time.Now().Add(timeout)
	// The worker and the producers each get their own client, so their own connection, as in
	// the other languages' benches and jobbroker-bench (a Worker has its own channel there).
	workerClient, err := jobbroker.NewClient(address)
	if err != nil {
		return nil, err
	}
	defer workerClient.Close()
	client, err := jobbroker.NewClient(address)
	if err != nil {
		return nil, err
	}
	defer client.Close()

	var handled atomic.Int64
	var warmOnce, allOnce sync.Once
	warmed := make(chan struct{})
	allHandled := make(chan struct{})
	worker := jobbroker.NewWorker(workerClient, jobbroker.WorkerOptions{
		WorkerID:    fmt.Sprintf("bench-stream-go-%d", os.Getpid()),
		Concurrency: inFlight,
	})
	// The warm-up job is the only job until warmed is closed, so the first call is it.
	var warming atomic.Bool
	warming.Store(true)
	worker.HandleFunc(queue, func(context.Context, *jobbroker.Job) error {
		if warming.Load() {
			warmOnce.Do(func() { close(warmed) })
			return nil
		}
		if handled.Add(1) == jobs {
			allOnce.Do(func() { close(allHandled) })
		}
		return nil
	})
	runCtx, stopWorker := context.WithCancel(context.Background())
	defer stopWorker()
	runErr := make(chan error, 1)
	go func() { runErr <- worker.Run(runCtx) }()

	// One job before the clock starts: the worker has subscribed once it is handled (Run has no
	// "subscribed" signal; jobbroker-bench's Worker::Start waits for the same thing).
	warmCtx, cancelWarm := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = client.Enqueue(warmCtx, queue, bytes.Repeat([]byte("w"), payloadBytes))
	cancelWarm()
	if err != nil {
		return nil, fmt.Errorf("warm-up enqueue: %w", err)
	}
	select {
	case <-warmed:
	case err := <-runErr:
		return nil, fmt.Errorf("worker ended before the warm-up job: %v", err)
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("warm-up job not handled within 60 s")
	}
	warming.Store(false)
	// The warm-up's ack is counted once the handler has returned, a moment after warmed: wait
	// for it, so that what is taken off below is exactly the warm-up's ack and ack message.
	waitUntil := time.Now().Add(10 * time.Second)
	for worker.Stats().Acked < 1 && time.Now().Before(waitUntil) {
		time.Sleep(time.Millisecond)
	}
	warm := worker.Stats()

	// The same request every call (the jobs are identical): the producers' own cost stays out
	// of the measurement as far as it can, as jobbroker-bench's C++ producers do.
	payload := bytes.Repeat([]byte("p"), payloadBytes)
	batchOf := func(n int) *pb.EnqueueBatchRequest {
		req := &pb.EnqueueBatchRequest{Jobs: make([]*pb.EnqueueRequest, n)}
		for i := range req.Jobs {
			req.Jobs[i] = &pb.EnqueueRequest{Queue: queue, Payload: payload}
		}
		return req
	}
	full := batchOf(producerBatch)
	broker := client.Broker()
	var (
		next       atomic.Int64
		errors     atomic.Int64
		aborted    atomic.Bool
		mu         sync.Mutex // guards firstError and latencies
		firstError string
		latencies  []int64
	)
	producer := func() {
		var mine []int64
		defer func() { mu.Lock(); latencies = append(latencies, mine...); mu.Unlock() }()
		for !aborted.Load() && time.Now().Before(deadline) {
			n := int64(producerBatch)
			first := next.Add(n) - n
			if first >= jobs {
				return
			}
			if first+n > jobs {
				n = jobs - first
			}
			req := full
			if n < int64(producerBatch) {
				req = batchOf(int(n))
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := broker.EnqueueBatch(ctx, req)
			cancel()
			if err != nil {
				if errors.Add(1) >= maxErrors {
					aborted.Store(true)
				}
				mu.Lock()
				if firstError == "" {
					s := status.Convert(err)
					firstError = fmt.Sprintf("EnqueueBatch: %s: %s", s.Code(), s.Message())
				}
				mu.Unlock()
				continue
			}
			mine = append(mine, time.Since(start).Microseconds())
		}
	}

	start := time.Now()
	var producers sync.WaitGroup
	for range concurrency {
		producers.Go(producer)
	}
	producers.Wait()
	timedOut := false
	if !aborted.Load() {
		select {
		case <-allHandled:
		case <-time.After(max(time.Until(deadline), time.Millisecond)):
			timedOut = true
		}
	}
	// The graceful stop returns once the broker has answered the last ack.
	stopWorker()
	if err := <-runErr; err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	seconds := time.Since(start).Seconds()

	stats := worker.Stats()
	acked := stats.Acked - warm.Acked
	slices.Sort(latencies)
	r := &report{
		Mode:          "stream-go",
		Address:       address,
		Concurrency:   concurrency,
		Workers:       1,
		Jobs:          jobs,
		Done:          acked,
		PayloadBytes:  payloadBytes,
		Seconds:       round(seconds, 4),
		InFlight:      inFlight,
		ProducerBatch: producerBatch,
		LatencyOf:     "enqueue",
		P50Ms:         percentileMs(latencies, 50),
		P90Ms:         percentileMs(latencies, 90),
		P99Ms:         percentileMs(latencies, 99),
		MaxMs:         percentileMs(latencies, 100),
		Errors:        errors.Load(),
		TimedOut:      timedOut && acked < jobs,
		FirstError:    firstError,
		AckMessages:   stats.AckMessages - warm.AckMessages,
		// WorkerStats has no count of refused acks (they are logged).
		AcksRefused: 0,
		Runtime:     fmt.Sprintf("go %s, grpc-go %s", runtime.Version()[2:], grpc.Version),
	}
	if seconds > 0 {
		r.JobsPerSec = round(float64(acked)/seconds, 1)
	}
	return r, nil
}
