#pragma once

// Converts core records to and from the versioned on-disk format of storage/record.proto.
// Encoding never fails; decoding returns kDataLoss for anything it cannot trust, so that a
// corrupt or too-new record stops recovery instead of being half-read.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/job.h"
#include "core/policy.h"
#include "core/store.h"

namespace jobbroker::storage {

// The format_version each encoder writes and the newest each decoder reads.
inline constexpr uint32_t kJobRecordFormatVersion = 1;
inline constexpr uint32_t kDedupRecordFormatVersion = 1;
inline constexpr uint32_t kPolicyRecordFormatVersion = 1;
inline constexpr uint32_t kLogEntryRecordFormatVersion = 1;
inline constexpr uint32_t kScheduleRecordFormatVersion = 1;

// Times are stored in whole microseconds: a finite time with a sub-microsecond part reads back
// rounded down to the microsecond (absl::ToUnixMicros). InfinitePast/InfiniteFuture and
// +/-InfiniteDuration round-trip exactly.
std::string EncodeJob(const core::Job& job);
// kDataLoss if `bytes` do not parse, carry no or a newer format_version, or hold an enum value
// this build does not know; the message says which.
absl::StatusOr<core::Job> DecodeJob(absl::string_view bytes);
// Only the fields a cold job's index entries need, from the same bytes, without copying the
// payload, headers, attempts or results (recovery's cost at millions of jobs). kDataLoss as for
// DecodeJob for what it reads; the fields it skips are checked when the job is read back whole.
absl::StatusOr<core::ColdJobFields> DecodeColdJobFields(absl::string_view bytes);
// The same into `job`, whose strings keep their storage from one record to the next: recovery
// decodes millions of records into one ColdJobFields instead of allocating its strings each time.
// On an error `job` holds part of the record.
absl::Status DecodeColdJobFields(absl::string_view bytes, core::ColdJobFields& job);

// The queue and key are not encoded: they are the store's key.
std::string EncodeDedup(const core::DedupEntry& entry);
// kDataLoss as for DecodeJob. `queue` and `key` are copied into the result.
absl::StatusOr<core::DedupEntry> DecodeDedup(absl::string_view queue, absl::string_view key,
                                             absl::string_view bytes);

std::string EncodePolicy(const core::PolicyOverride& policy);
// kDataLoss as for DecodeJob.
absl::StatusOr<core::PolicyOverride> DecodePolicy(absl::string_view bytes);

std::string EncodeSchedule(const core::Schedule& schedule);
// kDataLoss as for DecodeJob.
absl::StatusOr<core::Schedule> DecodeSchedule(absl::string_view bytes);

// A replication log entry (cluster mode): the transition of `epoch`, whole. Its partition and seq
// are not encoded: they are the store's key (or travel beside it).
std::string EncodeLogEntry(int64_t epoch, const core::Transition& transition);
struct DecodedLogEntry {
  int64_t epoch = 0;
  core::Transition transition;  // partition and seq as passed to DecodeLogEntry
};
// kDataLoss as for DecodeJob, for the entry or any record inside it; the message names which.
absl::StatusOr<DecodedLogEntry> DecodeLogEntry(uint32_t partition, uint64_t seq,
                                               absl::string_view bytes);

}  // namespace jobbroker::storage
