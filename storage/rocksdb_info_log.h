#pragma once

#include <cstdarg>
#include <cstddef>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/env.h"

namespace jobbroker::storage {

// RocksDB's info log, `LOG` in the data directory, written with plain write(2) calls whose errors
// are ignored: on a full disk lines are lost instead of the process. RocksDB's own file logger
// asserts on the write after a failed one (the Debian build keeps assertions on), and the info
// log is often the first writer to meet ENOSPC. At `max_bytes` the file is renamed to `LOG.old`
// (replacing the previous one) and a new one started. Thread-safe.
class RocksDbInfoLog final : public rocksdb::Logger {
 public:
  RocksDbInfoLog(std::string dir, size_t max_bytes);
  ~RocksDbInfoLog() override;

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override;

 private:
  void OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const size_t max_bytes_;
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  size_t size_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace jobbroker::storage
