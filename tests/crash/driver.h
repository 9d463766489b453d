#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace jobbroker::crash {

struct DriverOptions {
  // Broker SIGKILLs before the run settles. Workers are killed and stopped along the way.
  int kills = 20;
  uint64_t seed = 0;
  // Jobs in all, shared among the producers.
  int jobs = 2400;
  int producers = 3;
  int workers = 3;
  // The queues' lease; a stopped worker stays stopped longer than this.
  absl::Duration lease = absl::Seconds(1);
  // The queues' durability policy: "sync" (the default) or "group" (answered once in the log,
  // fsynced within 10 ms). Both must survive SIGKILL of the broker with nothing answered lost.
  std::string durability = "sync";
  // The broker's --max-hot-jobs; negative = its default. 0 makes every waiting job cold, so each
  // lease reads its job back from the store after every restart.
  int64_t max_hot_jobs = -1;
  // The broker's --partitions (the data dir is new): with 4, the harness's two queues live in
  // partitions 1 and 0, so every worker's stream spans two brokers.
  int partitions = 1;
  // How long the last broker gets to bring every job to an end (and producers to finish).
  absl::Duration settle_timeout = absl::Seconds(120);
  // Where logs and the data dir go; empty = a fresh directory under $TMPDIR (or /tmp).
  std::string out_dir;
  // Keep `out_dir` after a green run too (it is always kept after a red one).
  bool keep = false;
  // This program, run again as producer and worker.
  std::string self_exe;
  std::string broker_binary;
};

// Runs the whole scenario (README.md) and the checker; prints the summary table. Exit code 0
// when the checker found no violation and the run settled, 1 otherwise, 2 if the harness itself
// could not run (a broker that does not start, say).
int RunDriver(const DriverOptions& options);

}  // namespace jobbroker::crash
