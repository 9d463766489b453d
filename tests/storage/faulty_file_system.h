#pragma once

// A RocksDB FileSystem for tests that can be told, at run time, to fail every write: creating a
// file, appending to one, syncing it. Reads keep working. Like LevelDB's SpecialEnv, it stands in
// for a disk that fills up (ENOSPC) or breaks (EIO) and heals again.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "rocksdb/env.h"
#include "rocksdb/file_system.h"

namespace jobbroker::storage {

class FaultyFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  enum class Fault {
    kNone,     // everything passes through
    kNoSpace,  // IOStatus::NoSpace, as the local filesystem reports ENOSPC
    kIoError,  // a plain IOStatus::IOError, as for EIO
  };

  explicit FaultyFileSystem(
      std::shared_ptr<rocksdb::FileSystem> base = rocksdb::FileSystem::Default());

  // Takes effect for the next call, on every file (including ones already open).
  void SetFault(Fault fault) { fault_.store(fault); }
  Fault fault() const { return fault_.load(); }
  // Calls failed on purpose so far: proves a test's failure came from here.
  int64_t injected() const { return injected_.load(); }

  // The error for the current fault (OK under kNone); counts it.
  rocksdb::IOStatus Check(const char* what);

  const char* Name() const override { return "FaultyFileSystem"; }
  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                       const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override;

 private:
  std::atomic<Fault> fault_{Fault::kNone};
  std::atomic<int64_t> injected_{0};
};

// A FaultyFileSystem and the Env that RocksDbStoreOptions::env takes, owned together.
struct FaultyEnv {
  FaultyEnv();
  std::shared_ptr<FaultyFileSystem> fs;
  std::unique_ptr<rocksdb::Env> env;
};

}  // namespace jobbroker::storage
