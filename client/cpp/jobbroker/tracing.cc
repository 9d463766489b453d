#include "jobbroker/tracing.h"

#include <exception>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace jobbroker::client {
namespace {

constexpr char kMessagingSystem[] = "jobbroker";

// This absl is built without std::string_view as its string_view.
absl::string_view ToAbsl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}
std::string_view FromAbsl(absl::string_view text) {
  return std::string_view(text.data(), text.size());
}

bool IsLowerHex(std::string_view text) {
  for (char c : text) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

bool AllZero(std::string_view text) { return text.find_first_not_of('0') == std::string::npos; }

// A new trace or span id of `bytes` random bytes; never all zero, which W3C reserves for
// "none".
std::string RandomId(absl::BitGen& random, int bytes) {
  std::string hex;
  do {
    hex.clear();
    for (int i = 0; i < bytes; ++i) {
      absl::StrAppendFormat(&hex, "%02x", absl::Uniform<unsigned>(random, 0, 256));
    }
  } while (AllZero(hex));
  return hex;
}

void SetMessagingAttributes(Span& span, std::string_view operation, std::string_view queue) {
  span.SetAttribute("messaging.system", kMessagingSystem);
  span.SetAttribute("messaging.operation.type", operation);
  span.SetAttribute("messaging.destination.name", queue);
}

}  // namespace

bool SpanContext::valid() const {
  return trace_id.size() == 32 && IsLowerHex(trace_id) && !AllZero(trace_id) &&
         span_id.size() == 16 && IsLowerHex(span_id) && !AllZero(span_id);
}

std::string FormatTraceparent(const SpanContext& context) {
  return absl::StrFormat("00-%s-%s-%02x", context.trace_id, context.span_id, context.trace_flags);
}

std::optional<SpanContext> ParseTraceparent(std::string_view traceparent,
                                            std::string_view tracestate) {
  // version "-" trace-id "-" parent-id "-" trace-flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 hex.
  constexpr size_t kLength = 55;
  const std::string_view text = FromAbsl(absl::StripAsciiWhitespace(ToAbsl(traceparent)));
  if (text.size() < kLength || text[2] != '-' || text[35] != '-' || text[52] != '-') {
    return std::nullopt;
  }
  const std::string_view version = text.substr(0, 2);
  if (!IsLowerHex(version) || version == "ff") return std::nullopt;
  // Version 00 is exactly this long; a later version may append fields after a dash, and its
  // first four fields are read as version 00's (the specification's forward compatibility).
  if (version == "00" ? text.size() != kLength : text.size() > kLength && text[kLength] != '-') {
    return std::nullopt;
  }
  SpanContext context;
  context.trace_id = std::string(text.substr(3, 32));
  context.span_id = std::string(text.substr(36, 16));
  const std::string_view flags = text.substr(53, 2);
  int flag_bits = 0;
  if (!IsLowerHex(flags) || !absl::SimpleHexAtoi(ToAbsl(flags), &flag_bits)) return std::nullopt;
  context.trace_flags = static_cast<uint8_t>(flag_bits);
  if (!context.valid()) return std::nullopt;
  context.trace_state = std::string(absl::StripAsciiWhitespace(ToAbsl(tracestate)));
  return context;
}

EnqueueMiddleware TracingEnqueueMiddleware(std::shared_ptr<Tracer> tracer) {
  return [tracer = std::move(tracer)](
             v1::EnqueueBatchRequest& jobs,
             const EnqueueHandler& next) -> absl::StatusOr<std::vector<Enqueued>> {
    // One span per job: each job's consumer span is the child of its own producer span.
    std::vector<std::unique_ptr<Span>> spans;
    for (v1::EnqueueRequest& job : *jobs.mutable_jobs()) {
      std::unique_ptr<Span> span = tracer->StartSpan(absl::StrCat(job.queue(), " publish"),
                                                     SpanKind::kProducer, /*parent=*/std::nullopt);
      SetMessagingAttributes(*span, "publish", job.queue());
      const SpanContext context = span->context();
      auto& headers = *job.mutable_headers();
      headers[kTraceparentHeader] = FormatTraceparent(context);
      if (context.trace_state.empty()) {
        headers.erase(kTracestateHeader);
      } else {
        headers[kTracestateHeader] = context.trace_state;
      }
      spans.push_back(std::move(span));
    }
    auto end_all = [&spans](const std::string& error) {
      for (std::unique_ptr<Span>& span : spans) {
        if (!error.empty()) span->SetError(error);
        span->End();
      }
    };
    absl::StatusOr<std::vector<Enqueued>> enqueued;
    try {
      enqueued = next(jobs);
    } catch (...) {
      end_all("the enqueue threw an exception");
      throw;
    }
    if (!enqueued.ok()) {
      end_all(enqueued.status().ToString());
      return enqueued;
    }
    for (size_t i = 0; i < spans.size() && i < enqueued->size(); ++i) {
      spans[i]->SetAttribute("messaging.message.id", (*enqueued)[i].job_id);
    }
    end_all("");
    return enqueued;
  };
}

Middleware TracingWorkerMiddleware(std::shared_ptr<Tracer> tracer) {
  return [tracer = std::move(tracer)](JobContext& job, const Handler& next) -> absl::Status {
    std::optional<SpanContext> parent;
    if (auto it = job.headers().find(kTraceparentHeader); it != job.headers().end()) {
      auto state = job.headers().find(kTracestateHeader);
      parent = ParseTraceparent(
          it->second, state == job.headers().end() ? "" : std::string_view(state->second));
    }
    std::unique_ptr<Span> span =
        tracer->StartSpan(absl::StrCat(job.queue(), " process"), SpanKind::kConsumer, parent);
    SetMessagingAttributes(*span, "process", job.queue());
    span->SetAttribute("messaging.message.id", job.job_id());
    absl::Status status;
    try {
      status = next(job);
    } catch (const std::exception& e) {
      span->SetError(absl::StrCat("the handler threw: ", e.what()));
      span->End();
      throw;
    } catch (...) {
      span->SetError("the handler threw an exception");
      span->End();
      throw;
    }
    // A snooze gives the job back for later on purpose: not a failure.
    if (!status.ok() && !IsSnooze(status)) span->SetError(status.ToString());
    span->End();
    return status;
  };
}

// Fills in its RecordedSpan while it runs and hands it to the tracer at End. Must end before
// the tracer goes away.
class InMemoryTracer::RecordingSpan : public Span {
 public:
  RecordingSpan(InMemoryTracer* tracer, RecordedSpan span, uint8_t trace_flags)
      : tracer_(tracer), span_(std::move(span)), trace_flags_(trace_flags) {}

  SpanContext context() const override {
    return SpanContext{.trace_id = span_.trace_id,
                       .span_id = span_.span_id,
                       .trace_flags = trace_flags_,
                       .trace_state = span_.trace_state};
  }
  void SetAttribute(std::string_view key, std::string_view value) override {
    span_.attributes[std::string(key)] = std::string(value);
  }
  void SetError(std::string_view description) override {
    span_.error = true;
    span_.error_description = std::string(description);
  }
  void End() override {
    if (ended_) return;
    ended_ = true;
    tracer_->Record(span_);
  }

 private:
  InMemoryTracer* const tracer_;
  RecordedSpan span_;
  const uint8_t trace_flags_;
  bool ended_ = false;
};

std::unique_ptr<Span> InMemoryTracer::StartSpan(std::string_view name, SpanKind kind,
                                                const std::optional<SpanContext>& parent) {
  absl::MutexLock lock(&mu_);
  const std::optional<SpanContext>& from = parent.has_value() ? parent : current_;
  RecordedSpan span{.name = std::string(name), .kind = kind};
  span.span_id = RandomId(random_, 8);
  uint8_t trace_flags = 0x01;  // sampled: this tracer records every span
  if (from.has_value()) {
    span.trace_id = from->trace_id;
    span.parent_span_id = from->span_id;
    span.trace_state = from->trace_state;
    trace_flags = from->trace_flags;
  } else {
    span.trace_id = RandomId(random_, 16);
  }
  return std::make_unique<RecordingSpan>(this, std::move(span), trace_flags);
}

void InMemoryTracer::SetCurrent(std::optional<SpanContext> current) {
  absl::MutexLock lock(&mu_);
  current_ = std::move(current);
}

std::vector<RecordedSpan> InMemoryTracer::ended_spans() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

void InMemoryTracer::Record(RecordedSpan span) {
  absl::MutexLock lock(&mu_);
  ended_.push_back(std::move(span));
}

}  // namespace jobbroker::client
