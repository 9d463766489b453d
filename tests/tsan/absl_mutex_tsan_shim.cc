// Tells ThreadSanitizer about absl::Mutex, absl::CondVar and absl::Notification in a build whose
// Abseil is not instrumented.
//
// Why: Debian ships Abseil as prebuilt shared libraries without -fsanitize=thread. A TSan-built
// Abseil reports every lock and unlock to TSan itself (ABSL_TSAN_MUTEX_* in mutex.cc); Debian's
// cannot, so TSan sees no happens-before edge from absl::Mutex and reports a race on everything
// our code guards with one. Abseil's sources are not available here to rebuild it.
//
// How: tests/tsan/CMakeLists.txt links every executable with -Wl,--wrap=<symbol> for the
// out-of-line Abseil entry points below. The linker then sends each call our objects make to
// __wrap_<symbol> (defined here), which brackets the real call (__real_<symbol>) with the public
// annotations of <sanitizer/tsan_interface.h>, the same ones a TSan-built Abseil makes. Waits that
// release and re-acquire the mutex inside (Await*, LockWhen*, CondVar::Wait*) are reported as an
// unlock before the call and a lock after it: that may show a release that did not happen (the
// condition already held), never an acquire that did not; races stay visible.
//
// Conditions: Abseil evaluates a waiter's absl::Condition inside its own lock and unlock code, on
// whichever thread holds the mutex at that moment, where the annotations above make TSan ignore
// memory accesses. So each Condition is wrapped in one that, for its evaluation, tells TSan the
// evaluating thread holds the mutex (as Abseil's EvalConditionAnnotated does), so the condition's
// reads are checked too.
//
// Limits: only calls from objects linked into the executable are seen; Abseil calling itself, or
// gRPC calling Abseil, is not. Notification::HasBeenNotified() is inline and reads an atomic that
// uninstrumented code writes, so it gives no happens-before edge here; nothing in the tree uses it.
// The symbol names carry Abseil's inline namespace (JOBBROKER_ABSL_NS, from CMake); if they drift,
// linking fails on an undefined __real_ symbol rather than silently losing the annotations.

#include <sanitizer/tsan_interface.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#ifndef JOBBROKER_ABSL_NS
#error "JOBBROKER_ABSL_NS (the mangled inline namespace, e.g. 7debian3) comes from CMake"
#endif

namespace jobbroker::tsan_shim {
namespace {

#define JB_STR2(x) #x
#define JB_STR(x) JB_STR2(x)
constexpr std::string_view kMangledNs = JOBBROKER_ABSL_NS;
static_assert(kMangledNs.ends_with(JB_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME)),
              "JOBBROKER_ABSL_NS does not match Abseil's inline namespace");

constexpr unsigned kRead = __tsan_mutex_read_lock;

// The shared-lock holds of this thread: an Await or CondVar wait must report the mode the caller
// holds the mutex in, and the mutex cannot be asked.
thread_local std::vector<const absl::Mutex*> t_reader_held;

bool HeldAsReader(const absl::Mutex* mu) {
  return std::find(t_reader_held.begin(), t_reader_held.end(), mu) != t_reader_held.end();
}
void AddReader(const absl::Mutex* mu) { t_reader_held.push_back(mu); }
void RemoveReader(const absl::Mutex* mu) {
  auto it = std::find(t_reader_held.begin(), t_reader_held.end(), mu);
  if (it != t_reader_held.end()) t_reader_held.erase(it);
}

// Which annotation bracket this thread is inside, so that a Condition evaluated there knows how to
// step out of it and back in.
enum class Phase { kNone, kLocking, kUnlocking };
struct Bracket {
  const absl::Mutex* mu = nullptr;
  Phase phase = Phase::kNone;
  unsigned flags = 0;
};
thread_local Bracket t_bracket;

class InBracket {
 public:
  InBracket(const absl::Mutex* mu, Phase phase, unsigned flags) : saved_(t_bracket) {
    t_bracket = Bracket{mu, phase, flags};
  }
  ~InBracket() { t_bracket = saved_; }
  InBracket(const InBracket&) = delete;
  InBracket& operator=(const InBracket&) = delete;

 private:
  Bracket saved_;
};

void* Addr(const void* p) { return const_cast<void*>(p); }

// A caller's Condition, evaluated with TSan told that this thread holds `mu` meanwhile.
struct Annotated {
  const absl::Mutex* mu;
  const absl::Condition* cond;
};

bool EvalAnnotated(Annotated* a) {
  const Bracket b = t_bracket;
  void* mu = Addr(a->mu);
  if (b.mu != a->mu || b.phase == Phase::kNone) return a->cond->Eval();
  const unsigned f = b.flags & kRead;
  bool result;
  if (b.phase == Phase::kLocking) {
    __tsan_mutex_post_lock(mu, f, 0);
    result = a->cond->Eval();
    __tsan_mutex_pre_unlock(mu, f);
    __tsan_mutex_post_unlock(mu, f);
    __tsan_mutex_pre_lock(mu, f);
  } else {
    __tsan_mutex_post_unlock(mu, f);
    __tsan_mutex_pre_lock(mu, f);
    __tsan_mutex_post_lock(mu, f, 0);
    result = a->cond->Eval();
    __tsan_mutex_pre_unlock(mu, f);
  }
  return result;
}

// Runs `acquire` (which returns with `mu` held in mode `flags`) inside a lock bracket.
template <typename Acquire>
auto Bracketed(const absl::Mutex* mu, unsigned flags, Acquire acquire) {
  __tsan_mutex_pre_lock(Addr(mu), flags);
  const auto result = [&] {
    InBracket bracket(mu, Phase::kLocking, flags);
    return acquire();
  }();
  __tsan_mutex_post_lock(Addr(mu), flags, 0);
  return result;
}

// The same, for an acquire that waits for `cond`: `acquire` gets the annotated condition.
template <typename Acquire>
auto Locking(const absl::Mutex* mu, unsigned flags, const absl::Condition& cond, Acquire acquire) {
  Annotated a{mu, &cond};
  const absl::Condition annotated(&EvalAnnotated, &a);
  return Bracketed(mu, flags, [&] { return acquire(annotated); });
}

// For waits entered with `mu` held: reported as an unlock, then a lock around the real call.
unsigned ReleaseForWait(const absl::Mutex* mu) {
  const unsigned flags = HeldAsReader(mu) ? kRead : 0;
  __tsan_mutex_pre_unlock(Addr(mu), flags);
  __tsan_mutex_post_unlock(Addr(mu), flags);
  return flags;
}

}  // namespace

// The declarations name the real and wrapper symbols through asm labels, so the C++ names stay
// readable. Member functions take `this` as their first argument.
#define JB_SYM(kind, rest) "_ZN" kind "4absl" JOBBROKER_ABSL_NS rest
#define JB_PAIR(ret, name, kind, rest, ...)                          \
  ret Real##name(__VA_ARGS__) __asm__("__real_" JB_SYM(kind, rest)); \
  ret Wrap##name(__VA_ARGS__) __asm__("__wrap_" JB_SYM(kind, rest))

using absl::Condition;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

JB_PAIR(void, Lock, "", "5Mutex4LockEv", Mutex*);
JB_PAIR(void, Unlock, "", "5Mutex6UnlockEv", Mutex*);
JB_PAIR(bool, TryLock, "", "5Mutex7TryLockEv", Mutex*);
JB_PAIR(void, ReaderLock, "", "5Mutex10ReaderLockEv", Mutex*);
JB_PAIR(void, ReaderUnlock, "", "5Mutex12ReaderUnlockEv", Mutex*);
JB_PAIR(bool, ReaderTryLock, "", "5Mutex13ReaderTryLockEv", Mutex*);
JB_PAIR(void, DestroyComplete, "", "5MutexD1Ev", Mutex*);
JB_PAIR(void, DestroyBase, "", "5MutexD2Ev", Mutex*);
JB_PAIR(void, Await, "", "5Mutex5AwaitERKNS0_9ConditionE", Mutex*, const Condition&);
JB_PAIR(bool, AwaitWithTimeout, "", "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE",
        Mutex*, const Condition&, Duration);
JB_PAIR(bool, AwaitWithDeadline, "", "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
        Mutex*, const Condition&, Time);
JB_PAIR(void, LockWhen, "", "5Mutex8LockWhenERKNS0_9ConditionE", Mutex*, const Condition&);
JB_PAIR(void, ReaderLockWhen, "", "5Mutex14ReaderLockWhenERKNS0_9ConditionE", Mutex*,
        const Condition&);
JB_PAIR(bool, LockWhenWithTimeout, "",
        "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE", Mutex*, const Condition&,
        Duration);
JB_PAIR(bool, LockWhenWithDeadline, "", "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
        Mutex*, const Condition&, Time);
JB_PAIR(bool, ReaderLockWhenWithTimeout, "",
        "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE", Mutex*,
        const Condition&, Duration);
JB_PAIR(bool, ReaderLockWhenWithDeadline, "",
        "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE", Mutex*, const Condition&,
        Time);
JB_PAIR(void, CondWait, "", "7CondVar4WaitEPNS0_5MutexE", absl::CondVar*, Mutex*);
JB_PAIR(bool, CondWaitWithTimeout, "", "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE",
        absl::CondVar*, Mutex*, Duration);
JB_PAIR(bool, CondWaitWithDeadline, "", "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE",
        absl::CondVar*, Mutex*, Time);
JB_PAIR(void, Notify, "", "12Notification6NotifyEv", Notification*);
JB_PAIR(void, WaitForNotification, "K", "12Notification19WaitForNotificationEv",
        const Notification*);
JB_PAIR(bool, WaitForNotificationWithTimeout, "K",
        "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", const Notification*,
        Duration);
JB_PAIR(bool, WaitForNotificationWithDeadline, "K",
        "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", const Notification*, Time);

void WrapLock(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, 0);
  RealLock(mu);
  __tsan_mutex_post_lock(mu, 0, 0);
}

void WrapUnlock(Mutex* mu) {
  __tsan_mutex_pre_unlock(mu, 0);
  {
    InBracket bracket(mu, Phase::kUnlocking, 0);
    RealUnlock(mu);
  }
  __tsan_mutex_post_unlock(mu, 0);
}

bool WrapTryLock(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_lock);
  const bool locked = RealTryLock(mu);
  __tsan_mutex_post_lock(mu, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed),
                         0);
  return locked;
}

void WrapReaderLock(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, kRead);
  RealReaderLock(mu);
  __tsan_mutex_post_lock(mu, kRead, 0);
  AddReader(mu);
}

void WrapReaderUnlock(Mutex* mu) {
  RemoveReader(mu);
  __tsan_mutex_pre_unlock(mu, kRead);
  {
    InBracket bracket(mu, Phase::kUnlocking, kRead);
    RealReaderUnlock(mu);
  }
  __tsan_mutex_post_unlock(mu, kRead);
}

bool WrapReaderTryLock(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_read_lock);
  const bool locked = RealReaderTryLock(mu);
  __tsan_mutex_post_lock(
      mu, locked ? __tsan_mutex_try_read_lock : __tsan_mutex_try_read_lock_failed, 0);
  if (locked) AddReader(mu);
  return locked;
}

// not_static: TSan ignores the destruction of a mutex that was never created as not static (one
// with constant initialisation, destroyed at exit), as Abseil's own annotation does.
void WrapDestroyComplete(Mutex* mu) {
  __tsan_mutex_destroy(mu, __tsan_mutex_not_static);
  RealDestroyComplete(mu);
}

void WrapDestroyBase(Mutex* mu) {
  __tsan_mutex_destroy(mu, __tsan_mutex_not_static);
  RealDestroyBase(mu);
}

void WrapAwait(Mutex* mu, const Condition& cond) {
  const unsigned flags = ReleaseForWait(mu);
  Locking(mu, flags, cond, [&](const Condition& c) {
    RealAwait(mu, c);
    return true;
  });
}

bool WrapAwaitWithTimeout(Mutex* mu, const Condition& cond, Duration timeout) {
  const unsigned flags = ReleaseForWait(mu);
  return Locking(mu, flags, cond,
                 [&](const Condition& c) { return RealAwaitWithTimeout(mu, c, timeout); });
}

bool WrapAwaitWithDeadline(Mutex* mu, const Condition& cond, Time deadline) {
  const unsigned flags = ReleaseForWait(mu);
  return Locking(mu, flags, cond,
                 [&](const Condition& c) { return RealAwaitWithDeadline(mu, c, deadline); });
}

void WrapLockWhen(Mutex* mu, const Condition& cond) {
  Locking(mu, 0, cond, [&](const Condition& c) {
    RealLockWhen(mu, c);
    return true;
  });
}

void WrapReaderLockWhen(Mutex* mu, const Condition& cond) {
  Locking(mu, kRead, cond, [&](const Condition& c) {
    RealReaderLockWhen(mu, c);
    return true;
  });
  AddReader(mu);
}

bool WrapLockWhenWithTimeout(Mutex* mu, const Condition& cond, Duration timeout) {
  return Locking(mu, 0, cond,
                 [&](const Condition& c) { return RealLockWhenWithTimeout(mu, c, timeout); });
}

bool WrapLockWhenWithDeadline(Mutex* mu, const Condition& cond, Time deadline) {
  return Locking(mu, 0, cond,
                 [&](const Condition& c) { return RealLockWhenWithDeadline(mu, c, deadline); });
}

bool WrapReaderLockWhenWithTimeout(Mutex* mu, const Condition& cond, Duration timeout) {
  const bool met = Locking(mu, kRead, cond, [&](const Condition& c) {
    return RealReaderLockWhenWithTimeout(mu, c, timeout);
  });
  AddReader(mu);
  return met;
}

bool WrapReaderLockWhenWithDeadline(Mutex* mu, const Condition& cond, Time deadline) {
  const bool met = Locking(mu, kRead, cond, [&](const Condition& c) {
    return RealReaderLockWhenWithDeadline(mu, c, deadline);
  });
  AddReader(mu);
  return met;
}

// A CondVar wait releases the mutex and takes it back before returning, timed out or not.
void WrapCondWait(absl::CondVar* cv, Mutex* mu) {
  const unsigned flags = ReleaseForWait(mu);
  Bracketed(mu, flags, [&] {
    RealCondWait(cv, mu);
    return true;
  });
}

bool WrapCondWaitWithTimeout(absl::CondVar* cv, Mutex* mu, Duration timeout) {
  const unsigned flags = ReleaseForWait(mu);
  return Bracketed(mu, flags, [&] { return RealCondWaitWithTimeout(cv, mu, timeout); });
}

bool WrapCondWaitWithDeadline(absl::CondVar* cv, Mutex* mu, Time deadline) {
  const unsigned flags = ReleaseForWait(mu);
  return Bracketed(mu, flags, [&] { return RealCondWaitWithDeadline(cv, mu, deadline); });
}

// Notification: everything before Notify() happens before a wait that sees it.
void WrapNotify(Notification* n) {
  __tsan_release(n);
  RealNotify(n);
}

void WrapWaitForNotification(const Notification* n) {
  RealWaitForNotification(n);
  __tsan_acquire(Addr(n));
}

bool WrapWaitForNotificationWithTimeout(const Notification* n, Duration timeout) {
  const bool notified = RealWaitForNotificationWithTimeout(n, timeout);
  if (notified) __tsan_acquire(Addr(n));
  return notified;
}

bool WrapWaitForNotificationWithDeadline(const Notification* n, Time deadline) {
  const bool notified = RealWaitForNotificationWithDeadline(n, deadline);
  if (notified) __tsan_acquire(Addr(n));
  return notified;
}

}  // namespace jobbroker::tsan_shim
