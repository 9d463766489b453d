// How long the store's job record takes to encode: storage::EncodeJob, which writes JobRecord's
// wire format itself, next to the same bytes written by protobuf from a message built field by
// field (the encoder before issue 23; tests/storage/reference_job_encoder.h), and to decode
// (storage::DecodeJob). Every put of a job is encoded once, and a job is put at its enqueue, its
// lease and its ack.
//
//   build/bench/jobbroker-codec-bench [--rounds 5] [--encodes 1000000]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/job.h"
#include "storage/record_codec.h"
#include "tests/storage/reference_job_encoder.h"

namespace {

using jobbroker::core::AttemptOutcome;
using jobbroker::core::Job;
using jobbroker::core::JobState;

// A job as an ack writes it: one attempt, completed, a 100-byte payload (bench/peers' size).
Job AckedJob() {
  const absl::Time now = absl::Now();
  Job j;
  j.id = "01M936J95P004A9Q17NSMNFJGD";
  j.queue = "bench-queue";
  j.state = JobState::kCompleted;
  j.payload = std::string(100, 'x');
  j.seq = 123456;
  j.attempt = 1;
  j.max_attempts = 5;
  j.created_at = now;
  j.run_at = now;
  j.lease_duration = absl::Seconds(30);
  j.lease_id = "01M936J95P004A9Q17NSMNFJGE";
  j.worker_id = "worker-1";
  j.lease_deadline = now + absl::Seconds(30);
  j.lease_length = absl::Seconds(30);
  j.completed_at = now;
  j.attempts.push_back({1, "worker-1", now, now, AttemptOutcome::kCompleted, ""});
  return j;
}

// Nanoseconds per call of `f` over `n` calls; `sink` keeps the work from being optimised away.
template <typename F>
double NanosPerCall(int n, size_t& sink, F f) {
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) sink += f();
  return absl::ToDoubleNanoseconds(absl::Now() - start) / n;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  int encodes = 1000000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--encodes") == 0) encodes = std::atoi(argv[i + 1]);
  }
  if (rounds < 1 || encodes < 1) {
    std::fprintf(stderr, "usage: jobbroker-codec-bench [--rounds N] [--encodes N]\n");
    return 2;
  }
  const Job job = AckedJob();
  const std::string bytes = jobbroker::storage::EncodeJob(job);
  if (bytes != jobbroker::storage::ReferenceEncode(job)) {
    std::fprintf(stderr, "EncodeJob and protobuf disagree\n");
    return 1;
  }
  std::printf("job record of an acked job: %zu bytes; ns per call, %d calls a round\n",
              bytes.size(), encodes);
  std::printf("%-6s %14s %14s %8s %14s\n", "round", "protobuf", "EncodeJob", "ratio", "DecodeJob");
  size_t sink = 0;
  for (int round = 1; round <= rounds; ++round) {
    const double reference = NanosPerCall(
        encodes, sink, [&] { return jobbroker::storage::ReferenceEncode(job).size(); });
    const double direct =
        NanosPerCall(encodes, sink, [&] { return jobbroker::storage::EncodeJob(job).size(); });
    const double decode = NanosPerCall(
        encodes, sink, [&] { return jobbroker::storage::DecodeJob(bytes)->payload.size(); });
    std::printf("%-6d %14.1f %14.1f %7.2fx %14.1f\n", round, reference, direct, reference / direct,
                decode);
  }
  return sink == 0 ? 1 : 0;
}
