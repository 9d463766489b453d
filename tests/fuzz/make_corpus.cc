// Writes the seed corpus of the fuzz targets: make_fuzz_corpus OUT_DIR fills
// OUT_DIR/core_model_fuzzer/ and OUT_DIR/request_fuzzer/ (tests/fuzz/corpus in the repository;
// README.md says how to regenerate it). Deterministic: the same build writes the same files.
//
// core_model_fuzzer seeds are short stories (enqueue, lease, let the lease run out, ack late...)
// written as the choices the fuzzer reads (model_ops.h), so that fuzzing starts from inputs that
// already reach leases, retries, dedup keys and restarts. request_fuzzer seeds are one valid
// request of each kind, a few invalid ones, and config files.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "jobbroker/v1/admin.pb.h"
#include "jobbroker/v1/broker.pb.h"
#include "jobbroker/v1/policy.pb.h"
#include "tests/fuzz/model_ops.h"
#include "tests/fuzz/request_kinds.h"

namespace jobbroker::fuzz {
namespace {

namespace fs = std::filesystem;

// An input for core_model_fuzzer, built from its choices in the order the fuzzer reads them.
class Story {
 public:
  explicit Story(OpenArgs open = {}) { Fields(open); }

  template <typename Args>
  Story& Op(OpKind kind, Args args) {
    Kind(kind);
    return Fields(args);
  }
  Story& Op(OpKind kind) { return Kind(kind); }

  // FuzzedDataProvider takes integers from the end of the input: the first choice is the last
  // byte.
  std::string Bytes() const { return std::string(choices_.rbegin(), choices_.rend()); }

 private:
  Story& Kind(OpKind kind) {
    Choice(static_cast<int>(kind), static_cast<size_t>(OpKind::kCount));
    return *this;
  }
  template <typename Args>
  Story& Fields(Args args) {
    args.Visit([this](int& field, size_t n) { Choice(field, n); });
    return *this;
  }
  // One byte per choice among n > 1 (ConsumeIntegralInRange reads none when n == 1).
  void Choice(int value, size_t n) {
    if (value < 0 || static_cast<size_t>(value) >= n) {
      std::fprintf(stderr, "choice %d out of range %zu\n", value, n);
      std::exit(1);
    }
    if (n > 1) choices_.push_back(static_cast<char>(value));
  }

  std::vector<char> choices_;
};

EnqueueArgs Job(int queue = 0) {
  EnqueueArgs a;
  a.queue = queue;
  return a;
}
LeaseArgs Take(int max_jobs_index = 0, int lease = 0, int queue = 0) {
  LeaseArgs a;
  a.queue = queue;
  a.max_jobs = max_jobs_index;
  a.lease = lease;
  return a;
}
PolicyArgs Set(PolicyField field, int value, int queue = 0) {
  PolicyArgs a;
  a.queue = queue;
  a.field = field;
  a.value = value;
  return a;
}
AdvanceArgs By(int amount) { return AdvanceArgs{amount}; }
RefArgs Ref(int ref = 0) { return RefArgs{ref}; }
AckArgs AckOf(int ref = 0) { return AckArgs{ref, 0}; }
FailArgs FailOf(int ref = 0, bool permanent = false, int retry_after = 0) {
  return FailArgs{ref, permanent ? 1 : 0, retry_after};
}

std::vector<std::pair<std::string, std::string>> ModelSeeds() {
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&](const char* name, const Story& s) { out.emplace_back(name, s.Bytes()); };

  add("enqueue_lease_ack",
      Story().Op(OpKind::kEnqueue, Job()).Op(OpKind::kLease, Take()).Op(OpKind::kAck, AckOf()));
  // 500 ms lease, 1 s later: the lease has run out; the ack still counts (late-ack salvage).
  add("late_ack", Story()
                      .Op(OpKind::kEnqueue, Job())
                      .Op(OpKind::kLease, Take(0, 1))
                      .Op(OpKind::kAdvance, By(2))
                      .Op(OpKind::kTick)
                      .Op(OpKind::kAck, AckOf()));
  EnqueueArgs twice = Job();
  twice.max_attempts = 2;
  add("fail_until_dead_then_retry", Story()
                                        .Op(OpKind::kEnqueue, twice)
                                        .Op(OpKind::kLease, Take())
                                        .Op(OpKind::kFail, FailOf(0, false, 1))
                                        .Op(OpKind::kLease, Take())
                                        .Op(OpKind::kFail, FailOf())
                                        .Op(OpKind::kRetry, Ref())
                                        .Op(OpKind::kLease, Take())
                                        .Op(OpKind::kAck, AckOf()));
  EnqueueArgs keyed = Job();
  keyed.dedup_key = 1;
  EnqueueArgs keyed_other = keyed;
  keyed_other.payload = 1;
  BatchArgs batch;
  batch.extra = 2;
  batch.jobs = {keyed, keyed, keyed_other};
  add("dedup", Story()
                   .Op(OpKind::kEnqueue, keyed)
                   .Op(OpKind::kEnqueue, keyed)
                   .Op(OpKind::kEnqueue, keyed_other)
                   .Op(OpKind::kEnqueueBatch, batch));
  EnqueueArgs short_ttl = keyed;
  short_ttl.dedup_ttl = 2;  // 10 s
  add("dedup_key_freed_after_ttl", Story()
                                       .Op(OpKind::kEnqueue, short_ttl)
                                       .Op(OpKind::kLease, Take())
                                       .Op(OpKind::kFail, FailOf(0, true))
                                       .Op(OpKind::kAdvance, By(4))
                                       .Op(OpKind::kTick)
                                       .Op(OpKind::kEnqueue, keyed_other)
                                       .Op(OpKind::kRetry, Ref(1))
                                       .Op(OpKind::kEnqueue, keyed_other));
  EnqueueArgs c0 = Job(), c1 = Job();
  c0.concurrency_key = 1;
  c1.concurrency_key = 2;
  add("concurrency_keys_take_turns", Story()
                                         .Op(OpKind::kUpdatePolicy, Set(kSetMaxPerKey, 1))
                                         .Op(OpKind::kEnqueue, c0)
                                         .Op(OpKind::kEnqueue, c0)
                                         .Op(OpKind::kEnqueue, c0)
                                         .Op(OpKind::kEnqueue, c1)
                                         .Op(OpKind::kEnqueue, Job())
                                         .Op(OpKind::kLease, Take(2))
                                         .Op(OpKind::kLease, Take(2))
                                         .Op(OpKind::kAck, AckOf(2))
                                         .Op(OpKind::kLease, Take(2)));
  add("max_concurrency", Story()
                             .Op(OpKind::kUpdatePolicy, Set(kSetMaxConcurrency, 2))
                             .Op(OpKind::kEnqueue, Job())
                             .Op(OpKind::kEnqueue, Job())
                             .Op(OpKind::kEnqueue, Job())
                             .Op(OpKind::kLease, Take(2))
                             .Op(OpKind::kUpdatePolicy, Set(kSetMaxConcurrency, 1))
                             .Op(OpKind::kAck, AckOf())
                             .Op(OpKind::kLease, Take(2)));
  add("restart_with_lease_held", Story()
                                     .Op(OpKind::kEnqueue, Job())
                                     .Op(OpKind::kLease, Take())
                                     .Op(OpKind::kHeartbeat, HeartbeatArgs{0, 1, 2})
                                     .Op(OpKind::kRestart, OpenArgs{0, 0})
                                     .Op(OpKind::kAdvance, By(5))
                                     .Op(OpKind::kRestart, OpenArgs{1, 1})
                                     .Op(OpKind::kLease, Take())
                                     .Op(OpKind::kAck, AckOf(1)));
  add("cancel_active", Story()
                           .Op(OpKind::kEnqueue, Job())
                           .Op(OpKind::kLease, Take())
                           .Op(OpKind::kCancel, Ref())
                           .Op(OpKind::kHeartbeat, HeartbeatArgs{0, 0, 0})
                           .Op(OpKind::kFail, FailOf())
                           .Op(OpKind::kRetry, Ref())
                           .Op(OpKind::kLease, Take()));
  add("release", Story()
                     .Op(OpKind::kEnqueue, Job())
                     .Op(OpKind::kLease, Take())
                     .Op(OpKind::kRelease, Ref())
                     .Op(OpKind::kAck, AckOf())
                     .Op(OpKind::kLease, Take())
                     .Op(OpKind::kHeartbeat, HeartbeatArgs{0, 2, 3})
                     .Op(OpKind::kRelease, Ref()));
  add("retention", Story()
                       .Op(OpKind::kUpdatePolicy, Set(kSetCompletedCount, 1))
                       .Op(OpKind::kUpdatePolicy, Set(kSetFailedAge, 1))
                       .Op(OpKind::kEnqueue, Job())
                       .Op(OpKind::kEnqueue, Job())
                       .Op(OpKind::kEnqueue, Job())
                       .Op(OpKind::kLease, Take(2))
                       .Op(OpKind::kAck, AckOf())
                       .Op(OpKind::kAck, AckOf(1))
                       .Op(OpKind::kFail, FailOf(2, true))
                       .Op(OpKind::kTick)
                       .Op(OpKind::kAdvance, By(5))
                       .Op(OpKind::kTick));
  add("pause_resume", Story()
                          .Op(OpKind::kEnqueue, Job())
                          .Op(OpKind::kPause, QueueArgs{0})
                          .Op(OpKind::kLease, Take())
                          .Op(OpKind::kRestart, OpenArgs{})
                          .Op(OpKind::kResume, QueueArgs{0})
                          .Op(OpKind::kLease, Take()));
  EnqueueArgs delayed = Job();
  delayed.delay = 3;  // 10 s
  add("delayed_job", Story()
                         .Op(OpKind::kEnqueue, delayed)
                         .Op(OpKind::kLease, Take())
                         .Op(OpKind::kAdvance, By(3))
                         .Op(OpKind::kAdvance, By(3))
                         .Op(OpKind::kRestart, OpenArgs{})
                         .Op(OpKind::kLease, Take()));
  add("purge_delete", Story()
                          .Op(OpKind::kEnqueue, Job())
                          .Op(OpKind::kEnqueue, Job(1))
                          .Op(OpKind::kLease, Take())
                          .Op(OpKind::kAck, AckOf())
                          .Op(OpKind::kPurge, PurgeArgs{0, kPurgeDefault})
                          .Op(OpKind::kPurge, PurgeArgs{1, kPurgeActive})
                          .Op(OpKind::kPurge, PurgeArgs{1, kPurgeReady})
                          .Op(OpKind::kDelete, Ref(1)));
  add("max_length", Story()
                        .Op(OpKind::kUpdatePolicy, Set(kSetMaxLength, 1))
                        .Op(OpKind::kEnqueue, Job())
                        .Op(OpKind::kEnqueue, Job())
                        .Op(OpKind::kEnqueue, Job()));
  EnqueueArgs once = Job();
  once.max_attempts = 1;
  add("bulk_retry", Story()
                        .Op(OpKind::kEnqueue, once)
                        .Op(OpKind::kEnqueue, once)
                        .Op(OpKind::kLease, Take(1))
                        .Op(OpKind::kFail, FailOf(0))
                        .Op(OpKind::kFail, FailOf(1))
                        .Op(OpKind::kRetryQueue, RetryQueueArgs{0, 0, 1, 1})
                        .Op(OpKind::kRetryQueue, RetryQueueArgs{0, 0, 1, 0}));
  EnqueueArgs high = Job(), low = Job();
  high.priority = 3;  // 5
  low.priority = 2;   // -1
  add("priority", Story()
                      .Op(OpKind::kEnqueue, low)
                      .Op(OpKind::kEnqueue, Job())
                      .Op(OpKind::kEnqueue, high)
                      .Op(OpKind::kLease, Take())
                      .Op(OpKind::kLease, Take())
                      .Op(OpKind::kLease, Take()));
  // 1 s, doubling, at most 10 s, no jitter, 4 attempts.
  const std::vector<PolicyArgs> backoff = {Set(kSetInitialBackoff, 2), Set(kSetMaxBackoff, 1),
                                           Set(kSetMultiplier, 1), Set(kSetJitter, 0),
                                           Set(kSetMaxAttempts, 2)};
  Story with_backoff;
  for (const PolicyArgs& p : backoff) with_backoff.Op(OpKind::kUpdatePolicy, p);
  add("backoff", Story(with_backoff)
                     .Op(OpKind::kEnqueue, Job())
                     .Op(OpKind::kLease, Take())
                     .Op(OpKind::kFail, FailOf())
                     .Op(OpKind::kAdvance, By(2))
                     .Op(OpKind::kLease, Take())
                     .Op(OpKind::kFail, FailOf())
                     .Op(OpKind::kAdvance, By(2))
                     .Op(OpKind::kTick)
                     .Op(OpKind::kAdvance, By(2))
                     .Op(OpKind::kLease, Take()));
  // max_backoff 1 s, then initial_backoff 10 s: refused; a reset drops the run-time policy.
  add("policy_refused_reset_restart", Story()
                                          .Op(OpKind::kUpdatePolicy, Set(kSetMaxBackoff, 0))
                                          .Op(OpKind::kUpdatePolicy, Set(kSetInitialBackoff, 3))
                                          .Op(OpKind::kUpdatePolicy, Set(kSetLease, 0, 1))
                                          .Op(OpKind::kRestart, OpenArgs{2, 0})
                                          .Op(OpKind::kEnqueue, Job(1))
                                          .Op(OpKind::kLease, Take(0, 0, 1))
                                          .Op(OpKind::kUpdatePolicy,
                                              [] {
                                                PolicyArgs reset = Set(kSetNothing, 0, 1);
                                                reset.reset = 1;
                                                return reset;
                                              }())
                                          .Op(OpKind::kAdvance, By(2))
                                          .Op(OpKind::kTick)
                                          .Op(OpKind::kRestart, OpenArgs{}));
  return out;
}

template <typename Message>
std::string Request(RequestKind kind, const Message& m) {
  return std::string(1, static_cast<char>(kind)) + m.SerializeAsString();
}

std::vector<std::pair<std::string, std::string>> RequestSeeds() {
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&](const char* name, std::string bytes) { out.emplace_back(name, std::move(bytes)); };

  v1::EnqueueRequest enqueue;
  enqueue.set_queue("emails");
  enqueue.set_payload("hello");
  (*enqueue.mutable_headers())["trace"] = "abc";
  enqueue.set_priority(3);
  enqueue.mutable_delay()->set_seconds(5);
  enqueue.set_dedup_key("order-1");
  enqueue.mutable_dedup_ttl()->set_seconds(60);
  enqueue.set_max_attempts(3);
  enqueue.mutable_lease_duration()->set_seconds(10);
  enqueue.set_concurrency_key("tenant-a");
  add("enqueue", Request(RequestKind::kEnqueue, enqueue));
  v1::EnqueueRequest bad_enqueue = enqueue;
  bad_enqueue.set_queue("no spaces");
  bad_enqueue.mutable_run_at()->set_seconds(1);
  add("enqueue_bad", Request(RequestKind::kEnqueue, bad_enqueue));
  v1::EnqueueRequest seed_key;
  seed_key.set_queue(kSeedQueue);
  seed_key.set_payload("other");
  seed_key.set_dedup_key(kSeedDedupKey);
  add("enqueue_dedup_conflict", Request(RequestKind::kEnqueue, seed_key));

  v1::EnqueueBatchRequest batch;
  *batch.add_jobs() = enqueue;
  *batch.add_jobs() = seed_key;
  add("enqueue_batch", Request(RequestKind::kEnqueueBatch, batch));

  v1::LeaseRequest lease;
  lease.set_queue(kSeedQueue);
  lease.set_worker_id("w1");
  lease.set_max_jobs(2);
  lease.mutable_lease_duration()->set_seconds(30);
  lease.mutable_wait()->set_seconds(5);
  add("lease", Request(RequestKind::kLease, lease));
  v1::LeaseRequest lease_bad = lease;
  lease_bad.mutable_wait()->set_seconds(61);
  add("lease_bad_wait", Request(RequestKind::kLease, lease_bad));

  v1::HeartbeatRequest heartbeat;
  heartbeat.set_job_id(kSeedJobRef);
  heartbeat.set_lease_id(kSeedLeaseRef);
  heartbeat.mutable_extend_by()->set_seconds(60);
  heartbeat.set_checkpoint("step 3");
  add("heartbeat", Request(RequestKind::kHeartbeat, heartbeat));

  v1::AckRequest ack;
  ack.set_job_id(kSeedJobRef);
  ack.set_lease_id(kSeedLeaseRef);
  ack.set_result("done");
  add("ack", Request(RequestKind::kAck, ack));
  v1::AckRequest stale = ack;
  stale.set_lease_id("1-0000000000000000");
  add("ack_stale", Request(RequestKind::kAck, stale));

  v1::FailRequest fail;
  fail.set_job_id(kSeedJobRef);
  fail.set_lease_id(kSeedLeaseRef);
  fail.set_error("429");
  fail.mutable_retry_after()->set_seconds(30);
  add("fail", Request(RequestKind::kFail, fail));
  v1::FailRequest fail_bad = fail;
  fail_bad.mutable_retry_after()->set_seconds(-1);
  add("fail_negative_retry_after", Request(RequestKind::kFail, fail_bad));

  v1::ReleaseRequest release;
  release.set_job_id(kSeedJobRef);
  release.set_lease_id(kSeedLeaseRef);
  add("release", Request(RequestKind::kRelease, release));

  v1::WorkRequest subscribe;
  subscribe.set_request_id(1);
  subscribe.mutable_subscribe()->add_queues(kSeedQueue);
  subscribe.mutable_subscribe()->add_queues("other");
  subscribe.mutable_subscribe()->set_worker_id("w2");
  subscribe.mutable_subscribe()->set_max_in_flight(4);
  add("work_subscribe", Request(RequestKind::kWork, subscribe));
  v1::WorkRequest flow;
  flow.set_request_id(2);
  flow.mutable_flow()->set_max_in_flight(0);
  add("work_flow", Request(RequestKind::kWork, flow));
  v1::WorkRequest work_ack;
  *work_ack.mutable_ack() = ack;
  add("work_ack", Request(RequestKind::kWork, work_ack));

  v1::GetJobRequest get_job;
  get_job.set_job_id(kSeedJobRef);
  add("get_job", Request(RequestKind::kGetJob, get_job));
  v1::ListJobsRequest list;
  list.set_queue(kSeedQueue);
  list.set_state(v1::JOB_STATE_ACTIVE);
  list.set_page_size(1);
  add("list_jobs", Request(RequestKind::kListJobs, list));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(kSeedJobRef);
  add("cancel_job", Request(RequestKind::kCancelJob, cancel));
  v1::RetryJobRequest retry;
  retry.set_queue(kSeedQueue);
  retry.set_state(v1::JOB_STATE_CANCELLED);
  retry.set_limit(10);
  add("retry_jobs", Request(RequestKind::kRetryJob, retry));
  v1::DeleteJobRequest del;
  del.set_job_id(kSeedJobRef);
  add("delete_job", Request(RequestKind::kDeleteJob, del));
  v1::GetQueueRequest get_queue;
  get_queue.set_queue(kSeedQueue);
  add("get_queue", Request(RequestKind::kGetQueue, get_queue));

  v1::UpdateQueuePolicyRequest update;
  update.set_queue("emails");
  v1::QueuePolicy* p = update.mutable_policy();
  p->set_max_concurrency(4);
  p->set_max_concurrency_per_key(1);
  p->mutable_retry()->set_max_attempts(7);
  p->mutable_retry()->mutable_initial_backoff()->set_seconds(2);
  p->mutable_retry()->set_backoff_multiplier(1.5);
  p->mutable_retry()->mutable_max_backoff()->set_seconds(600);
  p->mutable_retry()->set_jitter(v1::JITTER_EQUAL);
  p->mutable_lease_duration()->set_seconds(45);
  p->mutable_completed_retention()->set_max_count(10);
  p->mutable_rate_limit()->set_per_second(2.5);
  p->set_paused(true);
  add("update_queue_policy", Request(RequestKind::kUpdateQueuePolicy, update));
  v1::UpdateQueuePolicyRequest update_bad = update;
  update_bad.mutable_policy()->mutable_lease_duration()->set_nanos(-5);
  add("update_queue_policy_bad", Request(RequestKind::kUpdateQueuePolicy, update_bad));

  v1::PauseQueueRequest pause;
  pause.set_queue(kSeedQueue);
  add("pause_queue", Request(RequestKind::kPauseQueue, pause));
  add("resume_queue", Request(RequestKind::kResumeQueue, pause));
  v1::PurgeQueueRequest purge;
  purge.set_queue(kSeedQueue);
  purge.add_states(v1::JOB_STATE_READY);
  add("purge_queue", Request(RequestKind::kPurgeQueue, purge));

  std::string json(1, static_cast<char>(RequestKind::kServerConfigJson));
  add("config", json + R"({"default_policy": {"max_concurrency": 8, "retry": {"max_attempts": 3,
 "initial_backoff": "0.5s", "jitter": "JITTER_NONE"}, "dedup_ttl": "3600s"},
 "queues": {"emails": {"lease_duration": "10s", "rate_limit": {"per_second": 5, "burst": 10},
 "failed_retention": {"max_count": "100", "max_age": "86400s"}}}})");
  add("config_bad", json + R"({"queues": {"bad name": {"max_length": "-1"}}})");
  add("config_typo", json + R"({"default_policy": {"max_concurency": 1}})");
  return out;
}

void Write(const fs::path& dir, const std::vector<std::pair<std::string, std::string>>& seeds) {
  fs::create_directories(dir);
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
      std::exit(1);
    }
  }
}

}  // namespace
}  // namespace jobbroker::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  jobbroker::fuzz::Write(root / "core_model_fuzzer", jobbroker::fuzz::ModelSeeds());
  jobbroker::fuzz::Write(root / "request_fuzzer", jobbroker::fuzz::RequestSeeds());
  return 0;
}
