#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "core/broker.h"

namespace jobbroker::testing {

// Runs an asynchronous operation and blocks for its answer.
template <typename T, typename Start>
T Await(Start start) {
  absl::Notification ready;
  std::optional<T> out;
  start([&](T value) {
    out.emplace(std::move(value));
    ready.Notify();
  });
  ready.WaitForNotification();
  return std::move(*out);
}

// A Broker (or node::Partitions, which has the same API) with blocking forms of its changes,
// for tests and the fuzzers: each waits until the change is durable (or refused) and returns its
// answer. Every other method is passed through, so a test reads `broker->Enqueue(spec)`
// whichever it calls. Owns the engine.
template <typename Engine>
class BlockingEngine {
 public:
  explicit BlockingEngine(std::unique_ptr<Engine> broker) : broker_(std::move(broker)) {}
  // Engine::Open(args...), wrapped.
  template <typename... Args>
  static absl::StatusOr<std::unique_ptr<BlockingEngine>> Open(Args&&... args) {
    absl::StatusOr<std::unique_ptr<Engine>> opened = Engine::Open(std::forward<Args>(args)...);
    if (!opened.ok()) return opened.status();
    return std::make_unique<BlockingEngine>(*std::move(opened));
  }

  Engine& broker() { return *broker_; }

  // Blocking forms.
  absl::StatusOr<core::EnqueueResult> Enqueue(core::EnqueueSpec spec);
  absl::StatusOr<std::vector<core::EnqueueResult>> EnqueueBatch(
      std::vector<core::EnqueueSpec> specs);
  absl::StatusOr<std::vector<core::LeasedJob>> Lease(core::LeaseSpec spec);
  absl::StatusOr<core::HeartbeatResult> Heartbeat(core::HeartbeatSpec spec);
  absl::Status Ack(core::AckSpec spec);
  absl::StatusOr<std::vector<absl::Status>> AckBatch(std::vector<core::AckSpec> specs);
  absl::StatusOr<core::FailResult> Fail(core::FailSpec spec);
  absl::Status Release(core::ReleaseSpec spec);
  absl::StatusOr<core::Job> CancelJob(std::string job_id);
  absl::StatusOr<core::QueueInfo> UpdateQueuePolicy(std::string queue, core::PolicyOverride policy,
                                                    bool reset = false);
  absl::StatusOr<core::Job> RetryJob(std::string job_id);
  absl::StatusOr<core::RetryJobsResult> RetryJobs(core::RetryJobsSpec spec);
  absl::Status DeleteJob(std::string job_id);
  absl::StatusOr<core::QueueInfo> SetQueuePaused(std::string queue, bool paused);
  absl::StatusOr<int64_t> PurgeQueue(std::string queue, std::vector<core::JobState> states = {});
  absl::StatusOr<core::ScheduleInfo> PutSchedule(core::Schedule schedule) {
    using R = absl::StatusOr<core::ScheduleInfo>;
    return Await<R>(
        [&](core::Done<R> d) { broker_->PutSchedule(std::move(schedule), std::move(d)); });
  }
  absl::Status DeleteSchedule(std::string id) {
    return Await<absl::Status>(
        [&](core::Done<absl::Status> d) { broker_->DeleteSchedule(std::move(id), std::move(d)); });
  }
  absl::StatusOr<core::EnqueueResult> TriggerSchedule(std::string id) {
    using R = absl::StatusOr<core::EnqueueResult>;
    return Await<R>(
        [&](core::Done<R> d) { broker_->TriggerSchedule(std::move(id), std::move(d)); });
  }

  // Passed through.
  void EnqueueBatch(std::vector<core::EnqueueSpec> specs,
                    core::Done<absl::StatusOr<std::vector<core::EnqueueResult>>> done,
                    bool batch = false) {
    broker_->EnqueueBatch(std::move(specs), std::move(done), batch);
  }
  uint64_t Lease(core::LeaseSpec spec, absl::Duration wait,
                 core::Done<absl::StatusOr<std::vector<core::LeasedJob>>> done) {
    return broker_->Lease(std::move(spec), wait, std::move(done));
  }
  bool CancelWait(uint64_t waiter) { return broker_->CancelWait(waiter); }
  absl::StatusOr<uint64_t> Subscribe(core::SubscribeSpec spec,
                                     std::shared_ptr<core::StreamSink> sink) {
    return broker_->Subscribe(std::move(spec), std::move(sink));
  }
  absl::Status SetFlow(uint64_t stream, int max_in_flight) {
    return broker_->SetFlow(stream, max_in_flight);
  }
  void Unsubscribe(uint64_t stream) { broker_->Unsubscribe(stream); }
  void Heartbeat(core::HeartbeatSpec spec, core::Done<absl::StatusOr<core::HeartbeatResult>> done) {
    broker_->Heartbeat(std::move(spec), std::move(done));
  }
  void Ack(core::AckSpec spec, core::Done<absl::Status> done) {
    broker_->Ack(std::move(spec), std::move(done));
  }
  void AckBatch(std::vector<core::AckSpec> specs,
                core::Done<absl::StatusOr<std::vector<absl::Status>>> done) {
    broker_->AckBatch(std::move(specs), std::move(done));
  }
  void Fail(core::FailSpec spec, core::Done<absl::StatusOr<core::FailResult>> done) {
    broker_->Fail(std::move(spec), std::move(done));
  }
  void Release(core::ReleaseSpec spec, core::Done<absl::Status> done) {
    broker_->Release(std::move(spec), std::move(done));
  }
  void CancelJob(std::string job_id, core::Done<absl::StatusOr<core::Job>> done) {
    broker_->CancelJob(std::move(job_id), std::move(done));
  }
  void RetryJobs(core::RetryJobsSpec spec, core::Done<absl::StatusOr<core::RetryJobsResult>> done) {
    broker_->RetryJobs(std::move(spec), std::move(done));
  }
  void PurgeQueue(std::string queue, std::vector<core::JobState> states,
                  core::Done<absl::StatusOr<int64_t>> done) {
    broker_->PurgeQueue(std::move(queue), std::move(states), std::move(done));
  }
  absl::StatusOr<core::Job> GetJob(const std::string& job_id) { return broker_->GetJob(job_id); }
  absl::StatusOr<std::string> JobQueue(const std::string& job_id) {
    return broker_->JobQueue(job_id);
  }
  absl::StatusOr<core::ListJobsResult> ListJobs(const core::ListJobsSpec& spec) {
    return broker_->ListJobs(spec);
  }
  absl::StatusOr<core::QueueInfo> GetQueue(const std::string& queue) {
    return broker_->GetQueue(queue);
  }
  std::vector<core::QueueInfo> ListQueues() { return broker_->ListQueues(); }
  absl::StatusOr<core::ScheduleInfo> GetSchedule(const std::string& id) {
    return broker_->GetSchedule(id);
  }
  std::vector<core::ScheduleInfo> ListSchedules(const std::string& queue = "") {
    return broker_->ListSchedules(queue);
  }
  absl::Time Tick() { return broker_->Tick(); }
  // core::Broker only (dependencies on other partitions' jobs).
  std::vector<std::string> AwaitedRemoteJobs() { return broker_->AwaitedRemoteJobs(); }
  absl::Status SettleRemoteJobs(std::vector<core::RemoteOutcome> outcomes) {
    return Await<absl::Status>([&](core::Done<absl::Status> d) {
      broker_->SettleRemoteJobs(std::move(outcomes), std::move(d));
    });
  }
  void Shutdown() { broker_->Shutdown(); }
  absl::Status Flush() { return broker_->Flush(); }
  absl::Status ResumeWrites() { return broker_->ResumeWrites(); }
  absl::Status storage_status() const { return broker_->storage_status(); }
  int64_t corrupt_records() const { return broker_->corrupt_records(); }
  uint64_t store_writes() const { return broker_->store_writes(); }
  core::Broker::MemoryCounts memory_counts() const { return broker_->memory_counts(); }

 private:
  std::unique_ptr<Engine> broker_;
};

using BlockingBroker = BlockingEngine<core::Broker>;

template <typename Engine>
absl::StatusOr<core::EnqueueResult> BlockingEngine<Engine>::Enqueue(core::EnqueueSpec spec) {
  std::vector<core::EnqueueSpec> one;
  one.push_back(std::move(spec));
  absl::StatusOr<std::vector<core::EnqueueResult>> r = EnqueueBatch(std::move(one));
  if (!r.ok()) return r.status();
  return std::move(r->front());
}

template <typename Engine>
absl::StatusOr<std::vector<core::EnqueueResult>> BlockingEngine<Engine>::EnqueueBatch(
    std::vector<core::EnqueueSpec> specs) {
  using R = absl::StatusOr<std::vector<core::EnqueueResult>>;
  return Await<R>([&](core::Done<R> d) { broker_->EnqueueBatch(std::move(specs), std::move(d)); });
}

template <typename Engine>
absl::StatusOr<std::vector<core::LeasedJob>> BlockingEngine<Engine>::Lease(core::LeaseSpec spec) {
  using R = absl::StatusOr<std::vector<core::LeasedJob>>;
  return Await<R>([&](core::Done<R> d) {
    broker_->Lease(std::move(spec), absl::ZeroDuration(), std::move(d));
  });
}

template <typename Engine>
absl::StatusOr<core::HeartbeatResult> BlockingEngine<Engine>::Heartbeat(core::HeartbeatSpec spec) {
  using R = absl::StatusOr<core::HeartbeatResult>;
  return Await<R>([&](core::Done<R> d) { broker_->Heartbeat(std::move(spec), std::move(d)); });
}

template <typename Engine>
absl::Status BlockingEngine<Engine>::Ack(core::AckSpec spec) {
  return Await<absl::Status>(
      [&](core::Done<absl::Status> d) { broker_->Ack(std::move(spec), std::move(d)); });
}

template <typename Engine>
absl::StatusOr<std::vector<absl::Status>> BlockingEngine<Engine>::AckBatch(
    std::vector<core::AckSpec> specs) {
  using R = absl::StatusOr<std::vector<absl::Status>>;
  return Await<R>([&](core::Done<R> d) { broker_->AckBatch(std::move(specs), std::move(d)); });
}

template <typename Engine>
absl::StatusOr<core::FailResult> BlockingEngine<Engine>::Fail(core::FailSpec spec) {
  using R = absl::StatusOr<core::FailResult>;
  return Await<R>([&](core::Done<R> d) { broker_->Fail(std::move(spec), std::move(d)); });
}

template <typename Engine>
absl::Status BlockingEngine<Engine>::Release(core::ReleaseSpec spec) {
  return Await<absl::Status>(
      [&](core::Done<absl::Status> d) { broker_->Release(std::move(spec), std::move(d)); });
}

template <typename Engine>
absl::StatusOr<core::Job> BlockingEngine<Engine>::CancelJob(std::string job_id) {
  using R = absl::StatusOr<core::Job>;
  return Await<R>([&](core::Done<R> d) { broker_->CancelJob(std::move(job_id), std::move(d)); });
}

template <typename Engine>
absl::StatusOr<core::QueueInfo> BlockingEngine<Engine>::UpdateQueuePolicy(
    std::string queue, core::PolicyOverride policy, bool reset) {
  using R = absl::StatusOr<core::QueueInfo>;
  return Await<R>([&](core::Done<R> d) {
    broker_->UpdateQueuePolicy(std::move(queue), std::move(policy), reset, std::move(d));
  });
}

template <typename Engine>
absl::StatusOr<core::Job> BlockingEngine<Engine>::RetryJob(std::string job_id) {
  using R = absl::StatusOr<core::Job>;
  return Await<R>([&](core::Done<R> d) { broker_->RetryJob(std::move(job_id), std::move(d)); });
}

template <typename Engine>
absl::StatusOr<core::RetryJobsResult> BlockingEngine<Engine>::RetryJobs(core::RetryJobsSpec spec) {
  using R = absl::StatusOr<core::RetryJobsResult>;
  return Await<R>([&](core::Done<R> d) { broker_->RetryJobs(std::move(spec), std::move(d)); });
}

template <typename Engine>
absl::Status BlockingEngine<Engine>::DeleteJob(std::string job_id) {
  return Await<absl::Status>(
      [&](core::Done<absl::Status> d) { broker_->DeleteJob(std::move(job_id), std::move(d)); });
}

template <typename Engine>
absl::StatusOr<core::QueueInfo> BlockingEngine<Engine>::SetQueuePaused(std::string queue,
                                                                       bool paused) {
  using R = absl::StatusOr<core::QueueInfo>;
  return Await<R>(
      [&](core::Done<R> d) { broker_->SetQueuePaused(std::move(queue), paused, std::move(d)); });
}

template <typename Engine>
absl::StatusOr<int64_t> BlockingEngine<Engine>::PurgeQueue(std::string queue,
                                                           std::vector<core::JobState> states) {
  using R = absl::StatusOr<int64_t>;
  return Await<R>([&](core::Done<R> d) {
    broker_->PurgeQueue(std::move(queue), std::move(states), std::move(d));
  });
}

}  // namespace jobbroker::testing
