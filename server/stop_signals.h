#pragma once

namespace jobbroker::server {

// SIGTERM and SIGINT, taken by one thread of their own from the first line of main on.
//
// While the broker starts (a recovery of millions of jobs, a wait for etcd), a signal ends the
// process at once, by that signal: nothing has been acknowledged yet, and the store is safe to
// stop at any write, as after a kill -9. An operator's Ctrl-C or a rollout's SIGTERM is not sat
// out until the start is over. Once Serving() was called, a signal is handed to Await() instead,
// and main stops gracefully (hand-over, drain, flush); a second signal during that stop ends the
// process at once, by that signal (Ctrl-C twice).
//
// Every thread started after Install() inherits the signals blocked, so none is interrupted by
// one mid-write and none takes one with the default action.
class StopSignals {
 public:
  // Blocks SIGTERM and SIGINT on the calling thread and starts the thread that takes them.
  // Call once, before any other thread is started (gRPC starts its own on first use).
  static StopSignals& Install();

  // From now on a signal starts the graceful stop instead of ending the process.
  void Serving();
  // Blocks until a signal came after Serving(); returns its number.
  int Await();

 private:
  StopSignals() = default;
  void Take();
};

}  // namespace jobbroker::server
