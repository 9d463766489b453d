#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace jobbroker::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
enum class LogFormat { kJson, kText };

// One event per line on stderr: JSON objects by default ({"time":..,"level":..,"event":..,
// fields...}), or "time level event key=value ..." text. Thread-safe; lines never interleave.
// Configure once at start; events below the level cost one comparison.
class Log {
 public:
  using Fields = std::initializer_list<std::pair<absl::string_view, std::string>>;

  static void Configure(LogLevel level, LogFormat format);
  static bool Enabled(LogLevel level);
  static void Write(LogLevel level, absl::string_view event, Fields fields = {});
};

// "debug", "info", "warn", "error"; false for anything else.
bool ParseLogLevel(absl::string_view text, LogLevel* level);
// "json", "text"; false for anything else.
bool ParseLogFormat(absl::string_view text, LogFormat* format);

}  // namespace jobbroker::server
