#include "tests/crash/fleet.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/crash/final_state.h"

namespace jobbroker::crash {
namespace {

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), "s"); }

}  // namespace

absl::Duration Fleet::Uniform(absl::Duration lo, absl::Duration hi) {
  const double f = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return lo + (hi - lo) * f;
}

absl::Status Fleet::StartWorkers(int count) {
  for (int w = 0; w < count; ++w) {
    workers_.push_back(std::make_unique<WorkerSlot>());
    workers_.back()->slot = w + 1;
    if (absl::Status s = StartWorker(*workers_.back()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Fleet::StartWorker(WorkerSlot& w) {
  ++w.incarnation;
  w.instance = absl::StrCat("w", w.slot, ".", w.incarnation);
  const std::string base = absl::StrCat(options_.out_dir, "/worker-", w.instance);
  absl::StatusOr<std::unique_ptr<testing::ChildProcess>> p = testing::ChildProcess::Start(
      {options_.self_exe, "worker", "--address", options_.address(w.slot), "--log", base + ".log",
       "--id", w.instance, "--seed", absl::StrCat(rng_()), "--queues", options_.queues,
       "--heartbeat", Seconds(options_.job_lease / 4)},
      base + ".out");
  if (!p.ok()) return p.status();
  w.process = *std::move(p);
  w.stopped = false;
  log_.Write({"WORKER_UP", w.instance, absl::StrCat(w.process->pid())});
  return absl::OkStatus();
}

absl::Status Fleet::StartProducers(int count, int jobs, absl::Duration spread) {
  const int per_producer = jobs / count;
  for (int i = 0; i < count; ++i) {
    ProducerSlot p;
    p.name = absl::StrCat("p", i + 1);
    const int own = per_producer + (i < jobs % count ? 1 : 0);
    const std::string base = absl::StrCat(options_.out_dir, "/producer-", p.name);
    absl::StatusOr<std::unique_ptr<testing::ChildProcess>> process = testing::ChildProcess::Start(
        {options_.self_exe, "producer", "--address", options_.address(i), "--log", base + ".log",
         "--name", p.name, "--jobs", absl::StrCat(own), "--seed", absl::StrCat(rng_()), "--spread",
         Seconds(spread), "--queues", options_.queues},
        base + ".out");
    if (!process.ok()) return process.status();
    p.process = *std::move(process);
    producers_.push_back(std::move(p));
  }
  return absl::OkStatus();
}

bool Fleet::ReapProducers() {
  bool all = true;
  for (ProducerSlot& p : producers_) {
    if (p.exited) continue;
    if (p.process->Running()) {
      all = false;
      continue;
    }
    p.exited = true;
    log_.Write({"PRODUCER_EXIT", p.name, absl::StrCat(p.process->exit_code())});
    if (p.process->exit_code() != 0) {
      problems_.push_back(absl::StrCat("producer ", p.name, " exited with code ",
                                       p.process->exit_code(), "; see ", options_.out_dir,
                                       "/producer-", p.name, ".out"));
    }
  }
  return all;
}

void Fleet::KillProducers() {
  for (ProducerSlot& p : producers_) {
    if (!p.exited) p.process->Kill9();
  }
  ReapProducers();
}

absl::Status Fleet::TendWorkers(bool now_all) {
  const absl::Time now = absl::Now();
  for (auto& w : workers_) {
    if (w->process != nullptr && !w->stopped && !w->process->Running()) {
      problems_.push_back(absl::StrCat("worker ", w->instance, " exited on its own with code ",
                                       w->process->exit_code(), "; see ", options_.out_dir,
                                       "/worker-", w->instance, ".out"));
      w->process.reset();
      w->restart_at = now;
    }
    if (w->stopped && (now_all || now >= w->cont_at)) {
      if (absl::Status s = w->process->Continue(); !s.ok()) return s;
      w->stopped = false;
      log_.Write({"WORKER_CONT", w->instance, absl::StrCat(w->process->pid())});
    }
    if (w->process == nullptr && (now_all || now >= w->restart_at)) {
      if (absl::Status s = StartWorker(*w); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Fleet::WorkerEvent() {
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
    log_.Write({"WORKER_KILL", w.instance, absl::StrCat(pid)});
    w.restart_at = absl::Now() + Uniform(absl::Milliseconds(100), options_.worker_dead_max);
    return absl::OkStatus();
  }
  if (absl::Status s = w.process->Pause(); !s.ok()) {
    return absl::InternalError(absl::StrCat("stopping ", w.instance, ": ", s.message()));
  }
  w.stopped = true;
  log_.Write({"WORKER_STOP", w.instance, absl::StrCat(pid)});
  w.cont_at = absl::Now() + options_.job_lease + Uniform(absl::Milliseconds(500), absl::Seconds(2));
  return absl::OkStatus();
}

void Fleet::StopWorkers() {
  for (auto& w : workers_) {
    if (w->process == nullptr) continue;
    const int code = w->process->Stop(absl::Seconds(10)).value_or(-1);
    if (code != 0) {
      problems_.push_back(
          absl::StrCat("worker ", w->instance, " ended with code ", code, " on SIGTERM"));
    }
  }
}

absl::Status Fleet::AwaitSettled(absl::Time deadline, size_t expected,
                                 const std::function<absl::Status()>& tend,
                                 const std::function<std::string()>& address) {
  const absl::Time started = absl::Now();
  bool settled = false;
  QueueCounts last;
  while (absl::Now() <= deadline) {
    if (absl::Status s = tend(); !s.ok()) return s;
    absl::StatusOr<QueueCounts> counts = CountJobs(address());
    if (counts.ok()) {
      last = *counts;
      if (last.open == 0 && last.terminal >= static_cast<int64_t>(expected)) {
        settled = true;
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  log_.Write({"SETTLED", settled ? "1" : "0"});
  if (!settled) {
    problems_.push_back(absl::StrCat(
        "not settled within ", absl::FormatDuration(absl::Now() - started), ": ", last.open,
        " jobs still open, ", last.terminal, " ended of ", expected, " acknowledged"));
  }
  return absl::OkStatus();
}

std::vector<std::string> Fleet::producer_names() const {
  std::vector<std::string> names;
  for (const ProducerSlot& p : producers_) names.push_back(p.name);
  return names;
}

}  // namespace jobbroker::crash
