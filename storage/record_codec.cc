#include "storage/record_codec.h"

#include <climits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "storage/record.pb.h"

namespace jobbroker::storage {
namespace {

constexpr int64_t kMinMicros = std::numeric_limits<int64_t>::min();
constexpr int64_t kMaxMicros = std::numeric_limits<int64_t>::max();

// The infinities are mapped by hand: absl::FromUnixMicros(INT64_MIN) is a finite time, so without
// the sentinel every "not yet" time (InfinitePast) would come back as a date in 290,000 BC.
int64_t TimeToMicros(absl::Time t) {
  if (t == absl::InfinitePast()) return kMinMicros;
  if (t == absl::InfiniteFuture()) return kMaxMicros;
  return absl::ToUnixMicros(t);
}

absl::Time MicrosToTime(int64_t us) {
  if (us == kMinMicros) return absl::InfinitePast();
  if (us == kMaxMicros) return absl::InfiniteFuture();
  return absl::FromUnixMicros(us);
}

int64_t DurationToMicros(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return kMaxMicros;
  if (d == -absl::InfiniteDuration()) return kMinMicros;
  return absl::ToInt64Microseconds(d);
}

absl::Duration MicrosToDuration(int64_t us) {
  if (us == kMaxMicros) return absl::InfiniteDuration();
  if (us == kMinMicros) return -absl::InfiniteDuration();
  return absl::Microseconds(us);
}

template <typename Message>
absl::Status Parse(const char* record, absl::string_view bytes, Message& msg) {
  if (bytes.size() > static_cast<size_t>(INT_MAX) ||
      !msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat(record, " does not parse (", bytes.size(), " bytes)"));
  }
  return absl::OkStatus();
}

// Version 0 is what an empty or foreign value parses to, so it is refused like a newer one:
// neither can be read with confidence.
absl::Status CheckVersion(const char* record, uint32_t version, uint32_t newest) {
  if (version == 0) {
    return absl::DataLossError(absl::StrCat(record, " has no format_version"));
  }
  if (version > newest) {
    return absl::DataLossError(absl::StrCat(record, " format_version ", version,
                                            " is newer than this build reads (", newest, ")"));
  }
  return absl::OkStatus();
}

absl::Status BadEnum(const char* record, const char* field, int32_t value) {
  return absl::DataLossError(absl::StrCat(record, " has unknown ", field, " ", value));
}

absl::StatusOr<core::JobState> ToJobState(int32_t v) {
  if (v < static_cast<int32_t>(core::JobState::kReady) ||
      v > static_cast<int32_t>(core::JobState::kWaiting)) {
    return BadEnum("JobRecord", "state", v);
  }
  return static_cast<core::JobState>(v);
}

absl::StatusOr<core::FailReason> ToFailReason(int32_t v) {
  if (v < static_cast<int32_t>(core::FailReason::kNone) ||
      v > static_cast<int32_t>(core::FailReason::kDependencyFailed)) {
    return BadEnum("JobRecord", "fail_reason", v);
  }
  return static_cast<core::FailReason>(v);
}

absl::StatusOr<core::AttemptOutcome> ToAttemptOutcome(int32_t v) {
  if (v < static_cast<int32_t>(core::AttemptOutcome::kRunning) ||
      v > static_cast<int32_t>(core::AttemptOutcome::kSnoozed)) {
    return BadEnum("JobRecord", "attempts.outcome", v);
  }
  return static_cast<core::AttemptOutcome>(v);
}

absl::StatusOr<core::Durability> ToDurability(int32_t v) {
  if (v < static_cast<int32_t>(core::Durability::kSync) ||
      v > static_cast<int32_t>(core::Durability::kNone)) {
    return BadEnum("PolicyRecord", "durability", v);
  }
  return static_cast<core::Durability>(v);
}

absl::StatusOr<core::Jitter> ToJitter(int32_t v) {
  if (v < static_cast<int32_t>(core::Jitter::kNone) ||
      v > static_cast<int32_t>(core::Jitter::kEqual)) {
    return BadEnum("PolicyRecord", "jitter", v);
  }
  return static_cast<core::Jitter>(v);
}

}  // namespace

namespace {

// JobRecord's wire format written straight from a Job, as protobuf's SerializeAsString would
// write the message built from it, byte for byte (record_codec_test.cc compares the two): fields
// in number order, proto3's zero values and empty strings left out, `optional` ones written when
// set. Every put of a job is encoded (a lease and an ack each write the whole record), and
// building the message first copied every string once more and allocated for each.
//
// Two passes share the field code: a Sizer counts the bytes of a nested record (its length goes
// before it), a Writer writes them into a buffer sized for the worst case.
class Sizer {
 public:
  void Varint(uint64_t v) { size_ += VarintSize(v); }
  void Raw(absl::string_view v) { size_ += v.size(); }
  size_t size() const { return size_; }

  static size_t VarintSize(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
      v >>= 7;
      ++n;
    }
    return n;
  }

 private:
  size_t size_ = 0;
};

class Writer {
 public:
  explicit Writer(char* at) : at_(at) {}
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      *at_++ = static_cast<char>(v | 0x80);
      v >>= 7;
    }
    *at_++ = static_cast<char>(v);
  }
  void Raw(absl::string_view v) {
    if (v.empty()) return;
    std::memcpy(at_, v.data(), v.size());
    at_ += v.size();
  }
  char* at() const { return at_; }

 private:
  char* at_;
};

// Protobuf's wire types: what a tag says follows it.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kStartGroup = 3;  // deprecated: only read (skipped), never written
constexpr int kEndGroup = 4;
constexpr int kFixed32 = 5;

template <typename Out>
void Tag(Out& out, int field, int wire_type) {
  out.Varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
// A varint field, left out when zero unless `always` (an `optional` one that is set). int32 and
// int64 go as their 64-bit two's complement: a negative int32 takes 10 bytes.
template <typename Out>
void VarintField(Out& out, int field, uint64_t v, bool always = false) {
  if (v == 0 && !always) return;
  Tag(out, field, kVarint);
  out.Varint(v);
}
template <typename Out>
void IntField(Out& out, int field, int64_t v) {
  VarintField(out, field, static_cast<uint64_t>(v));
}
// A bytes field, left out when empty unless `always` (an element of a repeated one).
template <typename Out>
void BytesField(Out& out, int field, absl::string_view v, bool always = false) {
  if (v.empty() && !always) return;
  Tag(out, field, kLengthDelimited);
  out.Varint(v.size());
  out.Raw(v);
}

template <typename Out>
void HeaderRecordFields(Out& out, absl::string_view key, absl::string_view value) {
  BytesField(out, 1, key);
  BytesField(out, 2, value);
}

template <typename Out>
void AttemptRecordFields(Out& out, const core::AttemptRecord& a) {
  IntField(out, 1, a.attempt);
  BytesField(out, 2, a.worker_id);
  IntField(out, 3, TimeToMicros(a.started_at));
  IntField(out, 4, TimeToMicros(a.ended_at));
  IntField(out, 5, static_cast<int32_t>(a.outcome));
  BytesField(out, 6, a.error);
}

}  // namespace

// Keep EncodeJob, DecodeJob and JobRecord in step with every member of Job; the codec and
// conformance tests build a Job with every field set to catch a forgotten one.
std::string EncodeJob(const core::Job& job) {
  // The worst case: every string, plus for each of the 33 fields and each repeated element a
  // tag, a length or number and, for a nested record, its own tags and numbers (an attempt's
  // six fields take at most 66 bytes).
  size_t bound = job.id.size() + job.queue.size() + job.payload.size() + job.dedup_key.size() +
                 job.concurrency_key.size() + job.lease_id.size() + job.worker_id.size() +
                 job.last_error.size() + job.result.size() + job.checkpoint.size() +
                 job.progress.size() + 33 * 12;
  for (const auto& [key, value] : job.headers) bound += key.size() + value.size() + 24;
  for (const core::AttemptRecord& a : job.attempts)
    bound += a.worker_id.size() + a.error.size() + 80;
  for (const std::string& id : job.depends_on) bound += id.size() + 12;
  for (const auto& [id, result] : job.dependency_results) bound += id.size() + result.size() + 24;
  std::string out(bound, '\0');
  Writer w(out.data());

  auto nested = [&w](int field, auto fields) {
    Sizer size;
    fields(size);
    Tag(w, field, kLengthDelimited);
    w.Varint(size.size());
    fields(w);
  };
  VarintField(w, 1, kJobRecordFormatVersion);
  BytesField(w, 2, job.id);
  BytesField(w, 3, job.queue);
  IntField(w, 4, static_cast<int32_t>(job.state));
  BytesField(w, 5, job.payload);
  // Pairs, not structured bindings: clang 14 cannot capture a binding in a lambda.
  for (const auto& header : job.headers)
    nested(6, [&](auto& out) { HeaderRecordFields(out, header.first, header.second); });
  IntField(w, 7, job.priority);
  VarintField(w, 8, job.seq);
  IntField(w, 9, job.attempt);
  IntField(w, 10, job.max_attempts);
  BytesField(w, 11, job.dedup_key);
  BytesField(w, 12, job.concurrency_key);
  IntField(w, 13, TimeToMicros(job.created_at));
  IntField(w, 14, TimeToMicros(job.run_at));
  IntField(w, 15, DurationToMicros(job.lease_duration));
  BytesField(w, 16, job.lease_id);
  BytesField(w, 17, job.worker_id);
  IntField(w, 18, TimeToMicros(job.lease_deadline));
  IntField(w, 19, DurationToMicros(job.lease_length));
  VarintField(w, 20, job.cancel_requested ? 1 : 0);
  BytesField(w, 21, job.last_error);
  IntField(w, 22, static_cast<int32_t>(job.fail_reason));
  for (const core::AttemptRecord& a : job.attempts)
    nested(23, [&](auto& out) { AttemptRecordFields(out, a); });
  BytesField(w, 24, job.result);
  BytesField(w, 25, job.checkpoint);
  IntField(w, 26, TimeToMicros(job.completed_at));
  IntField(w, 27, DurationToMicros(job.timeout));
  if (job.timeout_at != absl::InfiniteFuture())
    VarintField(w, 28, static_cast<uint64_t>(TimeToMicros(job.timeout_at)), /*always=*/true);
  if (job.expire_at != absl::InfiniteFuture())
    VarintField(w, 29, static_cast<uint64_t>(TimeToMicros(job.expire_at)), /*always=*/true);
  IntField(w, 30, job.snoozes);
  BytesField(w, 31, job.progress);
  for (const std::string& id : job.depends_on) BytesField(w, 32, id, /*always=*/true);
  for (const auto& dependency : job.dependency_results)
    nested(33, [&](auto& out) { HeaderRecordFields(out, dependency.first, dependency.second); });
  out.resize(static_cast<size_t>(w.at() - out.data()));
  return out;
}

absl::StatusOr<core::Job> DecodeJob(absl::string_view bytes) {
  storage::JobRecord r;
  BROKER_RETURN_IF_ERROR(Parse("JobRecord", bytes, r));
  BROKER_RETURN_IF_ERROR(CheckVersion("JobRecord", r.format_version(), kJobRecordFormatVersion));

  core::Job job;
  job.id = r.id();
  job.queue = r.queue();
  absl::StatusOr<core::JobState> state = ToJobState(r.state());
  if (!state.ok()) return state.status();
  job.state = *state;
  job.payload = r.payload();
  for (const storage::HeaderRecord& h : r.headers()) {
    if (!job.headers.emplace(h.key(), h.value()).second) {
      return absl::DataLossError(
          absl::StrCat("JobRecord has header \"", absl::CHexEscape(h.key()), "\" twice"));
    }
  }
  job.priority = r.priority();
  job.seq = r.seq();
  job.attempt = r.attempt();
  job.max_attempts = r.max_attempts();
  job.dedup_key = r.dedup_key();
  job.concurrency_key = r.concurrency_key();
  job.created_at = MicrosToTime(r.created_at_us());
  job.run_at = MicrosToTime(r.run_at_us());
  job.lease_duration = MicrosToDuration(r.lease_duration_us());
  job.lease_id = r.lease_id();
  job.worker_id = r.worker_id();
  job.lease_deadline = MicrosToTime(r.lease_deadline_us());
  job.lease_length = MicrosToDuration(r.lease_length_us());
  job.cancel_requested = r.cancel_requested();
  job.last_error = r.last_error();
  absl::StatusOr<core::FailReason> fail_reason = ToFailReason(r.fail_reason());
  if (!fail_reason.ok()) return fail_reason.status();
  job.fail_reason = *fail_reason;
  job.attempts.reserve(r.attempts_size());
  for (const storage::AttemptRecord& ar : r.attempts()) {
    core::AttemptRecord a;
    a.attempt = ar.attempt();
    a.worker_id = ar.worker_id();
    a.started_at = MicrosToTime(ar.started_at_us());
    a.ended_at = MicrosToTime(ar.ended_at_us());
    absl::StatusOr<core::AttemptOutcome> outcome = ToAttemptOutcome(ar.outcome());
    if (!outcome.ok()) return outcome.status();
    a.outcome = *outcome;
    a.error = ar.error();
    job.attempts.push_back(std::move(a));
  }
  job.result = r.result();
  job.checkpoint = r.checkpoint();
  job.completed_at = MicrosToTime(r.completed_at_us());
  job.timeout = MicrosToDuration(r.timeout_us());
  if (r.has_timeout_at_us()) job.timeout_at = MicrosToTime(r.timeout_at_us());
  if (r.has_expire_at_us()) job.expire_at = MicrosToTime(r.expire_at_us());
  job.snoozes = r.snoozes();
  job.progress = r.progress();
  job.depends_on.assign(r.depends_on().begin(), r.depends_on().end());
  for (const storage::HeaderRecord& d : r.dependency_results())
    job.dependency_results[d.key()] = d.value();
  return job;
}

namespace {

// Protobuf's wire format read by hand, for the few fields of a JobRecord that recovery reads of
// every cold job. protobuf's CodedInputStream reads each varint longer than one byte (every seq,
// every time) through an out-of-line fallback: at 10 million jobs, decoding through it was a
// fifth of the scan's thread, which is the one that bounds a restart. Accepts and refuses what
// protobuf's parser does for these fields (record_codec_test compares the two).
class WireReader {
 public:
  explicit WireReader(absl::string_view bytes)
      : at_(reinterpret_cast<const uint8_t*>(bytes.data())), end_(at_ + bytes.size()) {}

  bool done() const { return at_ == end_; }

  // At most 10 bytes; bits past the 64th are dropped, as protobuf does.
  bool Varint(uint64_t& out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ == end_) return false;
      const uint8_t byte = *at_++;
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (byte < 0x80) {
        out = value;
        return true;
      }
    }
    return false;
  }

  // A tag: at most 5 bytes, its bits past the 32nd dropped (as protobuf's parser reads one), and a
  // field number of at least 1.
  bool Tag(uint32_t& field, uint32_t& wire_type) {
    uint32_t tag = 0;
    for (int shift = 0;; shift += 7) {
      if (shift == 35 || at_ == end_) return false;
      const uint8_t byte = *at_++;
      tag |= static_cast<uint32_t>(byte & 0x7f) << shift;
      if (byte < 0x80) break;
    }
    if ((tag >> 3) == 0) return false;
    field = tag >> 3;
    wire_type = tag & 7;
    return true;
  }

  // The bytes of a length-delimited field, still in the record.
  bool Bytes(absl::string_view& out) {
    uint64_t size = 0;
    if (!Varint(size) || size > static_cast<uint64_t>(end_ - at_)) return false;
    out = absl::string_view(reinterpret_cast<const char*>(at_), size);
    at_ += size;
    return true;
  }

  // Steps over a field this reader does not keep. Groups (deprecated, never written by
  // EncodeJob) are stepped over to their end as protobuf does, at most `depth` deep.
  bool Skip(uint32_t field, uint32_t wire_type, int depth = 100) {
    switch (wire_type) {
      case kVarint: {
        uint64_t ignored;
        return Varint(ignored);
      }
      case kFixed64:
        return Advance(8);
      case kLengthDelimited: {
        absl::string_view ignored;
        return Bytes(ignored);
      }
      case kStartGroup: {
        if (depth == 0) return false;
        uint32_t inner = 0, inner_type = 0;
        while (Tag(inner, inner_type)) {
          if (inner_type == kEndGroup) return inner == field;
          if (!Skip(inner, inner_type, depth - 1)) return false;
        }
        return false;
      }
      case kFixed32:
        return Advance(4);
      default:  // kEndGroup with no start, and the unused 6 and 7
        return false;
    }
  }

 private:
  bool Advance(size_t n) {
    if (static_cast<size_t>(end_ - at_) < n) return false;
    at_ += n;
    return true;
  }

  const uint8_t* at_;
  const uint8_t* end_;
};

}  // namespace

absl::Status DecodeColdJobFields(absl::string_view bytes, core::ColdJobFields& job) {
  job.id.clear();
  job.queue.clear();
  job.concurrency_key.clear();
  job.depends_on.clear();
  job.seq = 0;
  job.priority = 0;
  WireReader in(bytes);
  uint64_t version = 0;
  uint64_t state = 0;
  uint64_t run_at_us = 0;
  std::optional<uint64_t> expire_at_us;
  // The field numbers and wire types of JobRecord (storage/record.proto); a field read twice
  // keeps its last value, as protobuf's own parser does.
  auto varint = [&](uint32_t wire_type, uint64_t& out) {
    return wire_type == kVarint && in.Varint(out);
  };
  auto string = [&](uint32_t wire_type, std::string& out) {
    absl::string_view view;
    if (wire_type != kLengthDelimited || !in.Bytes(view)) return false;
    out.assign(view.data(), view.size());
    return true;
  };
  bool ok = true;
  while (ok && !in.done()) {
    uint32_t field = 0, wire_type = 0;
    if (!in.Tag(field, wire_type)) {
      ok = false;
      break;
    }
    uint64_t value = 0;
    switch (field) {
      case storage::JobRecord::kFormatVersionFieldNumber:
        ok = varint(wire_type, version);
        break;
      case storage::JobRecord::kIdFieldNumber:
        ok = string(wire_type, job.id);
        break;
      case storage::JobRecord::kQueueFieldNumber:
        ok = string(wire_type, job.queue);
        break;
      case storage::JobRecord::kStateFieldNumber:
        ok = varint(wire_type, state);
        break;
      case storage::JobRecord::kPriorityFieldNumber:
        ok = varint(wire_type, value);
        job.priority = static_cast<int32_t>(value);  // int32 on the wire: its low 32 bits
        break;
      case storage::JobRecord::kSeqFieldNumber:
        ok = varint(wire_type, job.seq);
        break;
      case storage::JobRecord::kConcurrencyKeyFieldNumber:
        ok = string(wire_type, job.concurrency_key);
        break;
      case storage::JobRecord::kRunAtUsFieldNumber:
        ok = varint(wire_type, run_at_us);
        break;
      case storage::JobRecord::kExpireAtUsFieldNumber:
        ok = varint(wire_type, value);
        expire_at_us = value;
        break;
      case storage::JobRecord::kDependsOnFieldNumber:
        ok = string(wire_type, job.depends_on.emplace_back());
        break;
      default:
        ok = in.Skip(field, wire_type);
        break;
    }
  }
  if (!ok)
    return absl::DataLossError(absl::StrCat("JobRecord does not parse (", bytes.size(), " bytes)"));
  BROKER_RETURN_IF_ERROR(
      CheckVersion("JobRecord", static_cast<uint32_t>(version), kJobRecordFormatVersion));
  absl::StatusOr<core::JobState> known = ToJobState(static_cast<int32_t>(state));
  if (!known.ok()) return known.status();
  job.state = *known;
  job.run_at = MicrosToTime(static_cast<int64_t>(run_at_us));
  job.expire_at = expire_at_us.has_value() ? MicrosToTime(static_cast<int64_t>(*expire_at_us))
                                           : absl::InfiniteFuture();
  return absl::OkStatus();
}

absl::StatusOr<core::ColdJobFields> DecodeColdJobFields(absl::string_view bytes) {
  core::ColdJobFields job;
  BROKER_RETURN_IF_ERROR(DecodeColdJobFields(bytes, job));
  return job;
}

std::string EncodeDedup(const core::DedupEntry& entry) {
  storage::DedupRecord r;
  r.set_format_version(kDedupRecordFormatVersion);
  r.set_job_id(entry.job_id);
  r.set_expires_at_us(TimeToMicros(entry.expires_at));
  r.set_payload_hash(entry.payload_hash);
  return r.SerializeAsString();
}

absl::StatusOr<core::DedupEntry> DecodeDedup(absl::string_view queue, absl::string_view key,
                                             absl::string_view bytes) {
  storage::DedupRecord r;
  BROKER_RETURN_IF_ERROR(Parse("DedupRecord", bytes, r));
  BROKER_RETURN_IF_ERROR(
      CheckVersion("DedupRecord", r.format_version(), kDedupRecordFormatVersion));
  core::DedupEntry entry;
  entry.queue = std::string(queue);
  entry.key = std::string(key);
  entry.job_id = r.job_id();
  entry.expires_at = MicrosToTime(r.expires_at_us());
  entry.payload_hash = r.payload_hash();
  return entry;
}

std::string EncodeSchedule(const core::Schedule& s) {
  storage::ScheduleRecord r;
  r.set_format_version(kScheduleRecordFormatVersion);
  r.set_id(s.id);
  r.set_cron(s.cron);
  r.set_every_us(DurationToMicros(s.every));
  r.set_time_zone(s.time_zone);
  r.set_paused(s.paused);
  r.set_start_at_us(TimeToMicros(s.start_at));
  r.set_end_at_us(TimeToMicros(s.end_at));
  r.set_catch_up(static_cast<int32_t>(s.catch_up));
  r.set_created_at_us(TimeToMicros(s.created_at));
  r.set_next_run_at_us(TimeToMicros(s.next_run_at));
  r.set_last_run_at_us(TimeToMicros(s.last_run_at));
  r.set_last_job_id(s.last_job_id);
  r.set_queue(s.job.queue);
  r.set_payload(s.job.payload);
  for (const auto& [k, v] : s.job.headers) (*r.mutable_headers())[k] = v;
  r.set_priority(s.job.priority);
  r.set_max_attempts(s.job.max_attempts);
  r.set_lease_duration_us(DurationToMicros(s.job.lease_duration));
  r.set_concurrency_key(s.job.concurrency_key);
  r.set_timeout_us(DurationToMicros(s.job.timeout));
  return r.SerializeAsString();
}

absl::StatusOr<core::Schedule> DecodeSchedule(absl::string_view bytes) {
  storage::ScheduleRecord r;
  BROKER_RETURN_IF_ERROR(Parse("ScheduleRecord", bytes, r));
  BROKER_RETURN_IF_ERROR(
      CheckVersion("ScheduleRecord", r.format_version(), kScheduleRecordFormatVersion));
  if (r.catch_up() != static_cast<int32_t>(core::ScheduleCatchUp::kOne) &&
      r.catch_up() != static_cast<int32_t>(core::ScheduleCatchUp::kNone))
    return absl::DataLossError(
        absl::StrCat("ScheduleRecord: catch_up ", r.catch_up(), " is unknown to this build"));
  core::Schedule s;
  s.id = r.id();
  s.cron = r.cron();
  s.every = MicrosToDuration(r.every_us());
  s.time_zone = r.time_zone();
  s.paused = r.paused();
  s.start_at = MicrosToTime(r.start_at_us());
  s.end_at = MicrosToTime(r.end_at_us());
  s.catch_up = static_cast<core::ScheduleCatchUp>(r.catch_up());
  s.created_at = MicrosToTime(r.created_at_us());
  s.next_run_at = MicrosToTime(r.next_run_at_us());
  s.last_run_at = MicrosToTime(r.last_run_at_us());
  s.last_job_id = r.last_job_id();
  s.job.queue = r.queue();
  s.job.payload = r.payload();
  s.job.headers.insert(r.headers().begin(), r.headers().end());
  s.job.priority = r.priority();
  s.job.max_attempts = r.max_attempts();
  s.job.lease_duration = MicrosToDuration(r.lease_duration_us());
  s.job.concurrency_key = r.concurrency_key();
  s.job.timeout = MicrosToDuration(r.timeout_us());
  return s;
}

std::string EncodePolicy(const core::PolicyOverride& p) {
  storage::PolicyRecord r;
  r.set_format_version(kPolicyRecordFormatVersion);
  if (p.max_concurrency) r.set_max_concurrency(*p.max_concurrency);
  if (p.max_concurrency_per_key) r.set_max_concurrency_per_key(*p.max_concurrency_per_key);
  if (p.max_attempts) r.set_max_attempts(*p.max_attempts);
  if (p.initial_backoff) r.set_initial_backoff_us(DurationToMicros(*p.initial_backoff));
  if (p.backoff_multiplier) r.set_backoff_multiplier(*p.backoff_multiplier);
  if (p.max_backoff) r.set_max_backoff_us(DurationToMicros(*p.max_backoff));
  if (p.jitter) r.set_jitter(static_cast<int32_t>(*p.jitter));
  if (p.lease_duration) r.set_lease_duration_us(DurationToMicros(*p.lease_duration));
  if (p.dedup_ttl) r.set_dedup_ttl_us(DurationToMicros(*p.dedup_ttl));
  if (p.completed_max_count) r.set_completed_max_count(*p.completed_max_count);
  if (p.completed_max_age) r.set_completed_max_age_us(DurationToMicros(*p.completed_max_age));
  if (p.failed_max_count) r.set_failed_max_count(*p.failed_max_count);
  if (p.failed_max_age) r.set_failed_max_age_us(DurationToMicros(*p.failed_max_age));
  if (p.max_length) r.set_max_length(*p.max_length);
  if (p.rate_per_second) r.set_rate_per_second(*p.rate_per_second);
  if (p.rate_burst) r.set_rate_burst(*p.rate_burst);
  if (p.paused) r.set_paused(*p.paused);
  if (p.max_payload_bytes) r.set_max_payload_bytes(*p.max_payload_bytes);
  if (p.durability) r.set_durability(static_cast<int32_t>(*p.durability));
  if (p.group_commit_delay) r.set_group_commit_delay_us(DurationToMicros(*p.group_commit_delay));
  if (p.timeout) r.set_timeout_us(DurationToMicros(*p.timeout));
  if (p.max_snoozes) r.set_max_snoozes(*p.max_snoozes);
  return r.SerializeAsString();
}

absl::StatusOr<core::PolicyOverride> DecodePolicy(absl::string_view bytes) {
  storage::PolicyRecord r;
  BROKER_RETURN_IF_ERROR(Parse("PolicyRecord", bytes, r));
  BROKER_RETURN_IF_ERROR(
      CheckVersion("PolicyRecord", r.format_version(), kPolicyRecordFormatVersion));
  core::PolicyOverride p;
  if (r.has_max_concurrency()) p.max_concurrency = r.max_concurrency();
  if (r.has_max_concurrency_per_key()) p.max_concurrency_per_key = r.max_concurrency_per_key();
  if (r.has_max_attempts()) p.max_attempts = r.max_attempts();
  if (r.has_initial_backoff_us()) p.initial_backoff = MicrosToDuration(r.initial_backoff_us());
  if (r.has_backoff_multiplier()) p.backoff_multiplier = r.backoff_multiplier();
  if (r.has_max_backoff_us()) p.max_backoff = MicrosToDuration(r.max_backoff_us());
  if (r.has_jitter()) {
    absl::StatusOr<core::Jitter> jitter = ToJitter(r.jitter());
    if (!jitter.ok()) return jitter.status();
    p.jitter = *jitter;
  }
  if (r.has_lease_duration_us()) p.lease_duration = MicrosToDuration(r.lease_duration_us());
  if (r.has_dedup_ttl_us()) p.dedup_ttl = MicrosToDuration(r.dedup_ttl_us());
  if (r.has_completed_max_count()) p.completed_max_count = r.completed_max_count();
  if (r.has_completed_max_age_us()) {
    p.completed_max_age = MicrosToDuration(r.completed_max_age_us());
  }
  if (r.has_failed_max_count()) p.failed_max_count = r.failed_max_count();
  if (r.has_failed_max_age_us()) p.failed_max_age = MicrosToDuration(r.failed_max_age_us());
  if (r.has_max_length()) p.max_length = r.max_length();
  if (r.has_rate_per_second()) p.rate_per_second = r.rate_per_second();
  if (r.has_rate_burst()) p.rate_burst = r.rate_burst();
  if (r.has_paused()) p.paused = r.paused();
  if (r.has_max_payload_bytes()) p.max_payload_bytes = r.max_payload_bytes();
  if (r.has_durability()) {
    absl::StatusOr<core::Durability> durability = ToDurability(r.durability());
    if (!durability.ok()) return durability.status();
    p.durability = *durability;
  }
  if (r.has_timeout_us()) p.timeout = MicrosToDuration(r.timeout_us());
  if (r.has_max_snoozes()) p.max_snoozes = r.max_snoozes();
  if (r.has_group_commit_delay_us()) {
    p.group_commit_delay = MicrosToDuration(r.group_commit_delay_us());
  }
  return p;
}

std::string EncodeLogEntry(int64_t epoch, const core::Transition& t) {
  storage::LogEntryRecord r;
  r.set_format_version(kLogEntryRecordFormatVersion);
  r.set_epoch(epoch);
  storage::TransitionRecord& out = *r.mutable_transition();
  for (const core::Job& job : t.put_jobs) out.add_put_jobs(EncodeJob(job));
  for (const std::string& id : t.delete_jobs) out.add_delete_jobs(id);
  for (const core::DedupEntry& d : t.put_dedup) {
    storage::TransitionRecord::Dedup& put = *out.add_put_dedup();
    put.set_queue(d.queue);
    put.set_key(d.key);
    put.set_record(EncodeDedup(d));
  }
  for (const auto& [queue, key] : t.delete_dedup) {
    storage::TransitionRecord::DedupKey& del = *out.add_delete_dedup();
    del.set_queue(queue);
    del.set_key(key);
  }
  for (const auto& [queue, policy] : t.put_policies) {
    storage::TransitionRecord::Policy& put = *out.add_put_policies();
    put.set_queue(queue);
    put.set_record(EncodePolicy(policy));
  }
  for (const std::string& queue : t.delete_policies) out.add_delete_policies(queue);
  for (const core::Schedule& s : t.put_schedules) out.add_put_schedules(EncodeSchedule(s));
  for (const std::string& id : t.delete_schedules) out.add_delete_schedules(id);
  return r.SerializeAsString();
}

absl::StatusOr<DecodedLogEntry> DecodeLogEntry(uint32_t partition, uint64_t seq,
                                               absl::string_view bytes) {
  storage::LogEntryRecord r;
  BROKER_RETURN_IF_ERROR(Parse("LogEntryRecord", bytes, r));
  BROKER_RETURN_IF_ERROR(
      CheckVersion("LogEntryRecord", r.format_version(), kLogEntryRecordFormatVersion));
  DecodedLogEntry entry;
  entry.epoch = r.epoch();
  core::Transition& t = entry.transition;
  t.partition = partition;
  t.seq = seq;
  auto inside = [seq](const absl::Status& s) {
    return absl::DataLossError(absl::StrCat("log entry ", seq, ": ", s.message()));
  };
  const storage::TransitionRecord& in = r.transition();
  for (const std::string& bytes : in.put_jobs()) {
    absl::StatusOr<core::Job> job = DecodeJob(bytes);
    if (!job.ok()) return inside(job.status());
    t.put_jobs.push_back(*std::move(job));
  }
  t.delete_jobs.assign(in.delete_jobs().begin(), in.delete_jobs().end());
  for (const storage::TransitionRecord::Dedup& put : in.put_dedup()) {
    absl::StatusOr<core::DedupEntry> d = DecodeDedup(put.queue(), put.key(), put.record());
    if (!d.ok()) return inside(d.status());
    t.put_dedup.push_back(*std::move(d));
  }
  for (const storage::TransitionRecord::DedupKey& del : in.delete_dedup()) {
    t.delete_dedup.emplace_back(del.queue(), del.key());
  }
  for (const storage::TransitionRecord::Policy& put : in.put_policies()) {
    absl::StatusOr<core::PolicyOverride> policy = DecodePolicy(put.record());
    if (!policy.ok()) return inside(policy.status());
    t.put_policies.emplace_back(put.queue(), *std::move(policy));
  }
  t.delete_policies.assign(in.delete_policies().begin(), in.delete_policies().end());
  for (const std::string& bytes : in.put_schedules()) {
    absl::StatusOr<core::Schedule> s = DecodeSchedule(bytes);
    if (!s.ok()) return inside(s.status());
    t.put_schedules.push_back(*std::move(s));
  }
  t.delete_schedules.assign(in.delete_schedules().begin(), in.delete_schedules().end());
  return entry;
}

}  // namespace jobbroker::storage
