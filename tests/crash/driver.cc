#include "tests/crash/driver.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/crash/checker.h"
#include "tests/crash/final_state.h"
#include "tests/crash/fleet.h"
#include "tests/crash/line_log.h"
#include "tests/crash/verdict.h"
#include "tests/testing/child_process.h"
#include "tests/testing/process_util.h"

namespace jobbroker::crash {
namespace {

using ::jobbroker::testing::ChildProcess;

constexpr char kQueues[] = "crash.a,crash.b";
constexpr char kServingPrefix[] = "jobbroker: serving ";
constexpr absl::Duration kBrokerStartTimeout = absl::Seconds(60);
constexpr absl::Duration kTick = absl::Milliseconds(20);

// How long the broker runs between kills, and stays down after one (over a lease now and then,
// so that some leases run out while it is down).
constexpr absl::Duration kBrokerUpMin = absl::Milliseconds(800);
constexpr absl::Duration kBrokerUpMax = absl::Milliseconds(3200);
constexpr absl::Duration kBrokerDownMax = absl::Milliseconds(1500);
// Time between two worker events (a kill or a stop), and a killed worker's time dead.
constexpr absl::Duration kWorkerEventMin = absl::Milliseconds(1500);
constexpr absl::Duration kWorkerEventMax = absl::Milliseconds(4500);
constexpr absl::Duration kWorkerDeadMax = absl::Milliseconds(1000);

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), "s"); }

class Driver {
 public:
  explicit Driver(const DriverOptions& options) : options_(options), rng_(options.seed) {}

  std::string HotJobs() const {
    return options_.max_hot_jobs < 0 ? "default" : absl::StrCat(options_.max_hot_jobs);
  }

  int Run() {
    const absl::Time start = absl::Now();
    if (absl::Status s = Setup(); !s.ok()) return Abort(s);
    std::printf(
        "crash harness: seed %llu, %d broker kills, %d jobs, %d producers, %d workers, "
        "durability %s, max hot jobs %s, %d partitions\n",
        static_cast<unsigned long long>(options_.seed), options_.kills, options_.jobs,
        options_.producers, options_.workers, options_.durability.c_str(), HotJobs().c_str(),
        options_.partitions);
    std::printf(
        "  replay: tests/crash/run.sh --seed %llu --kills %d --jobs %d --durability %s%s%s\n",
        static_cast<unsigned long long>(options_.seed), options_.kills, options_.jobs,
        options_.durability.c_str(),
        options_.max_hot_jobs < 0 ? "" : absl::StrCat(" --max-hot-jobs ", HotJobs()).c_str(),
        options_.partitions == 1 ? ""
                                 : absl::StrCat(" --partitions ", options_.partitions).c_str());
    std::printf("  broker %s on %s, logs in %s\n", options_.broker_binary.c_str(), address_.c_str(),
                out_.c_str());
    std::fflush(stdout);

    if (absl::Status s = StartBroker(); !s.ok()) return Abort(s);
    // Runs every second through the kills: the checker finds each run once, and no gap but
    // across a kill.
    if (absl::Status s = PutEverySecondSchedule(address_); !s.ok()) return Abort(s);
    if (absl::Status s = fleet_->StartWorkers(options_.workers); !s.ok()) return Abort(s);
    // A broker cycle of the kill phase takes about 2.8 s: up 0.8..3.2 s, down 0..1.5 s, restart.
    if (absl::Status s = fleet_->StartProducers(options_.producers, options_.jobs,
                                                absl::Milliseconds(2800) * options_.kills);
        !s.ok())
      return Abort(s);
    if (absl::Status s = KillPhase(); !s.ok()) return Abort(s);
    const absl::Time kill_phase_end = absl::Now();
    if (absl::Status s = Settle(); !s.ok()) return Abort(s);
    const absl::Time settled = absl::Now();
    return Finish(start, kill_phase_end, settled);
  }

 private:
  absl::Status Setup() {
    out_ = options_.out_dir;
    if (out_.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string tmpl =
          absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/jobbroker-crash-XXXXXX");
      if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
      out_ = tmpl;
    }
    data_dir_ = absl::StrCat(out_, "/data");
    std::error_code ec;
    std::filesystem::create_directories(data_dir_, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", data_dir_, ": ", ec.message()));
    if (!std::filesystem::is_empty(data_dir_)) {
      return absl::FailedPreconditionError(absl::StrCat(data_dir_, " is not empty"));
    }
    // Retries due 0.2 s after a failure, exactly (no jitter); enough attempts that no job meant
    // to succeed dies of lost leases alone; retention 0 = keep every ended job, so the checker
    // sees them all.
    config_path_ = absl::StrCat(out_, "/config.json");
    std::ofstream config(config_path_);
    config << R"({"defaultPolicy": {"leaseDuration": ")" << Seconds(options_.lease)
           << R"(", "retry": {"maxAttempts": 40, "initialBackoff": "0.2s", )"
           << R"("backoffMultiplier": 1, "maxBackoff": "0.2s", "jitter": "JITTER_NONE"}, )"
           << R"("completedRetention": {"maxCount": "0", "maxAge": "0s"}, )"
           << R"("failedRetention": {"maxCount": "0", "maxAge": "0s"}, )"
           << R"("durability": ")"
           << (options_.durability == "group" ? "DURABILITY_GROUP" : "DURABILITY_SYNC")
           << R"(", "groupCommitDelay": "0.01s"}})"
           << "\n";
    config.close();
    if (!config) return absl::InternalError(absl::StrCat("cannot write ", config_path_));
    absl::StatusOr<int> port = testing::PortBelowEphemeralRange();
    if (!port.ok()) return port.status();
    address_ = absl::StrCat("127.0.0.1:", *port);
    absl::StatusOr<std::unique_ptr<LineLog>> log = LineLog::Open(absl::StrCat(out_, "/driver.log"));
    if (!log.ok()) return log.status();
    log_ = *std::move(log);
    fleet_ = std::make_unique<Fleet>(FleetOptions{.self_exe = options_.self_exe,
                                                  .out_dir = out_,
                                                  .queues = kQueues,
                                                  .job_lease = options_.lease,
                                                  .worker_dead_max = kWorkerDeadMax,
                                                  .address = [this](int) { return address_; }},
                                     *log_, rng_, problems_);
    log_->Write({"SEED", absl::StrCat(options_.seed)});
    return absl::OkStatus();
  }

  absl::Duration Uniform(absl::Duration lo, absl::Duration hi) {
    const double f = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    return lo + (hi - lo) * f;
  }

  absl::Status StartBroker() {
    ++broker_generation_;
    const std::string output = absl::StrCat(out_, "/broker-", broker_generation_, ".log");
    std::vector<std::string> args = {
        options_.broker_binary, "--listen", address_,   "--http-listen", "127.0.0.1:0",
        "--data-dir",           data_dir_,  "--config", config_path_};
    if (options_.max_hot_jobs >= 0) {
      args.push_back("--max-hot-jobs");
      args.push_back(HotJobs());
    }
    if (options_.partitions != 1) {
      args.push_back("--partitions");
      args.push_back(absl::StrCat(options_.partitions));
    }
    absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(args, output);
    if (!p.ok()) return p.status();
    broker_ = *std::move(p);
    const absl::Time deadline = absl::Now() + kBrokerStartTimeout;
    while (true) {
      if (absl::StrContains(ReadFile(output), kServingPrefix)) break;
      if (!broker_->Running()) {
        return absl::UnavailableError(absl::StrCat(
            "broker generation ", broker_generation_, " exited with code ", broker_->exit_code(),
            " before serving; its output (", output, "):\n", ReadFile(output)));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("broker generation ", broker_generation_, " did not serve within ",
                         absl::FormatDuration(kBrokerStartTimeout), "; see ", output));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    log_->Write({"BROKER_UP", absl::StrCat(broker_generation_), absl::StrCat(broker_->pid())});
    return absl::OkStatus();
  }

  void KillBroker() {
    const pid_t pid = broker_->pid();
    broker_->Kill9();
    log_->Write({"BROKER_KILL", absl::StrCat(broker_generation_), absl::StrCat(pid)});
    ++broker_kills_;
  }

  // Kills the broker `kills` times at random moments, restarting it on the same data dir,
  // while workers are killed and stopped at random.
  absl::Status KillPhase() {
    absl::Time next_kill = absl::Now() + Uniform(kBrokerUpMin, kBrokerUpMax);
    absl::Time restart_at = absl::InfiniteFuture();
    absl::Time next_worker_event = absl::Now() + Uniform(kWorkerEventMin, kWorkerEventMax);
    while (broker_kills_ < options_.kills || broker_ == nullptr) {
      const absl::Time now = absl::Now();
      if (absl::Status s = fleet_->TendWorkers(false); !s.ok()) return s;
      fleet_->ReapProducers();
      if (broker_ != nullptr && now >= next_kill) {
        KillBroker();
        broker_.reset();
        restart_at = now + Uniform(absl::ZeroDuration(), kBrokerDownMax);
      }
      if (broker_ == nullptr && absl::Now() >= restart_at) {
        if (absl::Status s = StartBroker(); !s.ok()) return s;
        next_kill = absl::Now() + Uniform(kBrokerUpMin, kBrokerUpMax);
      }
      if (absl::Now() >= next_worker_event) {
        if (absl::Status s = fleet_->WorkerEvent(); !s.ok()) return s;
        next_worker_event = absl::Now() + Uniform(kWorkerEventMin, kWorkerEventMax);
      }
      absl::SleepFor(kTick);
    }
    return fleet_->TendWorkers(true);
  }

  // Lets the last broker run, without kills, until producers are done and every job ended.
  absl::Status Settle() {
    const absl::Time deadline = absl::Now() + options_.settle_timeout;
    while (!fleet_->ReapProducers()) {
      if (absl::Status s = fleet_->TendWorkers(true); !s.ok()) return s;
      if (absl::Now() > deadline) {
        problems_.push_back(absl::StrCat("producers still running after the settle timeout (",
                                         absl::FormatDuration(options_.settle_timeout), ")"));
        fleet_->KillProducers();
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (absl::Status s = fleet_->AwaitSettled(
            deadline, AcknowledgedIds().size(), [this] { return fleet_->TendWorkers(true); },
            [this] { return address_; });
        !s.ok())
      return s;
    fleet_->StopWorkers();
    return absl::OkStatus();
  }

  std::vector<std::string> LogFiles(absl::string_view prefix) const {
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(out_)) {
      const std::string name = entry.path().filename().string();
      if (absl::StartsWith(name, prefix) && absl::EndsWith(name, ".log")) {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    return files;
  }

  CrashLogs ReadLogs() const {
    CrashLogs logs;
    for (const std::string& name : fleet_->producer_names()) {
      ParseProducerLog(name, ReadFile(absl::StrCat(out_, "/producer-", name, ".log")), logs);
    }
    for (const std::string& f : LogFiles("worker-")) ParseWorkerLog(ReadFile(f), logs);
    ParseDriverLog(ReadFile(absl::StrCat(out_, "/driver.log")), logs);
    return logs;
  }

  std::set<std::string> AcknowledgedIds() const {
    std::set<std::string> ids;
    for (const EnqueueRecord& e : ReadLogs().enqueues) ids.insert(e.job_id);
    return ids;
  }

  int Finish(absl::Time start, absl::Time kill_phase_end, absl::Time settled) {
    const CrashLogs logs = ReadLogs();
    std::set<std::string> ids;
    for (const EnqueueRecord& e : logs.enqueues) ids.insert(e.job_id);
    absl::StatusOr<FinalState> final_state = FetchFinalState(address_, ids);
    if (!final_state.ok()) return Abort(final_state.status());
    for (const std::string& gap : final_state->list_gaps) {
      problems_.push_back(absl::StrCat("admin views disagree: ", gap));
    }
    const int broker_code = broker_->Stop(absl::Seconds(30)).value_or(-1);
    if (broker_code != 0) {
      problems_.push_back(absl::StrCat("the last broker exited with code ", broker_code,
                                       " on SIGTERM; see ", out_, "/broker-", broker_generation_,
                                       ".log"));
    }

    const Report report = Check(logs, final_state->jobs);
    std::printf("\ncrash harness summary (seed %llu)\n",
                static_cast<unsigned long long>(options_.seed));
    std::printf("%s",
                report
                    .SummaryTable({{"wall time: kill phase / settle / total",
                                    absl::StrFormat("%.1fs / %.1fs / %.1fs",
                                                    absl::ToDoubleSeconds(kill_phase_end - start),
                                                    absl::ToDoubleSeconds(settled - kill_phase_end),
                                                    absl::ToDoubleSeconds(absl::Now() - start))}})
                    .c_str());
    return Verdict(report, problems_, options_.seed, out_, options_.keep);
  }

  int Abort(const absl::Status& s) {
    std::fprintf(stderr, "crash harness could not run (seed %llu): %s\nlogs kept in %s\n",
                 static_cast<unsigned long long>(options_.seed), std::string(s.message()).c_str(),
                 out_.c_str());
    return 2;
  }

  const DriverOptions& options_;
  std::mt19937_64 rng_;
  std::string out_;
  std::string data_dir_;
  std::string config_path_;
  std::string address_;
  std::unique_ptr<LineLog> log_;
  std::unique_ptr<ChildProcess> broker_;
  int broker_generation_ = 0;
  int broker_kills_ = 0;
  // Things that fail the run besides the checker's violations.
  std::vector<std::string> problems_;
  std::unique_ptr<Fleet> fleet_;  // after what it borrows
};

}  // namespace

int RunDriver(const DriverOptions& options) { return Driver(options).Run(); }

}  // namespace jobbroker::crash
