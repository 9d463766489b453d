#pragma once

#include <google/protobuf/duration.pb.h>
#include <google/protobuf/timestamp.pb.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "jobbroker/proto_time.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::testing {

// Short names for the client library's time conversions, used all over the tests.
inline google::protobuf::Duration ToProto(absl::Duration d) { return client::ToProtoDuration(d); }
inline google::protobuf::Timestamp ToProtoTime(absl::Time t) { return client::ToProtoTimestamp(t); }
inline absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return client::FromProtoTimestamp(t);
}
inline absl::Duration FromProto(const google::protobuf::Duration& d) {
  return client::FromProtoDuration(d);
}

// "NOT_FOUND" etc., for failure messages.
std::string CodeName(grpc::StatusCode code);

// The Broker and Admin APIs with a deadline on every call, so a hung broker fails a test instead
// of stalling it until the ctest timeout. Thread-safe (the stubs are).
//
// The Raw calls return the status as is. The Must/convenience calls record a GoogleTest failure
// (ADD_FAILURE) when the call fails, and return an empty value then.
class BrokerClient {
 public:
  explicit BrokerClient(std::shared_ptr<grpc::Channel> channel,
                        absl::Duration call_timeout = absl::Seconds(30));

  grpc::Status Enqueue(const jobbroker::v1::EnqueueRequest& req,
                       jobbroker::v1::EnqueueResponse* resp);
  grpc::Status EnqueueBatch(const jobbroker::v1::EnqueueBatchRequest& req,
                            jobbroker::v1::EnqueueBatchResponse* resp);
  // The deadline covers req.wait on top of the call timeout.
  grpc::Status Lease(const jobbroker::v1::LeaseRequest& req, jobbroker::v1::LeaseResponse* resp);
  grpc::Status Heartbeat(const jobbroker::v1::HeartbeatRequest& req,
                         jobbroker::v1::HeartbeatResponse* resp);
  grpc::Status Ack(const jobbroker::v1::AckRequest& req);
  grpc::Status Fail(const jobbroker::v1::FailRequest& req, jobbroker::v1::FailResponse* resp);
  grpc::Status Release(const jobbroker::v1::ReleaseRequest& req);

  grpc::Status GetJob(const std::string& job_id, jobbroker::v1::Job* job);
  grpc::Status ListJobs(const jobbroker::v1::ListJobsRequest& req,
                        jobbroker::v1::ListJobsResponse* resp);
  grpc::Status GetQueue(const std::string& queue, jobbroker::v1::QueueInfo* info);
  grpc::Status UpdateQueuePolicy(const jobbroker::v1::UpdateQueuePolicyRequest& req,
                                 jobbroker::v1::QueueInfo* info);
  grpc::Status CancelJob(const std::string& job_id, jobbroker::v1::Job* job);
  grpc::Status RetryJob(const jobbroker::v1::RetryJobRequest& req,
                        jobbroker::v1::RetryJobResponse* resp);
  grpc::Status DeleteJob(const std::string& job_id);
  grpc::Status PauseQueue(const std::string& queue, jobbroker::v1::QueueInfo* info);
  grpc::Status ResumeQueue(const std::string& queue, jobbroker::v1::QueueInfo* info);
  grpc::Status PurgeQueue(const jobbroker::v1::PurgeQueueRequest& req,
                          jobbroker::v1::PurgeQueueResponse* resp);

  // Enqueues `payload` on `queue`; returns the job id.
  std::string MustEnqueue(const std::string& queue, const std::string& payload = "payload");
  // Enqueues `req`; returns the job id.
  std::string MustEnqueue(const jobbroker::v1::EnqueueRequest& req);
  // Leases up to `max_jobs` jobs. Zero durations are left unset (no wait; the default lease).
  std::vector<jobbroker::v1::LeasedJob> MustLease(
      const std::string& queue, const std::string& worker_id, int max_jobs = 1,
      absl::Duration wait = absl::ZeroDuration(),
      absl::Duration lease_duration = absl::ZeroDuration());
  // One job, or nullopt if none was ready within `wait`.
  std::optional<jobbroker::v1::LeasedJob> LeaseOne(
      const std::string& queue, const std::string& worker_id,
      absl::Duration wait = absl::ZeroDuration(),
      absl::Duration lease_duration = absl::ZeroDuration());
  void MustAck(const jobbroker::v1::LeasedJob& job, const std::string& result = "");
  jobbroker::v1::Job MustGetJob(const std::string& job_id);
  // Counts by state name of `queue`; empty if the queue does not exist (NOT_FOUND).
  std::map<std::string, int64_t> Counts(const std::string& queue);
  // Every job of `queue` in `state` (UNSPECIFIED = all), oldest first, following page tokens.
  std::vector<jobbroker::v1::Job> ListAll(
      const std::string& queue,
      jobbroker::v1::JobState state = jobbroker::v1::JOB_STATE_UNSPECIFIED, int page_size = 100);

  jobbroker::v1::Broker::Stub& broker() { return *broker_; }
  jobbroker::v1::Admin::Stub& admin() { return *admin_; }

 private:
  void SetDeadline(grpc::ClientContext* ctx, absl::Duration extra = absl::ZeroDuration()) const;

  const absl::Duration call_timeout_;
  std::unique_ptr<jobbroker::v1::Broker::Stub> broker_;
  std::unique_ptr<jobbroker::v1::Admin::Stub> admin_;
};

// Polls `done` every 20 ms until it is true or `timeout` passes; returns its last value. Only for
// waiting on wall-clock events (lease expiry) that no RPC can wait for.
bool PollUntil(const std::function<bool()>& done, absl::Duration timeout);

}  // namespace jobbroker::testing

namespace jobbroker::v1 {

// GoogleTest prints these in failure messages. Without these overloads it takes its generic
// protobuf printer, which GCC 12 miscompiles into a -Werror=restrict false positive; these also
// print one line and cut huge payloads short.
void PrintTo(const Job& job, std::ostream* os);
void PrintTo(const LeasedJob& job, std::ostream* os);
void PrintTo(const AttemptRecord& record, std::ostream* os);
void PrintTo(const EnqueueResponse& resp, std::ostream* os);
void PrintTo(const QueueInfo& info, std::ostream* os);

}  // namespace jobbroker::v1
