// A complete worker: welcome emails, four at a time, until SIGTERM or Ctrl-C.
#include <signal.h>

#include <iostream>

#include "jobbroker/worker.h"

absl::Status SendEmail(const std::string& to, const std::string& idempotency_key) {
  std::cout << "email to " << to << " (key " << idempotency_key << ")" << std::endl;
  return absl::OkStatus();  // a real provider call; an error here is retried with backoff
}

int main() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before the worker starts its threads
  jobbroker::client::Worker worker({.concurrency = 4});
  worker.Handle("emails", [](jobbroker::client::JobContext& job) {
    if (job.payload().find('@') == std::string::npos)
      return jobbroker::client::PermanentError("not an address: " + job.payload());
    return SendEmail(job.payload(), job.idempotency_key());  // same key on every attempt
  });
  if (absl::Status s = worker.Start(); !s.ok()) return std::cerr << s << "\n", 1;
  int sig;
  sigwait(&stop, &sig);
  worker.Stop();  // finishes running jobs, gives back the rest
}
