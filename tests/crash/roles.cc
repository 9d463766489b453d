#include "tests/crash/roles.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/crash/producer.h"
#include "tests/crash/worker.h"

namespace jobbroker::crash {
namespace {

int Usage(const std::string& why) {
  std::fprintf(stderr, "%s\n", why.c_str());
  return 2;
}

std::vector<std::string> Queues(Flags& flags) {
  return absl::StrSplit(flags.String("queues", ""), ',', absl::SkipEmpty());
}

}  // namespace

int ProducerMain(Flags& flags) {
  ProducerOptions o;
  o.address = flags.String("address", "");
  o.log_path = flags.String("log", "");
  o.name = flags.String("name", "");
  o.queues = Queues(flags);
  absl::StatusOr<int64_t> jobs = flags.Int("jobs", 0);
  absl::StatusOr<uint64_t> seed = flags.Uint("seed", 0);
  absl::StatusOr<absl::Duration> spread = flags.Duration("spread", absl::ZeroDuration());
  if (!jobs.ok()) return Usage(std::string(jobs.status().message()));
  if (!seed.ok()) return Usage(std::string(seed.status().message()));
  if (!spread.ok()) return Usage(std::string(spread.status().message()));
  if (std::string unused = flags.Unused(); !unused.empty())
    return Usage("unknown flag --" + unused);
  o.jobs = static_cast<int>(*jobs);
  o.seed = *seed;
  o.spread = *spread;
  return RunProducer(o);
}

int WorkerMain(Flags& flags) {
  WorkerOptions o;
  o.address = flags.String("address", "");
  o.log_path = flags.String("log", "");
  o.instance = flags.String("id", "");
  o.queues = Queues(flags);
  absl::StatusOr<uint64_t> seed = flags.Uint("seed", 0);
  absl::StatusOr<absl::Duration> heartbeat = flags.Duration("heartbeat", o.heartbeat_interval);
  if (!seed.ok()) return Usage(std::string(seed.status().message()));
  if (!heartbeat.ok()) return Usage(std::string(heartbeat.status().message()));
  if (std::string unused = flags.Unused(); !unused.empty())
    return Usage("unknown flag --" + unused);
  o.seed = *seed;
  o.heartbeat_interval = *heartbeat;
  return RunWorker(o);
}

}  // namespace jobbroker::crash
