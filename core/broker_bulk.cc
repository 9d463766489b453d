// Broker: an operator's bulk calls, redrive (RetryJobs) and PurgeQueue. Each runs as batches of
// one transition; the next batch starts once the previous one is durable, so other calls run in
// between and bulk work goes at the pace of the disk.
#include <atomic>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/broker_mutation.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker::core {

// Bulk work cut into transitions: `step` does one batch under the mutex and says whether all is
// done; `done` gets the outcome once the last batch is durable, or the first error, with
// `lost` = true if that error is the failed write of the latest batch (whose changes then never
// reach the disk).
struct Broker::Batches {
  absl::AnyInvocable<absl::StatusOr<bool>(absl::Time now, Transition& t, Effects& fx)> step;
  absl::AnyInvocable<void(absl::Status status, bool lost)> done;
};

// A RetryJobs call in progress.
struct Broker::Redrive {
  RetryJobsSpec spec;
  RetryJobsResult result;
  bool started = false;
  absl::Time start;
  // Dead jobs in (completed_at, seq) order: the last one looked at. Only jobs that ended by
  // `start` are taken, so the walk ends even while jobs keep failing.
  TimeKey cursor{absl::InfinitePast(), 0};
  // A job retried here that fails again within the same clock tick sorts after the cursor once
  // more; this keeps it from being retried twice by one call.
  absl::flat_hash_set<uint64_t> retried;
  int64_t in_batch = 0;  // retried by the latest batch
};

// A PurgeQueue call in progress.
struct Broker::Purge {
  std::string queue;
  std::array<bool, 7> states{};  // indexed by JobState: purge jobs in it
  bool started = false;
  // Jobs are walked in enqueue order up to the first one enqueued after the call started, so the
  // purge ends even while producers keep enqueueing.
  uint64_t end_seq = 0;
  uint64_t cursor = 0;  // the last seq looked at
  int64_t purged = 0;
  int64_t in_batch = 0;  // purged by the latest batch
};

namespace {

absl::Status NoSuchQueue(const std::string& queue) {
  return absl::NotFoundError(absl::StrCat("queue ", queue, " not found"));
}

// An error that ended bulk work midway, with how far it got (the batches before it stay done).
absl::Status Midway(const absl::Status& s, absl::string_view what, int64_t n) {
  if (s.ok() || n == 0) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), " (", n, " jobs were ", what,
                                             " before it; the rest were not)"));
}

}  // namespace

void Broker::RetryJobs(RetryJobsSpec spec, Done<absl::StatusOr<RetryJobsResult>> done) {
  if (absl::Status s = ValidateRetryJobsSpec(spec); !s.ok()) return done(s);
  if (spec.limit == 0) spec.limit = kDefaultRetryLimit;

  if (spec.dry_run) {
    // Every job now in `state` has ended before now, so the real run would take them all, up
    // to the limit. A read: nothing to make durable.
    absl::StatusOr<RetryJobsResult> result;
    {
      absl::MutexLock lock(&mu_);
      const QueueState* q = queues_.Find(spec.queue);
      if (q == nullptr) {
        result = NoSuchQueue(spec.queue);
      } else {
        result = RetryJobsResult{std::min(q->count(spec.state), spec.limit), 0};
      }
    }
    return done(std::move(result));
  }

  auto r = std::make_shared<Redrive>();
  r->spec = std::move(spec);
  auto batches = std::make_shared<Batches>();
  batches->step =
      [this, r](absl::Time now, Transition& t, Effects& fx)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return RedriveBatchLocked(*r, now, t, fx); };
  batches->done = [r, done = std::move(done)](absl::Status s, bool lost) mutable {
    if (!s.ok()) return done(Midway(s, "retried", r->result.retried - (lost ? r->in_batch : 0)));
    done(r->result);
  };
  RunBatches(std::move(batches));
}

absl::StatusOr<bool> Broker::RedriveBatchLocked(Redrive& r, absl::Time now, Transition& t,
                                                Effects& fx) {
  fx.Require(Durability::kSync);  // an operator's change (Effects)
  QueueState* q = queues_.Find(r.spec.queue);
  // Queues are never removed, so only the first batch can miss it (and has changed nothing).
  if (q == nullptr) return NoSuchQueue(r.spec.queue);
  if (!r.started) {
    r.started = true;
    r.start = now;
  }
  int changes = kRetryBatch;
  int visits = kBulkVisitsPerBatch;
  r.in_batch = 0;
  bool finished = false;
  bool any = false;
  auto it = q->dead.upper_bound(r.cursor);
  while (changes > 0 && visits-- > 0) {
    if (r.result.matched >= r.spec.limit || it == q->dead.end() || it->first > r.start) {
      finished = true;
      break;
    }
    r.cursor = *it;
    Job& job = jobs_.Hot(it->second);
    if (job.state != r.spec.state || r.retried.contains(job.seq)) {
      ++it;
      continue;
    }
    RetryLocked(job, now, t);  // leaves q->dead: find the next one afresh
    r.retried.insert(job.seq);
    ++r.result.matched;
    ++r.result.retried;
    ++r.in_batch;
    --changes;
    any = true;
    it = q->dead.upper_bound(r.cursor);
  }
  if (!finished && r.result.matched >= r.spec.limit) finished = true;
  if (any) ServeConsumersLocked(*q, now, t, fx);
  return finished;
}

void Broker::PurgeQueue(std::string queue, std::vector<JobState> states,
                        Done<absl::StatusOr<int64_t>> done) {
  if (absl::Status s = ValidatePurge(queue, states); !s.ok()) return done(s);
  if (states.empty()) states = {JobState::kCompleted, JobState::kFailed, JobState::kCancelled};
  auto p = std::make_shared<Purge>();
  p->queue = std::move(queue);
  for (JobState s : states) p->states[static_cast<int>(s)] = true;
  auto batches = std::make_shared<Batches>();
  batches->step = [this, p](absl::Time, Transition& t, Effects& fx)
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return PurgeBatchLocked(*p, t, fx); };
  batches->done = [p, done = std::move(done)](absl::Status s, bool lost) mutable {
    if (!s.ok()) return done(Midway(s, "purged", p->purged - (lost ? p->in_batch : 0)));
    done(p->purged);
  };
  RunBatches(std::move(batches));
}

absl::StatusOr<bool> Broker::PurgeBatchLocked(Purge& p, Transition& t, Effects& fx) {
  fx.Require(Durability::kSync);  // an operator's change (Effects)
  QueueState* q = queues_.Find(p.queue);
  if (q == nullptr) return NoSuchQueue(p.queue);
  if (!p.started) {
    p.started = true;
    p.end_seq = jobs_.peek_next_seq();
  }
  int changes = kPurgeBatch;
  int visits = kBulkVisitsPerBatch;
  p.in_batch = 0;
  auto it = q->all.upper_bound(p.cursor);
  while (changes > 0 && visits-- > 0) {
    if (it == q->all.end() || *it >= p.end_seq) return true;
    p.cursor = *it;
    // The state decides first: a cold job is read back only to be removed.
    Job* job = p.states[static_cast<int>(StateOfLocked(*q, *it))] ? JobBySeqLocked(*it) : nullptr;
    if (job == nullptr) {
      ++it;
      continue;
    }
    RemoveJobLocked(*job, t);  // leaves q->all: find the next one afresh
    ++p.purged;
    ++p.in_batch;
    --changes;
    it = q->all.upper_bound(p.cursor);
  }
  return it == q->all.end() || *it >= p.end_seq;
}

void Broker::RunBatches(std::shared_ptr<Batches> batches) {
  while (true) {
    Effects fx;
    uint64_t commit = 0;
    absl::StatusOr<bool> finished = false;
    absl::Status refused = Mutate(fx, commit,
                                  [&](absl::Time now, Transition& t, Effects& effects)
                                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                        finished = batches->step(now, t, effects);
                                        return absl::OkStatus();
                                      });
    const bool ran = refused.ok();
    if (!ran) finished = refused;
    // The next batch starts once this one is durable. When that is known at once (inline
    // commits, or a batch that wrote nothing) the callback runs inside Finish: then this loop
    // goes on instead of recursing. Otherwise the write's callback continues from the writer's
    // thread. Whichever of the two comes second carries on.
    auto turn = std::make_shared<std::atomic<int>>(0);  // 1: the loop let go; 2: callback ran
    Finish(
        commit, std::move(fx),
        [this, batches, turn, ran, finished = std::move(finished)](absl::Status written) mutable {
          // Refused (shutting down, or writes stopped after a failure): no batch was made.
          if (!ran) return batches->done(finished.status(), /*lost=*/false);
          if (!written.ok()) return batches->done(NotDurable(written), /*lost=*/true);
          if (!finished.ok()) return batches->done(finished.status(), /*lost=*/false);
          if (*finished) return batches->done(absl::OkStatus(), /*lost=*/false);
          if (turn->exchange(2) == 1) RunBatches(std::move(batches));
        });
    if (turn->exchange(1) != 2) return;
  }
}

}  // namespace jobbroker::core
