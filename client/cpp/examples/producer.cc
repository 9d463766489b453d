// A complete producer over TLS with a token, configured by the environment like
// examples/worker.cc (JOBBROKER_ADDRESS, JOBBROKER_TOKEN, JOBBROKER_CA): enqueues PAYLOAD on
// QUEUE (default "emails") and prints the job's id.
#include <cstdlib>
#include <iostream>
#include <string>

#include "jobbroker/client.h"

int main(int argc, char** argv) {
  const std::string queue = argc > 1 ? argv[1] : "emails";
  const std::string payload = argc > 2 ? argv[2] : "ada@example.com";
  jobbroker::client::ClientOptions options;  // address and token: from the environment
  if (const char* ca = std::getenv("JOBBROKER_CA"); ca != nullptr && *ca != '\0') {
    absl::StatusOr<jobbroker::client::TlsOptions> tls = jobbroker::client::ReadTlsFiles(ca, "", "");
    if (!tls.ok()) return std::cerr << tls.status() << "\n", 1;
    options.tls = *std::move(tls);
  }
  jobbroker::client::Client client(options);
  // The dedup key makes the call safe to retry: a repeat returns the first job.
  absl::StatusOr<jobbroker::client::Enqueued> job =
      client.Enqueue(queue, payload, {.dedup_key = "welcome-" + payload});
  if (!job.ok()) return std::cerr << job.status() << "\n", 1;
  std::cout << job->job_id << "\n";
}
