// signup_worker: sends each new user a welcome email, through a fake email provider that
// appends to a file. The kill test (tests/e2e/kill_test.cc) runs two of these; the first dies
// with SIGKILL right after "sending" one email and before acking it, which is exactly the
// crash a durable broker exists for.
//
//   signup_worker --address HOST:PORT --outbox FILE [--die-after USER] [--idempotent]
//
// With --idempotent the worker passes the job's idempotency_key to the provider, and the
// provider skips keys it has seen: the retried job does not email the user twice.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "jobbroker/worker.h"

namespace {

// The fake provider: one line per email sent. flock keeps two worker processes from
// interleaving, as a real provider's own consistency would.
absl::Status SendWelcomeEmail(const std::string& outbox, const std::string& user,
                              const std::string& idempotency_key, bool provider_dedups) {
  int fd = open(outbox.c_str(), O_RDWR | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return absl::UnavailableError(std::strerror(errno));
  flock(fd, LOCK_EX);
  std::string seen;
  char buf[4096];
  lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) seen.append(buf, n);
  std::string tag = " key=" + idempotency_key + "\n";
  bool duplicate = provider_dedups && seen.find(tag) != std::string::npos;
  if (!duplicate) {
    std::string line = user + tag;
    if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      close(fd);
      return absl::UnavailableError("short write to the outbox");
    }
  }
  close(fd);  // also drops the lock
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:7070", outbox, die_after;
  bool idempotent = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--idempotent") {
      idempotent = true;
    } else if (i + 1 < argc && arg == "--address") {
      address = argv[++i];
    } else if (i + 1 < argc && arg == "--outbox") {
      outbox = argv[++i];
    } else if (i + 1 < argc && arg == "--die-after") {
      die_after = argv[++i];
    } else {
      std::cerr << "usage: signup_worker --address HOST:PORT --outbox FILE [--die-after USER]"
                   " [--idempotent]\n";
      return 2;
    }
  }
  if (outbox.empty()) {
    std::cerr << "signup_worker: --outbox is required\n";
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  jobbroker::client::Worker worker(
      {.address = address, .concurrency = 1, .lease_duration = absl::Seconds(1)});
  worker.Handle("signups", [&](jobbroker::client::JobContext& job) {
    // Without --idempotent the provider is handed no usable key: every call sends.
    std::string key =
        idempotent ? job.idempotency_key() : job.job_id() + "/" + std::to_string(job.attempt());
    absl::Status sent = SendWelcomeEmail(outbox, job.payload(), key, idempotent);
    if (sent.ok() && job.payload() == die_after) raise(SIGKILL);  // after the email, before the ack
    return sent;
  });
  if (absl::Status s = worker.Start(); !s.ok()) {
    std::cerr << "signup_worker: " << s << "\n";
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  worker.Stop(absl::Seconds(5));
  return 0;
}
