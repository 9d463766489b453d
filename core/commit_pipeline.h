#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/observer.h"
#include "core/policy.h"
#include "core/store.h"

namespace jobbroker::core {

// Orders the broker's transitions and makes them durable with group commit.
//
// The broker applies a transition to memory and Append()s it while holding its own mutex, so the
// pipeline's order is memory's order. In kBackground mode one writer thread takes everything
// appended since its last write, writes it as ONE Store::Write (one fsync), and then runs the
// WhenDurable callbacks of every sequence number it covered: many concurrent callers share one
// fsync. A reply waits for its own sequence number, which implies every earlier transition is
// durable too, so nothing a caller was told can be lost.
//
// Durability levels (a queue's policy): a kSync transition is answered once fsynced (above). A
// batch holding only kGroup and kNone transitions is written without fsync (Store::WriteUnsynced)
// and kGroup ones are answered then; the writer fsyncs (Store::Sync, or the next synced write)
// by the earliest group delay of what it wrote unsynced, measured in real time as the disk
// works in it. kNone transitions are answered at once, before they are written. Writes stay in
// order whatever the levels, so a crash never keeps a later transition without an earlier one.
//
// If a write fails, the pipeline stops: every pending and later callback gets that error,
// status() reports it, and nothing more is written (memory is then ahead of disk, and writing
// later transitions on top could persist a state that never existed). Once the store is
// writable again and the owner has rebuilt its memory from the store, Reset() drops what was
// appended meanwhile and the pipeline writes again.
//
// Thread-safe. `store` is borrowed and must outlive the pipeline.
class CommitPipeline {
 public:
  enum class Mode {
    kInline,      // Append writes at once on the caller's thread (tests, tools)
    kBackground,  // a writer thread batches appends (the server)
  };
  using Callback = absl::AnyInvocable<void(absl::Status)>;
  using FailureHook = absl::AnyInvocable<void(const absl::Status&)>;

  // `clock` times each write for `observer` (both borrowed; observer may be null). `on_failure`
  // (may be null) runs once per failure, right after the failed write, on the thread that wrote
  // it and without the pipeline's lock (in kInline mode inside Append, so under the caller's
  // locks): it must be quick and must not call the pipeline.
  CommitPipeline(Store& store, Mode mode, const Clock* clock = nullptr,
                 BrokerObserver* observer = nullptr, FailureHook on_failure = nullptr);
  ~CommitPipeline();  // writes what is pending, then stops the writer
  CommitPipeline(const CommitPipeline&) = delete;
  CommitPipeline& operator=(const CommitPipeline&) = delete;

  // Queues `t` and returns its sequence number (> 0). An empty transition is not written and
  // returns the last sequence number handed out, so waiting on it still orders after earlier ones.
  // `durability` and `group_delay` say when the writer must fsync it (see the class comment);
  // kInline mode always writes synced. `early_written`: someone will wait for this kSync
  // transition at kGroup level too (the broker's pushes to workers), so the writer writes its
  // batch unsynced, releases the kGroup waiters, and only then fsyncs, instead of one synced
  // write in which "written" cannot be told apart from "durable".
  uint64_t Append(Transition t, Durability durability = Durability::kSync,
                  absl::Duration group_delay = absl::ZeroDuration(), bool early_written = false);

  // Runs `done` once `seq` and everything before it are as durable as `level` asks (kSync: on
  // disk; kGroup: in the store's log; kNone: at once), with OK, or with the write error (also for
  // a `seq` that Reset() dropped). Runs it at once, on this thread, if that is already known.
  void WhenDurable(uint64_t seq, Callback done, Durability level = Durability::kSync);

  // Blocks until `seq` is as durable as `level` asks; the write's status.
  absl::Status WaitDurable(uint64_t seq, Durability level = Durability::kSync);

  // OK, or the write error that stopped the pipeline (until Reset()).
  absl::Status status() const;
  // status().ok() without taking the lock, for hot paths.
  bool healthy() const { return healthy_.load(std::memory_order_acquire); }
  // When the pipeline stopped (by the clock given; InfinitePast without one or while healthy).
  absl::Time failed_at() const;

  // After a failure: the caller has made the store writable again (Store::Resume) and rebuilt its
  // memory from the store. Drops every transition appended since the failure (their callbacks had
  // the error, and any later WhenDurable for them gets it too), and writes again. Waits for a
  // write in progress to finish. Nothing to do while healthy.
  void Reset();

  // Stops the pipeline as a failed write would, with `cause`: every transition not yet durable
  // and every later one is answered with it, nothing more is written until Reset(), and
  // on_failure runs. For an owner that knows the store refuses what comes next, before a write
  // tells it: cluster mode halts a partition's pipeline when this node stops leading it, so that
  // the broker rebuilds its memory from the replicated state before it writes again. A write in
  // progress finishes (its transitions may be stored; their callbacks have `cause` already). The
  // observer is not told: nothing failed in the store. Once stopped by a write's failure,
  // nothing to do; once halted, only the cause changes (later refusals say the new one: the
  // partition's leader moved on, say).
  void Halt(absl::Status cause);

  // How many times Reset() restarted the pipeline after a failure. Brokers that share it compare
  // it with the value at their last rebuild: the one that reset it rebuilt first, the others
  // must rebuild before they write (BrokerOptions::pipeline).
  uint64_t resets() const { return resets_.load(std::memory_order_acquire); }

  // Every transition up to this sequence number is in the store (Store::ReadJob sees it), synced
  // or not; a dropped one (Reset) counts as passed. Lock-free, for hot paths.
  uint64_t written() const { return written_.load(std::memory_order_acquire); }

  // The sequence number of the last transition appended (0: none yet). Taken after a caller's
  // read of memory that its owner changes and appends under one lock, it is at least the
  // number of every change that read could see (core::ReadFence).
  uint64_t last_appended() const;

  // Number of Store::Write and WriteUnsynced calls so far (for tests and metrics: fewer writes
  // than appends shows group commit at work). Transitions dropped after a failure were never
  // written: not counted.
  uint64_t writes() const;
  // Number of fsyncs asked of the store: synced writes and Sync calls.
  uint64_t syncs() const;

 private:
  // What the writer does next.
  struct WriteTask {
    std::vector<Transition> batch;  // empty: only fsync what was written unsynced
    uint64_t last = 0;              // the sequence numbers it covers end here
    bool broken = false;            // the pipeline has failed: fail them, write nothing
    bool sync = true;               // fsync (a synced write, or Store::Sync for an empty batch)
    bool early_written = false;     // sync: write unsynced, release kGroup waiters, then fsync
    absl::Time sync_by = absl::InfiniteFuture();  // unsynced: fsync by then
  };
  void WriterLoop();
  // Writes (or fails) `job` and runs the callbacks it settled.
  void WriteAndNotify(WriteTask task);
  // The store holds everything up to `seq` (not fsynced yet): runs the kGroup waiters up to it.
  void ReleaseWritten(uint64_t seq);
  // The error a dropped `seq` was dropped for, or nullptr.
  const absl::Status* DroppedLocked(uint64_t seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Store& store_;
  const Mode mode_;
  const Clock* const clock_;
  BrokerObserver* const observer_;
  FailureHook on_failure_;
  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t durable_seq_ ABSL_GUARDED_BY(mu_) = 0;  // fsynced up to here
  uint64_t written_seq_ ABSL_GUARDED_BY(mu_) = 0;  // in the store's log up to here (>= durable)
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t syncs_ ABSL_GUARDED_BY(mu_) = 0;
  // What is pending asks for: an fsync at once, or by a time (kGroup); none: InfiniteFuture.
  bool pending_sync_ ABSL_GUARDED_BY(mu_) = false;
  bool pending_early_written_ ABSL_GUARDED_BY(mu_) = false;  // see Append
  absl::Time pending_sync_by_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Written unsynced, to be fsynced by then (kGroup); InfiniteFuture if nothing waits for it.
  absl::Time unsynced_by_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool halted_ ABSL_GUARDED_BY(mu_) = false;  // error_ is a Halt's cause, not a failed write's
  absl::Time failed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::atomic<bool> healthy_{true};
  std::atomic<uint64_t> written_{0};  // written_seq_, readable without mu_
  std::atomic<uint64_t> resets_{0};
  // Sequence ranges Reset() dropped: first -> (last, the error they were dropped for). One entry
  // per failure, so it stays tiny.
  std::map<uint64_t, std::pair<uint64_t, absl::Status>> dropped_ ABSL_GUARDED_BY(mu_);
  std::vector<Transition> pending_ ABSL_GUARDED_BY(mu_);
  std::multimap<uint64_t, Callback> waiters_ ABSL_GUARDED_BY(mu_);          // for durable_seq_
  std::multimap<uint64_t, Callback> written_waiters_ ABSL_GUARDED_BY(mu_);  // for written_seq_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // the writer thread holds a batch
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
  // kInline: serialises Store::Write calls made on callers' threads.
  absl::Mutex inline_write_mu_;
};

}  // namespace jobbroker::core
