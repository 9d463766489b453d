// The C++ conformance worker (tests/interop/CONFORMANCE.md): the shortest program on the
// library's Worker (client/cpp/jobbroker/worker.h) that reaches every behaviour of
// docs/worker-contract.md. One handler per --queues entry; the job's payload says what the
// handler does; events go to --events, one JSON line per write(2) so that the harness can read
// them while the worker runs and after a SIGKILL.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "jobbroker/worker.h"

namespace {

using ::google::protobuf::Struct;
using ::google::protobuf::Value;
using ::jobbroker::client::JobContext;

struct Flags {
  std::string address;
  std::vector<std::string> queues;
  std::string events;
  int concurrency = 1;
  int prefetch = 0;
  int lease_ms = 0;
  int grace_ms = 10000;
  std::string die_at_step;
  std::string die_after_user;
  std::string outbox;
  bool idempotent = false;
  std::string lang_name = "cpp";
  // TLS (a CA to trust, and a client certificate for mutual TLS) and the bearer token.
  std::string ca;
  std::string cert;
  std::string key;
  std::string token;
};

// Parses the arguments of CONFORMANCE.md; an error names the flag.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  std::map<std::string, std::string*> strings = {{"--address", &flags.address},
                                                 {"--events", &flags.events},
                                                 {"--die-at-step", &flags.die_at_step},
                                                 {"--die-after-user", &flags.die_after_user},
                                                 {"--outbox", &flags.outbox},
                                                 {"--lang-name", &flags.lang_name},
                                                 {"--ca", &flags.ca},
                                                 {"--cert", &flags.cert},
                                                 {"--key", &flags.key},
                                                 {"--token", &flags.token}};
  std::map<std::string, int*> ints = {{"--concurrency", &flags.concurrency},
                                      {"--prefetch", &flags.prefetch},
                                      {"--lease-ms", &flags.lease_ms},
                                      {"--grace-ms", &flags.grace_ms}};
  std::string queues;
  strings["--queues"] = &queues;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--idempotent") {
      flags.idempotent = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[++i];
    if (auto s = strings.find(flag); s != strings.end()) {
      *s->second = value;
    } else if (auto n = ints.find(flag); n != ints.end()) {
      if (!absl::SimpleAtoi(value, n->second))
        return absl::InvalidArgumentError(absl::StrCat(flag, " takes a number, not ", value));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
  }
  flags.queues = absl::StrSplit(queues, ',', absl::SkipEmpty());
  if (flags.address.empty() || flags.queues.empty() || flags.events.empty())
    return absl::InvalidArgumentError(
        "--address, --queues and --events are required (see tests/interop/CONFORMANCE.md)");
  return flags;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json).ok()) std::abort();
  return json;
}

Value StringValue(const std::string& s) {
  Value v;
  v.set_string_value(s);
  return v;
}

Value NumberValue(double n) {
  Value v;
  v.set_number_value(n);
  return v;
}

// Appends one event line with a single write(2), so lines never interleave and a SIGKILL loses
// none that were written.
class Events {
 public:
  explicit Events(const std::string& path)
      : fd_(open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) {
      perror(path.c_str());
      std::exit(1);
    }
  }

  void Write(const std::string& event) { WriteLine(Fields(event)); }

  void WriteForJob(const std::string& event, const JobContext& job,
                   std::map<std::string, std::string> extra = {}) {
    Struct line = Fields(event);
    (*line.mutable_fields())["job"] = StringValue(job.job_id());
    (*line.mutable_fields())["attempt"] = NumberValue(job.attempt());
    for (auto& [key, value] : extra) (*line.mutable_fields())[key] = StringValue(value);
    WriteLine(line);
  }

 private:
  static Struct Fields(const std::string& event) {
    Struct line;
    (*line.mutable_fields())["event"] = StringValue(event);
    return line;
  }
  void WriteLine(const Struct& line) {
    const std::string text = ToJson(line) + "\n";
    if (write(fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size())) std::abort();
  }

  const int fd_;
};

[[noreturn]] void Die() {
  kill(getpid(), SIGKILL);
  while (true) pause();  // the signal is on its way
}

// The fake email provider of the sign-up example: one JSON line per email sent. With
// `dedupe`, a key it already holds sends nothing (the idempotency key at work).
void SendEmail(const std::string& outbox, const std::string& user, const std::string& key,
               bool dedupe) {
  if (dedupe) {
    std::ifstream sent(outbox);
    for (std::string line; std::getline(sent, line);) {
      Struct email;
      if (google::protobuf::util::JsonStringToMessage(line, &email).ok() &&
          email.fields().at("key").string_value() == key)
        return;
    }
  }
  Struct email;
  (*email.mutable_fields())["user"] = StringValue(user);
  (*email.mutable_fields())["key"] = StringValue(key);
  const std::string text = ToJson(email) + "\n";
  const int fd = open(outbox.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    std::abort();
  close(fd);
}

class ConformanceWorker {
 public:
  explicit ConformanceWorker(Flags flags) : flags_(std::move(flags)), events_(flags_.events) {}

  Events& events() { return events_; }

  // The handler registered for `queue`: does what the job's payload says.
  absl::Status Handle(const std::string& queue, JobContext& job) {
    events_.WriteForJob("start", job, {{"queue", job.queue()}, {"handler", queue}});
    Struct payload;
    if (!google::protobuf::util::JsonStringToMessage(job.payload(), &payload).ok())
      return jobbroker::client::PermanentError("the payload is not a JSON object");
    const auto& p = payload.fields();
    auto number = [&p](const std::string& key) {
      auto it = p.find(key);
      return it == p.end() ? 0.0 : it->second.number_value();
    };
    auto text = [&p](const std::string& key) {
      auto it = p.find(key);
      return it == p.end() ? std::string() : it->second.string_value();
    };
    const std::string action = text("action");
    const bool before_ok_attempt =
        !p.contains("ok_from_attempt") || job.attempt() < number("ok_from_attempt");
    auto ok = [&] {
      Struct result;
      (*result.mutable_fields())["queue"] = StringValue(queue);
      Value echo;
      echo.set_null_value(google::protobuf::NULL_VALUE);
      if (auto it = p.find("echo"); it != p.end()) echo = it->second;
      (*result.mutable_fields())["echo"] = echo;
      job.SetResult(ToJson(result));
      events_.WriteForJob("done", job);
      return absl::OkStatus();
    };
    auto end_cancelled = [&] {
      events_.WriteForJob("cancelled", job);
      return absl::CancelledError("cancelled");
    };

    if (action == "ok") return ok();
    if (action == "sleep") {
      if (job.WaitCancelled(absl::Milliseconds(number("ms")))) return end_cancelled();
      return ok();
    }
    if (action == "wait_cancel") {
      if (!before_ok_attempt) return ok();
      while (!job.WaitCancelled(absl::Hours(1))) {
      }
      if (text("after_cancel") == "return") {  // the work was done: its ack completes the job
        events_.WriteForJob("cancelled", job);
        return ok();
      }
      return end_cancelled();
    }
    if (action == "ignore_cancel") {
      // A handler stuck in a blocking call: it does not look at its cancellation.
      if (before_ok_attempt) absl::SleepFor(absl::Milliseconds(number("ms")));
      return ok();
    }
    if (action == "fail") {
      if (before_ok_attempt) return absl::UnknownError(text("message"));
      return ok();
    }
    if (action == "permanent") return jobbroker::client::PermanentError(text("message"));
    if (action == "retry_after") {
      if (job.attempt() == 1)
        return jobbroker::client::RetryAfter(absl::Milliseconds(number("ms")), text("message"));
      return ok();
    }
    if (action == "snooze") {
      if (FirstSight(job.job_id()))
        return jobbroker::client::Snooze(absl::Milliseconds(number("ms")));
      return ok();
    }
    if (action == "progress") {
      Struct progress;
      (*progress.mutable_fields())["percent"] = NumberValue(number("percent"));
      job.SetProgress(ToJson(progress));
      while (access(text("gate").c_str(), F_OK) != 0) {
        if (job.WaitCancelled(absl::Milliseconds(20))) return end_cancelled();
      }
      return ok();
    }
    if (action == "steps") return RunSteps(job, p.at("steps").list_value());
    if (action == "signup") {
      const std::string user = text("user");
      const std::string key = flags_.idempotent ? job.idempotency_key()
                                                : absl::StrCat(job.job_id(), "/", job.attempt());
      SendEmail(flags_.outbox, user, key, flags_.idempotent);
      if (user == flags_.die_after_user) Die();
      return ok();
    }
    return jobbroker::client::PermanentError(absl::StrCat("unknown action \"", action, "\""));
  }

 private:
  // One durable step per name; the job's result is the object of their results by name.
  absl::Status RunSteps(JobContext& job, const google::protobuf::ListValue& names) {
    std::string result = "{";
    for (const Value& name_value : names.values()) {
      const std::string& name = name_value.string_value();
      absl::StatusOr<std::string> step = job.Step(name, [&]() -> absl::StatusOr<std::string> {
        events_.WriteForJob("step", job, {{"step", name}});
        if (name == flags_.die_at_step) Die();
        Struct value;
        (*value.mutable_fields())["by"] = StringValue(flags_.lang_name);
        (*value.mutable_fields())["step"] = StringValue(name);
        return ToJson(value);
      });
      if (!step.ok()) {
        if (job.cancelled()) events_.WriteForJob("cancelled", job);
        return step.status();
      }
      if (result.size() > 1) result += ",";
      absl::StrAppend(&result, ToJson(StringValue(name)), ":", *step);
    }
    result += "}";
    job.SetResult(result);
    events_.WriteForJob("done", job);
    return absl::OkStatus();
  }

  // True the first time this process sees `job_id` (the snooze action snoozes once).
  bool FirstSight(const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    return snoozed_.insert(job_id).second;
  }

  const Flags flags_;
  Events events_;
  absl::Mutex mu_;
  std::set<std::string> snoozed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "interop_conformance_worker: " << flags.status().message() << "\n";
    return 2;
  }
  // SIGTERM and SIGINT start the graceful stop. They are blocked in every thread (the worker's
  // threads inherit the mask) and taken by one thread with sigwait, which may call Stop.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // The connection goes through the library's client options, as a user's program sets them.
  jobbroker::client::ClientOptions connection{.address = flags->address, .token = flags->token};
  if (!flags->ca.empty() || !flags->cert.empty()) {
    absl::StatusOr<jobbroker::client::TlsOptions> tls =
        jobbroker::client::ReadTlsFiles(flags->ca, flags->cert, flags->key);
    if (!tls.ok()) {
      std::cerr << "interop_conformance_worker: " << tls.status().message() << "\n";
      return 2;
    }
    connection.tls = *std::move(tls);
  }
  ConformanceWorker conformance(*flags);
  jobbroker::client::Worker worker(connection,
                                   {
                                       .concurrency = flags->concurrency,
                                       .prefetch = flags->prefetch,
                                       .lease_duration = absl::Milliseconds(flags->lease_ms),
                                   });
  for (const std::string& queue : flags->queues) {
    worker.Handle(
        queue, [&conformance, queue](JobContext& job) { return conformance.Handle(queue, job); });
  }
  // Stop returns once the worker stopped, and Run returns then too; joining this thread before
  // `worker` goes away keeps Stop's last steps off a destroyed worker.
  std::thread stopper([&worker, &stop_signals, grace = absl::Milliseconds(flags->grace_ms)] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    worker.Stop(grace);
  });
  conformance.events().Write("ready");
  if (absl::Status ended = worker.Run(); !ended.ok()) {
    std::cerr << "interop_conformance_worker: " << ended << "\n";
    std::_Exit(1);  // `stopper` still waits for a signal that will not come
  }
  stopper.join();
  conformance.events().Write("stopped");
  return 0;
}
