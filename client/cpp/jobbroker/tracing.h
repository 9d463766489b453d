#pragma once

// Tracing for producers and workers (docs/worker-contract.md §9): a producer middleware that
// starts a PRODUCER span "<queue> publish" and writes its W3C trace context into the job's
// headers (`traceparent`, `tracestate`), and a worker middleware that reads it back and starts
// a CONSUMER span "<queue> process" as that span's child, which ends with an error status when
// the handler fails.
//
// Why a tracer interface of our own instead of OpenTelemetry's: the C++ side builds from
// Debian's packages only, and Debian 12 packages no OpenTelemetry C++ (opentelemetry-cpp). The
// interface below is the small part of a tracer these middlewares need (start a span with a
// kind, a name and a remote parent; read its ids; set attributes and an error; end it), so
// that an OpenTelemetry tracer plugs in through an adapter of a few lines (client/cpp/README.md,
// "Tracing"), and InMemoryTracer records spans for tests, the way OpenTelemetry's in-memory
// exporter does.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "jobbroker/client.h"
#include "jobbroker/worker.h"

namespace jobbroker::client {

// The job headers that carry the trace context (W3C Trace Context, level 1).
inline constexpr char kTraceparentHeader[] = "traceparent";
inline constexpr char kTracestateHeader[] = "tracestate";

// A span's identity as W3C Trace Context carries it.
struct SpanContext {
  // 32 lowercase hex digits, not all zero.
  std::string trace_id;
  // 16 lowercase hex digits, not all zero.
  std::string span_id;
  // Bit 0: sampled.
  uint8_t trace_flags = 0;
  // The `tracestate` header's text, vendors' entries passed along as they are; may be empty.
  std::string trace_state;

  // Whether the ids have the form above.
  bool valid() const;
};

// "00-<trace_id>-<span_id>-<flags>", the `traceparent` header of `context`.
std::string FormatTraceparent(const SpanContext& context);
// The context a `traceparent` header names (and `tracestate`, kept as is); nullopt for a value
// that is not version 00's form (or a later version's prefix of it) or whose ids are all zero:
// the consumer span then starts a trace of its own.
std::optional<SpanContext> ParseTraceparent(std::string_view traceparent,
                                            std::string_view tracestate = "");

enum class SpanKind { kProducer, kConsumer };

// One span, started by Tracer::StartSpan. The middlewares call it from one thread at a time.
class Span {
 public:
  virtual ~Span() = default;
  // The ids this span hands to its children (the producer's go into the job's headers).
  virtual SpanContext context() const = 0;
  virtual void SetAttribute(std::string_view key, std::string_view value) = 0;
  // Marks the span failed (OpenTelemetry's status ERROR with `description`).
  virtual void SetError(std::string_view description) = 0;
  // Called once, last.
  virtual void End() = 0;
};

// What the tracing middlewares start spans with. Implementations must be thread-safe: the
// worker's handler threads start spans at once.
class Tracer {
 public:
  virtual ~Tracer() = default;
  // A span named `name`, child of `parent` when it is set (a context from another process: the
  // producer's, read from the job's headers); without one, child of whatever the tracer
  // considers current (an OpenTelemetry adapter: the active span), else the root of a new trace.
  virtual std::unique_ptr<Span> StartSpan(std::string_view name, SpanKind kind,
                                          const std::optional<SpanContext>& parent) = 0;
};

// Producer middleware for Client::Use: a PRODUCER span "<queue> publish" per job around the
// enqueue (a batch's jobs each get their own), child of the tracer's current span; its context
// goes into the job's headers as `traceparent` (and `tracestate` when not empty), replacing
// any there. Attributes: messaging.system, messaging.operation.type
// ("publish"), messaging.destination.name (the queue), messaging.message.id (the job id, once
// enqueued). A failed enqueue ends it with an error status.
EnqueueMiddleware TracingEnqueueMiddleware(std::shared_ptr<Tracer> tracer);

// Worker middleware for Worker::Use: a CONSUMER span "<queue> process" around the handler,
// child of the context in the job's `traceparent` (and `tracestate`) header, or of the
// tracer's current span when the job has none (or a malformed one). Attributes as the
// producer's, with messaging.operation.type "process" and the job id. A handler that returns
// an error (or throws) ends it with an error status; a Snooze is not an error.
Middleware TracingWorkerMiddleware(std::shared_ptr<Tracer> tracer);

// A span as InMemoryTracer recorded it.
struct RecordedSpan {
  std::string name;
  SpanKind kind = SpanKind::kProducer;
  std::string trace_id;
  std::string span_id;
  // Empty for the root of a trace.
  std::string parent_span_id;
  std::string trace_state;
  std::map<std::string, std::string> attributes;
  bool error = false;
  std::string error_description;
};

// A Tracer that keeps the spans it started in memory, for tests (OpenTelemetry's in-memory
// exporter in spirit). New ids come from a random generator; a span without a parent is the
// child of the context given to SetCurrent, if any, else the root of a new trace. Thread-safe.
class InMemoryTracer : public Tracer {
 public:
  std::unique_ptr<Span> StartSpan(std::string_view name, SpanKind kind,
                                  const std::optional<SpanContext>& parent) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // The parent of spans started without one from now on (nullopt: none), standing in for an
  // OpenTelemetry tracer's active span.
  void SetCurrent(std::optional<SpanContext> current) ABSL_LOCKS_EXCLUDED(mu_);

  // The spans that ended, in the order they ended.
  std::vector<RecordedSpan> ended_spans() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class RecordingSpan;
  void Record(RecordedSpan span) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::BitGen random_ ABSL_GUARDED_BY(mu_);
  std::optional<SpanContext> current_ ABSL_GUARDED_BY(mu_);
  std::vector<RecordedSpan> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::client
