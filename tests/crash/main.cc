// crash_harness: the crash-consistency harness (README.md). With no role it is the driver; the
// driver runs it again as `producer` and `worker` child processes.
//
//   crash_harness [--kills 20] [--seed S] [--jobs 2400] [--producers 3] [--workers 3]
//                 [--lease 1s] [--settle-timeout 120s] [--out DIR] [--keep 1]
//                 [--durability sync|group] [--max-hot-jobs N] [--partitions N]
//   crash_harness producer --address A --log F --name N --jobs J --seed S --spread D --queues Q,..
//   crash_harness worker --address A --log F --id W --seed S --queues Q,.. [--heartbeat D]

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "tests/crash/driver.h"
#include "tests/crash/flags.h"
#include "tests/crash/roles.h"

#ifndef JOBBROKER_BINARY
#error "JOBBROKER_BINARY must name the jobbroker binary under test"
#endif

namespace jobbroker::crash {
namespace {

int Usage(const std::string& why) {
  std::fprintf(stderr, "crash_harness: %s\n", why.c_str());
  return 2;
}

std::string SelfExe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// Like tests/testing/broker_process.cc: $JOBBROKER_BINARY, else the one this build produced.
std::string BrokerBinary() {
  const char* env = std::getenv("JOBBROKER_BINARY");
  return env != nullptr && *env != '\0' ? env : JOBBROKER_BINARY;
}

int Driver(Flags& flags) {
  DriverOptions o;
  absl::StatusOr<int64_t> kills = flags.Int("kills", o.kills);
  absl::StatusOr<uint64_t> seed = flags.Uint("seed", std::random_device()());
  absl::StatusOr<int64_t> jobs = flags.Int("jobs", o.jobs);
  absl::StatusOr<int64_t> producers = flags.Int("producers", o.producers);
  absl::StatusOr<int64_t> workers = flags.Int("workers", o.workers);
  absl::StatusOr<absl::Duration> lease = flags.Duration("lease", o.lease);
  absl::StatusOr<absl::Duration> settle = flags.Duration("settle-timeout", o.settle_timeout);
  absl::StatusOr<int64_t> keep = flags.Int("keep", 0);
  absl::StatusOr<int64_t> max_hot_jobs = flags.Int("max-hot-jobs", o.max_hot_jobs);
  absl::StatusOr<int64_t> partitions = flags.Int("partitions", o.partitions);
  o.out_dir = flags.String("out", "");
  o.durability = flags.String("durability", o.durability);
  for (const absl::Status& s : {kills.status(), seed.status(), jobs.status(), producers.status(),
                                workers.status(), lease.status(), settle.status(), keep.status(),
                                max_hot_jobs.status(), partitions.status()}) {
    if (!s.ok()) return Usage(std::string(s.message()));
  }
  if (std::string unused = flags.Unused(); !unused.empty())
    return Usage("unknown flag --" + unused);
  if (*kills < 0 || *jobs < 1 || *producers < 1 || *workers < 1 || *jobs < *producers) {
    return Usage("--kills must be >= 0, --jobs >= --producers >= 1, --workers >= 1");
  }
  if (*lease < absl::Milliseconds(100)) return Usage("--lease: at least 100ms");
  if (*partitions < 1 || *partitions > 32768) return Usage("--partitions: 1 to 32768");
  if (o.durability != "sync" && o.durability != "group")
    return Usage("--durability: sync or group");
  o.kills = static_cast<int>(*kills);
  o.seed = *seed;
  o.jobs = static_cast<int>(*jobs);
  o.producers = static_cast<int>(*producers);
  o.workers = static_cast<int>(*workers);
  o.lease = *lease;
  o.settle_timeout = *settle;
  o.keep = *keep != 0;
  o.max_hot_jobs = *max_hot_jobs;
  o.partitions = static_cast<int>(*partitions);
  o.self_exe = SelfExe();
  o.broker_binary = BrokerBinary();
  if (o.self_exe.empty()) return Usage("cannot read /proc/self/exe");
  return RunDriver(o);
}

}  // namespace
}  // namespace jobbroker::crash

int main(int argc, char** argv) {
  using namespace jobbroker::crash;
  const std::string role = argc > 1 ? argv[1] : "";
  const bool is_role = role == "producer" || role == "worker";
  absl::StatusOr<Flags> flags = Flags::Parse(argc, argv, is_role ? 2 : 1);
  if (!flags.ok()) return Usage(std::string(flags.status().message()));
  if (role == "producer") return ProducerMain(*flags);
  if (role == "worker") return WorkerMain(*flags);
  return Driver(*flags);
}
