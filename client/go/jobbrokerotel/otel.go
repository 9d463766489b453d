// Package jobbrokerotel traces jobs with OpenTelemetry, from the producer's enqueue to the
// worker's handler, as one trace:
//
//	client, err := jobbroker.New(jobbroker.Options{
//		EnqueueMiddleware: []jobbroker.EnqueueMiddleware{jobbrokerotel.EnqueueMiddleware()},
//	})
//	...
//	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{})
//	w.Use(jobbrokerotel.Middleware())
//
// EnqueueMiddleware starts a PRODUCER span "<queue> publish" for each job enqueued and writes
// its W3C trace context (the "traceparent" and "tracestate" headers) into the job's headers;
// Middleware reads them back from the job and runs the handler inside a CONSUMER span
// "<queue> process" whose parent is that producer span, ended with an error status when the
// handler fails. Attributes follow OpenTelemetry's messaging conventions (messaging.system
// "jobbroker", the queue as messaging.destination.name, the job id as messaging.message.id).
//
// It is a module of its own (jobbroker.dev/client/go/jobbrokerotel) so that the client
// library itself does not depend on OpenTelemetry: only programs that import this package
// build it in.
package jobbrokerotel

import (
	"context"
	"errors"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// instrumentationName names the tracer, as OpenTelemetry asks: the instrumenting package.
const instrumentationName = "jobbroker.dev/client/go/jobbrokerotel"

// Option configures EnqueueMiddleware and Middleware.
type Option func(*config)

type config struct {
	provider   trace.TracerProvider
	propagator propagation.TextMapPropagator
}

// WithTracerProvider sets where spans go; default otel.GetTracerProvider() at the time the
// middleware is made.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.provider = tp }
}

// WithPropagator sets how the trace context is written into and read from job headers;
// default propagation.TraceContext (W3C traceparent and tracestate), whatever the global
// propagator is, so that workers in other languages can read it.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.propagator = p }
}

func newConfig(opts []Option) config {
	c := config{provider: otel.GetTracerProvider(), propagator: propagation.TraceContext{}}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func (c config) tracer() trace.Tracer {
	return c.provider.Tracer(instrumentationName, trace.WithInstrumentationVersion(jobbroker.Version))
}

// EnqueueMiddleware is producer middleware (jobbroker.Options.EnqueueMiddleware): each job
// enqueued gets a PRODUCER span "<queue> publish", child of the span in the call's context,
// and that span's trace context in its headers (the request's Headers are changed in place).
// The span ends when the broker has answered: with the job id, or with the error.
func EnqueueMiddleware(opts ...Option) jobbroker.EnqueueMiddleware {
	cfg := newConfig(opts)
	tracer := cfg.tracer()
	return func(next jobbroker.EnqueueFunc) jobbroker.EnqueueFunc {
		return func(ctx context.Context, jobs []*pb.EnqueueRequest) ([]jobbroker.Enqueued, error) {
			spans := make([]trace.Span, len(jobs))
			for i, job := range jobs {
				attrs := []attribute.KeyValue{
					attribute.String("messaging.system", "jobbroker"),
					attribute.String("messaging.operation.type", "publish"),
					attribute.String("messaging.operation.name", "publish"),
					attribute.String("messaging.destination.name", job.GetQueue()),
					attribute.Int("messaging.message.body.size", len(job.GetPayload())),
				}
				if len(jobs) > 1 {
					attrs = append(attrs, attribute.Int("messaging.batch.message_count", len(jobs)))
				}
				spanCtx, span := tracer.Start(ctx, job.GetQueue()+" publish",
					trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
				spans[i] = span
				if job.Headers == nil {
					job.Headers = map[string]string{}
				}
				cfg.propagator.Inject(spanCtx, propagation.MapCarrier(job.Headers))
			}
			results, err := next(ctx, jobs)
			for i, span := range spans {
				if err != nil {
					span.RecordError(err)
					span.SetStatus(codes.Error, err.Error())
				} else if i < len(results) {
					span.SetAttributes(attribute.String("messaging.message.id", results[i].JobID))
				}
				span.End()
			}
			return results, err
		}
	}
}

// Middleware is worker middleware (jobbroker.Worker.Use): the handler runs inside a CONSUMER
// span "<queue> process" whose parent is the producer's span read from the job's headers (a
// job enqueued without them starts a new trace). The handler's context carries the span, so
// the handler's own spans are its children. A handler that fails (any error but a snooze,
// which is not a failure) ends it with an error status.
func Middleware(opts ...Option) jobbroker.MiddlewareFunc {
	cfg := newConfig(opts)
	tracer := cfg.tracer()
	return func(next jobbroker.Handler) jobbroker.Handler {
		return jobbroker.HandlerFunc(func(ctx context.Context, job *jobbroker.Job) error {
			parent := cfg.propagator.Extract(ctx, propagation.MapCarrier(job.Headers))
			ctx, span := tracer.Start(parent, job.Queue+" process",
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(
					attribute.String("messaging.system", "jobbroker"),
					attribute.String("messaging.operation.type", "process"),
					attribute.String("messaging.operation.name", "process"),
					attribute.String("messaging.destination.name", job.Queue),
					attribute.String("messaging.message.id", job.ID),
					attribute.Int("messaging.message.body.size", len(job.Payload)),
					attribute.String("jobbroker.attempt", strconv.Itoa(job.Attempt)),
				))
			defer span.End()
			err := next.ProcessJob(ctx, job)
			var snooze *jobbroker.SnoozeError
			if err != nil && !errors.As(err, &snooze) {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return err
		})
	}
}
