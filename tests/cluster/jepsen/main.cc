// cluster_harness: the Jepsen-style harness of cluster mode (README.md). With no role it is the
// driver; the driver runs it again as the crash harness's `producer` and `worker` children.
//
//   cluster_harness [--nemeses 12] [--kinds all|KIND,...] [--seed S] [--jobs 1200] [--producers 3]
//   [--workers 3]
//                   [--partitions 6] [--lease-ttl 2] [--job-lease 2s] [--settle-timeout 180s]
//                   [--out DIR] [--keep 1] --toxiproxy PATH
//   cluster_harness producer|worker ...   (tests/crash/roles.h)

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "tests/cluster/jepsen/cluster_driver.h"
#include "tests/cluster/jepsen/nemesis.h"
#include "tests/crash/flags.h"
#include "tests/crash/roles.h"

#if !defined(JOBBROKER_BINARY) || !defined(FAULTS_LIBRARY) || !defined(POWER_LOSS_BINARY) || \
    !defined(LOG_DUMP_BINARY)
#error "the build names the programs the harness runs (CMakeLists.txt)"
#endif

namespace jobbroker::jepsen {
namespace {

int Usage(const std::string& why) {
  std::fprintf(stderr, "cluster_harness: %s\n", why.c_str());
  return 2;
}

std::string SelfExe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::string FromEnv(const char* name, const char* fallback) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' ? env : fallback;
}

int Driver(crash::Flags& flags) {
  ClusterDriverOptions o;
  absl::StatusOr<int64_t> nemeses = flags.Int("nemeses", o.nemeses);
  absl::StatusOr<uint64_t> seed = flags.Uint("seed", std::random_device()());
  absl::StatusOr<int64_t> jobs = flags.Int("jobs", o.jobs);
  absl::StatusOr<int64_t> producers = flags.Int("producers", o.producers);
  absl::StatusOr<int64_t> workers = flags.Int("workers", o.workers);
  absl::StatusOr<int64_t> partitions = flags.Int("partitions", o.partitions);
  absl::StatusOr<int64_t> ttl = flags.Int("lease-ttl", o.lease_ttl);
  absl::StatusOr<absl::Duration> job_lease = flags.Duration("job-lease", o.job_lease);
  absl::StatusOr<absl::Duration> settle = flags.Duration("settle-timeout", o.settle_timeout);
  absl::StatusOr<int64_t> keep = flags.Int("keep", 0);
  o.out_dir = flags.String("out", "");
  o.kinds = flags.String("kinds", "all");
  if (absl::StatusOr<std::vector<Nemesis>> kinds = ParseNemeses(o.kinds); !kinds.ok())
    return Usage(std::string(kinds.status().message()));
  o.toxiproxy_binary = flags.String("toxiproxy", FromEnv("JOBBROKER_TOXIPROXY", ""));
  for (const absl::Status& s :
       {nemeses.status(), seed.status(), jobs.status(), producers.status(), workers.status(),
        partitions.status(), ttl.status(), job_lease.status(), settle.status(), keep.status()}) {
    if (!s.ok()) return Usage(std::string(s.message()));
  }
  if (std::string unused = flags.Unused(); !unused.empty())
    return Usage("unknown flag --" + unused);
  if (*nemeses < 0 || *jobs < *producers || *producers < 1 || *workers < 1)
    return Usage("--nemeses must be >= 0, --jobs >= --producers >= 1, --workers >= 1");
  if (*partitions < 3 || *partitions > 64) return Usage("--partitions: 3 to 64");
  if (*ttl < 2 || *ttl > 60) return Usage("--lease-ttl: 2 to 60 (seconds)");
  if (*job_lease < absl::Milliseconds(200)) return Usage("--job-lease: at least 200ms");
  if (o.toxiproxy_binary.empty())
    return Usage(
        "--toxiproxy (or $JOBBROKER_TOXIPROXY) names the Toxiproxy server; "
        "scripts/install-toxiproxy.sh prints it");
  o.nemeses = static_cast<int>(*nemeses);
  o.seed = *seed;
  o.jobs = static_cast<int>(*jobs);
  o.producers = static_cast<int>(*producers);
  o.workers = static_cast<int>(*workers);
  o.partitions = static_cast<int>(*partitions);
  o.lease_ttl = static_cast<int>(*ttl);
  o.job_lease = *job_lease;
  o.settle_timeout = *settle;
  o.keep = *keep != 0;
  o.self_exe = SelfExe();
  o.broker_binary = FromEnv("JOBBROKER_BINARY", JOBBROKER_BINARY);
  o.faults_library = FAULTS_LIBRARY;
  o.power_loss_binary = POWER_LOSS_BINARY;
  o.log_dump_binary = LOG_DUMP_BINARY;
  if (o.self_exe.empty()) return Usage("cannot read /proc/self/exe");
  return RunClusterDriver(o);
}

}  // namespace
}  // namespace jobbroker::jepsen

int main(int argc, char** argv) {
  using namespace jobbroker;
  const std::string role = argc > 1 ? argv[1] : "";
  const bool is_role = role == "producer" || role == "worker";
  absl::StatusOr<crash::Flags> flags = crash::Flags::Parse(argc, argv, is_role ? 2 : 1);
  if (!flags.ok()) return jepsen::Usage(std::string(flags.status().message()));
  if (role == "producer") return crash::ProducerMain(*flags);
  if (role == "worker") return crash::WorkerMain(*flags);
  return jepsen::Driver(*flags);
}
