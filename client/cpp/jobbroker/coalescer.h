#pragma once

#include <compare>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "jobbroker/client.h"
#include "jobbroker/v1/broker.pb.h"

namespace jobbroker::client {

// Producer coalescing (docs/worker-contract.md §10): merges the jobs of concurrent
// Client::Enqueue calls into EnqueueBatch calls and answers each caller on its own. Internal to
// the client library; Client holds one when ClientOptions::batching is on.
//
// Threaded: every caller blocks in Enqueue until its job is answered, so the callers' threads
// are the senders. A caller whose job makes a batch ready to go (under the in-flight limit,
// with no linger) sends it at once from its own thread. A batch that waited (for the in-flight
// limit, or for its linger) is handed to the thread of its first job's caller, woken by
// whoever made it ready: the caller that finished an in-flight batch of its key, or the linger
// timer's thread. So no thread is made per job, and with a linger of 0 there is no timer at
// all; the one timer thread starts with the first linger.
//
// Thread-safe.
class Coalescer {
 public:
  struct Options {
    int max_jobs = 100;
    int64_t max_bytes = int64_t{1} << 20;
    absl::Duration linger = absl::ZeroDuration();
    int max_in_flight = 4;
  };

  // How batches leave; Client's are its unary Enqueue and EnqueueBatch (with their retries and
  // routing), tests give stubs. Called from the callers' threads, several at once, never with
  // the coalescer's lock held. `deadline` bounds the call's first attempt.
  struct Transport {
    // A batch of one, and each job of a refused batch sent again alone.
    std::function<absl::StatusOr<Enqueued>(const v1::EnqueueRequest& job, absl::Time deadline)>
        send_one;
    // Two or more jobs of one key, in the order of their calls: one result per job.
    std::function<absl::StatusOr<std::vector<Enqueued>>(const v1::EnqueueBatchRequest& jobs,
                                                        absl::Time deadline)>
        send_batch;
    // The partition count of the cluster table the client holds; 0 for none (the jobs are then
    // keyed by their queue).
    std::function<uint32_t()> partition_count;
  };

  // What is under way now, for tests.
  struct Counts {
    int waiting_jobs = 0;       // in open or full batches not yet sent
    int in_flight_batches = 0;  // handed to a sender and not answered yet
  };

  Coalescer(Options options, Transport transport);
  // Close(), then stops the timer thread.
  ~Coalescer();
  Coalescer(const Coalescer&) = delete;
  Coalescer& operator=(const Coalescer&) = delete;

  // Adds `job` to the open batch of its key and blocks until the job is answered: its result
  // in the batch, the error of the whole batch, or (when the batch was refused whole) the
  // answer of the job sent again alone. `deadline` is this caller's; a batch's is its callers'
  // earliest. After Close() the job is sent alone at once.
  absl::StatusOr<Enqueued> Enqueue(const v1::EnqueueRequest& job, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sends the open batches now (their linger cut short) and waits until every batch has been
  // answered. Later Enqueue calls are sent alone. Idempotent.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

  // The bytes of `job` that count toward Options::max_bytes: its payload and its headers' names
  // and values.
  static int64_t JobBytes(const v1::EnqueueRequest& job);
  // Whether a batch that failed with `code` applied none of its jobs and refuses it whole, so
  // that each job may be sent again alone (§10 "Answers").
  static bool RefusesWhole(absl::StatusCode code);

 private:
  // A batch never spans partitions, and dedup-keyed jobs go apart: their batches are retried.
  struct Key {
    bool by_queue = false;  // no partition count is known yet
    uint32_t partition = 0;
    std::string queue;  // only by_queue
    bool dedup = false;
    auto operator<=>(const Key&) const = default;
  };

  struct Waiter;

  struct Batch {
    Key key;
    uint64_t id = 0;
    v1::EnqueueBatchRequest jobs;
    std::vector<Waiter*> waiters;  // one per job, same order
    int64_t bytes = 0;
    absl::Time deadline = absl::InfiniteFuture();
    // A linger timer will send it (rule 3); until it fires, the end of an in-flight batch
    // does not.
    bool linger_pending = false;
  };

  // One caller blocked in Enqueue, on its own stack. It is woken once, through `woken` (which
  // it may destroy as soon as it sees it notified): to send a batch, with its answer, or to
  // send its job again alone. Whoever wakes it writes the fields below first and does not touch
  // it after Notify(). Each caller has its own, so answering a batch's callers takes no lock
  // they contend for.
  struct Waiter {
    enum class Next { kWait, kSend, kAnswered, kAlone };
    absl::Time deadline;
    absl::Notification woken;
    Next next = Next::kWait;
    std::unique_ptr<Batch> batch;     // kSend: the batch this thread is to send
    absl::StatusOr<Enqueued> result;  // kAnswered
  };

  struct KeyState {
    std::unique_ptr<Batch> open;
    // Full batches that met the in-flight limit, oldest first; they go before `open`.
    std::deque<std::unique_ptr<Batch>> full;
    int in_flight = 0;
  };

  struct Timer {
    absl::Time due;
    Key key;
    uint64_t batch_id;
  };

  Key KeyOf(const v1::EnqueueRequest& job) const;
  // Adds `self`'s job to the open batch of `key` (rule 1) and applies rules 2 to 4: the batch
  // for this thread to send now, or nullptr (it waits, or another thread sends it).
  std::unique_ptr<Batch> JoinLocked(const Key& key, int64_t bytes, const v1::EnqueueRequest& job,
                                    Waiter* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `batch` (of `ks`) in flight: handed back for the calling thread to send when its job
  // is in it, else given to its first waiter's thread.
  std::unique_ptr<Batch> DispatchLocked(KeyState& ks, std::unique_ptr<Batch> batch,
                                        bool caller_in_it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The open batch of `ks` is full: sent at once under the in-flight limit, else queued.
  std::unique_ptr<Batch> SealLocked(KeyState& ks, bool caller_in_it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After an in-flight batch of `ks` ended: the next full batch, else the open one unless its
  // linger is still running.
  void SendNextLocked(KeyState& ks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `batch` (which holds `self`'s job) from this thread, answers its other callers, and
  // returns `self`'s answer.
  absl::StatusOr<Enqueued> SendAndAnswer(std::unique_ptr<Batch> batch, Waiter* self,
                                         const v1::EnqueueRequest& own_job)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ArmTimerLocked(const Batch& batch, absl::Time due) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void FireLocked(const Timer& timer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseIfIdleLocked(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` as a unary call, counted in alone_sends_ (already incremented for it).
  absl::StatusOr<Enqueued> SendAlone(const v1::EnqueueRequest& job, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const Transport transport_;

  mutable absl::Mutex mu_;
  std::map<Key, KeyState> keys_ ABSL_GUARDED_BY(mu_);
  uint64_t next_batch_id_ ABSL_GUARDED_BY(mu_) = 1;
  int waiting_jobs_ ABSL_GUARDED_BY(mu_) = 0;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Close() started: open batches go at once, new jobs alone.
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // Callers sending their job alone after their batch was refused, or after Close(): Close()
  // waits for them too, as they use the transport.
  int alone_sends_ ABSL_GUARDED_BY(mu_) = 0;
  // Due times only grow (each is its batch's opening plus the one linger), so a FIFO.
  std::deque<Timer> timers_ ABSL_GUARDED_BY(mu_);
  absl::CondVar timer_cv_;
  bool timer_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_thread_;  // started with the first timer; joined by the destructor
  bool timer_started_ ABSL_GUARDED_BY(mu_) = false;
  // Signalled when the last key goes idle or the last alone send ends, for Close().
  absl::CondVar idle_cv_;
};

}  // namespace jobbroker::client
