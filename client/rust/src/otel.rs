//! OpenTelemetry tracing as middleware (feature `tracing-otel`), `docs/worker-contract.md` §9.
//!
//! * [`producer_middleware`] starts a PRODUCER span `"<queue> publish"` around each enqueue
//!   and writes its W3C trace context (`traceparent`, and `tracestate` when there is one)
//!   into the job's headers.
//! * [`worker_middleware`] reads those headers and runs the handler inside a CONSUMER span
//!   `"<queue> process"` whose parent is the producer's span: one trace from the enqueue to
//!   the work, across processes and languages. The span ends with an error status when the
//!   handler fails (a snooze is not a failure).
//!
//! ```no_run
//! use opentelemetry::global;
//! use jobbroker::{Client, Worker, otel};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The application installs its tracer provider (and exporter) with the SDK first.
//! let client = Client::new("127.0.0.1:7070")?
//!     .with_producer_middleware(otel::producer_middleware(global::tracer("jobbroker")));
//! client.enqueue(jobbroker::job("emails", "hi")).await?;
//!
//! let mut worker = Worker::builder("127.0.0.1:7070").build()?;
//! worker.use_middleware(otel::worker_middleware(global::tracer("jobbroker")));
//! # Ok(()) }
//! ```
//!
//! The parent of the producer span is the caller's current OpenTelemetry context (run the
//! enqueue inside it with [`opentelemetry::trace::FutureExt::with_context`]); the handler runs
//! inside the consumer span's context, so its own spans are the consumer span's children. In
//! [`Client::enqueue_batch`](crate::Client::enqueue_batch) each job gets its own producer span,
//! which ends before the batch is sent and carries no job id.

use std::sync::Arc;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{FutureExt, SpanKind, Status as SpanStatus, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;

use crate::middleware::{BoxFuture, EnqueueNext, HandlerNext};
use crate::{Job, Output, Status, WorkerError, v1};

/// `messaging.system` of every span.
const SYSTEM: &str = "jobbroker";

fn common_attributes(queue: &str, operation: &'static str, kind: &'static str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("messaging.system", SYSTEM),
        KeyValue::new("messaging.destination.name", queue.to_string()),
        KeyValue::new("messaging.operation.name", operation),
        KeyValue::new("messaging.operation.type", kind),
    ]
}

/// Producer middleware for [`Client::with_producer_middleware`](crate::Client::with_producer_middleware):
/// a PRODUCER span `"<queue> publish"` around the enqueue, its trace context written into the
/// job's headers (`traceparent`, `tracestate`). The span gets the job id
/// (`messaging.message.id`) when the broker answers, an error status when it refuses.
pub fn producer_middleware<T>(
    tracer: T,
) -> impl Fn(v1::EnqueueRequest, EnqueueNext) -> BoxFuture<Result<v1::EnqueueResponse, Status>>
+ Send
+ Sync
+ 'static
where
    T: Tracer + Send + Sync + 'static,
    T::Span: Send + Sync + 'static,
{
    let tracer = Arc::new(tracer);
    move |mut request, next| {
        let parent = Context::current();
        let span = tracer
            .span_builder(format!("{} publish", request.queue))
            .with_kind(SpanKind::Producer)
            .with_attributes(common_attributes(&request.queue, "publish", "send"))
            .start_with_context(tracer.as_ref(), &parent);
        let cx = parent.with_span(span);
        TraceContextPropagator::new().inject_context(&cx, &mut request.headers);
        Box::pin(async move {
            let answer = next.run(request).with_context(cx.clone()).await;
            let span = cx.span();
            match &answer {
                Ok(sent) if !sent.job_id.is_empty() => {
                    span.set_attribute(KeyValue::new("messaging.message.id", sent.job_id.clone()));
                }
                Ok(_) => {}
                Err(status) => span.set_status(SpanStatus::error(status.to_string())),
            }
            span.end();
            answer
        })
    }
}

/// Worker middleware for [`Worker::use_middleware`](crate::Worker::use_middleware): the
/// handler runs inside a CONSUMER span `"<queue> process"` whose parent is the trace context
/// in the job's headers (the producer's span), with the job id and attempt as attributes. The
/// span ends when the handler does, with an error status if it failed.
pub fn worker_middleware<T>(
    tracer: T,
) -> impl Fn(Job, HandlerNext) -> BoxFuture<Result<Output, WorkerError>> + Send + Sync + 'static
where
    T: Tracer + Send + Sync + 'static,
    T::Span: Send + Sync + 'static,
{
    let tracer = Arc::new(tracer);
    move |job, next| {
        let parent =
            TraceContextPropagator::new().extract_with_context(&Context::current(), job.headers());
        let mut attributes = common_attributes(job.queue(), "process", "process");
        attributes.push(KeyValue::new("messaging.message.id", job.id().to_string()));
        attributes.push(KeyValue::new("jobbroker.attempt", i64::from(job.attempt())));
        let span = tracer
            .span_builder(format!("{} process", job.queue()))
            .with_kind(SpanKind::Consumer)
            .with_attributes(attributes)
            .start_with_context(tracer.as_ref(), &parent);
        let cx = parent.with_span(span);
        Box::pin(async move {
            let outcome = next.run(job).with_context(cx.clone()).await;
            let span = cx.span();
            match &outcome {
                Ok(_) | Err(WorkerError::Snooze(_)) => {}
                Err(error) => span.set_status(SpanStatus::error(error.to_string())),
            }
            span.end();
            outcome
        })
    }
}
