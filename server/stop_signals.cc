#include "server/stop_signals.h"

#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/observability/log.h"

namespace jobbroker::server {
namespace {

// Process-wide, never destroyed: the signal thread may outlive main's return.
struct State {
  sigset_t signals;
  absl::Mutex mu;
  bool serving ABSL_GUARDED_BY(mu) = false;
  int received ABSL_GUARDED_BY(mu) = 0;  // 0: none yet
};

State& TheState() {
  static State* state = new State();
  return *state;
}

// Dies of `sig` as an unhandled signal would: the exit status says what ended the process.
[[noreturn]] void DieOf(int sig) {
  signal(sig, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  pthread_sigmask(SIG_UNBLOCK, &only, nullptr);
  raise(sig);
  std::_Exit(128 + sig);  // not reached: the default action of both signals ends the process
}

}  // namespace

StopSignals& StopSignals::Install() {
  static StopSignals* installed = [] {
    State& state = TheState();
    sigemptyset(&state.signals);
    sigaddset(&state.signals, SIGTERM);
    sigaddset(&state.signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &state.signals, nullptr);
    auto* signals = new StopSignals();
    std::thread([signals] { signals->Take(); }).detach();
    return signals;
  }();
  return *installed;
}

void StopSignals::Take() {
  State& state = TheState();
  for (;;) {
    int sig = 0;
    sigwait(&state.signals, &sig);
    absl::MutexLock lock(&state.mu);
    if (!state.serving) {
      Log::Write(LogLevel::kInfo, "stopped_while_starting", {{"signal", absl::StrCat(sig)}});
      DieOf(sig);
    }
    if (state.received != 0) {
      // The operator will not wait for the graceful stop (a hand-over that waits for its
      // timeout, a drain). What it would still do is a courtesy: every answer already given was
      // durable, and the store is safe to stop at any write, as after a kill -9.
      Log::Write(LogLevel::kWarn, "stopped_during_graceful_stop", {{"signal", absl::StrCat(sig)}});
      DieOf(sig);
    }
    state.received = sig;
  }
}

void StopSignals::Serving() {
  State& state = TheState();
  absl::MutexLock lock(&state.mu);
  state.serving = true;
}

int StopSignals::Await() {
  State& state = TheState();
  absl::MutexLock lock(&state.mu);
  auto received = [&state]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) { return state.received != 0; };
  state.mu.Await(absl::Condition(&received));
  return state.received;
}

}  // namespace jobbroker::server
