// What request_fuzzer parses its input as: the first byte (modulo kCount) picks the message, the
// rest are its wire bytes (or, for kServerConfigJson, the text of a --config file). Shared with
// make_corpus.cc.
#pragma once

namespace jobbroker::fuzz {

enum class RequestKind : int {
  kEnqueue,
  kEnqueueBatch,
  kLease,
  kHeartbeat,
  kAck,
  kFail,
  kRelease,
  kWork,
  kGetJob,
  kListJobs,
  kCancelJob,
  kRetryJob,
  kDeleteJob,
  kGetQueue,
  kUpdateQueuePolicy,
  kPauseQueue,
  kResumeQueue,
  kPurgeQueue,
  kServerConfigJson,
  kCount,
};

// Ids a request may use to name the job (and its lease) that every run leases before it parses
// the input: "J" and "L" stand for them, so that Heartbeat, Ack, Fail and Release get past the
// lookup to their own checks. The job is in queue kSeedQueue with dedup key kSeedDedupKey.
inline constexpr char kSeedJobRef[] = "J";
inline constexpr char kSeedLeaseRef[] = "L";
inline constexpr char kSeedQueue[] = "q";
inline constexpr char kSeedDedupKey[] = "d";

}  // namespace jobbroker::fuzz
