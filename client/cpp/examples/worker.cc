// A complete worker over TLS with a token, configured by the environment: it works the queue
// named by its argument (default "emails") until SIGTERM or Ctrl-C.
//
//   JOBBROKER_ADDRESS  the broker, or nodes of one cluster as "h1:p1,h2:p2" (default
//   127.0.0.1:7070) JOBBROKER_TOKEN    the bearer token (a broker started with --auth-tokens)
//   JOBBROKER_CA       the CA file that signed the broker's certificate; unset: plaintext
#include "jobbroker/worker.h"

#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  const std::string queue = argc > 1 ? argv[1] : "emails";
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before the worker starts its threads

  jobbroker::client::ClientOptions options;  // address and token: from the environment
  if (const char* ca = std::getenv("JOBBROKER_CA"); ca != nullptr && *ca != '\0') {
    absl::StatusOr<jobbroker::client::TlsOptions> tls = jobbroker::client::ReadTlsFiles(ca, "", "");
    if (!tls.ok()) return std::cerr << tls.status() << "\n", 1;
    options.tls = *std::move(tls);
  }
  jobbroker::client::Worker worker(options, {.concurrency = 4});
  worker.Handle(queue, [](jobbroker::client::JobContext& job) {
    if (job.payload().find('@') == std::string::npos)
      return jobbroker::client::PermanentError("not an address: " + job.payload());
    // A real provider call goes here, with job.idempotency_key() (the same on every attempt);
    // an error returned is retried with backoff.
    std::cout << "sent " << job.job_id() << " to " << job.payload() << std::endl;
    job.SetResult("sent");
    return absl::OkStatus();
  });
  if (absl::Status s = worker.Start(); !s.ok()) return std::cerr << s << "\n", 1;
  std::cout << jobbroker::client::kClientName << " working " << queue << std::endl;
  int sig;
  sigwait(&stop, &sig);
  worker.Stop();  // finishes running jobs, gives back the rest
}
