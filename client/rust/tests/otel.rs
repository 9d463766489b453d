//! The tracing middleware (feature `tracing-otel`) with the OpenTelemetry SDK's in-memory
//! exporter: a job enqueued through the traced client and worked by the traced worker against
//! the real broker is one trace, the consumer span a child of the producer span.

mod common;

use common::{Broker, GIVE_UP, Running};
use jobbroker::{Job, Worker, WorkerError, job, otel};
use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
use opentelemetry::{Key, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == Key::from(key.to_string()))
        .map(|kv| &kv.value)
}

/// The finished span named `name` whose `messaging.message.id` is `job_id`.
fn span_of<'a>(spans: &'a [SpanData], name: &str, job_id: &str) -> &'a SpanData {
    spans
        .iter()
        .find(|s| {
            s.name == name
                && attribute(s, "messaging.message.id").map(|v| v.as_str().into_owned())
                    == Some(job_id.to_string())
        })
        .unwrap_or_else(|| panic!("no span {name:?} of job {job_id}"))
}

#[tokio::test]
async fn a_job_is_one_trace_from_the_enqueue_to_its_handler() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let tracer = provider.tracer("jobbroker-test");

    let broker = Broker::start();
    let client = broker
        .client()
        .await
        .with_producer_middleware(otel::producer_middleware(tracer.clone()));
    let mut worker = Worker::builder(broker.addr.as_str()).build().unwrap();
    worker.use_middleware(otel::worker_middleware(tracer.clone()));
    worker.handle("traced", |job: Job| async move {
        match job.text()? {
            "fail" => Err(WorkerError::permanent("refused on purpose")),
            _ => Ok("traced"),
        }
    });
    let running = Running::start(worker);

    let done = client
        .enqueue_and_wait(job("traced", "ok"), Some(GIVE_UP))
        .await
        .unwrap();
    assert!(
        done.headers.contains_key("traceparent"),
        "the producer wrote its trace context into the headers: {:?}",
        done.headers
    );
    let failed = client
        .enqueue_and_wait(job("traced", "fail"), Some(GIVE_UP))
        .await
        .unwrap_err();
    let failed_id = failed.job().unwrap().id.clone();
    running.stop().await.unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let producer = span_of(&spans, "traced publish", &done.id);
    let consumer = span_of(&spans, "traced process", &done.id);
    assert_eq!(producer.span_kind, SpanKind::Producer);
    assert_eq!(consumer.span_kind, SpanKind::Consumer);
    assert_eq!(
        consumer.span_context.trace_id(),
        producer.span_context.trace_id(),
        "one trace"
    );
    assert_eq!(
        consumer.parent_span_id,
        producer.span_context.span_id(),
        "the consumer span is the producer span's child"
    );
    assert!(consumer.parent_span_is_remote);
    assert_eq!(consumer.status, Status::Unset);
    assert_eq!(
        attribute(consumer, "messaging.destination.name").map(|v| v.as_str().into_owned()),
        Some("traced".to_string())
    );

    // A failed handler ends its span with an error status, in the producer's trace too.
    let failed_producer = span_of(&spans, "traced publish", &failed_id);
    let failed_consumer = span_of(&spans, "traced process", &failed_id);
    assert_eq!(
        failed_consumer.parent_span_id,
        failed_producer.span_context.span_id()
    );
    match &failed_consumer.status {
        Status::Error { description } => {
            assert!(description.contains("refused on purpose"), "{description}")
        }
        other => panic!("want an error status, got {other:?}"),
    }
    provider.shutdown().unwrap();
}
