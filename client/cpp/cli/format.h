#pragma once

#include <google/protobuf/duration.pb.h>
#include <google/protobuf/message.h>
#include <google/protobuf/timestamp.pb.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "jobbroker/v1/job.pb.h"

namespace jobbroker::cli {

// Human-readable pieces of the CLI's output. Every function returns one line without '\n'.

// Compact and rounded down to two units: "850ms", "42s", "3m12s", "2h5m", "3d4h". Negative
// durations keep their sign.
std::string FormatAge(absl::Duration d);
// "-" for an unset (zero) duration, else FormatAge.
std::string FormatAge(const google::protobuf::Duration& d);
// "2030-01-02T15:04:05Z (3m12s ago)" or "(in 10s)" relative to `now`; "-" when unset.
std::string FormatTime(const google::protobuf::Timestamp& t, absl::Time now);
// Only the relative part, for tables: "3m12s ago", "in 10s"; "-" when unset.
std::string FormatRelative(const google::protobuf::Timestamp& t, absl::Time now);

// Enum names without their type's prefix: READY, ATTEMPTS_EXHAUSTED, LEASE_EXPIRED. An unset
// outcome is "RUNNING" (the attempt has not ended).
std::string StateName(v1::JobState state);
std::string FailReasonName(v1::FailReason reason);
std::string OutcomeName(v1::AttemptOutcome outcome);
// Parses "ready", "READY" or "JOB_STATE_READY"; INVALID_ARGUMENT listing the choices otherwise.
absl::StatusOr<v1::JobState> ParseState(const std::string& text);

// `bytes` as text when it is printable UTF-8 (newlines and tabs shown as \n and \t), cut to
// `max_chars` with "..."; otherwise "<N bytes, binary>". Empty bytes are "(empty)".
std::string Printable(const std::string& bytes, size_t max_chars);
// `text` on one line (newlines and tabs become spaces), cut to `max_chars` with "...".
std::string OneLine(const std::string& text, size_t max_chars);

// Proto3 JSON of `message` with every field, defaults included, so scripts can rely on keys.
// `pretty` indents it for people. Field names are lowerCamelCase (jobId, maxConcurrency).
std::string ToJson(const google::protobuf::Message& message, bool pretty = false);

}  // namespace jobbroker::cli
