// jobbroker-bench: load against a running broker over its public gRPC API.
//
//   jobbroker-bench enqueue   [--concurrency N] [--jobs N] [--payload-bytes N]
//   jobbroker-bench e2e       [--workers N] [--jobs N] [--concurrency N]
//   jobbroker-bench e2e-mixed [--workers N] [--concurrency N] [--jobs N]
//   jobbroker-bench batch     [--concurrency N] [--batch N] [--jobs N]
//   jobbroker-bench stream    [--workers N] [--in-flight N] [--concurrency N] [--producer-batch N]
//   common: --address HOST:PORT (127.0.0.1:7070) --queue NAME --channels N --timeout SECONDS
//
// enqueue:   N producer threads, each a blocking unary Enqueue loop. Every Enqueue waits for its
//            synced WAL write, so concurrency 1 measures fsync latency and higher concurrency
//            measures group commit.
// batch:     N producer threads, each a blocking EnqueueBatch loop of --batch jobs.
// e2e:       preloads --jobs jobs (EnqueueBatch, not timed), then --workers threads loop
//            Lease(max_jobs 1) -> Ack until all are done; reports the lease+ack phase.
// e2e-mixed: producers and workers at the same time; reports jobs/s from the first enqueue to
//            the last ack, and the enqueue-to-ack latency of each job.
//
// Each run prints one human line and one JSON line (prefixed by nothing, starting with '{').
// Exit code 0 when every job went through, 1 on errors or timeout, 2 on bad usage.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "jobbroker/bench/v1/echo.grpc.pb.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "jobbroker/worker.h"

namespace jobbroker::bench {
namespace {

// jobbroker::bench::v1 is the echo server's API; the broker's is meant here.
namespace v1 = ::jobbroker::v1;

// The header a mixed run uses to carry each job's enqueue time to the worker.
constexpr char kEnqueuedAtHeader[] = "bench-enqueued-at-ns";
constexpr int64_t kMaxErrors = 100;

struct Flags {
  std::string mode;
  std::string address = "127.0.0.1:7070";
  std::string queue;  // empty: a fresh name per run
  int concurrency = 16;
  int workers = 16;
  int64_t jobs = 20000;
  int payload_bytes = 100;
  int channels = 4;
  int batch = 100;
  int in_flight = 16;      // stream modes: jobs each streaming worker holds at once
  int producer_batch = 1;  // stream mode: jobs per producer call (1: Enqueue, more: EnqueueBatch)
  int64_t preload = 0;     // backlog mode: ready jobs waiting before the measured Lease+Acks
  int64_t keys = 0;        // backlog mode: distinct concurrency keys of the preloaded jobs
  int64_t queues = 1;      // backlog and e2e modes: queues the jobs are spread over
  double rate = 1000;      // latency mode: enqueues per second
  int senders = 1;         // latency mode: producer threads sharing the rate
  double timeout_seconds = 300;
};

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: jobbroker-bench enqueue|batch|e2e|e2e-mixed|stream|drain|latency|backlog "
               "[flags]\n"
               "  batch: --concurrency producers, each an EnqueueBatch loop of --batch jobs\n"
               "  echo: as enqueue, but Echo on jobbroker-echo-server (bench/echo/): baseline\n"
               "  stream: --workers streaming workers (jobbroker::client::Worker, no-op\n"
               "          handler) while --concurrency producers enqueue; jobs/s end to end\n"
               "  drain: as stream, but the producers enqueue every job first (not timed);\n"
               "          then the workers start: jobs/s of the workers alone\n"
               "  backlog: preload --preload jobs (over --keys concurrency keys and --queues\n"
               "          queues), then time --jobs Lease+Ack cycles by --workers unary workers\n"
               "  latency: one idle streaming worker, enqueues at --rate per second; time\n"
               "          from the Enqueue's send (and its return, on stderr) to the job's\n"
               "          arrival in the handler\n"
               "  --address HOST:PORT   broker gRPC address (default 127.0.0.1:7070)\n"
               "  --concurrency N       producer threads (default 16)\n"
               "  --workers N           worker threads for e2e modes (default 16)\n"
               "  --jobs N              jobs per run (default 20000)\n"
               "  --payload-bytes N     payload size (default 100)\n"
               "  --queue NAME          queue to use (default: a fresh name per run)\n"
               "  --channels N          gRPC connections to spread threads over (default 4)\n"
               "  --batch N             EnqueueBatch size: batch mode, preloads (default 100)\n"
               "  --producer-batch N    stream mode: jobs per producer call; 1 = Enqueue\n"
               "  --in-flight N         stream modes: jobs each worker holds (default 16)\n"
               "  --preload N           backlog mode: ready jobs before measuring (default 0)\n"
               "  --keys N              backlog mode: concurrency keys of those jobs (default 0)\n"
               "  --queues N            backlog, e2e: spread the jobs over N queues named\n"
               "                        QUEUE-0 .. QUEUE-(N-1); each worker leases from them in\n"
               "                        turn, without waiting on an empty one (default 1: QUEUE)\n"
               "  --rate N              latency mode: enqueues per second (default 1000)\n"
               "  --senders N           latency mode: producer threads that share the rate, each\n"
               "                        waiting for its Enqueue before the next (default 1)\n"
               "  --timeout SECONDS     give up after this long (default 300)\n");
}

bool ParseInt(const char* text, int64_t min, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < min) return false;
  *out = v;
  return true;
}

// Hand-rolled: Debian's Abseil ships absl/flags in a form that is awkward to link standalone.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      Usage(stdout);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) {
      if (!flags->mode.empty()) {
        std::fprintf(stderr, "unexpected argument: %s\n", arg.c_str());
        return false;
      }
      flags->mode = arg;
      continue;
    }
    std::string value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      std::fprintf(stderr, "%s needs a value\n", arg.c_str());
      return false;
    }
    int64_t n = 0;
    auto as_int = [&](int64_t min) {
      if (ParseInt(value.c_str(), min, &n)) return true;
      std::fprintf(stderr, "%s: not an integer >= %lld: %s\n", arg.c_str(),
                   static_cast<long long>(min), value.c_str());
      return false;
    };
    if (arg == "--mode") {
      flags->mode = value;
    } else if (arg == "--address") {
      flags->address = value;
    } else if (arg == "--queue") {
      flags->queue = value;
    } else if (arg == "--concurrency") {
      if (!as_int(1)) return false;
      flags->concurrency = static_cast<int>(n);
    } else if (arg == "--workers") {
      if (!as_int(1)) return false;
      flags->workers = static_cast<int>(n);
    } else if (arg == "--jobs") {
      if (!as_int(1)) return false;
      flags->jobs = n;
    } else if (arg == "--payload-bytes") {
      if (!as_int(0)) return false;
      flags->payload_bytes = static_cast<int>(n);
    } else if (arg == "--channels") {
      if (!as_int(1)) return false;
      flags->channels = static_cast<int>(n);
    } else if (arg == "--batch") {
      if (!as_int(1)) return false;
      flags->batch = static_cast<int>(std::min<int64_t>(n, 1000));
    } else if (arg == "--producer-batch") {
      if (!as_int(1)) return false;
      flags->producer_batch = static_cast<int>(std::min<int64_t>(n, 1000));
    } else if (arg == "--in-flight") {
      if (!as_int(1)) return false;
      flags->in_flight = static_cast<int>(n);
    } else if (arg == "--preload") {
      if (!as_int(0)) return false;
      flags->preload = n;
    } else if (arg == "--keys") {
      if (!as_int(0)) return false;
      flags->keys = n;
    } else if (arg == "--queues") {
      if (!as_int(1)) return false;
      flags->queues = n;
    } else if (arg == "--rate") {
      if (!as_int(1)) return false;
      flags->rate = static_cast<double>(n);
    } else if (arg == "--senders") {
      if (!as_int(1)) return false;
      flags->senders = static_cast<int>(n);
    } else if (arg == "--timeout") {
      if (!as_int(1)) return false;
      flags->timeout_seconds = static_cast<double>(n);
    } else {
      std::fprintf(stderr, "unknown flag: %s\n", arg.c_str());
      return false;
    }
  }
  if (flags->mode != "enqueue" && flags->mode != "batch" && flags->mode != "e2e" &&
      flags->mode != "e2e-mixed" && flags->mode != "stream" && flags->mode != "drain" &&
      flags->mode != "latency" && flags->mode != "backlog" && flags->mode != "echo") {
    std::fprintf(
        stderr,
        "mode must be enqueue, batch, e2e, e2e-mixed, stream, drain, latency, backlog or echo\n");
    return false;
  }
  return true;
}

// A few independent connections: one HTTP/2 connection serialises on one client thread and one
// server poller, which would cap high concurrency at what a single connection does.
class Channels {
 public:
  Channels(const std::string& address, int n) {
    for (int i = 0; i < n; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetMaxReceiveMessageSize(64 << 20);
      args.SetMaxSendMessageSize(64 << 20);
      channels_.push_back(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    }
  }
  std::unique_ptr<v1::Broker::Stub> BrokerStub(int i) const {
    return v1::Broker::NewStub(channels_[static_cast<size_t>(i) % channels_.size()]);
  }
  // Thread i's connection, for services other than Broker (echo mode): the same one BrokerStub(i)
  // would use.
  std::shared_ptr<grpc::Channel> Channel(int i) const {
    return channels_[static_cast<size_t>(i) % channels_.size()];
  }
  // Fails fast with a readable message when nothing listens at the address.
  bool WaitConnected(absl::Duration timeout) const {
    for (const auto& c : channels_) {
      if (!c->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) return false;
    }
    return true;
  }

 private:
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
};

// Latency samples from many threads, merged once at the end.
class Latencies {
 public:
  void Add(std::vector<int64_t> micros) {
    absl::MutexLock lock(&mu_);
    all_.insert(all_.end(), micros.begin(), micros.end());
  }
  // Percentile `p` (0..100) in milliseconds; 0 without samples.
  double PercentileMs(double p) {
    absl::MutexLock lock(&mu_);
    if (all_.empty()) return 0;
    if (!sorted_) {
      std::sort(all_.begin(), all_.end());
      sorted_ = true;
    }
    const size_t i = std::min(all_.size() - 1,
                              static_cast<size_t>(p / 100.0 * static_cast<double>(all_.size())));
    return static_cast<double>(all_[i]) / 1000.0;
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> all_ ABSL_GUARDED_BY(mu_);
  bool sorted_ ABSL_GUARDED_BY(mu_) = false;
};

// Counts failed calls and remembers the first one's status for the report.
class Errors {
 public:
  void Record(const grpc::Status& s, const char* what) {
    if (count_.fetch_add(1) == 0) {
      absl::MutexLock lock(&mu_);
      first_ = absl::StrCat(what, ": code ", s.error_code(), ": ", s.error_message());
    }
  }
  int64_t count() const { return count_.load(); }
  std::string first() {
    absl::MutexLock lock(&mu_);
    return first_;
  }

 private:
  std::atomic<int64_t> count_{0};
  absl::Mutex mu_;
  std::string first_ ABSL_GUARDED_BY(mu_);
};

struct Report {
  std::string mode;
  int concurrency = 0;
  int workers = 0;
  int64_t jobs = 0;
  int64_t done = 0;
  double seconds = 0;
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
  int in_flight = 0;       // stream modes: jobs each worker holds at once
  int producer_batch = 0;  // jobs per producer call
  std::string latency_of;  // what the percentiles measure
  int64_t errors = 0;
  std::string first_error;
  bool timed_out = false;
};

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

void Print(const Report& r, const Flags& flags) {
  const double rate = r.seconds > 0 ? static_cast<double>(r.done) / r.seconds : 0;
  std::printf(
      "%-9s concurrency=%d workers=%d jobs=%lld done=%lld seconds=%.3f jobs_per_sec=%.1f "
      "%s_p50_ms=%.2f %s_p99_ms=%.2f errors=%lld%s\n",
      r.mode.c_str(), r.concurrency, r.workers, static_cast<long long>(r.jobs),
      static_cast<long long>(r.done), r.seconds, rate, r.latency_of.c_str(), r.p50_ms,
      r.latency_of.c_str(), r.p99_ms, static_cast<long long>(r.errors),
      r.timed_out ? " TIMED_OUT" : "");
  std::printf(
      "{\"mode\":\"%s\",\"address\":\"%s\",\"concurrency\":%d,\"workers\":%d,\"jobs\":%lld,"
      "\"done\":%lld,\"payload_bytes\":%d,\"seconds\":%.4f,\"jobs_per_sec\":%.1f,"
      "\"in_flight\":%d,\"producer_batch\":%d,\"keys\":%lld,\"queues\":%lld,"
      "\"latency_of\":\"%s\",\"p50_ms\":%.3f,"
      "\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"errors\":%lld,"
      "\"timed_out\":%s,\"first_error\":\"%s\"}\n",
      r.mode.c_str(), JsonEscape(flags.address).c_str(), r.concurrency, r.workers,
      static_cast<long long>(r.jobs), static_cast<long long>(r.done), flags.payload_bytes,
      r.seconds, rate, r.in_flight, r.producer_batch, static_cast<long long>(flags.keys),
      static_cast<long long>(flags.queues), r.latency_of.c_str(), r.p50_ms, r.p90_ms, r.p99_ms,
      r.max_ms, static_cast<long long>(r.errors), r.timed_out ? "true" : "false",
      JsonEscape(r.first_error).c_str());
  std::fflush(stdout);
}

// p50, p90, p99 and max of `l` into `r`.
void SetPercentiles(Latencies& l, Report* r) {
  r->p50_ms = l.PercentileMs(50);
  r->p90_ms = l.PercentileMs(90);
  r->p99_ms = l.PercentileMs(99);
  r->max_ms = l.PercentileMs(100);
}

grpc::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& fn,
                  absl::Duration timeout = absl::Seconds(30)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return fn(&ctx);
}

class Bench {
 public:
  explicit Bench(Flags flags)
      : flags_(std::move(flags)),
        channels_(flags_.address, flags_.channels),
        payload_(static_cast<size_t>(flags_.payload_bytes), 'p'),
        deadline_(absl::Now() + absl::Seconds(flags_.timeout_seconds)) {
    if (flags_.queue.empty()) {
      flags_.queue =
          absl::StrCat("bench-", flags_.mode, "-", getpid(), "-", absl::ToUnixMillis(absl::Now()));
    }
  }

  int Run() {
    if (!channels_.WaitConnected(absl::Seconds(10))) {
      std::fprintf(stderr, "cannot connect to %s\n", flags_.address.c_str());
      return 1;
    }
    Report r;
    if (flags_.mode == "enqueue" || flags_.mode == "batch") {
      r = RunEnqueue(flags_.mode == "batch");
    } else if (flags_.mode == "e2e") {
      r = RunE2e();
    } else if (flags_.mode == "stream" || flags_.mode == "drain") {
      r = RunStream(flags_.mode == "drain");
    } else if (flags_.mode == "latency") {
      r = RunLatency();
    } else if (flags_.mode == "backlog") {
      r = RunBacklog();
    } else if (flags_.mode == "echo") {
      r = RunEcho();
    } else {
      r = RunMixed();
    }
    Print(r, flags_);
    if (!r.first_error.empty()) std::fprintf(stderr, "first error: %s\n", r.first_error.c_str());
    // Workers may ack a few more than asked (each checks the count before it leases).
    return r.done >= r.jobs && r.errors == 0 ? 0 : 1;
  }

 private:
  // The errors of a run, and whether it ran out of time before its jobs were done.
  void SetErrors(Errors& errors, Report* r) const {
    r->errors = errors.count();
    r->first_error = errors.first();
    r->timed_out = absl::Now() >= deadline_ && r->done < r->jobs;
  }

  // True once the run should stop: past --timeout, or aborted.
  bool TimedOut() const { return abort_.load() || absl::Now() >= deadline_; }

  // Counts a failed call; a broker that keeps failing ends the run instead of spinning on errors
  // until the timeout.
  void RecordError(Errors* errors, const grpc::Status& s, const char* what) {
    errors->Record(s, what);
    if (errors->count() >= kMaxErrors) abort_.store(true);
  }

  // `threads` producers share `next` and enqueue until `jobs` are claimed: single jobs, or with
  // `batch` > 1 EnqueueBatch calls of that many (latencies are then per call).
  std::vector<std::thread> StartProducers(int threads, std::atomic<int64_t>* next,
                                          std::atomic<int64_t>* enqueued, Latencies* latencies,
                                          Errors* errors, bool stamp, int batch = 1) {
    if (batch > 1)
      return StartBatchProducers(threads, next, enqueued, latencies, errors, batch, flags_.jobs);
    std::vector<std::thread> producers;
    for (int t = 0; t < threads; ++t) {
      producers.emplace_back([=, this] {
        std::unique_ptr<v1::Broker::Stub> stub = channels_.BrokerStub(t);
        std::vector<int64_t> micros;
        v1::EnqueueRequest req;
        req.set_queue(flags_.queue);
        req.set_payload(payload_);
        while (next->fetch_add(1) < flags_.jobs && !TimedOut()) {
          const absl::Time start = absl::Now();
          if (stamp) {
            (*req.mutable_headers())[kEnqueuedAtHeader] = absl::StrCat(absl::ToUnixNanos(start));
          }
          v1::EnqueueResponse resp;
          grpc::Status s =
              Call([&](grpc::ClientContext* ctx) { return stub->Enqueue(ctx, req, &resp); });
          if (!s.ok()) {
            RecordError(errors, s, "Enqueue");
            continue;
          }
          micros.push_back(absl::ToInt64Microseconds(absl::Now() - start));
          enqueued->fetch_add(1);
        }
        latencies->Add(std::move(micros));
      });
    }
    return producers;
  }

  // EnqueueBatch loops of `batch` jobs until `total` are claimed; with --keys the jobs are spread
  // over that many concurrency keys. Latencies are per call.
  // The queue of job `i` (and of a worker's `i`th lease): --queue, or with --queues one of
  // QUEUE-0 .. QUEUE-(N-1) in turn.
  std::string QueueOf(int64_t i) const {
    if (flags_.queues == 1) return flags_.queue;
    return absl::StrCat(flags_.queue, "-", i % flags_.queues);
  }

  std::vector<std::thread> StartBatchProducers(int threads, std::atomic<int64_t>* next,
                                               std::atomic<int64_t>* enqueued, Latencies* latencies,
                                               Errors* errors, int batch, int64_t total) {
    std::vector<std::thread> producers;
    for (int t = 0; t < threads; ++t) {
      producers.emplace_back([=, this] {
        std::unique_ptr<v1::Broker::Stub> stub = channels_.BrokerStub(t);
        std::vector<int64_t> micros;
        while (!TimedOut()) {
          const int64_t first = next->fetch_add(batch);
          if (first >= total) break;
          const int64_t n = std::min<int64_t>(batch, total - first);
          v1::EnqueueBatchRequest req;
          for (int64_t i = 0; i < n; ++i) {
            v1::EnqueueRequest* job = req.add_jobs();
            job->set_queue(QueueOf(first + i));
            job->set_payload(payload_);
            if (flags_.keys > 0)
              job->set_concurrency_key(absl::StrCat("key-", (first + i) % flags_.keys));
          }
          const absl::Time start = absl::Now();
          v1::EnqueueBatchResponse resp;
          grpc::Status s =
              Call([&](grpc::ClientContext* ctx) { return stub->EnqueueBatch(ctx, req, &resp); });
          if (!s.ok()) {
            RecordError(errors, s, "EnqueueBatch");
            continue;
          }
          micros.push_back(absl::ToInt64Microseconds(absl::Now() - start));
          enqueued->fetch_add(n);
        }
        latencies->Add(std::move(micros));
      });
    }
    return producers;
  }

  // Workers lease one job at a time and ack it, until `target` jobs are acked (or time runs
  // out). `*finished` is when the last ack completed. With `stamp`, latencies are enqueue-to-ack
  // (from the job's header); else they are one Lease+Ack cycle.
  std::vector<std::thread> StartWorkers(std::atomic<int64_t>* acked, absl::Mutex* finished_mu,
                                        absl::Time* finished, Latencies* latencies, Errors* errors,
                                        bool stamp) {
    std::vector<std::thread> workers;
    for (int t = 0; t < flags_.workers; ++t) {
      workers.emplace_back([=, this] {
        std::unique_ptr<v1::Broker::Stub> stub = channels_.BrokerStub(t);
        std::vector<int64_t> micros;
        v1::LeaseRequest req;
        req.set_queue(flags_.queue);
        req.set_worker_id(absl::StrCat("bench-worker-", t));
        req.set_max_jobs(1);
        // A short long-poll: no busy loop when the queue is momentarily empty, and a quick exit
        // once the last job is done. Over many queues a worker moves on to the next instead.
        if (flags_.queues == 1) req.mutable_wait()->set_nanos(200 * 1000 * 1000);
        // Workers start spread over the queues, so that they do not all visit the same queue
        // one after the other and find it emptied by the ones before.
        int64_t turn = t * std::max<int64_t>(1, flags_.queues / flags_.workers);
        while (acked->load() < flags_.jobs && !TimedOut()) {
          if (flags_.queues > 1) req.set_queue(QueueOf(turn++));
          const absl::Time start = absl::Now();
          v1::LeaseResponse resp;
          grpc::Status s =
              Call([&](grpc::ClientContext* ctx) { return stub->Lease(ctx, req, &resp); });
          if (!s.ok()) {
            RecordError(errors, s, "Lease");
            continue;
          }
          for (const v1::LeasedJob& job : resp.jobs()) {
            v1::AckRequest ack;
            ack.set_job_id(job.job_id());
            ack.set_lease_id(job.lease_id());
            v1::AckResponse ack_resp;
            s = Call([&](grpc::ClientContext* ctx) { return stub->Ack(ctx, ack, &ack_resp); });
            if (!s.ok()) {
              RecordError(errors, s, "Ack");
              continue;
            }
            const absl::Time now = absl::Now();
            absl::Time from = start;
            if (stamp) {
              auto it = job.headers().find(kEnqueuedAtHeader);
              int64_t ns = 0;
              if (it != job.headers().end() && ParseInt(it->second.c_str(), 0, &ns)) {
                from = absl::FromUnixNanos(ns);
              }
            }
            micros.push_back(absl::ToInt64Microseconds(now - from));
            if (acked->fetch_add(1) + 1 == flags_.jobs) {
              absl::MutexLock lock(finished_mu);
              *finished = now;
            }
          }
        }
        latencies->Add(std::move(micros));
      });
    }
    return workers;
  }

  // enqueue and batch modes: --concurrency producers, single jobs or --batch per call.
  Report RunEnqueue(bool batched) {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> enqueued{0};
    Latencies latencies;
    Errors errors;
    const int batch = batched ? std::max(flags_.batch, 2) : 1;
    const absl::Time start = absl::Now();
    std::vector<std::thread> producers =
        StartProducers(flags_.concurrency, &next, &enqueued, &latencies, &errors, false, batch);
    for (std::thread& t : producers) t.join();
    Report r;
    r.mode = batched ? "batch" : "enqueue";
    r.producer_batch = batch;
    r.concurrency = flags_.concurrency;
    r.jobs = flags_.jobs;
    r.done = enqueued.load();
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    r.latency_of = "enqueue";
    SetPercentiles(latencies, &r);
    SetErrors(errors, &r);
    return r;
  }

  // The plain-gRPC baseline for enqueue (bench/echo/): the same producer threads, channels,
  // payload, per-call deadline and timing as StartProducers, calling Echo instead of Enqueue, so
  // `enqueue` against the broker and `echo` against jobbroker-echo-server compare directly.
  Report RunEcho() {
    namespace echo_v1 = ::jobbroker::bench::v1;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> echoed{0};
    Latencies latencies;
    Errors errors;
    const absl::Time start = absl::Now();
    std::vector<std::thread> producers;
    for (int t = 0; t < flags_.concurrency; ++t) {
      producers.emplace_back([&, t] {
        std::unique_ptr<echo_v1::Echo::Stub> stub = echo_v1::Echo::NewStub(channels_.Channel(t));
        std::vector<int64_t> micros;
        echo_v1::EchoMessage req;
        req.set_payload(payload_);
        while (next.fetch_add(1) < flags_.jobs && !TimedOut()) {
          const absl::Time sent = absl::Now();
          echo_v1::EchoMessage resp;
          grpc::Status s =
              Call([&](grpc::ClientContext* ctx) { return stub->Echo(ctx, req, &resp); });
          if (!s.ok()) {
            RecordError(&errors, s, "Echo");
            continue;
          }
          micros.push_back(absl::ToInt64Microseconds(absl::Now() - sent));
          echoed.fetch_add(1);
        }
        latencies.Add(std::move(micros));
      });
    }
    for (std::thread& t : producers) t.join();
    Report r;
    r.mode = "echo";
    r.producer_batch = 1;
    r.concurrency = flags_.concurrency;
    r.jobs = flags_.jobs;
    r.done = echoed.load();
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    r.latency_of = "echo";
    SetPercentiles(latencies, &r);
    SetErrors(errors, &r);
    return r;
  }

  // Preloads all jobs with EnqueueBatch from `concurrency` threads; returns how many went in.
  // Preloads `count` jobs (all of --jobs if negative); with --keys, spread over that many
  // concurrency keys.
  int64_t Preload(Errors* errors, int64_t count = -1) {
    if (count < 0) count = flags_.jobs;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> enqueued{0};
    Latencies unused;
    const absl::Time start = absl::Now();
    std::vector<std::thread> threads = StartBatchProducers(flags_.concurrency, &next, &enqueued,
                                                           &unused, errors, flags_.batch, count);
    for (std::thread& t : threads) t.join();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::fprintf(stderr, "preloaded %lld jobs into %s in %.3f s (%.0f jobs/s, batches of %d)\n",
                 static_cast<long long>(enqueued.load()), flags_.queue.c_str(), seconds,
                 seconds > 0 ? static_cast<double>(enqueued.load()) / seconds : 0, flags_.batch);
    return enqueued.load();
  }

  // Lease+Ack cost behind a backlog: --preload ready jobs wait (the measured jobs are among
  // them), and --workers unary workers take --jobs of them. Leasing is O(log n): this shows it.
  Report RunBacklog() {
    const int64_t total = std::max(flags_.preload, flags_.jobs);
    std::fprintf(stderr, "backlog of %lld ready jobs over %lld keys and %lld queues\n",
                 static_cast<long long>(total), static_cast<long long>(flags_.keys),
                 static_cast<long long>(flags_.queues));
    return RunPreloaded("backlog", total);
  }

  Report RunE2e() { return RunPreloaded("e2e", flags_.jobs); }

  // Preloads `preload` jobs, then --workers unary workers Lease+Ack --jobs of them.
  Report RunPreloaded(const char* mode, int64_t preload) {
    Errors errors;
    Report r;
    r.mode = mode;
    r.concurrency = flags_.workers;
    r.workers = flags_.workers;
    r.jobs = flags_.jobs;
    r.latency_of = "lease_ack";
    if (Preload(&errors, preload) != preload) {
      SetErrors(errors, &r);
      return r;
    }
    std::atomic<int64_t> acked{0};
    absl::Mutex finished_mu;
    absl::Time finished = absl::InfiniteFuture();
    Latencies latencies;
    const absl::Time start = absl::Now();
    std::vector<std::thread> workers =
        StartWorkers(&acked, &finished_mu, &finished, &latencies, &errors, false);
    for (std::thread& t : workers) t.join();
    absl::MutexLock lock(&finished_mu);
    r.done = acked.load();
    r.seconds = absl::ToDoubleSeconds(
        (finished == absl::InfiniteFuture() ? absl::Now() : finished) - start);
    SetPercentiles(latencies, &r);
    SetErrors(errors, &r);
    return r;
  }

  Report RunMixed() {
    Errors errors;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> enqueued{0};
    std::atomic<int64_t> acked{0};
    absl::Mutex finished_mu;
    absl::Time finished = absl::InfiniteFuture();
    Latencies enqueue_latencies;
    Latencies e2e_latencies;
    const absl::Time start = absl::Now();
    std::vector<std::thread> workers =
        StartWorkers(&acked, &finished_mu, &finished, &e2e_latencies, &errors, true);
    std::vector<std::thread> producers =
        StartProducers(flags_.concurrency, &next, &enqueued, &enqueue_latencies, &errors, true);
    for (std::thread& t : producers) t.join();
    if (enqueued.load() != flags_.jobs) {
      // Some enqueues failed: the workers would wait for jobs that never come.
      abort_.store(true);
    }
    for (std::thread& t : workers) t.join();
    Report r;
    r.mode = "e2e-mixed";
    r.concurrency = flags_.concurrency;
    r.workers = flags_.workers;
    r.jobs = flags_.jobs;
    absl::MutexLock lock(&finished_mu);
    r.done = acked.load();
    r.seconds = absl::ToDoubleSeconds(
        (finished == absl::InfiniteFuture() ? absl::Now() : finished) - start);
    r.latency_of = "enqueue_to_ack";
    SetPercentiles(e2e_latencies, &r);
    SetErrors(errors, &r);
    return r;
  }

  // Streaming workers as users run them: the client library's Worker, a no-op handler.
  std::vector<std::unique_ptr<client::Worker>> StartStreamWorkers(
      int n, const std::function<void(client::JobContext&)>& on_job) {
    std::vector<std::unique_ptr<client::Worker>> workers;
    for (int i = 0; i < n; ++i) {
      client::WorkerOptions o;
      o.address = flags_.address;
      o.worker_id = absl::StrCat("bench-stream-", i);
      o.concurrency = flags_.in_flight;
      auto w = std::make_unique<client::Worker>(o);
      w->Handle(flags_.queue, [on_job](client::JobContext& job) {
        on_job(job);
        return absl::OkStatus();
      });
      absl::Status s = w->Start();
      if (!s.ok()) std::fprintf(stderr, "worker start: %s\n", s.ToString().c_str());
      workers.push_back(std::move(w));
    }
    return workers;
  }

  // Enqueue -> push -> ack with `workers` streaming workers, while the producers enqueue
  // (stream), or once they have filled the queue (drain; the fill is not timed): what the lease
  // and ack path alone sustains, without producers competing for the same cores.
  Report RunStream(bool drain) {
    Errors errors;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> enqueued{0};
    std::atomic<int64_t> handled{0};
    Latencies enqueue_latencies;
    absl::Notification all_handled;
    auto start_workers = [&] {
      return StartStreamWorkers(flags_.workers, [&](client::JobContext&) {
        // A drain's workers start after the fill: they wait for exactly what it enqueued.
        const int64_t all = drain ? enqueued.load() : flags_.jobs;
        if (handled.fetch_add(1) + 1 == all) all_handled.Notify();
      });
    };
    auto produce = [&] {
      std::vector<std::thread> producers =
          StartProducers(flags_.concurrency, &next, &enqueued, &enqueue_latencies, &errors, false,
                         flags_.producer_batch);
      for (std::thread& t : producers) t.join();
    };
    decltype(start_workers()) workers;
    absl::Time start;
    if (drain) {
      produce();
      start = absl::Now();
      workers = start_workers();
    } else {
      workers = start_workers();
      start = absl::Now();
      produce();
    }
    all_handled.WaitForNotificationWithDeadline(deadline_);
    // Stop waits for the last acks to be answered: the run ends when the broker has them all.
    for (auto& w : workers) w->Stop(absl::Seconds(30));
    const absl::Time end = absl::Now();
    int64_t acked = 0;
    for (auto& w : workers) acked += w->stats().acked;
    Report r;
    r.mode = drain ? "drain" : "stream";
    r.in_flight = flags_.in_flight;
    r.producer_batch = flags_.producer_batch;
    r.concurrency = flags_.concurrency;
    r.workers = flags_.workers;
    r.jobs = flags_.jobs;
    r.done = acked;
    r.seconds = absl::ToDoubleSeconds(end - start);
    r.latency_of = "enqueue";
    SetPercentiles(enqueue_latencies, &r);
    SetErrors(errors, &r);
    return r;
  }

  // One idle streaming worker; one producer sends at a fixed rate. Latency: from the Enqueue's
  // send to the job's arrival in the handler (the report), and from Enqueue returning (stderr; a
  // push may even arrive first: both follow the same fsync; such samples count as 0).
  Report RunLatency() {
    Errors errors;
    absl::Mutex mu;
    std::map<std::string, absl::Time> sent, returned, arrived;
    absl::Notification all_arrived;
    auto workers = StartStreamWorkers(1, [&](client::JobContext& job) {
      absl::Time now = absl::Now();
      absl::MutexLock lock(&mu);
      arrived[job.job_id()] = now;
      if (static_cast<int64_t>(arrived.size()) == flags_.jobs) all_arrived.Notify();
    });
    // Job i is due at start + i / rate; sender k sends jobs k, k + senders, ... and waits for
    // each answer before its next send, as a web handler does. One sender cannot offer the rate
    // once an Enqueue takes longer than 1 / rate (a replicated write does): it then sends as fast
    // as its answers come, and the run's jobs_per_sec says so. Several senders offer the whole
    // rate while an Enqueue takes less than senders / rate.
    const absl::Duration interval = absl::Seconds(1) / flags_.rate;
    const absl::Time start = absl::Now();
    std::vector<std::thread> senders;
    for (int k = 0; k < flags_.senders; ++k) {
      senders.emplace_back([&, k] {
        std::unique_ptr<v1::Broker::Stub> stub = channels_.BrokerStub(k);
        v1::EnqueueRequest req;
        req.set_queue(flags_.queue);
        req.set_payload(payload_);
        for (int64_t i = k; i < flags_.jobs && !TimedOut(); i += flags_.senders) {
          absl::Time due = start + interval * i;
          if (absl::Time now = absl::Now(); now < due) absl::SleepFor(due - now);
          const absl::Time send = absl::Now();
          v1::EnqueueResponse resp;
          grpc::Status s =
              Call([&](grpc::ClientContext* ctx) { return stub->Enqueue(ctx, req, &resp); });
          const absl::Time back = absl::Now();
          if (!s.ok()) {
            RecordError(&errors, s, "Enqueue");
            continue;
          }
          absl::MutexLock lock(&mu);
          sent[resp.job_id()] = send;
          returned[resp.job_id()] = back;
        }
      });
    }
    for (std::thread& t : senders) t.join();
    all_arrived.WaitForNotificationWithDeadline(deadline_);
    for (auto& w : workers) w->Stop(absl::Seconds(30));
    Latencies from_return, from_send;
    std::vector<int64_t> r_us, s_us;
    {
      absl::MutexLock lock(&mu);
      for (const auto& [id, at] : arrived) {
        if (!returned.count(id)) continue;
        r_us.push_back(std::max<int64_t>(0, absl::ToInt64Microseconds(at - returned[id])));
        s_us.push_back(absl::ToInt64Microseconds(at - sent[id]));
      }
    }
    from_return.Add(std::move(r_us));
    from_send.Add(std::move(s_us));
    std::fprintf(stderr, "latency from the Enqueue's return: p50 %.2f ms, p99 %.2f ms\n",
                 from_return.PercentileMs(50), from_return.PercentileMs(99));
    Report r;
    r.mode = "latency";
    r.concurrency = flags_.senders;
    r.workers = 1;
    r.jobs = flags_.jobs;
    {
      absl::MutexLock lock(&mu);
      r.done = static_cast<int64_t>(arrived.size());
    }
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    // From the send, as the peers are measured (bench/peers): what a producer waits for.
    r.latency_of = "send_to_arrival";
    SetPercentiles(from_send, &r);
    SetErrors(errors, &r);
    return r;
  }

  Flags flags_;
  const Channels channels_;
  const std::string payload_;
  const absl::Time deadline_;
  // Set to stop every thread early: too many errors, or jobs that will never arrive.
  std::atomic<bool> abort_{false};
};

}  // namespace
}  // namespace jobbroker::bench

int main(int argc, char** argv) {
  // As in the broker (server/main.cc): Debian's Abseil checks lock order on every lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  jobbroker::bench::Flags flags;
  if (!jobbroker::bench::ParseFlags(argc, argv, &flags)) {
    jobbroker::bench::Usage(stderr);
    return 2;
  }
  return jobbroker::bench::Bench(std::move(flags)).Run();
}
