#include "storage/rocksdb_info_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace jobbroker::storage {

RocksDbInfoLog::RocksDbInfoLog(std::string dir, size_t max_bytes)
    : path_(absl::StrCat(dir, "/LOG")), max_bytes_(max_bytes) {}

RocksDbInfoLog::~RocksDbInfoLog() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
}

void RocksDbInfoLog::OpenLocked() {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  struct stat st;
  size_ = fd_ >= 0 && ::fstat(fd_, &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
}

void RocksDbInfoLog::Logv(const char* format, va_list ap) {
  char message[2048];
  int n = std::vsnprintf(message, sizeof(message), format, ap);
  if (n < 0) return;
  std::string line = absl::StrCat(
      absl::FormatTime("%Y/%m/%d-%H:%M:%E6S ", absl::Now(), absl::LocalTimeZone()),
      absl::string_view(message, std::min<size_t>(static_cast<size_t>(n), sizeof(message) - 1)),
      "\n");
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0 && size_ >= max_bytes_) {
    ::close(fd_);
    fd_ = -1;
    ::rename(path_.c_str(), absl::StrCat(path_, ".old").c_str());
  }
  if (fd_ < 0) OpenLocked();
  if (fd_ < 0) return;
  // A failed or short write (a full disk) loses this line and nothing else.
  ssize_t written = ::write(fd_, line.data(), line.size());
  if (written > 0) size_ += static_cast<size_t>(written);
}

}  // namespace jobbroker::storage
