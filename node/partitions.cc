#include "node/partitions.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/ids.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker::node {
namespace {

// A long poll's handle: the broker's waiter id with the partition in the low bits.
constexpr int kPartitionBits = 15;
static_assert(core::kMaxPartitions == (1u << kPartitionBits));

}  // namespace

absl::StatusOr<std::unique_ptr<Partitions>> Partitions::Open(core::Store& store,
                                                             const core::Clock& clock,
                                                             uint32_t count,
                                                             core::BrokerOptions options) {
  return OpenOver({&store}, clock, count, std::move(options), /*start_halted=*/false);
}

absl::StatusOr<std::unique_ptr<Partitions>> Partitions::Open(std::vector<core::Store*> stores,
                                                             const core::Clock& clock,
                                                             core::BrokerOptions options) {
  const auto count = static_cast<uint32_t>(stores.size());
  return OpenOver(std::move(stores), clock, count, std::move(options), /*start_halted=*/true);
}

absl::StatusOr<std::unique_ptr<Partitions>> Partitions::OpenOver(std::vector<core::Store*> stores,
                                                                 const core::Clock& clock,
                                                                 uint32_t count,
                                                                 core::BrokerOptions options,
                                                                 bool start_halted) {
  if (count < 1 || count > core::kMaxPartitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("partitions is ", count, "; it must be 1 to ", core::kMaxPartitions));
  }
  if (options.pipeline != nullptr)
    return absl::InvalidArgumentError("Partitions makes the pipelines of its brokers");
  std::unique_ptr<Partitions> partitions(new Partitions());
  partitions->cluster_ = start_halted;
  for (core::Store* store : stores) {
    // A failed write stops the partitions on that pipeline: the ticker must wake to schedule
    // their retries.
    partitions->pipelines_.push_back(std::make_unique<core::CommitPipeline>(
        *store, options.commit_mode, &clock, options.observer,
        [wake = options.wake](const absl::Status&) {
          if (wake) wake();
        }));
  }
  // Over a store per partition (cluster mode) no partition may write before its node leads it:
  // each starts halted, and its broker's first ResumeWrites after that rebuilds it.
  if (start_halted) {
    for (size_t p = 0; p < partitions->pipelines_.size(); ++p) {
      partitions->pipelines_[p]->Halt(core::NotStorageFailure(
          absl::UnavailableError(absl::StrCat("partition ", p, " has no leader yet"))));
    }
  }
  // Each partition's recovery (a scan of its records, then its indexes, under its own lock) is
  // independent of the others': they run side by side, one thread per core, so that a restart
  // with many jobs takes less time on more cores. The store and the pipelines take concurrent
  // callers.
  std::vector<absl::StatusOr<std::unique_ptr<core::Broker>>> opened(count);
  auto open_one = [&](uint32_t p) {
    const size_t own_store = stores.size() == 1 ? 0 : p;
    core::BrokerOptions own = options;
    own.partition = p;
    own.partition_count = count;
    own.pipeline = partitions->pipelines_[own_store].get();
    // The memory bound is the node's: each partition keeps its share whole (rounded up).
    own.max_hot_jobs = (options.max_hot_jobs + count - 1) / count;
    // Each configured queue is created by the broker it lives in only, so it is listed once.
    own.queue_policies.clear();
    for (const auto& [queue, policy] : options.queue_policies)
      if (core::PartitionOfQueue(queue, count) == p) own.queue_policies.emplace(queue, policy);
    opened[p] = core::Broker::Open(*stores[own_store], clock, std::move(own));
  };
  const uint32_t threads =
      std::min(count, std::max(1u, static_cast<uint32_t>(std::thread::hardware_concurrency())));
  std::atomic<uint32_t> next{0};
  auto open_next = [&] {
    for (uint32_t p = next++; p < count; p = next++) open_one(p);
  };
  std::vector<std::thread> helpers;
  for (uint32_t i = 1; i < threads; ++i) helpers.emplace_back(open_next);
  open_next();
  for (std::thread& t : helpers) t.join();
  for (absl::StatusOr<std::unique_ptr<core::Broker>>& broker : opened) {
    if (!broker.ok()) return broker.status();  // every opened broker closes before its pipeline
    partitions->brokers_.push_back(*std::move(broker));
  }
  return partitions;
}

Partitions::~Partitions() {
  // Ends bulk work that continues from the pipeline's callbacks (core::Broker::PurgeQueue).
  Shutdown();
  Flush().IgnoreError();
  brokers_.clear();  // before the pipelines they write on
}

uint64_t Partitions::store_writes() const {
  uint64_t writes = 0;
  for (const auto& pipeline : pipelines_) writes += pipeline->writes();
  return writes;
}

void Partitions::HaltWrites(uint32_t partition, absl::Status cause) {
  core::CommitPipeline& pipeline = *pipelines_[pipelines_.size() == 1 ? 0 : partition];
  pipeline.Halt(cause);
  // After the halt, so that a watch that comes in between is refused (Broker::WatchJob). Ended
  // with the pipeline's cause: a halt of a halted pipeline only changes it, and it says who
  // leads now. Over one shared pipeline every broker was halted with it.
  const absl::Status cause_now = pipeline.status();
  if (pipelines_.size() == 1) {
    for (const std::unique_ptr<core::Broker>& broker : brokers_) broker->EndWatches(cause_now);
  } else {
    brokers_[partition]->EndWatches(cause_now);
  }
}

uint32_t Partitions::PartitionOfQueue(std::string_view queue) const {
  return core::PartitionOfQueue(queue, count());
}

core::Broker& Partitions::BrokerOfJob(const std::string& id) {
  if (brokers_.size() == 1) return *brokers_[0];
  return *brokers_[core::PartitionOfJobId(id, count()).value_or(0)];
}

void Partitions::EnqueueBatch(std::vector<core::EnqueueSpec> specs,
                              core::Done<absl::StatusOr<std::vector<core::EnqueueResult>>> done,
                              bool batch) {
  if (brokers_.size() == 1 || specs.empty())
    return brokers_[0]->EnqueueBatch(std::move(specs), std::move(done), batch);
  const uint32_t first = PartitionOfQueue(specs[0].queue);
  const bool one_partition = std::all_of(specs.begin(), specs.end(), [&](const auto& s) {
    return PartitionOfQueue(s.queue) == first;
  });
  if (one_partition) {
    if (absl::Status s = CheckRemoteDependencies(specs, first, batch); !s.ok()) return done(s);
    return brokers_[first]->EnqueueBatch(std::move(specs), std::move(done), batch);
  }
  // Field errors first, as on one partition: they say what to fix.
  if (absl::Status s = core::ValidateEnqueueBatch(specs, /*name_jobs=*/true); !s.ok())
    return done(s);
  std::vector<std::string> where;
  std::vector<uint32_t> seen;
  for (const core::EnqueueSpec& s : specs) {
    const uint32_t p = PartitionOfQueue(s.queue);
    if (std::find(seen.begin(), seen.end(), p) != seen.end()) continue;
    seen.push_back(p);
    where.push_back(absl::StrCat(p, " (queue ", s.queue, ")"));
  }
  done(absl::InvalidArgumentError(absl::StrCat(
      "jobs: the batch spans partitions ", absl::StrJoin(where, ", "),
      "; a batch is all or nothing within one partition: send one batch per partition")));
}

absl::Status Partitions::CheckRemoteDependencies(const std::vector<core::EnqueueSpec>& specs,
                                                 uint32_t partition, bool batch) {
  // In cluster mode another partition's broker here may be a follower's, behind its leader: the
  // relay finds out instead (a dependency it cannot find fails its dependents).
  if (cluster_) return absl::OkStatus();
  bool any = false;
  for (const core::EnqueueSpec& s : specs)
    for (const std::string& id : s.depends_on)
      any = any || core::PartitionOfJobId(id, count()).value_or(partition) != partition;
  if (!any) return absl::OkStatus();
  // Field errors first, as the broker would answer them.
  BROKER_RETURN_IF_ERROR(core::ValidateEnqueueBatch(specs, /*name_jobs=*/batch));
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<std::string>& ids = specs[i].depends_on;
    for (size_t k = 0; k < ids.size(); ++k) {
      const uint32_t p = core::PartitionOfJobId(ids[k], count()).value_or(partition);
      if (p == partition || brokers_[p]->JobQueue(ids[k]).ok()) continue;
      return absl::InvalidArgumentError(absl::StrCat(batch ? absl::StrCat("jobs[", i, "].") : "",
                                                     "depends_on[", k, "]: no job ", ids[k]));
    }
  }
  return absl::OkStatus();
}

uint64_t Partitions::Lease(core::LeaseSpec spec, absl::Duration wait,
                           core::Done<absl::StatusOr<std::vector<core::LeasedJob>>> done) {
  const uint32_t p = PartitionOfQueue(spec.queue);
  const uint64_t waiter = brokers_[p]->Lease(std::move(spec), wait, std::move(done));
  return waiter == 0 ? 0 : (waiter << kPartitionBits) | p;
}

bool Partitions::CancelWait(uint64_t waiter) {
  const uint32_t p = waiter & (core::kMaxPartitions - 1);
  if (waiter == 0 || p >= count()) return false;
  return brokers_[p]->CancelWait(waiter >> kPartitionBits);
}

absl::StatusOr<uint64_t> Partitions::Subscribe(core::SubscribeSpec spec,
                                               std::shared_ptr<core::StreamSink> sink) {
  BROKER_RETURN_IF_ERROR(core::ValidateSubscribeSpec(spec));
  // The stream's queues by partition, in the order they were named.
  std::vector<std::pair<uint32_t, std::vector<std::string>>> groups;
  for (std::string& queue : spec.queues) {
    const uint32_t p = PartitionOfQueue(queue);
    auto group =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == p; });
    if (group == groups.end()) group = groups.insert(groups.end(), {p, {}});
    group->second.push_back(std::move(queue));
  }
  Stream stream;
  if (groups.size() > 1) {
    stream.credit = std::make_shared<core::StreamCredit>(std::max(spec.max_in_flight, 1),
                                                         static_cast<int>(groups.size()));
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    core::SubscribeSpec own = spec;
    own.queues = std::move(groups[i].second);
    own.credit = stream.credit;
    own.credit_member = static_cast<int>(i);
    core::Broker* broker = brokers_[groups[i].first].get();
    absl::StatusOr<uint64_t> handle = broker->Subscribe(std::move(own), sink);
    if (!handle.ok()) {
      for (const Stream::Member& m : stream.members) m.broker->Unsubscribe(m.handle);
      return handle.status();
    }
    stream.members.push_back({broker, *handle});
    if (stream.credit != nullptr) {
      stream.credit->SetRefill(static_cast<int>(i),
                               [broker, h = *handle] { broker->RefillStream(h); });
    }
  }
  // A member that found the budget spent before its refill was set waits for no one: try now.
  if (stream.credit != nullptr) stream.credit->Refill();
  absl::MutexLock lock(&streams_mu_);
  const uint64_t id = next_stream_++;
  streams_.emplace(id, std::move(stream));
  return id;
}

absl::Status Partitions::SetFlow(uint64_t stream, int max_in_flight) {
  BROKER_RETURN_IF_ERROR(core::ValidateMaxInFlight(max_in_flight));
  std::vector<Stream::Member> members;
  {
    absl::MutexLock lock(&streams_mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return absl::NotFoundError("the stream has not subscribed");
    if (it->second.credit != nullptr) it->second.credit->SetMax(max_in_flight);
    members = it->second.members;
  }
  for (const Stream::Member& m : members)
    BROKER_RETURN_IF_ERROR(m.broker->SetFlow(m.handle, max_in_flight));
  return absl::OkStatus();
}

void Partitions::Unsubscribe(uint64_t stream) {
  Stream ended;
  {
    absl::MutexLock lock(&streams_mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return;
    ended = std::move(it->second);
    streams_.erase(it);
  }
  for (const Stream::Member& m : ended.members) m.broker->Unsubscribe(m.handle);
}

void Partitions::Heartbeat(core::HeartbeatSpec spec,
                           core::Done<absl::StatusOr<core::HeartbeatResult>> done) {
  BrokerOfJob(spec.job_id).Heartbeat(std::move(spec), std::move(done));
}

void Partitions::Ack(core::AckSpec spec, core::Done<absl::Status> done) {
  BrokerOfJob(spec.job_id).Ack(std::move(spec), std::move(done));
}

void Partitions::AckBatch(std::vector<core::AckSpec> specs,
                          core::Done<absl::StatusOr<std::vector<absl::Status>>> done) {
  if (brokers_.size() == 1) return brokers_[0]->AckBatch(std::move(specs), std::move(done));
  if (absl::Status s = core::ValidateAckBatch(specs); !s.ok()) return done(s);
  // Each partition's acks, with where each goes in the answer.
  struct Part {
    core::Broker* broker;
    std::vector<core::AckSpec> specs;
    std::vector<size_t> index;
  };
  std::vector<Part> parts;
  for (size_t i = 0; i < specs.size(); ++i) {
    core::Broker* broker = &BrokerOfJob(specs[i].job_id);
    auto part =
        std::find_if(parts.begin(), parts.end(), [&](const Part& p) { return p.broker == broker; });
    if (part == parts.end()) part = parts.insert(parts.end(), Part{broker, {}, {}});
    part->specs.push_back(std::move(specs[i]));
    part->index.push_back(i);
  }
  if (parts.size() == 1)
    return parts[0].broker->AckBatch(std::move(parts[0].specs), std::move(done));
  // Answered when the last part is; the parts answer on any thread.
  struct Gather {
    absl::Mutex mu;
    std::vector<absl::Status> statuses ABSL_GUARDED_BY(mu);
    int pending ABSL_GUARDED_BY(mu) = 0;
    core::Done<absl::StatusOr<std::vector<absl::Status>>> done;
  };
  auto gather = std::make_shared<Gather>();
  {
    absl::MutexLock lock(&gather->mu);
    gather->statuses.resize(specs.size());
    gather->pending = static_cast<int>(parts.size());
  }
  gather->done = std::move(done);
  for (Part& part : parts) {
    part.broker->AckBatch(std::move(part.specs), [gather, index = std::move(part.index)](
                                                     absl::StatusOr<std::vector<absl::Status>> r) {
      std::vector<absl::Status> answer;
      {
        absl::MutexLock lock(&gather->mu);
        for (size_t k = 0; k < index.size(); ++k)
          gather->statuses[index[k]] = r.ok() ? (*r)[k] : r.status();
        if (--gather->pending > 0) return;
        answer = std::move(gather->statuses);
      }
      gather->done(std::move(answer));
    });
  }
}

void Partitions::Fail(core::FailSpec spec, core::Done<absl::StatusOr<core::FailResult>> done) {
  BrokerOfJob(spec.job_id).Fail(std::move(spec), std::move(done));
}

void Partitions::Release(core::ReleaseSpec spec, core::Done<absl::Status> done) {
  BrokerOfJob(spec.job_id).Release(std::move(spec), std::move(done));
}

void Partitions::CancelJob(std::string job_id, core::Done<absl::StatusOr<core::Job>> done) {
  core::Broker& broker = BrokerOfJob(job_id);
  broker.CancelJob(std::move(job_id), std::move(done));
}

void Partitions::UpdateQueuePolicy(std::string queue, core::PolicyOverride policy, bool reset,
                                   core::Done<absl::StatusOr<core::QueueInfo>> done) {
  const uint32_t p = PartitionOfQueue(queue);
  brokers_[p]->UpdateQueuePolicy(std::move(queue), std::move(policy), reset, std::move(done));
}

void Partitions::RetryJob(std::string job_id, core::Done<absl::StatusOr<core::Job>> done) {
  core::Broker& broker = BrokerOfJob(job_id);
  broker.RetryJob(std::move(job_id), std::move(done));
}

void Partitions::RetryJobs(core::RetryJobsSpec spec,
                           core::Done<absl::StatusOr<core::RetryJobsResult>> done) {
  const uint32_t p = PartitionOfQueue(spec.queue);
  brokers_[p]->RetryJobs(std::move(spec), std::move(done));
}

void Partitions::DeleteJob(std::string job_id, core::Done<absl::Status> done) {
  core::Broker& broker = BrokerOfJob(job_id);
  broker.DeleteJob(std::move(job_id), std::move(done));
}

void Partitions::SetQueuePaused(std::string queue, bool paused,
                                core::Done<absl::StatusOr<core::QueueInfo>> done) {
  const uint32_t p = PartitionOfQueue(queue);
  brokers_[p]->SetQueuePaused(std::move(queue), paused, std::move(done));
}

void Partitions::PurgeQueue(std::string queue, std::vector<core::JobState> states,
                            core::Done<absl::StatusOr<int64_t>> done) {
  const uint32_t p = PartitionOfQueue(queue);
  brokers_[p]->PurgeQueue(std::move(queue), std::move(states), std::move(done));
}

absl::StatusOr<core::Job> Partitions::GetJob(const std::string& job_id, core::ReadFence* fence) {
  return BrokerOfJob(job_id).GetJob(job_id, fence);
}

absl::StatusOr<std::string> Partitions::JobQueue(const std::string& job_id) {
  return BrokerOfJob(job_id).JobQueue(job_id);
}

absl::StatusOr<core::ListJobsResult> Partitions::ListJobs(const core::ListJobsSpec& spec,
                                                          core::ReadFence* fence) {
  return brokers_[PartitionOfQueue(spec.queue)]->ListJobs(spec, fence);
}

absl::StatusOr<core::QueueInfo> Partitions::GetQueue(const std::string& queue,
                                                     core::ReadFence* fence) {
  return brokers_[PartitionOfQueue(queue)]->GetQueue(queue, fence);
}

std::vector<core::QueueInfo> Partitions::ListQueues(const std::vector<bool>* served,
                                                    core::ReadFence* fence) {
  std::vector<core::QueueInfo> all;
  for (size_t p = 0; p < brokers_.size(); ++p) {
    // A broker that stopped leading its partition still remembers its queues, and its fence
    // would refuse the whole read.
    if (served != nullptr && (p >= served->size() || !(*served)[p])) continue;
    std::vector<core::QueueInfo> some = brokers_[p]->ListQueues(fence);
    if (brokers_.size() == 1) return some;
    all.insert(all.end(), std::make_move_iterator(some.begin()),
               std::make_move_iterator(some.end()));
  }
  std::sort(all.begin(), all.end(),
            [](const core::QueueInfo& a, const core::QueueInfo& b) { return a.name < b.name; });
  return all;
}

std::vector<core::WorkerInfo> Partitions::ListWorkers(const std::string& queue,
                                                      const std::vector<bool>& served) {
  std::vector<core::WorkerInfo> all;
  for (size_t p = 0; p < brokers_.size() && p < served.size(); ++p) {
    // A broker that stopped leading its partition keeps no consumers, but may keep jobs.
    if (served[p]) core::MergeWorkers(all, brokers_[p]->ListWorkers(queue));
  }
  return all;
}

absl::StatusOr<core::Broker*> Partitions::BrokerOfSchedule(const std::string& id,
                                                           const std::vector<bool>& served) {
  if (absl::Status s = core::ValidateScheduleId(id); !s.ok()) return s;
  for (size_t p = 0; p < brokers_.size() && p < served.size(); ++p) {
    if (served[p] && brokers_[p]->GetSchedule(id).ok()) return brokers_[p].get();
  }
  return absl::NotFoundError(absl::StrCat("schedule ", id, " not found"));
}

void Partitions::PutSchedule(core::Schedule schedule, const std::vector<bool>& served,
                             core::Done<absl::StatusOr<core::ScheduleInfo>> done) {
  const uint32_t target = PartitionOfQueue(schedule.job.queue);
  for (size_t p = 0; p < brokers_.size() && p < served.size(); ++p) {
    if (p == target || !served[p]) continue;
    absl::StatusOr<core::ScheduleInfo> other = brokers_[p]->GetSchedule(schedule.id);
    if (other.ok())
      return done(absl::FailedPreconditionError(
          absl::StrCat("schedule ", schedule.id, " enqueues into queue ", other->schedule.job.queue,
                       ", which lives in another partition than queue ", schedule.job.queue,
                       "; delete it before putting it again with the new queue")));
  }
  brokers_[target]->PutSchedule(std::move(schedule), std::move(done));
}

absl::StatusOr<core::ScheduleInfo> Partitions::GetSchedule(const std::string& id,
                                                           const std::vector<bool>& served,
                                                           core::ReadFence* fence) {
  if (absl::Status s = core::ValidateScheduleId(id); !s.ok()) return s;
  // Each partition looked in adds to the fence: a NOT_FOUND must not show a delete that a
  // failover could take back either.
  for (size_t p = 0; p < brokers_.size() && p < served.size(); ++p) {
    if (!served[p]) continue;
    absl::StatusOr<core::ScheduleInfo> found = brokers_[p]->GetSchedule(id, fence);
    if (found.ok() || !absl::IsNotFound(found.status())) return found;
  }
  return absl::NotFoundError(absl::StrCat("schedule ", id, " not found"));
}

std::vector<core::ScheduleInfo> Partitions::ListSchedules(const std::string& queue,
                                                          const std::vector<bool>& served,
                                                          core::ReadFence* fence) {
  std::vector<core::ScheduleInfo> all;
  for (size_t p = 0; p < brokers_.size() && p < served.size(); ++p) {
    if (!served[p] || (!queue.empty() && p != PartitionOfQueue(queue))) continue;
    std::vector<core::ScheduleInfo> some = brokers_[p]->ListSchedules(queue, fence);
    all.insert(all.end(), std::make_move_iterator(some.begin()),
               std::make_move_iterator(some.end()));
  }
  std::sort(all.begin(), all.end(), [](const core::ScheduleInfo& a, const core::ScheduleInfo& b) {
    return a.schedule.id < b.schedule.id;
  });
  return all;
}

void Partitions::DeleteSchedule(std::string id, const std::vector<bool>& served,
                                core::Done<absl::Status> done) {
  absl::StatusOr<core::Broker*> broker = BrokerOfSchedule(id, served);
  if (!broker.ok()) return done(broker.status());
  (*broker)->DeleteSchedule(std::move(id), std::move(done));
}

void Partitions::TriggerSchedule(std::string id, const std::vector<bool>& served,
                                 core::Done<absl::StatusOr<core::EnqueueResult>> done) {
  absl::StatusOr<core::Broker*> broker = BrokerOfSchedule(id, served);
  if (!broker.ok()) return done(broker.status());
  (*broker)->TriggerSchedule(std::move(id), std::move(done));
}

absl::Time Partitions::Tick() {
  absl::Time next = absl::InfiniteFuture();
  for (const std::unique_ptr<core::Broker>& broker : brokers_)
    next = std::min(next, broker->Tick());
  return next;
}

void Partitions::Shutdown() {
  for (const std::unique_ptr<core::Broker>& broker : brokers_) broker->Shutdown();
}

absl::Status Partitions::Flush() {
  absl::Status first;
  for (const std::unique_ptr<core::Broker>& broker : brokers_) {
    absl::Status flushed = broker->Flush();
    // A partition halted because this node does not lead it (cluster mode) has nothing of its
    // own to make durable: every change it took before it stopped leading was answered, as
    // committed or as of unknown outcome. Only a failing store is a failed flush.
    if (!flushed.ok() && core::IsNotStorageFailure(flushed)) continue;
    first.Update(flushed);
  }
  return first;
}

absl::Status Partitions::ResumeWrites() {
  absl::Status first;
  for (const std::unique_ptr<core::Broker>& broker : brokers_) first.Update(broker->ResumeWrites());
  return first;
}

absl::Status Partitions::storage_status() const {
  for (const std::unique_ptr<core::Broker>& broker : brokers_) {
    absl::Status s = broker->storage_status();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

int64_t Partitions::corrupt_records() const {
  int64_t n = 0;
  for (const std::unique_ptr<core::Broker>& broker : brokers_) n += broker->corrupt_records();
  return n;
}

core::Broker::MemoryCounts Partitions::memory_counts() const {
  core::Broker::MemoryCounts all;
  for (const std::unique_ptr<core::Broker>& broker : brokers_) {
    core::Broker::MemoryCounts some = broker->memory_counts();
    all.hot_jobs += some.hot_jobs;
    all.cold_jobs += some.cold_jobs;
  }
  return all;
}

}  // namespace jobbroker::node
