#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/broker.h"
#include "core/clock.h"
#include "core/commit_pipeline.h"
#include "core/done.h"
#include "core/requests.h"
#include "core/store.h"
#include "core/stream_credit.h"
#include "core/stream_sink.h"

namespace jobbroker::node {

// The partitions one jobbroker process serves: a core::Broker per partition, each with its own
// mutex (so partitions run on several cores at once), all sharing one CommitPipeline over one
// Store (so fsyncs do not multiply with partitions); in cluster mode each partition writes to its
// own replicated store on a pipeline of its own instead. And the routing of the Broker API to them:
// a queue lives in PartitionOfQueue(queue) (core/ids.h), a job in the partition its id carries.
//
// Every call has core::Broker's contract. Where a call spans partitions:
//  - EnqueueBatch stays all-or-nothing, so a batch whose queues live in several partitions is
//    refused (kInvalidArgument naming them); the client sends one batch per partition. A job may
//    depend on jobs of other partitions (on a single node their existence is checked here; the
//    DependencyRelay delivers their outcomes).
//  - A Work stream over queues of several partitions is subscribed in each, sharing one
//    max_in_flight budget (core/stream_credit.h): it holds at most max_in_flight jobs in all.
//  - AckBatch applies each ack in its job's partition; a partition refusing writes answers that
//    refusal for its items (the others are applied), instead of failing the whole call.
//  - ListQueues lists every partition's queues, by name.
// With one partition every call goes straight to the one broker.
//
// Thread-safe. `store` and `clock` are borrowed and must outlive it.
class Partitions {
 public:
  // Opens `count` brokers (1 to core::kMaxPartitions) over `store`, partition i with
  // options.partition = i and only the configured queue policies of its own queues, all on one
  // CommitPipeline in options.commit_mode (options.pipeline must be unset), each keeping its
  // share of options.max_hot_jobs whole. The first broker's
  // error if one does not open (see core::Broker::Open).
  static absl::StatusOr<std::unique_ptr<Partitions>> Open(core::Store& store,
                                                          const core::Clock& clock, uint32_t count,
                                                          core::BrokerOptions options);
  // Cluster mode: partition p's broker writes through `stores[p]` (the partition's replicated
  // store, cluster/node), on a pipeline of its own: a partition whose writes stop (this node
  // stopped leading it) stops alone, and each waits for its own followers. Every partition
  // starts halted ("partition P has no leader yet"): it writes after its broker's first successful
  // ResumeWrites (Tick retries it). Otherwise as Open.
  static absl::StatusOr<std::unique_ptr<Partitions>> Open(std::vector<core::Store*> stores,
                                                          const core::Clock& clock,
                                                          core::BrokerOptions options);
  // Shuts every broker down, then closes the pipeline (which writes what is pending).
  ~Partitions();
  Partitions(const Partitions&) = delete;
  Partitions& operator=(const Partitions&) = delete;

  uint32_t count() const { return static_cast<uint32_t>(brokers_.size()); }
  core::Broker& broker(uint32_t partition) { return *brokers_[partition]; }
  uint32_t PartitionOfQueue(std::string_view queue) const;
  // The broker of the partition job `id` lives in. An id that is not of core::NewJobId's form
  // goes to partition 0, whose broker answers for it as for any unknown or malformed id.
  core::Broker& BrokerOfJob(const std::string& id);

  // --- core::Broker's API, routed ---------------------------------------------------------------
  void EnqueueBatch(std::vector<core::EnqueueSpec> specs,
                    core::Done<absl::StatusOr<std::vector<core::EnqueueResult>>> done,
                    bool batch = false);
  uint64_t Lease(core::LeaseSpec spec, absl::Duration wait,
                 core::Done<absl::StatusOr<std::vector<core::LeasedJob>>> done);
  bool CancelWait(uint64_t waiter);
  absl::StatusOr<uint64_t> Subscribe(core::SubscribeSpec spec,
                                     std::shared_ptr<core::StreamSink> sink);
  absl::Status SetFlow(uint64_t stream, int max_in_flight);
  void Unsubscribe(uint64_t stream);
  void Heartbeat(core::HeartbeatSpec spec, core::Done<absl::StatusOr<core::HeartbeatResult>> done);
  void Ack(core::AckSpec spec, core::Done<absl::Status> done);
  void AckBatch(std::vector<core::AckSpec> specs,
                core::Done<absl::StatusOr<std::vector<absl::Status>>> done);
  void Fail(core::FailSpec spec, core::Done<absl::StatusOr<core::FailResult>> done);
  void Release(core::ReleaseSpec spec, core::Done<absl::Status> done);
  void CancelJob(std::string job_id, core::Done<absl::StatusOr<core::Job>> done);
  void UpdateQueuePolicy(std::string queue, core::PolicyOverride policy, bool reset,
                         core::Done<absl::StatusOr<core::QueueInfo>> done);
  void RetryJob(std::string job_id, core::Done<absl::StatusOr<core::Job>> done);
  void RetryJobs(core::RetryJobsSpec spec, core::Done<absl::StatusOr<core::RetryJobsResult>> done);
  void DeleteJob(std::string job_id, core::Done<absl::Status> done);
  void SetQueuePaused(std::string queue, bool paused,
                      core::Done<absl::StatusOr<core::QueueInfo>> done);
  void PurgeQueue(std::string queue, std::vector<core::JobState> states,
                  core::Done<absl::StatusOr<int64_t>> done);
  // Reads; `fence` as core::Broker's (the server answers once it passes).
  absl::StatusOr<core::Job> GetJob(const std::string& job_id, core::ReadFence* fence = nullptr);
  absl::StatusOr<std::string> JobQueue(const std::string& job_id);
  absl::StatusOr<core::ListJobsResult> ListJobs(const core::ListJobsSpec& spec,
                                                core::ReadFence* fence = nullptr);
  absl::StatusOr<core::QueueInfo> GetQueue(const std::string& queue,
                                           core::ReadFence* fence = nullptr);
  // Every partition's queues, by name; with `served`, those of the partitions it marks only.
  std::vector<core::QueueInfo> ListQueues(const std::vector<bool>* served = nullptr,
                                          core::ReadFence* fence = nullptr);
  // The workers of the partitions `served` marks (by number), merged by worker_id
  // (core::Broker::ListWorkers); `served` shorter than the partitions: the rest are not asked.
  std::vector<core::WorkerInfo> ListWorkers(const std::string& queue,
                                            const std::vector<bool>& served);

  // Recurring schedules. A schedule lives in (and is run by) the partition of its template's
  // queue; the calls by id look for it in the partitions `served` marks (those this node leads;
  // shorter than the partitions: the rest are not looked in). kNotFound if none has it.
  // PutSchedule is kFailedPrecondition if the id belongs to a schedule of another partition.
  void PutSchedule(core::Schedule schedule, const std::vector<bool>& served,
                   core::Done<absl::StatusOr<core::ScheduleInfo>> done);
  absl::StatusOr<core::ScheduleInfo> GetSchedule(const std::string& id,
                                                 const std::vector<bool>& served,
                                                 core::ReadFence* fence = nullptr);
  // By id; with `queue` set, only its partition is asked.
  std::vector<core::ScheduleInfo> ListSchedules(const std::string& queue,
                                                const std::vector<bool>& served,
                                                core::ReadFence* fence = nullptr);
  void DeleteSchedule(std::string id, const std::vector<bool>& served,
                      core::Done<absl::Status> done);
  void TriggerSchedule(std::string id, const std::vector<bool>& served,
                       core::Done<absl::StatusOr<core::EnqueueResult>> done);

  // Ticks every partition; the earliest time one of them asks to run again.
  absl::Time Tick();
  void Shutdown();
  // Waits until everything appended so far, in any partition, is durable. A partition halted
  // because this node does not lead it (a core::NotStorageFailure cause) has nothing to flush.
  absl::Status Flush();
  // Halts the partition's pipeline with `cause` (core::CommitPipeline::Halt): its broker refuses
  // changes until its ResumeWrites rebuilds its memory from the store. Cluster mode, when this
  // node stops leading the partition (or before it rebuilds on leading it again).
  void HaltWrites(uint32_t partition, absl::Status cause);
  // Every partition's ResumeWrites; the first error.
  absl::Status ResumeWrites();
  // OK while every partition takes writes, else the first refusal.
  absl::Status storage_status() const;
  int64_t corrupt_records() const;
  uint64_t store_writes() const;
  core::Broker::MemoryCounts memory_counts() const;

 private:
  // A Work stream as subscribed in each partition its queues live in.
  struct Stream {
    struct Member {
      core::Broker* broker;
      uint64_t handle;
    };
    std::vector<Member> members;
    std::shared_ptr<core::StreamCredit> credit;  // null for a stream on one partition
  };

  Partitions() = default;
  // Single node: every job another partition's job in `specs` (all of `partition`) depends on
  // exists, else kInvalidArgument naming it, as the broker names one of its own partition.
  absl::Status CheckRemoteDependencies(const std::vector<core::EnqueueSpec>& specs,
                                       uint32_t partition, bool batch);
  // The served partition whose broker holds schedule `id`: kNotFound if none does,
  // kInvalidArgument for a malformed id.
  absl::StatusOr<core::Broker*> BrokerOfSchedule(const std::string& id,
                                                 const std::vector<bool>& served);

  // `start_halted`: every pipeline halted before its broker opens (cluster mode).
  // `stores` holds one store for all partitions (Open) or one per partition (Open over several
  // stores).
  static absl::StatusOr<std::unique_ptr<Partitions>> OpenOver(std::vector<core::Store*> stores,
                                                              const core::Clock& clock,
                                                              uint32_t count,
                                                              core::BrokerOptions options,
                                                              bool start_halted);

  // Constant after construction (Open).
  // One shared by every partition (Open), or one per partition (Open over several stores). Declared
  // first: they outlive the brokers.
  std::vector<std::unique_ptr<core::CommitPipeline>> pipelines_;
  std::vector<std::unique_ptr<core::Broker>> brokers_;
  bool cluster_ = false;  // over a store per partition, each led by some node (Open over stores)

  absl::Mutex streams_mu_;
  absl::flat_hash_map<uint64_t, Stream> streams_ ABSL_GUARDED_BY(streams_mu_);
  uint64_t next_stream_ ABSL_GUARDED_BY(streams_mu_) = 1;
};

}  // namespace jobbroker::node
