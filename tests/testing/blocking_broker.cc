#include "tests/testing/blocking_broker.h"

namespace jobbroker::testing {

absl::StatusOr<std::unique_ptr<BlockingBroker>> BlockingBroker::Open(Store& store,
                                                                     const Clock& clock,
                                                                     BrokerOptions options) {
  absl::StatusOr<std::unique_ptr<Broker>> opened = Broker::Open(store, clock, std::move(options));
  if (!opened.ok()) return opened.status();
  return std::make_unique<BlockingBroker>(*std::move(opened));
}

absl::StatusOr<EnqueueResult> BlockingBroker::Enqueue(EnqueueSpec spec) {
  std::vector<EnqueueSpec> one;
  one.push_back(std::move(spec));
  absl::StatusOr<std::vector<EnqueueResult>> r = EnqueueBatch(std::move(one));
  if (!r.ok()) return r.status();
  return std::move(r->front());
}

absl::StatusOr<std::vector<EnqueueResult>> BlockingBroker::EnqueueBatch(
    std::vector<EnqueueSpec> specs) {
  using R = absl::StatusOr<std::vector<EnqueueResult>>;
  return Await<R>([&](Done<R> d) { broker_->EnqueueBatch(std::move(specs), std::move(d)); });
}

absl::StatusOr<std::vector<LeasedJob>> BlockingBroker::Lease(LeaseSpec spec) {
  using R = absl::StatusOr<std::vector<LeasedJob>>;
  return Await<R>(
      [&](Done<R> d) { broker_->Lease(std::move(spec), absl::ZeroDuration(), std::move(d)); });
}

absl::StatusOr<HeartbeatResult> BlockingBroker::Heartbeat(HeartbeatSpec spec) {
  using R = absl::StatusOr<HeartbeatResult>;
  return Await<R>([&](Done<R> d) { broker_->Heartbeat(std::move(spec), std::move(d)); });
}

absl::Status BlockingBroker::Ack(AckSpec spec) {
  return Await<absl::Status>(
      [&](Done<absl::Status> d) { broker_->Ack(std::move(spec), std::move(d)); });
}

absl::StatusOr<std::vector<absl::Status>> BlockingBroker::AckBatch(std::vector<AckSpec> specs) {
  using R = absl::StatusOr<std::vector<absl::Status>>;
  return Await<R>([&](Done<R> d) { broker_->AckBatch(std::move(specs), std::move(d)); });
}

absl::StatusOr<FailResult> BlockingBroker::Fail(FailSpec spec) {
  using R = absl::StatusOr<FailResult>;
  return Await<R>([&](Done<R> d) { broker_->Fail(std::move(spec), std::move(d)); });
}

absl::Status BlockingBroker::Release(ReleaseSpec spec) {
  return Await<absl::Status>(
      [&](Done<absl::Status> d) { broker_->Release(std::move(spec), std::move(d)); });
}

absl::StatusOr<Job> BlockingBroker::CancelJob(std::string job_id) {
  using R = absl::StatusOr<Job>;
  return Await<R>([&](Done<R> d) { broker_->CancelJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<QueueInfo> BlockingBroker::UpdateQueuePolicy(std::string queue,
                                                            PolicyOverride policy, bool reset) {
  using R = absl::StatusOr<QueueInfo>;
  return Await<R>([&](Done<R> d) {
    broker_->UpdateQueuePolicy(std::move(queue), std::move(policy), reset, std::move(d));
  });
}

absl::StatusOr<Job> BlockingBroker::RetryJob(std::string job_id) {
  using R = absl::StatusOr<Job>;
  return Await<R>([&](Done<R> d) { broker_->RetryJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<RetryJobsResult> BlockingBroker::RetryJobs(RetryJobsSpec spec) {
  using R = absl::StatusOr<RetryJobsResult>;
  return Await<R>([&](Done<R> d) { broker_->RetryJobs(std::move(spec), std::move(d)); });
}

absl::Status BlockingBroker::DeleteJob(std::string job_id) {
  return Await<absl::Status>(
      [&](Done<absl::Status> d) { broker_->DeleteJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<QueueInfo> BlockingBroker::SetQueuePaused(std::string queue, bool paused) {
  using R = absl::StatusOr<QueueInfo>;
  return Await<R>(
      [&](Done<R> d) { broker_->SetQueuePaused(std::move(queue), paused, std::move(d)); });
}

absl::StatusOr<int64_t> BlockingBroker::PurgeQueue(std::string queue,
                                                   std::vector<JobState> states) {
  using R = absl::StatusOr<int64_t>;
  return Await<R>(
      [&](Done<R> d) { broker_->PurgeQueue(std::move(queue), std::move(states), std::move(d)); });
}

}  // namespace jobbroker::testing
