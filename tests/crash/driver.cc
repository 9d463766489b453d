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
#include "tests/crash/line_log.h"
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
    for (int w = 0; w < options_.workers; ++w) {
      workers_.push_back(std::make_unique<WorkerSlot>());
      workers_.back()->slot = w + 1;
      if (absl::Status s = StartWorker(*workers_.back()); !s.ok()) return Abort(s);
    }
    if (absl::Status s = StartProducers(); !s.ok()) return Abort(s);
    if (absl::Status s = KillPhase(); !s.ok()) return Abort(s);
    const absl::Time kill_phase_end = absl::Now();
    if (absl::Status s = Settle(); !s.ok()) return Abort(s);
    const absl::Time settled = absl::Now();
    return Finish(start, kill_phase_end, settled);
  }

 private:
  struct WorkerSlot {
    int slot = 0;
    int incarnation = 0;
    std::string instance;
    std::unique_ptr<ChildProcess> process;
    bool stopped = false;
    absl::Time cont_at;
    absl::Time restart_at;  // while dead
  };

  struct ProducerSlot {
    std::string name;
    std::unique_ptr<ChildProcess> process;
    bool exited = false;
  };

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
    log_->Write({"SEED", absl::StrCat(options_.seed)});
    return absl::OkStatus();
  }

  absl::Duration Uniform(absl::Duration lo, absl::Duration hi) {
    const double f = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    return lo + (hi - lo) * f;
  }

  uint64_t ChildSeed() { return rng_(); }

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

  absl::Status StartWorker(WorkerSlot& w) {
    ++w.incarnation;
    w.instance = absl::StrCat("w", w.slot, ".", w.incarnation);
    absl::StatusOr<std::unique_ptr<ChildProcess>> p =
        ChildProcess::Start({options_.self_exe, "worker", "--address", address_, "--log",
                             absl::StrCat(out_, "/worker-", w.instance, ".log"), "--id", w.instance,
                             "--seed", absl::StrCat(ChildSeed()), "--queues", kQueues,
                             "--heartbeat", Seconds(options_.lease / 4)},
                            absl::StrCat(out_, "/worker-", w.instance, ".out"));
    if (!p.ok()) return p.status();
    w.process = *std::move(p);
    w.stopped = false;
    log_->Write({"WORKER_UP", w.instance, absl::StrCat(w.process->pid())});
    return absl::OkStatus();
  }

  absl::Status StartProducers() {
    // A broker cycle of the kill phase takes about 2.8 s: up 0.8..3.2 s, down 0..1.5 s, restart.
    const absl::Duration spread = absl::Milliseconds(2800) * options_.kills;
    const int per_producer = options_.jobs / options_.producers;
    for (int i = 0; i < options_.producers; ++i) {
      ProducerSlot p;
      p.name = absl::StrCat("p", i + 1);
      const int jobs = per_producer + (i < options_.jobs % options_.producers ? 1 : 0);
      absl::StatusOr<std::unique_ptr<ChildProcess>> process =
          ChildProcess::Start({options_.self_exe, "producer", "--address", address_, "--log",
                               absl::StrCat(out_, "/producer-", p.name, ".log"), "--name", p.name,
                               "--jobs", absl::StrCat(jobs), "--seed", absl::StrCat(ChildSeed()),
                               "--spread", Seconds(spread), "--queues", kQueues},
                              absl::StrCat(out_, "/producer-", p.name, ".out"));
      if (!process.ok()) return process.status();
      p.process = *std::move(process);
      producers_.push_back(std::move(p));
    }
    return absl::OkStatus();
  }

  // Notes producers that ended; true when all have.
  bool ReapProducers() {
    bool all = true;
    for (ProducerSlot& p : producers_) {
      if (p.exited) continue;
      if (p.process->Running()) {
        all = false;
        continue;
      }
      p.exited = true;
      log_->Write({"PRODUCER_EXIT", p.name, absl::StrCat(p.process->exit_code())});
      if (p.process->exit_code() != 0) {
        problems_.push_back(absl::StrCat("producer ", p.name, " exited with code ",
                                         p.process->exit_code(), "; see ", out_, "/producer-",
                                         p.name, ".out"));
      }
    }
    return all;
  }

  // Continues stopped workers whose time is up, restarts dead ones whose time is up, and
  // restarts (as a problem) a worker that exited on its own. `now_all` does both at once.
  absl::Status TendWorkers(bool now_all) {
    const absl::Time now = absl::Now();
    for (auto& w : workers_) {
      if (w->process != nullptr && !w->stopped && !w->process->Running()) {
        problems_.push_back(absl::StrCat("worker ", w->instance, " exited on its own with code ",
                                         w->process->exit_code(), "; see ", out_, "/worker-",
                                         w->instance, ".out"));
        w->process.reset();
        w->restart_at = now;
      }
      if (w->stopped && (now_all || now >= w->cont_at)) {
        if (absl::Status s = w->process->Continue(); !s.ok()) return s;
        w->stopped = false;
        log_->Write({"WORKER_CONT", w->instance, absl::StrCat(w->process->pid())});
      }
      if (w->process == nullptr && (now_all || now >= w->restart_at)) {
        if (absl::Status s = StartWorker(*w); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  // Kills or stops one running worker at random.
  absl::Status WorkerEvent() {
    std::vector<WorkerSlot*> candidates;
    for (auto& w : workers_) {
      if (w->process != nullptr && !w->stopped) candidates.push_back(w.get());
    }
    if (candidates.empty()) return absl::OkStatus();
    WorkerSlot& w =
        *candidates[std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(rng_)];
    const pid_t pid = w.process->pid();
    if (std::uniform_int_distribution<int>(0, 99)(rng_) < 60) {
      w.process->Kill9();
      w.process.reset();
      log_->Write({"WORKER_KILL", w.instance, absl::StrCat(pid)});
      w.restart_at = absl::Now() + Uniform(absl::Milliseconds(100), kWorkerDeadMax);
    } else {
      if (absl::Status s = w.process->Pause(); !s.ok()) {
        return absl::InternalError(absl::StrCat("stopping ", w.instance, ": ", s.message()));
      }
      w.stopped = true;
      log_->Write({"WORKER_STOP", w.instance, absl::StrCat(pid)});
      w.cont_at = absl::Now() + options_.lease + Uniform(absl::Milliseconds(500), absl::Seconds(2));
    }
    return absl::OkStatus();
  }

  // Kills the broker `kills` times at random moments, restarting it on the same data dir,
  // while workers are killed and stopped at random.
  absl::Status KillPhase() {
    absl::Time next_kill = absl::Now() + Uniform(kBrokerUpMin, kBrokerUpMax);
    absl::Time restart_at = absl::InfiniteFuture();
    absl::Time next_worker_event = absl::Now() + Uniform(kWorkerEventMin, kWorkerEventMax);
    while (broker_kills_ < options_.kills || broker_ == nullptr) {
      const absl::Time now = absl::Now();
      if (absl::Status s = TendWorkers(false); !s.ok()) return s;
      ReapProducers();
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
        if (absl::Status s = WorkerEvent(); !s.ok()) return s;
        next_worker_event = absl::Now() + Uniform(kWorkerEventMin, kWorkerEventMax);
      }
      absl::SleepFor(kTick);
    }
    return TendWorkers(true);
  }

  // Lets the last broker run, without kills, until producers are done and every job ended.
  absl::Status Settle() {
    const absl::Time deadline = absl::Now() + options_.settle_timeout;
    while (!ReapProducers()) {
      if (absl::Status s = TendWorkers(true); !s.ok()) return s;
      if (absl::Now() > deadline) {
        problems_.push_back(absl::StrCat("producers still running after the settle timeout (",
                                         absl::FormatDuration(options_.settle_timeout), ")"));
        for (ProducerSlot& p : producers_) p.process->Kill9();
        ReapProducers();
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    const size_t expected = AcknowledgedIds().size();
    bool settled = false;
    QueueCounts last;
    while (absl::Now() <= deadline) {
      if (absl::Status s = TendWorkers(true); !s.ok()) return s;
      absl::StatusOr<QueueCounts> counts = CountJobs(address_);
      if (counts.ok()) {
        last = *counts;
        if (last.open == 0 && last.terminal >= static_cast<int64_t>(expected)) {
          settled = true;
          break;
        }
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
    log_->Write({"SETTLED", settled ? "1" : "0"});
    if (!settled) {
      problems_.push_back(absl::StrCat(
          "not settled within ", absl::FormatDuration(options_.settle_timeout), ": ", last.open,
          " jobs still open, ", last.terminal, " ended of ", expected, " acknowledged"));
    }
    for (auto& w : workers_) {
      if (w->process == nullptr) continue;
      const int code = w->process->Stop(absl::Seconds(10)).value_or(-1);
      if (code != 0) {
        problems_.push_back(
            absl::StrCat("worker ", w->instance, " ended with code ", code, " on SIGTERM"));
      }
    }
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
    for (const ProducerSlot& p : producers_) {
      ParseProducerLog(p.name, ReadFile(absl::StrCat(out_, "/producer-", p.name, ".log")), logs);
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
    if (!report.ok()) std::printf("\nVIOLATIONS\n%s", report.ViolationList().c_str());
    if (!problems_.empty()) {
      std::printf("\nRUN PROBLEMS\n%s\n", absl::StrJoin(problems_, "\n").c_str());
    }
    const bool green = report.ok() && problems_.empty();
    std::printf("\n%s (seed %llu)\n", green ? "PASS" : "FAIL",
                static_cast<unsigned long long>(options_.seed));
    if (green && !options_.keep) {
      std::error_code ec;
      std::filesystem::remove_all(out_, ec);
    } else {
      std::printf("logs and data kept in %s\n", out_.c_str());
    }
    std::fflush(stdout);
    return green ? 0 : 1;
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
  std::vector<std::unique_ptr<WorkerSlot>> workers_;
  std::vector<ProducerSlot> producers_;
  // Things that fail the run besides the checker's violations.
  std::vector<std::string> problems_;
};

}  // namespace

int RunDriver(const DriverOptions& options) { return Driver(options).Run(); }

}  // namespace jobbroker::crash
