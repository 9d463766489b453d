#include "server/observability/log.h"

#include <atomic>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace jobbroker::server {
namespace {

std::atomic<int> level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> format{static_cast<int>(LogFormat::kJson)};
absl::Mutex write_mu;

const char* Name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

void AppendJsonString(std::string& out, absl::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

}  // namespace

void Log::Configure(LogLevel l, LogFormat f) {
  level.store(static_cast<int>(l));
  format.store(static_cast<int>(f));
}

bool Log::Enabled(LogLevel l) { return static_cast<int>(l) >= level.load(); }

void Log::Write(LogLevel l, absl::string_view event, Fields fields) {
  if (!Enabled(l)) return;
  std::string time = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::string line;
  if (static_cast<LogFormat>(format.load()) == LogFormat::kJson) {
    line = absl::StrCat("{\"time\":\"", time, "\",\"level\":\"", Name(l), "\",\"event\":");
    AppendJsonString(line, event);
    for (const auto& [key, value] : fields) {
      line += ',';
      AppendJsonString(line, key);
      line += ':';
      AppendJsonString(line, value);
    }
    line += "}\n";
  } else {
    line = absl::StrCat(time, " ", Name(l), " ", event);
    for (const auto& [key, value] : fields) {
      bool quote = value.empty() || value.find_first_of(" \"=") != std::string::npos;
      absl::StrAppend(&line, " ", key, "=");
      if (quote) {
        AppendJsonString(line, value);
      } else {
        line += value;
      }
    }
    line += "\n";
  }
  absl::MutexLock lock(&write_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

bool ParseLogLevel(absl::string_view text, LogLevel* out) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (text == Name(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

bool ParseLogFormat(absl::string_view text, LogFormat* out) {
  if (text == "json") {
    *out = LogFormat::kJson;
  } else if (text == "text") {
    *out = LogFormat::kText;
  } else {
    return false;
  }
  return true;
}

}  // namespace jobbroker::server
