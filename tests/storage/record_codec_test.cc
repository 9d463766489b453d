#include "storage/record_codec.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/record.pb.h"
#include "tests/storage/reference_job_encoder.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::storage {

using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::HasSubstr;

TEST(RecordCodecTest, FullJobRoundTrips) {
  core::Job job = FullJob();
  absl::StatusOr<core::Job> decoded = DecodeJob(EncodeJob(job));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, job);
}

TEST(RecordCodecTest, DefaultJobRoundTrips) {
  core::Job job;  // every time InfinitePast, every duration zero, no attempts
  absl::StatusOr<core::Job> decoded = DecodeJob(EncodeJob(job));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, job);
}

TEST(RecordCodecTest, InfinitiesRoundTrip) {
  core::Job job = SimpleJob("j");
  job.created_at = absl::InfinitePast();
  job.run_at = absl::InfiniteFuture();
  job.lease_duration = absl::InfiniteDuration();
  job.lease_length = -absl::InfiniteDuration();
  absl::StatusOr<core::Job> decoded = DecodeJob(EncodeJob(job));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->created_at, absl::InfinitePast());
  EXPECT_EQ(decoded->run_at, absl::InfiniteFuture());
  EXPECT_EQ(decoded->lease_duration, absl::InfiniteDuration());
  EXPECT_EQ(decoded->lease_length, -absl::InfiniteDuration());
}

// A record written before run-time limits and expiry existed has neither field: it means no
// limit and no expiry, not "at 1970".
TEST(RecordCodecTest, ARecordWithoutTimeoutAtOrExpireAtHasNeither) {
  JobRecord record;
  ASSERT_TRUE(record.ParseFromString(EncodeJob(SimpleJob("j"))));
  ASSERT_FALSE(record.has_timeout_at_us());
  ASSERT_FALSE(record.has_expire_at_us());
  record.clear_timeout_us();
  absl::StatusOr<core::Job> decoded = DecodeJob(record.SerializeAsString());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->timeout_at, absl::InfiniteFuture());
  EXPECT_EQ(decoded->expire_at, absl::InfiniteFuture());
  EXPECT_EQ(decoded->timeout, absl::ZeroDuration());
}

// The format stores microseconds (see record_codec.h): finer parts are dropped, not rounded up.
TEST(RecordCodecTest, SubMicrosecondPartsAreTruncated) {
  core::Job job = SimpleJob("j");
  job.created_at = absl::FromUnixMicros(1700000000000001) + absl::Nanoseconds(999);
  job.lease_duration = absl::Microseconds(5) + absl::Nanoseconds(999);
  absl::StatusOr<core::Job> decoded = DecodeJob(EncodeJob(job));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->created_at, absl::FromUnixMicros(1700000000000001));
  EXPECT_EQ(decoded->lease_duration, absl::Microseconds(5));
}

TEST(RecordCodecTest, WritesCurrentFormatVersion) {
  storage::JobRecord record;
  ASSERT_TRUE(record.ParseFromString(EncodeJob(FullJob())));
  EXPECT_EQ(record.format_version(), kJobRecordFormatVersion);
  EXPECT_EQ(kJobRecordFormatVersion, 1u);
}

TEST(RecordCodecTest, GarbageJobBytesAreDataLoss) {
  absl::StatusOr<core::Job> decoded = DecodeJob("\xff\xff\xff\xff not a record");
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("JobRecord does not parse"));
}

TEST(RecordCodecTest, TruncatedJobRecordIsDataLoss) {
  std::string bytes = EncodeJob(FullJob());
  absl::StatusOr<core::Job> decoded =
      DecodeJob(absl::string_view(bytes).substr(0, bytes.size() - 3));
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
}

TEST(RecordCodecTest, EmptyBytesAreDataLossForMissingVersion) {
  absl::StatusOr<core::Job> decoded = DecodeJob("");
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("no format_version"));
}

TEST(RecordCodecTest, NewerJobFormatIsDataLoss) {
  storage::JobRecord record;
  record.set_format_version(99);
  record.set_id("j");
  record.set_state(static_cast<int32_t>(core::JobState::kReady));
  absl::StatusOr<core::Job> decoded = DecodeJob(record.SerializeAsString());
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("format_version 99"));
}

TEST(RecordCodecTest, UnknownJobStateIsDataLoss) {
  storage::JobRecord record;
  ASSERT_TRUE(record.ParseFromString(EncodeJob(SimpleJob("j"))));
  record.set_state(42);
  absl::StatusOr<core::Job> decoded = DecodeJob(record.SerializeAsString());
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("state 42"));
}

TEST(RecordCodecTest, UnknownAttemptOutcomeIsDataLoss) {
  storage::JobRecord record;
  ASSERT_TRUE(record.ParseFromString(EncodeJob(FullJob())));
  record.mutable_attempts(0)->set_outcome(-1);
  absl::StatusOr<core::Job> decoded = DecodeJob(record.SerializeAsString());
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("attempts.outcome -1"));
}

TEST(RecordCodecTest, DuplicateHeaderIsDataLoss) {
  storage::JobRecord record;
  ASSERT_TRUE(record.ParseFromString(EncodeJob(SimpleJob("j"))));
  for (int i = 0; i < 2; ++i) {
    storage::HeaderRecord* h = record.add_headers();
    h->set_key("k");
    h->set_value("v");
  }
  absl::StatusOr<core::Job> decoded = DecodeJob(record.SerializeAsString());
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
}

// A field added later without a version bump (allowed by record.proto's rules) is ignored.
TEST(RecordCodecTest, UnknownFieldOfSameVersionIsIgnored) {
  core::Job job = FullJob();
  std::string bytes = EncodeJob(job);
  bytes += std::string("\xa0\x06\x01", 3);  // field 100, varint 1
  absl::StatusOr<core::Job> decoded = DecodeJob(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, job);
}

// A job with random fields, each left at its default half the time.
core::Job RandomJob(std::mt19937_64& random) {
  auto chance = [&] { return random() % 2 == 0; };
  auto text = [&] {
    return chance() ? std::string() : std::string(random() % 300, 'a' + random() % 26);
  };
  auto number = [&] { return chance() ? 0 : static_cast<int64_t>(random()) >> (random() % 64); };
  auto time = [&] {
    switch (random() % 4) {
      case 0:
        return absl::InfinitePast();
      case 1:
        return absl::InfiniteFuture();
      default:
        return absl::FromUnixMicros(number());
    }
  };
  core::Job j;
  j.id = text();
  j.queue = text();
  j.state = static_cast<core::JobState>(random() % 8);
  j.payload = text();
  for (int h = random() % 3; h > 0; --h) j.headers[text()] = text();
  j.priority = static_cast<int32_t>(number());
  j.seq = static_cast<uint64_t>(number());
  j.attempt = static_cast<int32_t>(number());
  j.max_attempts = static_cast<int32_t>(number());
  j.dedup_key = text();
  j.concurrency_key = text();
  j.created_at = time();
  j.run_at = time();
  j.lease_duration = absl::Microseconds(number());
  j.lease_id = text();
  j.worker_id = text();
  j.lease_deadline = time();
  j.lease_length = absl::Microseconds(number());
  j.cancel_requested = chance();
  j.last_error = text();
  j.fail_reason = static_cast<core::FailReason>(random() % 3);
  for (int a = random() % 3; a > 0; --a)
    j.attempts.push_back(core::AttemptRecord{static_cast<int32_t>(number()), text(), time(), time(),
                                             static_cast<core::AttemptOutcome>(random() % 4),
                                             text()});
  j.result = text();
  j.checkpoint = text();
  j.completed_at = time();
  j.timeout = absl::Microseconds(number());
  j.timeout_at = time();
  j.expire_at = time();
  j.snoozes = static_cast<int32_t>(number());
  j.progress = text();
  for (int d = random() % 3; d > 0; --d) j.depends_on.push_back(text());
  for (int d = random() % 3; d > 0; --d) j.dependency_results[text()] = text();
  return j;
}

// Recovery's light decode of a cold job reads the same fields as the whole decode, from the
// same bytes.
void ExpectColdFieldsOf(const core::Job& job) {
  const std::string bytes = EncodeJob(job);
  absl::StatusOr<core::Job> whole = DecodeJob(bytes);
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<core::ColdJobFields> cold = DecodeColdJobFields(bytes);
  ASSERT_TRUE(cold.ok()) << cold.status();
  ExpectSameIndexFields(*cold, *whole);
}

TEST(RecordCodecTest, ColdFieldsAreTheWholeDecodesFields) {
  core::Job full = FullJob();
  full.depends_on = {"01A", "01B"};
  full.expire_at = absl::FromUnixMicros(1700000000123456);
  ExpectColdFieldsOf(full);
  full.priority = -7;  // a negative int32 is ten bytes on the wire
  full.state = core::JobState::kScheduled;
  full.run_at = absl::InfiniteFuture();
  ExpectColdFieldsOf(full);
  ExpectColdFieldsOf(core::Job());  // every field at its default: nothing on the wire
  ExpectColdFieldsOf(SimpleJob("j"));
}

TEST(RecordCodecTest, ColdFieldsRefuseWhatTheWholeDecodeRefuses) {
  EXPECT_THAT(DecodeColdJobFields("\xff\xff\xff\xff not a record"),
              StatusIs(absl::StatusCode::kDataLoss));
  const std::string bytes = EncodeJob(FullJob());
  EXPECT_THAT(DecodeColdJobFields(absl::string_view(bytes).substr(0, bytes.size() - 3)),
              StatusIs(absl::StatusCode::kDataLoss));
  absl::StatusOr<core::ColdJobFields> empty = DecodeColdJobFields("");
  EXPECT_THAT(empty, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(empty.status().message(), HasSubstr("no format_version"));

  storage::JobRecord record;
  ASSERT_TRUE(record.ParseFromString(EncodeJob(SimpleJob("j"))));
  record.set_format_version(99);
  absl::StatusOr<core::ColdJobFields> newer = DecodeColdJobFields(record.SerializeAsString());
  EXPECT_THAT(newer.status().message(), HasSubstr("format_version 99"));
  record.set_format_version(kJobRecordFormatVersion);
  record.set_state(42);
  absl::StatusOr<core::ColdJobFields> state = DecodeColdJobFields(record.SerializeAsString());
  EXPECT_THAT(state.status().message(), HasSubstr("state 42"));
}

TEST(RecordCodecTest, ColdFieldsRefuseAKnownFieldOfAnotherWireType) {
  std::string bytes = EncodeJob(SimpleJob("j"));
  bytes += std::string("\x42\x01\x01", 3);  // field 8 (seq, a varint) as 1 length-delimited byte
  EXPECT_THAT(DecodeColdJobFields(bytes), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(RecordCodecTest, ColdFieldsSkipUnknownFields) {
  core::Job job = SimpleJob("j");
  std::string bytes = EncodeJob(job);
  bytes += std::string("\xa0\x06\x01", 3);  // field 100, varint 1
  absl::StatusOr<core::ColdJobFields> cold = DecodeColdJobFields(bytes);
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ(cold->id, job.id);
  EXPECT_EQ(cold->seq, job.seq);
}

TEST(RecordCodecTest, ColdFieldsOfRandomJobsDecodedIntoOneStructAreTheWholeDecodes) {
  // As recovery does: one ColdJobFields for every record, so nothing of a record may stay in it
  // for the next one (a concurrency key, a dependency, an expiry).
  std::mt19937_64 random(20261206);
  core::ColdJobFields cold;
  for (int i = 0; i < 1000; ++i) {
    core::Job job = RandomJob(random);
    job.state = static_cast<core::JobState>(1 + random() % 7);  // a state DecodeJob knows
    const std::string bytes = EncodeJob(job);
    absl::StatusOr<core::Job> whole = DecodeJob(bytes);
    ASSERT_TRUE(whole.ok()) << "random job " << i << ": " << whole.status();
    ASSERT_TRUE(DecodeColdJobFields(bytes, cold).ok()) << "random job " << i;
    SCOPED_TRACE(::testing::Message() << "random job " << i);
    ExpectSameIndexFields(cold, *whole);
  }
}

TEST(RecordCodecTest, ColdFieldsAcceptAndRefuseTheFieldsTheySkipAsProtobufDoes) {
  const std::string valid = EncodeJob(SimpleJob("j"));
  struct Case {
    const char* what;
    std::string appended;
  };
  const Case cases[] = {
      {"an unknown varint", std::string("\xa0\x06\x01", 3)},
      {"an unknown 10-byte varint", std::string("\xa0\x06") + std::string(9, '\xff') + "\x01"},
      {"an unknown 11-byte varint", std::string("\xa0\x06") + std::string(10, '\xff') + "\x01"},
      {"an unknown fixed64", std::string("\xa1\x06", 2) + std::string(8, 'x')},
      {"a cut fixed64", std::string("\xa1\x06", 2) + std::string(7, 'x')},
      {"an unknown fixed32", std::string("\xa5\x06", 2) + std::string(4, 'x')},
      {"a cut fixed32", std::string("\xa5\x06", 2) + std::string(3, 'x')},
      {"an unknown string", std::string("\xa2\x06\x03"
                                        "abc",
                                        6)},
      {"a string longer than the record", std::string("\xa2\x06\x04"
                                                      "abc",
                                                      6)},
      {"a group", std::string("\xa3\x06\x08\x01\xa4\x06", 6)},
      {"a group in a group", std::string("\xa3\x06\xab\x06\xac\x06\xa4\x06", 8)},
      {"a group closed by another field's end", std::string("\xa3\x06\xac\x06", 4)},
      {"a group never closed", std::string("\xa3\x06\x08\x01", 4)},
      {"an end of group alone", std::string("\xa4\x06", 2)},
      {"wire type 6", std::string("\xa6\x06\x01", 3)},
      {"wire type 7", std::string("\xa7\x06\x01", 3)},
      {"field number 0", std::string("\x00\x01", 2)},
      {"a tag past 32 bits", std::string("\xf8\xff\xff\xff\x7f\x01", 6)},
      {"the largest field number", std::string("\xf8\xff\xff\xff\x0f\x01", 6)},
      {"a tag cut short", std::string("\xa0", 1)},
  };
  for (const Case& c : cases) {
    const std::string bytes = valid + c.appended;
    storage::JobRecord parsed;
    const bool protobuf_accepts = parsed.ParseFromString(bytes);
    absl::StatusOr<core::ColdJobFields> cold = DecodeColdJobFields(bytes);
    EXPECT_EQ(cold.ok(), protobuf_accepts) << c.what << ": " << cold.status();
    if (cold.ok()) {
      EXPECT_EQ(cold->id, "j") << c.what;
    } else {
      EXPECT_THAT(cold, StatusIs(absl::StatusCode::kDataLoss)) << c.what;
    }
  }
}

TEST(RecordCodecTest, EncodeJobWritesWhatProtobufWritesByteForByte) {
  EXPECT_EQ(EncodeJob(FullJob()), ReferenceEncode(FullJob()));
  EXPECT_EQ(EncodeJob(SimpleJob("j")), ReferenceEncode(SimpleJob("j")));
  EXPECT_EQ(EncodeJob(core::Job()), ReferenceEncode(core::Job()));

  // Edges: the extremes of each integer, zero times where presence matters, empty strings in
  // repeated fields, an attempt with every field at its default, a string past 127 bytes (a
  // two-byte length).
  core::Job edges = FullJob();
  edges.priority = std::numeric_limits<int32_t>::min();
  edges.attempt = std::numeric_limits<int32_t>::max();
  edges.max_attempts = -1;
  edges.seq = std::numeric_limits<uint64_t>::max();
  edges.snoozes = -2;
  edges.timeout_at = absl::UnixEpoch();  // set, and zero on the wire: still written
  edges.expire_at = absl::InfinitePast();
  edges.run_at = absl::UnixEpoch();
  edges.lease_duration = -absl::InfiniteDuration();
  edges.timeout = absl::ZeroDuration();
  edges.headers[""] = "";
  edges.depends_on = {"", "a", std::string(300, 'd')};
  edges.dependency_results = {{"", ""}, {"x", std::string(200, 'r')}};
  edges.attempts.push_back(core::AttemptRecord{});
  edges.payload = std::string(100000, '\x80');
  EXPECT_EQ(EncodeJob(edges), ReferenceEncode(edges));

  // And many jobs with random fields.
  std::mt19937_64 random(20261205);
  for (int i = 0; i < 1000; ++i) {
    const core::Job j = RandomJob(random);
    ASSERT_EQ(EncodeJob(j), ReferenceEncode(j)) << "random job " << i;
  }
}

TEST(RecordCodecTest, DedupRoundTripsWithQueueAndKeyFromArguments) {
  core::DedupEntry entry = Dedup("emails", std::string("k\0ey", 4), "job-1");
  entry.payload_hash = 0xfedcba9876543210ULL;
  absl::StatusOr<core::DedupEntry> decoded =
      DecodeDedup(entry.queue, entry.key, EncodeDedup(entry));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, entry);
}

TEST(RecordCodecTest, DedupGarbageAndNewerVersionAreDataLoss) {
  EXPECT_THAT(DecodeDedup("q", "k", "\xff\xff\xff"), StatusIs(absl::StatusCode::kDataLoss));
  storage::DedupRecord record;
  record.set_format_version(99);
  absl::StatusOr<core::DedupEntry> decoded = DecodeDedup("q", "k", record.SerializeAsString());
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("DedupRecord format_version 99"));
}

TEST(RecordCodecTest, FullPolicyRoundTrips) {
  core::PolicyOverride policy = FullPolicy();
  absl::StatusOr<core::PolicyOverride> decoded = DecodePolicy(EncodePolicy(policy));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, policy);
}

// Fields set to zero or false must stay set: "0 = unlimited" is a choice, not "use the default".
TEST(RecordCodecTest, PolicyKeepsSetZeroValuesAndUnsetFields) {
  core::PolicyOverride policy;
  policy.max_concurrency = 0;
  policy.paused = false;
  policy.initial_backoff = absl::ZeroDuration();
  absl::StatusOr<core::PolicyOverride> decoded = DecodePolicy(EncodePolicy(policy));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, policy);
  EXPECT_FALSE(decoded->max_attempts.has_value());

  absl::StatusOr<core::PolicyOverride> empty = DecodePolicy(EncodePolicy(core::PolicyOverride{}));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
}

TEST(RecordCodecTest, PolicyGarbageNewerVersionAndBadJitterAreDataLoss) {
  EXPECT_THAT(DecodePolicy("\xff\xff\xff"), StatusIs(absl::StatusCode::kDataLoss));

  storage::PolicyRecord newer;
  newer.set_format_version(99);
  EXPECT_THAT(DecodePolicy(newer.SerializeAsString()), StatusIs(absl::StatusCode::kDataLoss));

  storage::PolicyRecord bad_jitter;
  bad_jitter.set_format_version(kPolicyRecordFormatVersion);
  bad_jitter.set_jitter(0);
  absl::StatusOr<core::PolicyOverride> decoded = DecodePolicy(bad_jitter.SerializeAsString());
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("jitter 0"));
}

TEST(RecordCodecTest, ScheduleRoundTrips) {
  const core::Schedule full = FullSchedule();
  absl::StatusOr<core::Schedule> decoded = DecodeSchedule(EncodeSchedule(full));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, full);

  // The defaults: no bounds, never ran, an every series, catch-up ONE.
  core::Schedule every;
  every.id = "tick";
  every.every = absl::Seconds(90);
  every.job.queue = "q";
  absl::StatusOr<core::Schedule> plain = DecodeSchedule(EncodeSchedule(every));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*plain, every);
  EXPECT_EQ(plain->start_at, absl::InfinitePast());
  EXPECT_EQ(plain->next_run_at, absl::InfiniteFuture());
}

TEST(RecordCodecTest, ScheduleGarbageNewerVersionAndUnknownCatchUpAreDataLoss) {
  EXPECT_THAT(DecodeSchedule("\xff\xff\xff"), StatusIs(absl::StatusCode::kDataLoss));
  storage::ScheduleRecord newer;
  newer.set_format_version(kScheduleRecordFormatVersion + 1);
  EXPECT_THAT(DecodeSchedule(newer.SerializeAsString()), StatusIs(absl::StatusCode::kDataLoss));
  storage::ScheduleRecord bad;
  bad.set_format_version(kScheduleRecordFormatVersion);
  bad.set_catch_up(7);
  absl::StatusOr<core::Schedule> decoded = DecodeSchedule(bad.SerializeAsString());
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("catch_up 7"));
}

TEST(RecordCodecTest, LogEntryRoundTripsEveryPartOfItsTransition) {
  core::Transition t;
  t.partition = 99;  // not encoded: the decoder takes partition and seq from the key
  t.seq = 1;
  t.put_jobs = {FullJob("a"), FullJob("b")};
  t.delete_jobs = {"c"};
  t.put_dedup = {Dedup("q", std::string("k\0\xff", 3), "a")};
  t.delete_dedup = {{"q", "old"}};
  t.put_policies = {{"q", FullPolicy()}};
  t.delete_policies = {"r"};
  t.put_schedules = {FullSchedule("s1"), FullSchedule("s2")};
  t.delete_schedules = {"s3"};
  absl::StatusOr<DecodedLogEntry> decoded = DecodeLogEntry(3, 42, EncodeLogEntry(-7, t));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->epoch, -7);
  EXPECT_EQ(decoded->transition.partition, 3u);
  EXPECT_EQ(decoded->transition.seq, 42u);
  EXPECT_EQ(decoded->transition.put_jobs, t.put_jobs);
  EXPECT_EQ(decoded->transition.delete_jobs, t.delete_jobs);
  EXPECT_EQ(decoded->transition.put_dedup, t.put_dedup);
  EXPECT_EQ(decoded->transition.delete_dedup, t.delete_dedup);
  EXPECT_EQ(decoded->transition.put_policies, t.put_policies);
  EXPECT_EQ(decoded->transition.delete_policies, t.delete_policies);
  EXPECT_EQ(decoded->transition.put_schedules, t.put_schedules);
  EXPECT_EQ(decoded->transition.delete_schedules, t.delete_schedules);

  absl::StatusOr<DecodedLogEntry> empty = DecodeLogEntry(0, 5, EncodeLogEntry(2, {}));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->transition.empty());
}

TEST(RecordCodecTest, LogEntryGarbageNewerVersionAndBadRecordInsideAreDataLoss) {
  EXPECT_THAT(DecodeLogEntry(0, 1, "\xff\xff\xff"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DecodeLogEntry(0, 1, ""), StatusIs(absl::StatusCode::kDataLoss));

  storage::LogEntryRecord newer;
  newer.set_format_version(kLogEntryRecordFormatVersion + 1);
  EXPECT_THAT(DecodeLogEntry(0, 1, newer.SerializeAsString()),
              StatusIs(absl::StatusCode::kDataLoss));

  storage::LogEntryRecord bad_job;
  bad_job.set_format_version(kLogEntryRecordFormatVersion);
  bad_job.mutable_transition()->add_put_jobs("not a job record");
  absl::StatusOr<DecodedLogEntry> decoded = DecodeLogEntry(0, 8, bad_job.SerializeAsString());
  EXPECT_THAT(decoded, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoded.status().message(), HasSubstr("log entry 8: JobRecord"));
}

}  // namespace
}  // namespace jobbroker::storage
