#include "client/cpp/cli/format.h"

#include <google/protobuf/util/json_util.h>

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "jobbroker/proto_time.h"

namespace jobbroker::cli {
namespace {

// The length of the UTF-8 sequence starting at `s[i]`, or 0 if it is not valid there.
size_t Utf8SequenceLength(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

std::string StripPrefix(const std::string& name, absl::string_view prefix) {
  return std::string(absl::StripPrefix(name, prefix));
}

// Cuts `text` (valid UTF-8) to at most `max_chars` characters, ending in "..." when cut.
std::string Cut(const std::string& text, size_t max_chars) {
  size_t chars = 0;
  for (size_t i = 0; i < text.size();) {
    if (chars == max_chars) {
      return absl::StrCat(text.substr(0, i), "...");
    }
    const size_t n = Utf8SequenceLength(text, i);
    i += n == 0 ? 1 : n;
    ++chars;
  }
  return text;
}

}  // namespace

std::string FormatAge(absl::Duration d) {
  if (d < absl::ZeroDuration()) return absl::StrCat("-", FormatAge(-d));
  if (d < absl::Seconds(1)) return absl::StrCat(absl::ToInt64Milliseconds(d), "ms");
  const int64_t s = absl::ToInt64Seconds(d);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m", s % 60, "s");
  if (s < 86400) return absl::StrCat(s / 3600, "h", s % 3600 / 60, "m");
  return absl::StrCat(s / 86400, "d", s % 86400 / 3600, "h");
}

std::string FormatAge(const google::protobuf::Duration& d) {
  if (d.seconds() == 0 && d.nanos() == 0) return "-";
  return FormatAge(client::FromProtoDuration(d));
}

std::string FormatTime(const google::protobuf::Timestamp& t, absl::Time now) {
  if (!client::IsSet(t)) return "-";
  const absl::Time time = client::FromProtoTimestamp(t);
  const std::string when = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone());
  if (time <= now) return absl::StrCat(when, " (", FormatAge(now - time), " ago)");
  return absl::StrCat(when, " (in ", FormatAge(time - now), ")");
}

std::string FormatRelative(const google::protobuf::Timestamp& t, absl::Time now) {
  if (!client::IsSet(t)) return "-";
  const absl::Time time = client::FromProtoTimestamp(t);
  if (time <= now) return absl::StrCat(FormatAge(now - time), " ago");
  return absl::StrCat("in ", FormatAge(time - now));
}

std::string StateName(v1::JobState state) {
  return StripPrefix(v1::JobState_Name(state), "JOB_STATE_");
}

std::string FailReasonName(v1::FailReason reason) {
  return StripPrefix(v1::FailReason_Name(reason), "FAIL_REASON_");
}

std::string OutcomeName(v1::AttemptOutcome outcome) {
  if (outcome == v1::ATTEMPT_OUTCOME_UNSPECIFIED) return "RUNNING";
  return StripPrefix(v1::AttemptOutcome_Name(outcome), "ATTEMPT_OUTCOME_");
}

absl::StatusOr<v1::JobState> ParseState(const std::string& text) {
  std::string name = absl::AsciiStrToUpper(text);
  if (!absl::StartsWith(name, "JOB_STATE_")) name = absl::StrCat("JOB_STATE_", name);
  v1::JobState state;
  if (v1::JobState_Parse(name, &state) && state != v1::JOB_STATE_UNSPECIFIED) return state;
  std::vector<std::string> choices;
  for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
    choices.push_back(absl::AsciiStrToLower(StateName(static_cast<v1::JobState>(s))));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--state: \"", text, "\" is not one of ", absl::StrJoin(choices, "|")));
}

std::string Printable(const std::string& bytes, size_t max_chars) {
  if (bytes.empty()) return "(empty)";
  std::string text;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = Utf8SequenceLength(bytes, i);
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F) && c != '\n' && c != '\t')) {
      return absl::StrCat("<", bytes.size(), " bytes, binary>");
    }
    if (c == '\n') {
      text += "\\n";
    } else if (c == '\t') {
      text += "\\t";
    } else {
      text.append(bytes, i, n);
    }
    i += n;
  }
  return Cut(text, max_chars);
}

std::string OneLine(const std::string& text, size_t max_chars) {
  std::string line = text;
  for (char& c : line) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return Cut(line, max_chars);
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.add_whitespace = pretty;
  std::string json;
  // Only fails for messages that cannot be JSON (unknown Any types); ours always can.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  if (pretty) absl::StripTrailingAsciiWhitespace(&json);
  return json;
}

}  // namespace jobbroker::cli
