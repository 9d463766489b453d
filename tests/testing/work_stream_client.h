#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "jobbroker/v1/broker.grpc.pb.h"

namespace jobbroker::testing {

// A raw Broker.Work stream for tests: a reader thread queues every message the broker sends,
// so a test can wait for the next one of a kind. Sends are serialised. Cancel() breaks the
// stream the way a dying worker would.
class WorkStreamClient {
 public:
  explicit WorkStreamClient(jobbroker::v1::Broker::Stub& stub);
  ~WorkStreamClient();

  // Sends a request with a fresh request_id (returned).
  uint64_t Send(jobbroker::v1::WorkRequest request);
  // Subscribes and waits for the answer; returns its code.
  grpc::StatusCode Subscribe(const std::vector<std::string>& queues, int max_in_flight,
                             absl::Duration lease_duration = absl::ZeroDuration(),
                             const std::string& worker_id = "stream-worker",
                             bool batch_pushes = false);
  // Sends `request` and waits for its WorkResult (other messages stay queued).
  jobbroker::v1::WorkResult Call(jobbroker::v1::WorkRequest request);
  grpc::StatusCode Ack(const jobbroker::v1::LeasedJob& job);
  grpc::StatusCode Flow(int max_in_flight);

  // The next pushed job / lost lease / cancel notice, waiting up to `timeout`.
  std::optional<jobbroker::v1::LeasedJob> NextJob(absl::Duration timeout = absl::Seconds(10));
  std::optional<std::string> NextLeaseLost(absl::Duration timeout = absl::Seconds(10));
  // The whole LeaseLost message (with why the lease ended); its own queue, apart from
  // NextLeaseLost's.
  std::optional<jobbroker::v1::LeaseLost> NextLeaseLostNotice(
      absl::Duration timeout = absl::Seconds(10));
  std::optional<std::string> NextCancel(absl::Duration timeout = absl::Seconds(10));
  // Jobs received so far and not yet taken by NextJob.
  size_t pending_jobs();
  // Messages that carried pushed jobs (a job or a job_batch), and how many were job_batches.
  size_t job_messages();
  size_t job_batches();

  // Whether the broker ended the stream (the reader saw its end); Close() then gives its status.
  bool ended();
  // Breaks the stream (client-side cancel), as a crashed worker's connection would.
  void Cancel();
  // Half-closes and waits for the broker to finish the stream; its status.
  grpc::Status Close();

 private:
  void ReadLoop();

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<jobbroker::v1::WorkRequest, jobbroker::v1::WorkResponse>>
      stream_;
  std::thread reader_;
  absl::Mutex write_mu_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(write_mu_) = 1;
  std::deque<jobbroker::v1::LeasedJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> lost_ ABSL_GUARDED_BY(mu_);
  std::deque<jobbroker::v1::LeaseLost> lost_notices_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> cancels_ ABSL_GUARDED_BY(mu_);
  std::deque<jobbroker::v1::WorkResult> results_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  size_t job_messages_ ABSL_GUARDED_BY(mu_) = 0;
  size_t job_batches_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ = false;
};

}  // namespace jobbroker::testing
