#pragma once

#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/observer.h"
#include "core/store.h"

namespace jobbroker {

// Orders the broker's transitions and makes them durable with group commit.
//
// The broker applies a transition to memory and Append()s it while holding its own mutex, so the
// pipeline's order is memory's order. In kBackground mode one writer thread takes everything
// appended since its last write, writes it as ONE Store::Write (one fsync), and then runs the
// WhenDurable callbacks of every sequence number it covered: many concurrent callers share one
// fsync. A reply waits for its own sequence number, which implies every earlier transition is
// durable too, so nothing a caller was told can be lost.
//
// If a write fails, the pipeline stops: every pending and later callback gets that error and
// status() reports it (memory is then ahead of disk; the process must restart and recover).
//
// Thread-safe. `store` is borrowed and must outlive the pipeline.
class CommitPipeline {
 public:
  enum class Mode {
    kInline,      // Append writes at once on the caller's thread (tests, tools)
    kBackground,  // a writer thread batches appends (the server)
  };
  using Callback = absl::AnyInvocable<void(absl::Status)>;

  // `clock` times each write for `observer` (both borrowed; observer may be null).
  CommitPipeline(Store& store, Mode mode, const Clock* clock = nullptr,
                 BrokerObserver* observer = nullptr);
  ~CommitPipeline();  // writes what is pending, then stops the writer
  CommitPipeline(const CommitPipeline&) = delete;
  CommitPipeline& operator=(const CommitPipeline&) = delete;

  // Queues `t` and returns its sequence number (> 0). An empty transition is not written and
  // returns the last sequence number handed out, so waiting on it still orders after earlier ones.
  uint64_t Append(Transition t);

  // Runs `done` once `seq` and everything before it are durable, with OK, or with the write error.
  // Runs it at once, on this thread, if that is already known.
  void WhenDurable(uint64_t seq, Callback done);

  // Blocks until `seq` is durable; the write's status.
  absl::Status WaitDurable(uint64_t seq);

  // OK, or the first write error.
  absl::Status status() const;

  // Number of Store::Write calls so far (for tests and metrics: fewer writes than appends shows
  // group commit at work).
  uint64_t writes() const;

 private:
  void WriterLoop();
  // Writes `batch` covering sequence numbers up to `last` and runs the callbacks it satisfied.
  void WriteAndNotify(std::vector<Transition> batch, uint64_t last);

  Store& store_;
  const Mode mode_;
  const Clock* const clock_;
  BrokerObserver* const observer_;
  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t durable_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<Transition> pending_ ABSL_GUARDED_BY(mu_);
  std::multimap<uint64_t, Callback> waiters_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
  // kInline: serialises Store::Write calls made on callers' threads.
  absl::Mutex inline_write_mu_;
};

}  // namespace jobbroker
