// replica_log_dump --data-dir DIR: prints the replication logs of a STOPPED cluster node's data
// dir, for the one-writer-per-epoch check of the cluster harness (tests/crash/checker.h,
// ParseReplicaLogDump, has the format). Per partition of the store (a store holds its partition
// count, fixed when it was created), in partition order:
//
//   # partition <p> floor <epoch floor> base <seq>/<epoch> applied <seq> end <seq>
//   <p>\t<seq>\t<epoch>\t<digest>            one line per stored entry, in seq order
//
// The header is the replica's view (RocksDbReplicaStorage::Open, as the node opens it); the
// entries are every record the replication log holds above the base, read as stored, so that a
// gap or a stray entry shows instead of stopping the dump. The digest is FNV-1a 64 (16 hex
// digits) of the entry as the replication wire carries it (storage::EncodeLogEntry: its epoch and
// transition; an epoch-start entry's transition is empty): stable across processes and builds
// of one format, unlike absl::Hash, which is seeded per process. Two nodes' entries at one
// (partition, seq, epoch) must have one digest.
//
// Opening the store does what a node's start would (RocksDB replays its WAL; a format-1 store is
// upgraded), so it is for a node's data dir after the node stopped; a running node holds the
// directory's lock and the dump fails. Exit 0 after the whole dump; 2, with a message on stderr,
// on a bad command line, a directory without a store, or any read error.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/replication/rocksdb_replica_storage.h"
#include "storage/record_codec.h"
#include "storage/rocksdb_store.h"

namespace jobbroker {
namespace {

// Entries read from the store at a time: bounds the memory a long log needs.
constexpr size_t kEntriesPerRead = 1024;

int Fail(const std::string& why) {
  std::fprintf(stderr, "replica_log_dump: %s\n", why.c_str());
  return 2;
}

// FNV-1a, 64 bits.
uint64_t Fnv1a64(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::Status DumpPartition(storage::RocksDbStore& store, uint32_t p) {
  absl::StatusOr<std::unique_ptr<cluster::RocksDbReplicaStorage>> replica =
      cluster::RocksDbReplicaStorage::Open(&store, p);
  if (!replica.ok()) return replica.status();
  const cluster::LogPosition base = (*replica)->log_base();
  std::printf("# partition %" PRIu32 " floor %" PRId64 " base %" PRIu64 "/%" PRId64
              " applied %" PRIu64 " end %" PRIu64 "\n",
              p, (*replica)->epoch_floor(), base.seq, base.epoch, (*replica)->applied_seq(),
              (*replica)->log_end());
  for (uint64_t from = base.seq + 1;;) {
    absl::StatusOr<std::vector<storage::ReplicaLogRecord>> entries =
        store.ReadReplicaLog(p, from, kEntriesPerRead);
    if (!entries.ok()) return entries.status();
    if (entries->empty()) return absl::OkStatus();
    for (const storage::ReplicaLogRecord& e : *entries) {
      std::printf("%" PRIu32 "\t%" PRIu64 "\t%" PRId64 "\t%016" PRIx64 "\n", p, e.seq, e.epoch,
                  Fnv1a64(storage::EncodeLogEntry(e.epoch, e.transition)));
    }
    if (entries->back().seq == UINT64_MAX) return absl::OkStatus();
    from = entries->back().seq + 1;
  }
}

int Main(int argc, char** argv) {
  std::string dir;
  if (argc == 3 && std::string(argv[1]) == "--data-dir") {
    dir = argv[2];
  } else if (argc == 2 && absl::StartsWith(argv[1], "--data-dir=")) {
    dir = std::string(argv[1]).substr(sizeof("--data-dir=") - 1);
  }
  if (dir.empty()) return Fail("usage: replica_log_dump --data-dir DIR");
  // RocksDbStore::Open would create a store where there is none.
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", error)) {
    return Fail(absl::StrCat(dir, " holds no jobbroker store"));
  }
  absl::StatusOr<std::unique_ptr<storage::RocksDbStore>> store = storage::RocksDbStore::Open(dir);
  if (!store.ok()) return Fail(store.status().ToString());
  for (uint32_t p = 0; p < (*store)->partitions(); ++p) {
    if (absl::Status s = DumpPartition(**store, p); !s.ok()) {
      std::fflush(stdout);
      return Fail(absl::StrCat("partition ", p, ": ", s.ToString()));
    }
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) return Fail("cannot write the dump");
  return 0;
}

}  // namespace
}  // namespace jobbroker

int main(int argc, char** argv) { return jobbroker::Main(argc, argv); }
