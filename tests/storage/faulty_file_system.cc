#include "tests/storage/faulty_file_system.h"

#include <utility>

namespace jobbroker::storage {
namespace {

// Every way of putting bytes on disk asks the file system first.
class FaultyWritableFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultyWritableFile(std::unique_ptr<rocksdb::FSWritableFile> file, FaultyFileSystem& fs)
      : FSWritableFileOwnerWrapper(std::move(file)), fs_(fs) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    if (rocksdb::IOStatus s = fs_.Check("append"); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, options, dbg);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    if (rocksdb::IOStatus s = fs_.Check("append"); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    if (rocksdb::IOStatus s = fs_.Check("append"); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    if (rocksdb::IOStatus s = fs_.Check("append"); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, info, dbg);
  }
  rocksdb::IOStatus Flush(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    if (rocksdb::IOStatus s = fs_.Check("flush"); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Flush(options, dbg);
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    if (rocksdb::IOStatus s = fs_.Check("sync"); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Sync(options, dbg);
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    if (rocksdb::IOStatus s = fs_.Check("sync"); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::Fsync(options, dbg);
  }
  rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override {
    if (rocksdb::IOStatus s = fs_.Check("sync"); !s.ok()) return s;
    return FSWritableFileOwnerWrapper::RangeSync(offset, nbytes, options, dbg);
  }

 private:
  FaultyFileSystem& fs_;
};

}  // namespace

FaultyFileSystem::FaultyFileSystem(std::shared_ptr<rocksdb::FileSystem> base)
    : FileSystemWrapper(base) {}

rocksdb::IOStatus FaultyFileSystem::Check(const char* what) {
  switch (fault_.load()) {
    case Fault::kNone:
      return rocksdb::IOStatus::OK();
    case Fault::kNoSpace:
      ++injected_;
      return rocksdb::IOStatus::NoSpace("injected", what);
    case Fault::kIoError:
      ++injected_;
      return rocksdb::IOStatus::IOError("injected I/O error", what);
  }
  return rocksdb::IOStatus::OK();
}

rocksdb::IOStatus FaultyFileSystem::NewWritableFile(
    const std::string& fname, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  if (rocksdb::IOStatus s = Check("create"); !s.ok()) return s;
  std::unique_ptr<rocksdb::FSWritableFile> file;
  rocksdb::IOStatus s = target()->NewWritableFile(fname, options, &file, dbg);
  if (s.ok()) *result = std::make_unique<FaultyWritableFile>(std::move(file), *this);
  return s;
}

rocksdb::IOStatus FaultyFileSystem::ReopenWritableFile(
    const std::string& fname, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  if (rocksdb::IOStatus s = Check("reopen"); !s.ok()) return s;
  std::unique_ptr<rocksdb::FSWritableFile> file;
  rocksdb::IOStatus s = target()->ReopenWritableFile(fname, options, &file, dbg);
  if (s.ok()) *result = std::make_unique<FaultyWritableFile>(std::move(file), *this);
  return s;
}

rocksdb::IOStatus FaultyFileSystem::ReuseWritableFile(
    const std::string& fname, const std::string& old_fname, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  if (rocksdb::IOStatus s = Check("reuse"); !s.ok()) return s;
  std::unique_ptr<rocksdb::FSWritableFile> file;
  rocksdb::IOStatus s = target()->ReuseWritableFile(fname, old_fname, options, &file, dbg);
  if (s.ok()) *result = std::make_unique<FaultyWritableFile>(std::move(file), *this);
  return s;
}

FaultyEnv::FaultyEnv()
    : fs(std::make_shared<FaultyFileSystem>()), env(rocksdb::NewCompositeEnv(fs)) {}

}  // namespace jobbroker::storage
