package jobbrokerotel_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"jobbroker.dev/client/go/jobbroker"
	"jobbroker.dev/client/go/jobbrokerotel"
)

// startBroker starts the real broker binary ($JOBBROKER_BIN, default build/server/jobbroker of
// the checkout) on free ports with a fresh data directory, for the test's duration.
func startBroker(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("JOBBROKER_BIN")
	if bin == "" {
		_, file, _, _ := runtime.Caller(0)
		bin = filepath.Join(filepath.Dir(file), "..", "..", "..", "build", "server", "jobbroker")
	}
	dir := t.TempDir()
	log, err := os.Create(filepath.Join(dir, "broker.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		log.Close()
	})
	serving := regexp.MustCompile(`^jobbroker: serving grpc=(\S+)`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := serving.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case addr := <-found:
		return addr
	case <-exited:
		t.Fatalf("the broker exited before serving (log in %s)", log.Name())
	case <-time.After(30 * time.Second):
		t.Fatal("the broker did not print its serving line in time")
	}
	return ""
}

func TestATracedJobIsOneTraceFromPublishToProcess(t *testing.T) {
	addr := startBroker(t)
	exporter := tracetest.NewInMemoryExporter()
	// A syncer exports each span as it ends, so the spans are there once the job is.
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { provider.Shutdown(context.Background()) })
	traced := jobbrokerotel.WithTracerProvider(provider)

	client, err := jobbroker.New(jobbroker.Options{
		Address:           addr,
		EnqueueMiddleware: []jobbroker.EnqueueMiddleware{jobbrokerotel.EnqueueMiddleware(traced)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	queue := "traced"
	handlerSpans := make(chan trace.SpanContext, 2)
	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{})
	w.Use(jobbrokerotel.Middleware(traced))
	w.HandleFunc(queue, func(ctx context.Context, job *jobbroker.Job) error {
		handlerSpans <- trace.SpanContextFromContext(ctx)
		if job.Text() == "fail" {
			return jobbroker.Permanentf("refused")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runDone := make(chan error, 1)
	runCtx, stopWorker := context.WithCancel(ctx)
	go func() { runDone <- w.Run(runCtx) }()
	defer func() { stopWorker(); <-runDone }()

	job, err := client.EnqueueAndWait(ctx, queue, []byte("ok"))
	if err != nil {
		t.Fatal(err)
	}
	spans := exporter.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the producer's and the consumer's: %v", len(spans), spans)
	}
	producer, consumer := spans[0], spans[1]
	if producer.SpanKind != trace.SpanKindProducer {
		producer, consumer = consumer, producer
	}
	if producer.Name != queue+" publish" || producer.SpanKind != trace.SpanKindProducer {
		t.Fatalf("producer span %q kind %v, want %q PRODUCER", producer.Name, producer.SpanKind, queue+" publish")
	}
	if consumer.Name != queue+" process" || consumer.SpanKind != trace.SpanKindConsumer {
		t.Fatalf("consumer span %q kind %v, want %q CONSUMER", consumer.Name, consumer.SpanKind, queue+" process")
	}
	if consumer.SpanContext.TraceID() != producer.SpanContext.TraceID() {
		t.Fatalf("trace ids differ: producer %v, consumer %v", producer.SpanContext.TraceID(), consumer.SpanContext.TraceID())
	}
	if consumer.Parent.SpanID() != producer.SpanContext.SpanID() || !consumer.Parent.IsRemote() {
		t.Fatalf("consumer's parent %v, want the producer span %v (remote)", consumer.Parent.SpanID(), producer.SpanContext.SpanID())
	}
	if got := <-handlerSpans; got.SpanID() != consumer.SpanContext.SpanID() {
		t.Fatalf("the handler's context carries span %v, want the consumer span %v", got.SpanID(), consumer.SpanContext.SpanID())
	}
	if job.GetHeaders()["traceparent"] == "" {
		t.Fatalf("the job's headers %v carry no traceparent", job.GetHeaders())
	}
	if consumer.Status.Code == codes.Error || producer.Status.Code == codes.Error {
		t.Fatalf("a successful job has an error status: %v, %v", producer.Status, consumer.Status)
	}

	exporter.Reset()
	_, err = client.EnqueueAndWait(ctx, queue, []byte("fail"))
	var ended *jobbroker.JobEndedError
	if !errors.As(err, &ended) {
		t.Fatalf("EnqueueAndWait of a failing job: %v", err)
	}
	<-handlerSpans
	var failed []string
	for _, s := range exporter.GetSpans() {
		if s.SpanKind == trace.SpanKindConsumer {
			failed = append(failed, fmt.Sprintf("%v %q", s.Status.Code, s.Status.Description))
			if s.Status.Code != codes.Error || s.Status.Description != "refused" {
				t.Fatalf("the failed handler's span status %v %q, want Error %q", s.Status.Code, s.Status.Description, "refused")
			}
		}
	}
	if len(failed) != 1 {
		t.Fatalf("consumer spans of the failed job: %v, want one", failed)
	}
}
