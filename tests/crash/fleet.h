#pragma once

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tests/crash/line_log.h"
#include "tests/testing/child_process.h"

namespace jobbroker::crash {

struct FleetOptions {
  std::string self_exe;  // the harness binary, run again as `producer` and `worker` (roles.h)
  std::string out_dir;   // where producer-<name>.log/.out and worker-<instance>.log/.out go
  std::string queues;    // comma-separated, for every child
  // The queues' job lease: workers heartbeat at a quarter of it, and a stopped worker stays
  // stopped past it (its lease runs out).
  absl::Duration job_lease = absl::Seconds(2);
  absl::Duration worker_dead_max = absl::Seconds(1);  // a killed worker's time dead, at most
  // The --address of a child: a worker's slot (from 1), a producer's index (from 0).
  std::function<std::string(int index)> address;
};

// The clients of a harness run, shared by the crash harness and the cluster harness
// (tests/cluster/jepsen/): producers that enqueue on a schedule, and workers that are killed and
// stopped at random, each a child process of the harness binary; every event goes to the
// driver's log (checker.h's driver events), and what fails the run to `problems`.
class Fleet {
 public:
  // Borrows log, rng and problems: they must outlive the fleet.
  Fleet(FleetOptions options, LineLog& log, std::mt19937_64& rng,
        std::vector<std::string>& problems)
      : options_(std::move(options)), log_(log), rng_(rng), problems_(problems) {}

  absl::Status StartWorkers(int count);
  // `jobs` shared among `count` producers, each spreading its share over `spread`.
  absl::Status StartProducers(int count, int jobs, absl::Duration spread);

  // Notes producers that ended (a non-zero exit is a problem); true once all have.
  bool ReapProducers();
  // SIGKILLs the producers still running (the settle timeout ran out), then reaps them.
  void KillProducers();
  // Continues stopped workers and restarts dead ones whose time is up (every one now with
  // `now_all`); a worker that exited by itself is a problem, and restarted.
  absl::Status TendWorkers(bool now_all);
  // Kills (60%) or stops for longer than a lease (40%) one running worker, chosen at random.
  absl::Status WorkerEvent();
  // SIGTERMs every worker; an exit other than 0 is a problem.
  void StopWorkers();
  // Once the producers are done: until `deadline`, calls `tend` (workers, brokers) and asks the
  // broker at `address()` for its counts, until no job is open and at least `expected` ended.
  // Logs SETTLED 1 or 0; not settled is a problem. `tend`'s error, if any, ends it.
  absl::Status AwaitSettled(absl::Time deadline, size_t expected,
                            const std::function<absl::Status()>& tend,
                            const std::function<std::string()>& address);

  std::vector<std::string> producer_names() const;

 private:
  struct WorkerSlot {
    int slot = 0;
    int incarnation = 0;
    std::string instance;
    std::unique_ptr<testing::ChildProcess> process;
    bool stopped = false;
    absl::Time cont_at;
    absl::Time restart_at;  // while dead
  };
  struct ProducerSlot {
    std::string name;
    std::unique_ptr<testing::ChildProcess> process;
    bool exited = false;
  };

  absl::Status StartWorker(WorkerSlot& w);
  absl::Duration Uniform(absl::Duration lo, absl::Duration hi);

  const FleetOptions options_;
  LineLog& log_;
  std::mt19937_64& rng_;
  std::vector<std::string>& problems_;
  std::vector<std::unique_ptr<WorkerSlot>> workers_;
  std::vector<ProducerSlot> producers_;
};

}  // namespace jobbroker::crash
