// The replication messages as frames and back, and what a frame that cannot be taken gets.

#include "cluster/transport/wire.h"

#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/record_codec.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::cluster {
namespace {

using ::jobbroker::storage::Dedup;
using ::jobbroker::storage::FullJob;
using ::jobbroker::storage::FullPolicy;
using ::jobbroker::testing::StatusIs;
using ::testing::HasSubstr;

ReplicationMessage Envelope() {
  ReplicationMessage m;
  m.from = "node-a";
  m.to = "node-b";
  m.partition = 5;
  return m;
}

ReplicationMessage RoundTrip(const ReplicationMessage& m) {
  v1::ReplicationFrame frame = ToWire(m);
  // Through bytes, as on a stream.
  v1::ReplicationFrame parsed;
  EXPECT_TRUE(parsed.ParseFromString(frame.SerializeAsString()));
  absl::StatusOr<ReplicationMessage> back = FromWire(parsed);
  EXPECT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->from, m.from);
  EXPECT_EQ(back->to, m.to);
  EXPECT_EQ(back->partition, m.partition);
  return back.ok() ? *std::move(back) : ReplicationMessage{};
}

TEST(ReplicationWireTest, AppendRequestRoundTripsWithWholeTransitions) {
  ReplicationMessage m = Envelope();
  AppendRequest request{9, {40, 8}, {}, 38};
  LogEntry first{41, 8, {}};
  first.transition.put_jobs = {FullJob("a")};
  first.transition.put_dedup = {Dedup("emails", "k", "a")};
  first.transition.put_policies = {{"emails", FullPolicy()}};
  LogEntry epoch_start{42, 9, {}};  // empty
  LogEntry removal{43, 9, {}};
  removal.transition.delete_jobs = {"a"};
  removal.transition.delete_dedup = {{"emails", "k"}};
  removal.transition.delete_policies = {"emails"};
  request.entries = {first, epoch_start, removal};
  m.body = request;

  ReplicationMessage back = RoundTrip(m);
  const auto* got = std::get_if<AppendRequest>(&back.body);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->epoch, 9);
  EXPECT_EQ(got->prev, (LogPosition{40, 8}));
  EXPECT_EQ(got->commit_seq, 38u);
  ASSERT_EQ(got->entries.size(), 3u);
  EXPECT_EQ(got->entries[0].seq, 41u);
  EXPECT_EQ(got->entries[0].epoch, 8);
  EXPECT_EQ(got->entries[0].transition.put_jobs, first.transition.put_jobs);
  EXPECT_EQ(got->entries[0].transition.put_dedup, first.transition.put_dedup);
  EXPECT_EQ(got->entries[0].transition.put_policies, first.transition.put_policies);
  EXPECT_EQ(got->entries[0].transition.partition, 5u);
  EXPECT_TRUE(got->entries[1].transition.empty());
  EXPECT_EQ(got->entries[1].epoch, 9);
  EXPECT_EQ(got->entries[2].transition.delete_jobs, removal.transition.delete_jobs);
  EXPECT_EQ(got->entries[2].transition.delete_dedup, removal.transition.delete_dedup);
  EXPECT_EQ(got->entries[2].transition.delete_policies, removal.transition.delete_policies);
}

TEST(ReplicationWireTest, SnapshotChunkResponseAndAckRoundTrip) {
  ReplicationMessage chunk = Envelope();
  SnapshotChunk c{7, {100, 6}, 3, true, {}};
  c.records.put_jobs = {FullJob("x"), FullJob("y")};
  chunk.body = c;
  ReplicationMessage back = RoundTrip(chunk);
  const auto* got_chunk = std::get_if<SnapshotChunk>(&back.body);
  ASSERT_NE(got_chunk, nullptr);
  EXPECT_EQ(got_chunk->epoch, 7);
  EXPECT_EQ(got_chunk->at, (LogPosition{100, 6}));
  EXPECT_EQ(got_chunk->index, 3u);
  EXPECT_TRUE(got_chunk->last);
  EXPECT_EQ(got_chunk->records.put_jobs, c.records.put_jobs);

  for (AppendResponse::Result result :
       {AppendResponse::Result::kMatched, AppendResponse::Result::kMismatch,
        AppendResponse::Result::kStaleEpoch}) {
    ReplicationMessage response = Envelope();
    response.body = AppendResponse{11, result, 50, 44};
    back = RoundTrip(response);
    const auto* got = std::get_if<AppendResponse>(&back.body);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->epoch, 11);
    EXPECT_EQ(got->result, result);
    EXPECT_EQ(got->match_seq, 50u);
    EXPECT_EQ(got->retry_from, 44u);
  }

  ReplicationMessage ack = Envelope();
  ack.body = SnapshotAck{7, {100, 6}, 4};
  back = RoundTrip(ack);
  const auto* got_ack = std::get_if<SnapshotAck>(&back.body);
  ASSERT_NE(got_ack, nullptr);
  EXPECT_EQ(got_ack->epoch, 7);
  EXPECT_EQ(got_ack->at, (LogPosition{100, 6}));
  EXPECT_EQ(got_ack->next_index, 4u);
}

// Each bad frame is INVALID_ARGUMENT naming the field.
void ExpectRefused(const v1::ReplicationFrame& frame, const std::string& field) {
  absl::StatusOr<ReplicationMessage> m = FromWire(frame);
  EXPECT_THAT(m, StatusIs(absl::StatusCode::kInvalidArgument)) << field;
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(field));
}

TEST(ReplicationWireTest, FramesThatCannotBeTakenNameTheirField) {
  ReplicationMessage m = Envelope();
  m.body = AppendRequest{3, {10, 2}, {LogEntry{11, 3, {}}, LogEntry{12, 3, {}}}, 9};
  const v1::ReplicationFrame good = ToWire(m);

  v1::ReplicationFrame frame = good;
  frame.clear_from();
  ExpectRefused(frame, "from");
  frame = good;
  frame.clear_to();
  ExpectRefused(frame, "to");
  frame = good;
  frame.clear_body();
  ExpectRefused(frame, "body");
  frame = good;
  frame.mutable_append()->mutable_entries(1)->set_seq(14);
  ExpectRefused(frame, "append.entries[1].seq");
  frame = good;
  frame.mutable_append()->mutable_entries(0)->set_record("not a record");
  ExpectRefused(frame, "append.entries[0].record");

  ReplicationMessage response = Envelope();
  response.body = AppendResponse{1, AppendResponse::Result::kMatched, 1, 0};
  frame = ToWire(response);
  frame.mutable_append_response()->set_result(v1::AppendResponse::RESULT_UNSPECIFIED);
  ExpectRefused(frame, "append_response.result");

  ReplicationMessage chunk = Envelope();
  SnapshotChunk c{1, {5, 1}, 0, false, {}};
  c.records.delete_jobs = {"x"};
  chunk.body = c;
  ExpectRefused(ToWire(chunk), "snapshot_chunk.records");
}

}  // namespace
}  // namespace jobbroker::cluster
