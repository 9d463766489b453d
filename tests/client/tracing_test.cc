// Tracing (client/cpp/jobbroker/tracing.h): the W3C traceparent header's form, and a job
// enqueued through the tracing producer middleware and worked by the tracing worker middleware
// against the real broker, recorded by InMemoryTracer: one trace, the consumer span the child
// of the producer span.
#include "jobbroker/tracing.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "jobbroker/worker.h"
#include "tests/testing/broker_process.h"

namespace jobbroker::client {
namespace {

using ::jobbroker::testing::BrokerProcess;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr char kTraceId[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr char kSpanId[] = "00f067aa0ba902b7";

TEST(TraceparentTest, FormatsAndParsesVersion00) {
  const SpanContext context{.trace_id = kTraceId, .span_id = kSpanId, .trace_flags = 1};
  const std::string header = FormatTraceparent(context);
  EXPECT_EQ(header, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  std::optional<SpanContext> parsed = ParseTraceparent(header, " vendor=abc ");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->trace_id, kTraceId);
  EXPECT_EQ(parsed->span_id, kSpanId);
  EXPECT_EQ(parsed->trace_flags, 1);
  EXPECT_EQ(parsed->trace_state, "vendor=abc");
}

TEST(TraceparentTest, RefusesWhatIsNotAValidContext) {
  const std::string trace = kTraceId;
  const std::string span = kSpanId;
  for (const std::string& bad : {
           std::string(""),
           "00-" + trace + "-" + span,                             // no flags
           "00-" + trace + "-" + span + "-01-extra",               // version 00 is exact
           "ff-" + trace + "-" + span + "-01",                     // the forbidden version
           "00-" + std::string(32, '0') + "-" + span + "-01",      // zero trace id
           "00-" + trace + "-" + std::string(16, '0') + "-01",     // zero span id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + span + "-01",  // upper case
           "00-" + trace + "-" + span + "-0g",                     // flags not hex
           "00_" + trace + "_" + span + "_01",                     // wrong separators
       }) {
    EXPECT_FALSE(ParseTraceparent(bad).has_value()) << bad;
  }
  // A later version's header is read by its first four fields.
  std::optional<SpanContext> later = ParseTraceparent("01-" + trace + "-" + span + "-00-more");
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->span_id, kSpanId);
}

TEST(InMemoryTracerTest, ChildrenKeepTheTraceAndRootsStartNewOnes) {
  InMemoryTracer tracer;
  std::unique_ptr<Span> root = tracer.StartSpan("root", SpanKind::kProducer, std::nullopt);
  const SpanContext root_context = root->context();
  EXPECT_TRUE(root_context.valid());
  std::unique_ptr<Span> child = tracer.StartSpan("child", SpanKind::kConsumer, root_context);
  EXPECT_EQ(child->context().trace_id, root_context.trace_id);
  EXPECT_NE(child->context().span_id, root_context.span_id);
  child->SetError("boom");
  child->End();
  root->End();
  std::vector<RecordedSpan> spans = tracer.ended_spans();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].name, "child");
  EXPECT_EQ(spans[0].parent_span_id, root_context.span_id);
  EXPECT_TRUE(spans[0].error);
  EXPECT_EQ(spans[1].parent_span_id, "");
}

class TracingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<BrokerProcess>> broker = BrokerProcess::Start();
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
    options_ = ClientOptions{.address = broker_->address()};
  }

  // The spans of the tracer once `count` have ended (the consumer span ends after the ack the
  // producer's wait may see first); polls for up to 30 s, a bound for a hung test only.
  std::vector<RecordedSpan> AwaitSpans(const InMemoryTracer& tracer, size_t count) {
    for (const absl::Time give_up = absl::Now() + absl::Seconds(30); absl::Now() < give_up;) {
      if (tracer.ended_spans().size() >= count) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return tracer.ended_spans();
  }

  std::unique_ptr<BrokerProcess> broker_;
  ClientOptions options_;
};

TEST_F(TracingTest, TheConsumerSpanIsTheChildOfTheProducerSpanAcrossTheBroker) {
  auto tracer = std::make_shared<InMemoryTracer>();
  // The producer's caller is inside a span of its own, with vendor state: the trace continues.
  tracer->SetCurrent(SpanContext{
      .trace_id = kTraceId, .span_id = kSpanId, .trace_flags = 1, .trace_state = "vendor=7"});
  Client client(options_);
  client.Use(TracingEnqueueMiddleware(tracer));
  Worker worker(options_, {});
  worker.Use(TracingWorkerMiddleware(tracer));
  worker.Handle("emails", [](JobContext&) { return absl::OkStatus(); });
  ASSERT_TRUE(worker.Start().ok());

  absl::StatusOr<v1::Job> done = client.EnqueueAndWait("emails", "hello");
  ASSERT_TRUE(done.ok()) << done.status();
  std::vector<RecordedSpan> spans = AwaitSpans(*tracer, 2);
  worker.Stop(absl::Seconds(5));
  ASSERT_EQ(spans.size(), 2u);
  // The worker may end its span before the producer's thread has read the enqueue's reply.
  if (spans[0].kind == SpanKind::kConsumer) std::swap(spans[0], spans[1]);
  const RecordedSpan& producer = spans[0];
  const RecordedSpan& consumer = spans[1];

  EXPECT_EQ(producer.name, "emails publish");
  EXPECT_EQ(producer.kind, SpanKind::kProducer);
  EXPECT_EQ(producer.trace_id, kTraceId);
  EXPECT_EQ(producer.parent_span_id, kSpanId);
  EXPECT_FALSE(producer.error);
  EXPECT_THAT(producer.attributes, Contains(Pair("messaging.message.id", done->id())));
  EXPECT_THAT(producer.attributes, Contains(Pair("messaging.destination.name", "emails")));

  EXPECT_EQ(consumer.name, "emails process");
  EXPECT_EQ(consumer.kind, SpanKind::kConsumer);
  EXPECT_EQ(consumer.trace_id, producer.trace_id);
  EXPECT_EQ(consumer.parent_span_id, producer.span_id);
  EXPECT_EQ(consumer.trace_state, "vendor=7");
  EXPECT_FALSE(consumer.error);
  EXPECT_THAT(consumer.attributes, Contains(Pair("messaging.operation.type", "process")));

  // What crossed the broker: the job's headers.
  EXPECT_THAT(done->headers(), Contains(Pair("traceparent", "00-" + producer.trace_id + "-" +
                                                                producer.span_id + "-01")));
  EXPECT_THAT(done->headers(), Contains(Pair("tracestate", "vendor=7")));
}

TEST_F(TracingTest, AFailingHandlerEndsItsSpanWithAnErrorAndAJobWithoutContextStartsATrace) {
  auto tracer = std::make_shared<InMemoryTracer>();
  Client plain(options_);  // no producer middleware: the job carries no traceparent
  Worker worker(options_, {});
  worker.Use(TracingWorkerMiddleware(tracer));
  worker.Handle("invoices", [](JobContext&) { return PermanentError("bad address"); });
  ASSERT_TRUE(worker.Start().ok());

  absl::StatusOr<v1::Job> failed = plain.EnqueueAndWait("invoices", "x");
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted) << failed.status();
  std::vector<RecordedSpan> spans = AwaitSpans(*tracer, 1);
  worker.Stop(absl::Seconds(5));
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].name, "invoices process");
  EXPECT_EQ(spans[0].parent_span_id, "");
  EXPECT_TRUE(spans[0].error);
  EXPECT_THAT(spans[0].error_description, HasSubstr("bad address"));
}

TEST_F(TracingTest, EachJobOfABatchGetsItsOwnProducerSpan) {
  auto tracer = std::make_shared<InMemoryTracer>();
  Client client(options_);
  client.Use(TracingEnqueueMiddleware(tracer));
  v1::EnqueueBatchRequest batch;
  *batch.add_jobs() = MakeEnqueueRequest("thumbnails", "a.png", {});
  *batch.add_jobs() = MakeEnqueueRequest("thumbnails", "b.png", {});
  absl::StatusOr<std::vector<Enqueued>> enqueued = client.EnqueueBatch(batch);
  ASSERT_TRUE(enqueued.ok()) << enqueued.status();
  std::vector<RecordedSpan> spans = tracer->ended_spans();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_NE(spans[0].span_id, spans[1].span_id);
  for (size_t i = 0; i < 2; ++i) {
    absl::StatusOr<v1::Job> job = client.GetJob((*enqueued)[i].job_id);
    ASSERT_TRUE(job.ok()) << job.status();
    std::optional<SpanContext> sent = ParseTraceparent(job->headers().at("traceparent"));
    ASSERT_TRUE(sent.has_value());
    EXPECT_EQ(sent->span_id, spans[i].span_id);
    EXPECT_THAT(spans[i].attributes, Contains(Pair("messaging.message.id", job->id())));
  }
}

TEST_F(TracingTest, AFailedEnqueueEndsTheProducerSpanWithAnError) {
  auto tracer = std::make_shared<InMemoryTracer>();
  Client client(options_);
  client.Use(TracingEnqueueMiddleware(tracer));
  EXPECT_EQ(client.Enqueue("bad queue name!", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<RecordedSpan> spans = tracer->ended_spans();
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].kind, SpanKind::kProducer);
  EXPECT_TRUE(spans[0].error);
  EXPECT_EQ(spans[0].parent_span_id, "");
}

}  // namespace
}  // namespace jobbroker::client
