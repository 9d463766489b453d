#include "tests/crash/line_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace jobbroker::crash {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

std::string OneField(absl::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

absl::StatusOr<std::unique_ptr<LineLog>> LineLog::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  return std::unique_ptr<LineLog>(new LineLog(fd));
}

LineLog::~LineLog() { close(fd_); }

void LineLog::Write(std::initializer_list<absl::string_view> fields) {
  absl::MutexLock lock(&mu_);
  std::string line = absl::StrCat(NowMicros());
  for (absl::string_view f : fields) absl::StrAppend(&line, "\t", f);
  line.push_back('\n');
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "crash harness: cannot write a log line: %s\n", std::strerror(errno));
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace jobbroker::crash
