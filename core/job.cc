#include "core/job.h"

namespace jobbroker::core {

const char* FailReasonLabel(FailReason r) {
  switch (r) {
    case FailReason::kNone:
      return "";
    case FailReason::kPermanent:
      return "permanent";
    case FailReason::kAttemptsExhausted:
      return "attempts_exhausted";
    case FailReason::kSnoozeLimit:
      return "snooze_limit";
    case FailReason::kExpired:
      return "expired";
    case FailReason::kDependencyFailed:
      return "dependency_failed";
  }
  return "";
}

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kReady:
      return "JOB_STATE_READY";
    case JobState::kScheduled:
      return "JOB_STATE_SCHEDULED";
    case JobState::kActive:
      return "JOB_STATE_ACTIVE";
    case JobState::kCompleted:
      return "JOB_STATE_COMPLETED";
    case JobState::kFailed:
      return "JOB_STATE_FAILED";
    case JobState::kCancelled:
      return "JOB_STATE_CANCELLED";
    case JobState::kWaiting:
      return "JOB_STATE_WAITING";
  }
  return "JOB_STATE_UNSPECIFIED";
}

uint64_t PayloadHash(const std::string& payload) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a offset basis
  for (unsigned char c : payload) {
    h ^= c;
    h *= 1099511628211ull;  // FNV prime
  }
  return h;
}

std::string TruncateUtf8(std::string text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  // Step back over continuation bytes (10xxxxxx) so a multi-byte character is not split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return text;
}

}  // namespace jobbroker::core
