#include "tests/crash/producer.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/crash/channel.h"
#include "tests/crash/checker.h"
#include "tests/crash/line_log.h"

namespace jobbroker::crash {
namespace {

constexpr absl::Duration kCallDeadline = absl::Seconds(5);
// Attempts of a job that fails on every attempt: few, so that it dies quickly.
constexpr int kExhaustAttempts = 3;
constexpr int32_t kSlowTimeoutNanos = 500'000'000;

// A broker being killed or restarting answers with one of these; a retry with the same dedup
// keys is then safe (a committed job is found again, deduplicated). RESOURCE_EXHAUSTED is a
// full disk (the cluster harness fills one): writes resume once it has room, or another
// replica leads.
bool Retryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::ABORTED:
      return true;
    default:
      return false;
  }
}

const char* PickKind(std::mt19937_64& rng) {
  const int roll = std::uniform_int_distribution<int>(0, 99)(rng);
  if (roll < 77) return kKindOk;
  if (roll < 80) return kKindSlow;
  if (roll < 88) return kKindFlaky;
  if (roll < 94) return kKindPermanent;
  return kKindExhaust;
}

struct Planned {
  v1::EnqueueRequest request;
  std::string kind;
};

class Producer {
 public:
  Producer(const ProducerOptions& options, std::unique_ptr<LineLog> log)
      : options_(options), log_(std::move(log)), brokers_(options.address), rng_(options.seed) {}

  int Run() {
    const absl::Time deadline = absl::Now() + options_.spread;
    int next = 0;
    int64_t batch = 0;
    while (next < options_.jobs) {
      Pause(deadline, options_.jobs - next);
      const bool as_batch = std::uniform_int_distribution<int>(0, 99)(rng_) < 20;
      const int size = as_batch ? std::uniform_int_distribution<int>(2, 8)(rng_) : 1;
      // A batch goes to one queue: queues may live in different partitions, and a batch is all
      // or nothing within one (node/partitions.h).
      const size_t queue = static_cast<size_t>(next) % options_.queues.size();
      std::vector<Planned> jobs;
      for (int i = 0; i < size && next < options_.jobs; ++i) jobs.push_back(Plan(next++, queue));
      // In a batch whose first job completes in the end, each later job waits for it half the
      // time: the checker finds none started before it completed (DEPENDENCY_ORDER).
      const std::string& first = jobs.front().kind;
      if (as_batch && (first == kKindOk || first == kKindFlaky || first == kKindSlow)) {
        for (size_t i = 1; i < jobs.size(); ++i) {
          if (std::uniform_int_distribution<int>(0, 1)(rng_) == 1)
            jobs[i].request.add_depends_on_index(0);
        }
      }
      // A single job waits, one time in six, for the latest job of another queue that completes
      // in the end: with queues in several partitions, a dependency across them, delivered by
      // the relay (server/grpc/dependency_relay.h).
      if (!as_batch && !last_completing_.job_id.empty() && last_completing_.queue != queue &&
          std::uniform_int_distribution<int>(0, 5)(rng_) == 0)
        jobs.front().request.add_depends_on(last_completing_.job_id);
      const bool ok = as_batch ? EnqueueBatch(jobs, ++batch) : Enqueue(jobs.front());
      if (!ok) return 2;
    }
    return 0;
  }

 private:
  Planned Plan(int index, size_t queue) {
    Planned p;
    p.kind = PickKind(rng_);
    const std::string key = absl::StrCat(options_.name, "-", index);
    v1::EnqueueRequest& r = p.request;
    r.set_queue(options_.queues[queue]);
    r.set_dedup_key(key);
    r.set_payload(absl::StrCat("kind=", p.kind, ";key=", key));
    if (p.kind == kKindExhaust) r.set_max_attempts(kExhaustAttempts);
    // Under the 1 s lease, so the limit, not the lease, ends the hung first attempt.
    if (p.kind == kKindSlow) r.mutable_timeout()->set_nanos(kSlowTimeoutNanos);
    return p;
  }

  // One call in five is a batch of 2..8: 1.8 jobs a call on average.
  void Pause(absl::Time deadline, int jobs_left) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return;
    const double calls_left = std::max(1.0, jobs_left / 1.8);
    const double scale = std::uniform_real_distribution<double>(0.5, 1.5)(rng_);
    absl::SleepFor(left / calls_left * scale);
  }

  // Runs `call` until it is answered; false on a non-retryable answer. `tries` counts calls.
  template <typename Call>
  bool UntilAnswered(const std::string& what, int* tries, Call call) {
    for (*tries = 1;; ++*tries) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
      const grpc::Status s = call(ctx);
      if (s.ok()) return true;
      if (!Retryable(s.error_code())) {
        std::fprintf(stderr, "%s: %s refused with code %d: %s\n", options_.name.c_str(),
                     what.c_str(), static_cast<int>(s.error_code()), s.error_message().c_str());
        return false;
      }
      brokers_.Next();  // a cluster: another node answers for this one meanwhile
      absl::SleepFor(absl::Milliseconds(50) * std::min(*tries, 6));
    }
  }

  void Record(const Planned& p, const v1::EnqueueResponse& r, int tries, int64_t batch) {
    log_->Write({"ENQ", r.job_id(), p.request.dedup_key(), p.kind, p.request.queue(),
                 r.deduplicated() ? "1" : "0", absl::StrCat(tries), absl::StrCat(batch)});
  }

  bool Enqueue(const Planned& p) {
    v1::EnqueueResponse response;
    int tries = 0;
    if (!UntilAnswered(absl::StrCat("enqueue ", p.request.dedup_key()), &tries,
                       [&](grpc::ClientContext& ctx) {
                         response.Clear();
                         return brokers_.Current().Enqueue(&ctx, p.request, &response);
                       })) {
      return false;
    }
    if (response.job_id().empty()) {
      std::fprintf(stderr, "%s: enqueue answered without a job id\n", options_.name.c_str());
      return false;
    }
    Record(p, response, tries, 0);
    if (p.kind == kKindOk || p.kind == kKindFlaky || p.kind == kKindSlow)
      last_completing_ = {response.job_id(), QueueIndex(p.request.queue())};
    return true;
  }

  size_t QueueIndex(const std::string& queue) const {
    return static_cast<size_t>(std::find(options_.queues.begin(), options_.queues.end(), queue) -
                               options_.queues.begin());
  }

  bool EnqueueBatch(const std::vector<Planned>& jobs, int64_t batch) {
    v1::EnqueueBatchRequest request;
    for (const Planned& p : jobs) *request.add_jobs() = p.request;
    v1::EnqueueBatchResponse response;
    int tries = 0;
    if (!UntilAnswered(absl::StrCat("batch ", batch), &tries, [&](grpc::ClientContext& ctx) {
          response.Clear();
          return brokers_.Current().EnqueueBatch(&ctx, request, &response);
        })) {
      return false;
    }
    if (response.results_size() != static_cast<int>(jobs.size())) {
      std::fprintf(stderr, "%s: batch %lld of %zu jobs answered with %d results\n",
                   options_.name.c_str(), static_cast<long long>(batch), jobs.size(),
                   response.results_size());
      return false;
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      Record(jobs[i], response.results(static_cast<int>(i)), tries, batch);
    }
    return true;
  }

  const ProducerOptions& options_;
  std::unique_ptr<LineLog> log_;
  BrokerRing brokers_;
  std::mt19937_64 rng_;
  // The latest single job acknowledged whose kind completes in the end, and its queue's index.
  struct {
    std::string job_id;
    size_t queue = 0;
  } last_completing_;
};

}  // namespace

int RunProducer(const ProducerOptions& options) {
  absl::StatusOr<std::unique_ptr<LineLog>> log = LineLog::Open(options.log_path);
  if (!log.ok() || options.queues.empty()) {
    std::fprintf(stderr, "producer: %s\n",
                 log.ok() ? "no queues" : std::string(log.status().message()).c_str());
    return 2;
  }
  return Producer(options, *std::move(log)).Run();
}

}  // namespace jobbroker::crash
