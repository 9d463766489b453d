// Broker: Enqueue and EnqueueBatch (all or nothing, dedup keys, max_length).
#include "absl/strings/str_cat.h"
#include "core/broker_mutation.h"
#include "core/ids.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker::core {

void Broker::EnqueueBatch(std::vector<EnqueueSpec> specs,
                          Done<absl::StatusOr<std::vector<EnqueueResult>>> done, bool batch) {
  const bool name_jobs = batch || specs.size() > 1;
  if (absl::Status s = ValidateEnqueueBatch(specs, name_jobs); !s.ok()) return done(s);
  Run<std::vector<EnqueueResult>>(
      std::move(done),
      [this, specs = std::move(specs), name_jobs](absl::Time now, Transition& t, Effects& fx)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable {
            return EnqueueLocked(specs, name_jobs, now, t, fx);
          });
}

absl::StatusOr<std::vector<EnqueueResult>> Broker::EnqueueLocked(std::vector<EnqueueSpec>& specs,
                                                                 bool name_jobs, absl::Time now,
                                                                 Transition& t, Effects& fx) {
  // First decide everything without changing anything, so a refusal changes nothing.
  struct Plan {
    int duplicate_of = -1;        // index of an earlier job of this batch with the same key
    std::string existing_job_id;  // a stored job holding the key
  };
  std::vector<Plan> plan(specs.size());
  std::map<std::pair<std::string, std::string>, size_t> batch_keys;
  std::map<std::string, int64_t> new_live;
  for (size_t i = 0; i < specs.size(); ++i) {
    const EnqueueSpec& s = specs[i];
    std::string where = name_jobs ? absl::StrCat("jobs[", i, "].") : "";
    const QueueState* q = queues_.Find(s.queue);
    int64_t max_payload = q == nullptr ? queues_.EffectivePolicy(s.queue, {}).max_payload_bytes
                                       : q->policy.max_payload_bytes;
    if (static_cast<int64_t>(s.payload.size()) > max_payload)
      return absl::ResourceExhaustedError(
          absl::StrCat(where, "payload is ", s.payload.size(), " bytes; queue ", s.queue,
                       " accepts at most ", max_payload, " (its policy's max_payload_bytes)"));
    if (s.expire_at.has_value()) {
      // A job that could never start is a mistake the producer should hear of, not a dead job.
      const absl::Time run_at = s.delay.has_value() ? now + *s.delay : s.run_at.value_or(now);
      if (*s.expire_at <= std::max(run_at, now))
        return absl::InvalidArgumentError(
            absl::StrCat(where, "expire_at ",
                         absl::FormatTime(absl::RFC3339_full, *s.expire_at, absl::UTCTimeZone()),
                         " is not after the time the job could first run; it would never start"));
    }
    for (size_t k = 0; k < s.depends_on.size(); ++k) {
      // Another partition's job is checked where it lives (node::Partitions, or the relay).
      if (!IsRemoteJobLocked(s.depends_on[k]) && FindJobLocked(s.depends_on[k]) == nullptr)
        return absl::InvalidArgumentError(
            absl::StrCat(where, "depends_on[", k, "]: no job ", s.depends_on[k]));
    }
    if (!s.dedup_key.empty()) {
      auto key = std::make_pair(s.queue, s.dedup_key);
      uint64_t hash = PayloadHash(s.payload);
      if (auto it = batch_keys.find(key); it != batch_keys.end()) {
        if (PayloadHash(specs[it->second].payload) != hash)
          return absl::AlreadyExistsError(
              absl::StrCat(where, "dedup_key \"", s.dedup_key, "\" is used by jobs[", it->second,
                           "] of the same batch with a different payload"));
        plan[i].duplicate_of = static_cast<int>(it->second);
        continue;
      }
      if (const DedupEntry* held_by = dedup_.Find(s.queue, s.dedup_key)) {
        const DedupEntry& e = *held_by;
        const Job* holder = FindJobLocked(e.job_id);
        bool held = now < e.expires_at || (holder != nullptr && !IsTerminal(holder->state));
        if (held) {
          if (e.payload_hash != hash)
            return absl::AlreadyExistsError(absl::StrCat(where, "dedup_key \"", s.dedup_key,
                                                         "\" is held by job ", e.job_id,
                                                         " with a different payload"));
          plan[i].existing_job_id = e.job_id;
          continue;
        }
      }
      batch_keys.emplace(std::move(key), i);
    }
    ++new_live[s.queue];
  }
  for (const auto& [name, added] : new_live) {
    // Find, not Get: a refused batch must not even create a queue.
    const QueueState* q = queues_.Find(name);
    int64_t live = q == nullptr ? 0 : q->live();
    int64_t max_length =
        q == nullptr ? queues_.EffectivePolicy(name, {}).max_length : q->policy.max_length;
    if (max_length > 0 && live + added > max_length)
      return absl::ResourceExhaustedError(absl::StrCat("queue ", name, " is full: ", live,
                                                       " jobs are not finished and max_length is ",
                                                       max_length));
  }

  std::vector<EnqueueResult> results(specs.size());
  absl::flat_hash_set<QueueState*> touched;
  for (size_t i = 0; i < specs.size(); ++i) {
    EnqueueSpec& s = specs[i];
    if (plan[i].duplicate_of >= 0) {
      results[i] = {results[plan[i].duplicate_of].job_id, true};
      observer_.Enqueued(s.queue, results[i].job_id, true);
      continue;
    }
    if (!plan[i].existing_job_id.empty()) {
      results[i] = {plan[i].existing_job_id, true};
      observer_.Enqueued(s.queue, results[i].job_id, true);
      continue;
    }
    QueueState& q = queues_.Get(s.queue);
    fx.Touch(q.policy);
    auto owned = std::make_unique<Job>();
    Job& job = *owned;
    job.id = NewJobId(now, options_.partition, gen_);
    job.queue = s.queue;
    job.payload = std::move(s.payload);
    job.headers = std::move(s.headers);
    job.priority = s.priority;
    job.seq = jobs_.NextSeq();
    job.max_attempts = s.max_attempts > 0 ? s.max_attempts : q.policy.retry.max_attempts;
    job.dedup_key = std::move(s.dedup_key);
    job.concurrency_key = std::move(s.concurrency_key);
    job.created_at = now;
    job.lease_duration = s.lease_duration;
    job.timeout = s.timeout;
    job.expire_at = s.expire_at.value_or(absl::InfiniteFuture());
    job.run_at = now;
    if (s.delay.has_value()) job.run_at = now + *s.delay;
    if (s.run_at.has_value()) job.run_at = std::max(now, *s.run_at);
    job.state = job.run_at > now ? JobState::kScheduled : JobState::kReady;
    if (!s.depends_on.empty() || !s.depends_on_index.empty()) {
      // Checked above: every id is a job here, every index an earlier job of the batch.
      job.depends_on = ResolveDependenciesLocked(s, results);
      SetDependencyStateLocked(job, now);
    }

    if (!job.dedup_key.empty()) {
      DedupEntry e{job.queue, job.dedup_key, job.id, now + s.dedup_ttl.value_or(q.policy.dedup_ttl),
                   PayloadHash(job.payload)};
      deadlines_.Note(e.expires_at);
      t.put_dedup.push_back(e);
      dedup_.Put(std::move(e));
    }
    observer_.Enqueued(job.queue, job.id, false);
    ++q.enqueued_total;
    results[i] = {job.id, false};
    q.all.insert(job.seq);
    IndexLocked(job);
    t.put_jobs.push_back(job);
    touched.insert(&q);
    jobs_.Adopt(std::move(owned), JobTable::kNotWritten);
  }
  for (QueueState* q : touched) ServeConsumersLocked(*q, now, t, fx);
  return results;
}

}  // namespace jobbroker::core
