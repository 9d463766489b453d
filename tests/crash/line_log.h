#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace jobbroker::crash {

// Wall-clock time in microseconds since the epoch. Every process of a run logs with it, so
// events of the driver, the workers and the broker's attempt records can be ordered against
// each other (they share the host's clock).
int64_t NowMicros();

// Turns tabs and line breaks into spaces, so that any text (a broker's error message) fits in
// one field of a log line.
std::string OneField(absl::string_view text);

// An append-only log of tab-separated lines, each "<NowMicros>\t<field>\t<field>...\n".
//
// Each line is one write(2) on an O_APPEND descriptor with no user-space buffer: once Write
// returns, the line is in the kernel and survives a SIGKILL of the writer a moment later. A
// process killed inside write(2) can leave at most its last line without a newline; readers
// skip such a line. Thread-safe.
class LineLog {
 public:
  // Opens (creates, appends to) `path`.
  static absl::StatusOr<std::unique_ptr<LineLog>> Open(const std::string& path);
  ~LineLog();

  LineLog(const LineLog&) = delete;
  LineLog& operator=(const LineLog&) = delete;

  // Appends one line stamped with NowMicros(). Fields must hold no tab or newline (see
  // OneField). A failed write aborts the process: a harness that silently lost a log line
  // could report a false violation, or miss a real one.
  void Write(std::initializer_list<absl::string_view> fields);

 private:
  explicit LineLog(int fd) : fd_(fd) {}

  const int fd_;
  absl::Mutex mu_;  // keeps the timestamps of one file in file order
};

}  // namespace jobbroker::crash
