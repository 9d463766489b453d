// Broker.EnqueueStream against the real binary: EnqueueBatch calls as messages of one stream,
// each answered by its request_id once durable, a refused batch answered without ending the
// stream, and every answered job still there after a kill -9.

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/http_client.h"
#include "tests/testing/matchers.h"

namespace jobbroker::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr char kQueue[] = "streamed";

v1::EnqueueStreamRequest Batch(uint64_t request_id, const std::vector<std::string>& payloads,
                               const std::string& queue = kQueue) {
  v1::EnqueueStreamRequest request;
  request.set_request_id(request_id);
  for (const std::string& payload : payloads) {
    v1::EnqueueRequest* job = request.mutable_batch()->add_jobs();
    job->set_queue(queue);
    job->set_payload(payload);
  }
  return request;
}

class EnqueueStreamTest : public BrokerFixture {
 protected:
  using Stream = grpc::ClientReaderWriter<v1::EnqueueStreamRequest, v1::EnqueueStreamResponse>;

  // A hung broker fails the test instead of stalling it.
  std::unique_ptr<Stream> Open(grpc::ClientContext* ctx) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + kWaitDeadline));
    return client().broker().EnqueueStream(ctx);
  }

  // Reads `n` answers, by request_id; a stream that ends first fails the test.
  static std::map<uint64_t, v1::EnqueueStreamResponse> ReadAnswers(Stream& stream, int n) {
    std::map<uint64_t, v1::EnqueueStreamResponse> answers;
    for (int i = 0; i < n; ++i) {
      v1::EnqueueStreamResponse response;
      if (!stream.Read(&response)) {
        ADD_FAILURE() << "the stream ended after " << i << " of " << n << " answers";
        break;
      }
      EXPECT_FALSE(answers.contains(response.request_id())) << response.request_id();
      answers[response.request_id()] = response;
    }
    return answers;
  }
};

TEST_F(EnqueueStreamTest, EachBatchIsAnsweredByItsRequestIdWithItsJobsInOrder) {
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = Open(&ctx);
  // Three batches in flight at once: none waits for the one before.
  ASSERT_TRUE(stream->Write(Batch(7, {"a1", "a2"})));
  ASSERT_TRUE(stream->Write(Batch(8, {"b1"})));
  ASSERT_TRUE(stream->Write(Batch(9, {"c1", "c2", "c3"})));
  std::map<uint64_t, v1::EnqueueStreamResponse> answers = ReadAnswers(*stream, 3);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_THAT(stream->Finish(), IsOk());

  const std::map<uint64_t, std::vector<std::string>> sent = {
      {7, {"a1", "a2"}}, {8, {"b1"}}, {9, {"c1", "c2", "c3"}}};
  ASSERT_THAT(answers, SizeIs(3));
  for (const auto& [id, payloads] : sent) {
    SCOPED_TRACE(id);
    const v1::EnqueueStreamResponse& answer = answers[id];
    EXPECT_EQ(answer.code(), 0) << answer.message();
    ASSERT_THAT(answer.results(), SizeIs(payloads.size()));
    for (size_t i = 0; i < payloads.size(); ++i) {
      const v1::Job job = client().MustGetJob(answer.results(i).job_id());
      EXPECT_EQ(job.payload(), payloads[i]);
      EXPECT_EQ(job.state(), v1::JOB_STATE_READY);
    }
  }
  EXPECT_EQ(client().Counts(kQueue), (std::map<std::string, int64_t>{{"JOB_STATE_READY", 6}}));
}

TEST_F(EnqueueStreamTest, ARefusedBatchChangesNothingAndTheStreamGoesOn) {
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = Open(&ctx);
  v1::EnqueueStreamRequest bad_delay = Batch(1, {"x", "y"});
  *bad_delay.mutable_batch()->mutable_jobs(1)->mutable_delay() = ToProto(absl::Seconds(-5));
  ASSERT_TRUE(stream->Write(bad_delay));
  v1::EnqueueStreamRequest empty;
  empty.set_request_id(2);
  ASSERT_TRUE(stream->Write(empty));
  ASSERT_TRUE(stream->Write(Batch(3, {"kept"})));
  std::map<uint64_t, v1::EnqueueStreamResponse> answers = ReadAnswers(*stream, 3);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_THAT(stream->Finish(), IsOk());

  EXPECT_EQ(answers[1].code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(answers[1].message(), HasSubstr("jobs[1].delay"));
  EXPECT_THAT(answers[1].results(), SizeIs(0));
  EXPECT_EQ(answers[2].code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(answers[2].message(), HasSubstr("jobs"));
  EXPECT_EQ(answers[3].code(), 0) << answers[3].message();
  ASSERT_THAT(answers[3].results(), SizeIs(1));
  // Only the good batch's job exists.
  std::vector<v1::Job> jobs = client().ListAll(kQueue);
  ASSERT_THAT(jobs, SizeIs(1));
  EXPECT_EQ(jobs[0].id(), answers[3].results(0).job_id());
  EXPECT_EQ(jobs[0].payload(), "kept");
}

// A writer far ahead of the broker: the stream holds at most EnqueueStream::kMaxPending batches
// unanswered and reads the rest as answers go out; every batch is answered once.
TEST_F(EnqueueStreamTest, AWriterFarAheadGetsEveryAnswer) {
  constexpr int kBatches = 400;
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = Open(&ctx);
  std::thread writer([&stream] {
    for (int i = 0; i < kBatches; ++i) {
      if (!stream->Write(Batch(i, {absl::StrCat(i, ".0"), absl::StrCat(i, ".1")}))) return;
    }
    stream->WritesDone();
  });
  std::map<uint64_t, v1::EnqueueStreamResponse> answers = ReadAnswers(*stream, kBatches);
  writer.join();
  EXPECT_THAT(stream->Finish(), IsOk());
  ASSERT_THAT(answers, SizeIs(kBatches));
  for (const auto& [id, answer] : answers) {
    EXPECT_EQ(answer.code(), 0) << id << ": " << answer.message();
    EXPECT_THAT(answer.results(), SizeIs(2)) << id;
  }
  EXPECT_EQ(client().Counts(kQueue),
            (std::map<std::string, int64_t>{{"JOB_STATE_READY", 2 * kBatches}}));
}

// /metrics counts the streams open (jobbroker_enqueue_streams_open): one while a producer
// sends, none once it has ended its stream.
TEST_F(EnqueueStreamTest, MetricsCountTheStreamsOpen) {
  auto open_streams = [this] {
    return Sample(HttpGet(process().http_address(), "/metrics"), "jobbroker_enqueue_streams_open");
  };
  EXPECT_EQ(open_streams(), 0);
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = Open(&ctx);
  ASSERT_TRUE(stream->Write(Batch(1, {"a"})));
  ReadAnswers(*stream, 1);  // the stream is open at the broker once it has answered
  EXPECT_EQ(open_streams(), 1);
  stream->WritesDone();
  EXPECT_THAT(stream->Finish(), IsOk());
  // The broker lets go of the stream just after the client has its end.
  const absl::Time give_up = absl::Now() + kWaitDeadline;
  while (open_streams() != 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(open_streams(), 0);
}

// An answer on the stream means durable, as a unary call's: kill -9 right after the last one.
TEST_F(EnqueueStreamTest, EveryAnsweredJobSurvivesAKill9) {
  constexpr int kBatches = 50;
  std::vector<std::string> ids;
  {
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream = Open(&ctx);
    for (int i = 0; i < kBatches; ++i) {
      std::vector<std::string> payloads;
      for (int j = 0; j < 20; ++j) payloads.push_back(absl::StrCat(i, "/", j));
      ASSERT_TRUE(stream->Write(Batch(i, payloads)));
    }
    std::map<uint64_t, v1::EnqueueStreamResponse> answers = ReadAnswers(*stream, kBatches);
    for (const auto& [id, answer] : answers) {
      ASSERT_EQ(answer.code(), 0) << answer.message();
      for (const v1::EnqueueResponse& r : answer.results()) ids.push_back(r.job_id());
    }
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_THAT(stream->Finish(), IsOk());
  }
  ASSERT_NO_FATAL_FAILURE(Kill9AndRestart());
  ASSERT_THAT(ids, SizeIs(kBatches * 20));
  for (const std::string& id : ids) EXPECT_EQ(client().MustGetJob(id).queue(), kQueue);
}

}  // namespace
}  // namespace jobbroker::testing
