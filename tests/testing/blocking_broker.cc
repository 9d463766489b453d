#include "tests/testing/blocking_broker.h"

namespace jobbroker::testing {

absl::StatusOr<std::unique_ptr<BlockingBroker>> BlockingBroker::Open(core::Store& store,
                                                                     const core::Clock& clock,
                                                                     core::BrokerOptions options) {
  absl::StatusOr<std::unique_ptr<core::Broker>> opened =
      core::Broker::Open(store, clock, std::move(options));
  if (!opened.ok()) return opened.status();
  return std::make_unique<BlockingBroker>(*std::move(opened));
}

absl::StatusOr<core::EnqueueResult> BlockingBroker::Enqueue(core::EnqueueSpec spec) {
  std::vector<core::EnqueueSpec> one;
  one.push_back(std::move(spec));
  absl::StatusOr<std::vector<core::EnqueueResult>> r = EnqueueBatch(std::move(one));
  if (!r.ok()) return r.status();
  return std::move(r->front());
}

absl::StatusOr<std::vector<core::EnqueueResult>> BlockingBroker::EnqueueBatch(
    std::vector<core::EnqueueSpec> specs) {
  using R = absl::StatusOr<std::vector<core::EnqueueResult>>;
  return Await<R>([&](core::Done<R> d) { broker_->EnqueueBatch(std::move(specs), std::move(d)); });
}

absl::StatusOr<std::vector<core::LeasedJob>> BlockingBroker::Lease(core::LeaseSpec spec) {
  using R = absl::StatusOr<std::vector<core::LeasedJob>>;
  return Await<R>([&](core::Done<R> d) {
    broker_->Lease(std::move(spec), absl::ZeroDuration(), std::move(d));
  });
}

absl::StatusOr<core::HeartbeatResult> BlockingBroker::Heartbeat(core::HeartbeatSpec spec) {
  using R = absl::StatusOr<core::HeartbeatResult>;
  return Await<R>([&](core::Done<R> d) { broker_->Heartbeat(std::move(spec), std::move(d)); });
}

absl::Status BlockingBroker::Ack(core::AckSpec spec) {
  return Await<absl::Status>(
      [&](core::Done<absl::Status> d) { broker_->Ack(std::move(spec), std::move(d)); });
}

absl::StatusOr<std::vector<absl::Status>> BlockingBroker::AckBatch(
    std::vector<core::AckSpec> specs) {
  using R = absl::StatusOr<std::vector<absl::Status>>;
  return Await<R>([&](core::Done<R> d) { broker_->AckBatch(std::move(specs), std::move(d)); });
}

absl::StatusOr<core::FailResult> BlockingBroker::Fail(core::FailSpec spec) {
  using R = absl::StatusOr<core::FailResult>;
  return Await<R>([&](core::Done<R> d) { broker_->Fail(std::move(spec), std::move(d)); });
}

absl::Status BlockingBroker::Release(core::ReleaseSpec spec) {
  return Await<absl::Status>(
      [&](core::Done<absl::Status> d) { broker_->Release(std::move(spec), std::move(d)); });
}

absl::StatusOr<core::Job> BlockingBroker::CancelJob(std::string job_id) {
  using R = absl::StatusOr<core::Job>;
  return Await<R>([&](core::Done<R> d) { broker_->CancelJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<core::QueueInfo> BlockingBroker::UpdateQueuePolicy(std::string queue,
                                                                  core::PolicyOverride policy,
                                                                  bool reset) {
  using R = absl::StatusOr<core::QueueInfo>;
  return Await<R>([&](core::Done<R> d) {
    broker_->UpdateQueuePolicy(std::move(queue), std::move(policy), reset, std::move(d));
  });
}

absl::StatusOr<core::Job> BlockingBroker::RetryJob(std::string job_id) {
  using R = absl::StatusOr<core::Job>;
  return Await<R>([&](core::Done<R> d) { broker_->RetryJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<core::RetryJobsResult> BlockingBroker::RetryJobs(core::RetryJobsSpec spec) {
  using R = absl::StatusOr<core::RetryJobsResult>;
  return Await<R>([&](core::Done<R> d) { broker_->RetryJobs(std::move(spec), std::move(d)); });
}

absl::Status BlockingBroker::DeleteJob(std::string job_id) {
  return Await<absl::Status>(
      [&](core::Done<absl::Status> d) { broker_->DeleteJob(std::move(job_id), std::move(d)); });
}

absl::StatusOr<core::QueueInfo> BlockingBroker::SetQueuePaused(std::string queue, bool paused) {
  using R = absl::StatusOr<core::QueueInfo>;
  return Await<R>(
      [&](core::Done<R> d) { broker_->SetQueuePaused(std::move(queue), paused, std::move(d)); });
}

absl::StatusOr<int64_t> BlockingBroker::PurgeQueue(std::string queue,
                                                   std::vector<core::JobState> states) {
  using R = absl::StatusOr<int64_t>;
  return Await<R>([&](core::Done<R> d) {
    broker_->PurgeQueue(std::move(queue), std::move(states), std::move(d));
  });
}

}  // namespace jobbroker::testing
