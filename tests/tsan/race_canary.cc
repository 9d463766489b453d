// Checks the TSan build itself (tests/tsan/run.sh runs it; it is not a ctest test).
//
//   tsan_race_canary clean        hands data between threads only through absl::Mutex (Lock,
//                                 Await, LockWhen, CondVar) and absl::Notification: with the shim
//                                 TSan must stay quiet, without it TSan reports a race.
//   tsan_race_canary unguarded    writes a value under a mutex and reads it without the mutex.
//   tsan_race_canary wrong-mutex  writes under one mutex and reads under another.
//
// The last two must be reported even with the shim: the shim may only add the happens-before
// edges Abseil really provides. They order the accesses with a relaxed atomic, which gives no
// happens-before edge, so TSan's verdict does not depend on timing.

#include <atomic>
#include <cstdio>
#include <string_view>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

int Clean() {
  absl::Mutex mu;
  absl::CondVar cv;
  int stage = 0;   // guarded by mu
  long total = 0;  // guarded by mu
  int handed = 0;  // written before Notify, read after the wait
  absl::Notification done;

  std::thread worker([&] {
    for (int i = 0; i < 100; ++i) {
      absl::MutexLock lock(&mu);
      total += i;
    }
    {
      absl::MutexLock lock(&mu);
      stage = 1;
      // Wakes the main thread's Await; Abseil evaluates its condition on this thread.
    }
    {
      absl::MutexLock lock(&mu);
      while (stage != 2) cv.Wait(&mu);
      total *= 2;
      stage = 3;
    }
    handed = 42;
    done.Notify();
  });

  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* s) { return *s == 1; }, &stage));
    total += 1;
    stage = 2;
    cv.Signal();
  }
  mu.LockWhen(absl::Condition(
      +[](int* s) { return *s == 3; }, &stage));
  const long seen = total;
  mu.Unlock();
  done.WaitForNotification();
  const int got = handed;
  worker.join();
  if (seen != (4950 + 1) * 2 || got != 42) {
    std::fprintf(stderr, "clean: wrong values %ld %d\n", seen, got);
    return 1;
  }
  return 0;
}

// The writer sets `value` under `write_mu`; the reader waits on a relaxed flag (no
// happens-before) and reads it under another mutex, or under none.
int Racy(bool read_locked) {
  absl::Mutex write_mu, read_mu;
  std::atomic<bool> written{false};
  int value = 0;
  std::thread writer([&] {
    {
      absl::MutexLock lock(&write_mu);
      value = 7;
    }
    written.store(true, std::memory_order_relaxed);
  });
  while (!written.load(std::memory_order_relaxed)) std::this_thread::yield();
  int seen;
  if (read_locked) {
    absl::MutexLock lock(&read_mu);
    seen = value;
  } else {
    seen = value;
  }
  writer.join();
  return seen == 7 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc > 1 ? argv[1] : "";
  if (mode == "clean") return Clean();
  if (mode == "unguarded") return Racy(/*read_locked=*/false);
  if (mode == "wrong-mutex") return Racy(/*read_locked=*/true);
  std::fprintf(stderr, "usage: %s clean|unguarded|wrong-mutex\n", argv[0]);
  return 2;
}
