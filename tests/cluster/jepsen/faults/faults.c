// jobbroker_faults: an LD_PRELOAD shim that gives the cluster harness the faults that need root
// on a real machine (README.md): a full disk, the page cache lost in a power cut, and a wall
// clock that is off. Inert unless its environment variables name what to do:
//
//   JOBBROKER_FAULTS_ROOT     a directory: only regular files under it are refused or journalled
//   JOBBROKER_FAULTS_FULL     a path: while a file exists there, writes under ROOT fail ENOSPC
//   JOBBROKER_FAULTS_JOURNAL  a file: "<dev> <ino> <size>" appended after each fsync under ROOT
//                             (and "<dev> <ino> 0" when a file there is created or truncated)
//   JOBBROKER_FAULTS_CLOCK_SKEW  seconds (may be negative) added to the wall clock
//                             (CLOCK_REALTIME*, gettimeofday, time); monotonic clocks untouched
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char* root;  // with a trailing '/'
static size_t root_len;
static const char* full_marker;
static int journal_fd = -1;
static long long skew_ns;

static pthread_once_t once = PTHREAD_ONCE_INIT;

static ssize_t (*real_write)(int, const void*, size_t);
static ssize_t (*real_pwrite)(int, const void*, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void*, size_t, off64_t);
static ssize_t (*real_writev)(int, const struct iovec*, int);
static ssize_t (*real_pwritev)(int, const struct iovec*, int, off_t);
static ssize_t (*real_pwritev2)(int, const struct iovec*, int, off_t, int);
static int (*real_fallocate)(int, int, off_t, off_t);
static int (*real_fallocate64)(int, int, off64_t, off64_t);
static int (*real_posix_fallocate)(int, off_t, off_t);
static int (*real_posix_fallocate64)(int, off64_t, off64_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off64_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_open)(const char*, int, ...);
static int (*real_open64)(const char*, int, ...);
static int (*real_openat)(int, const char*, int, ...);
static int (*real_openat64)(int, const char*, int, ...);
static int (*real_clock_gettime)(clockid_t, struct timespec*);
static int (*real_gettimeofday)(struct timeval*, void*);
static time_t (*real_time)(time_t*);

#define RESOLVE(name) real_##name = dlsym(RTLD_NEXT, #name)

static void Init(void) {
  RESOLVE(write);
  RESOLVE(pwrite);
  RESOLVE(pwrite64);
  RESOLVE(writev);
  RESOLVE(pwritev);
  RESOLVE(pwritev2);
  RESOLVE(fallocate);
  RESOLVE(fallocate64);
  RESOLVE(posix_fallocate);
  RESOLVE(posix_fallocate64);
  RESOLVE(ftruncate);
  RESOLVE(ftruncate64);
  RESOLVE(fsync);
  RESOLVE(fdatasync);
  RESOLVE(open);
  RESOLVE(open64);
  RESOLVE(openat);
  RESOLVE(openat64);
  RESOLVE(clock_gettime);
  RESOLVE(gettimeofday);
  RESOLVE(time);
  const char* skew = getenv("JOBBROKER_FAULTS_CLOCK_SKEW");
  if (skew != NULL) skew_ns = strtoll(skew, NULL, 10) * 1000000000LL;
  const char* dir = getenv("JOBBROKER_FAULTS_ROOT");
  if (dir == NULL || dir[0] != '/') return;
  static char root_buf[PATH_MAX];
  snprintf(root_buf, sizeof(root_buf), "%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/");
  root = root_buf;
  root_len = strlen(root_buf);
  full_marker = getenv("JOBBROKER_FAULTS_FULL");
  const char* journal = getenv("JOBBROKER_FAULTS_JOURNAL");
  if (journal != NULL) {
    journal_fd = real_open(journal, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  }
}

static void EnsureInit(void) { pthread_once(&once, Init); }

// Whether `fd` is a regular file under ROOT; fills `st` then.
static int UnderRoot(int fd, struct stat* st) {
  if (root == NULL || fd < 0) return 0;
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) return 0;
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof(path) - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return strncmp(path, root, root_len) == 0;
}

// Whether a write of file data to `fd` must fail: the disk is "full" and fd is ours.
static int Full(int fd) {
  EnsureInit();
  if (full_marker == NULL) return 0;
  struct stat marker;
  if (stat(full_marker, &marker) != 0) return 0;  // the common case: one failing syscall
  struct stat st;
  return UnderRoot(fd, &st);
}

static void Journal(const struct stat* st, long long size) {
  if (journal_fd < 0) return;
  char line[96];
  const int n = snprintf(line, sizeof(line), "%llu\t%llu\t%lld\n", (unsigned long long)st->st_dev,
                         (unsigned long long)st->st_ino, size);
  if (n > 0) (void)real_write(journal_fd, line, (size_t)n);  // O_APPEND: one line, one write
}

static void JournalSynced(int fd) {
  struct stat st;
  if (journal_fd >= 0 && UnderRoot(fd, &st)) Journal(&st, (long long)st.st_size);
}

static void JournalOpened(int fd, int flags) {
  if (fd < 0 || journal_fd < 0 || !(flags & (O_TRUNC | O_CREAT))) return;
  struct stat st;
  if (UnderRoot(fd, &st) && st.st_size == 0) Journal(&st, 0);
}

#define REFUSE_IF_FULL(fd) \
  do {                     \
    if (Full(fd)) {        \
      errno = ENOSPC;      \
      return -1;           \
    }                      \
  } while (0)

ssize_t write(int fd, const void* buf, size_t count) {
  REFUSE_IF_FULL(fd);
  return real_write(fd, buf, count);
}
ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  REFUSE_IF_FULL(fd);
  return real_pwrite(fd, buf, count, offset);
}
ssize_t pwrite64(int fd, const void* buf, size_t count, off64_t offset) {
  REFUSE_IF_FULL(fd);
  return real_pwrite64(fd, buf, count, offset);
}
ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  REFUSE_IF_FULL(fd);
  return real_writev(fd, iov, iovcnt);
}
ssize_t pwritev(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  REFUSE_IF_FULL(fd);
  return real_pwritev(fd, iov, iovcnt, offset);
}
ssize_t pwritev2(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags) {
  REFUSE_IF_FULL(fd);
  return real_pwritev2(fd, iov, iovcnt, offset, flags);
}
int fallocate(int fd, int mode, off_t offset, off_t len) {
  REFUSE_IF_FULL(fd);
  return real_fallocate(fd, mode, offset, len);
}
int fallocate64(int fd, int mode, off64_t offset, off64_t len) {
  REFUSE_IF_FULL(fd);
  return real_fallocate64(fd, mode, offset, len);
}
// posix_fallocate returns the error instead of setting errno.
int posix_fallocate(int fd, off_t offset, off_t len) {
  if (Full(fd)) return ENOSPC;
  return real_posix_fallocate(fd, offset, len);
}
int posix_fallocate64(int fd, off64_t offset, off64_t len) {
  if (Full(fd)) return ENOSPC;
  return real_posix_fallocate64(fd, offset, len);
}
int ftruncate(int fd, off_t length) {
  struct stat st;
  if (Full(fd) && fstat(fd, &st) == 0 && length > st.st_size) {
    errno = ENOSPC;
    return -1;
  }
  return real_ftruncate(fd, length);
}
int ftruncate64(int fd, off64_t length) {
  struct stat st;
  if (Full(fd) && fstat(fd, &st) == 0 && length > st.st_size) {
    errno = ENOSPC;
    return -1;
  }
  return real_ftruncate64(fd, length);
}

int fsync(int fd) {
  EnsureInit();
  const int rc = real_fsync(fd);
  const int saved = errno;
  if (rc == 0) JournalSynced(fd);
  errno = saved;
  return rc;
}
int fdatasync(int fd) {
  EnsureInit();
  const int rc = real_fdatasync(fd);
  const int saved = errno;
  if (rc == 0) JournalSynced(fd);
  errno = saved;
  return rc;
}

// The opens: the mode argument is there only with O_CREAT or O_TMPFILE.
#define OPEN_BODY(call)                  \
  EnsureInit();                          \
  mode_t mode = 0;                       \
  if (flags & (O_CREAT | __O_TMPFILE)) { \
    va_list ap;                          \
    va_start(ap, flags);                 \
    mode = (mode_t)va_arg(ap, int);      \
    va_end(ap);                          \
  }                                      \
  const int fd = call;                   \
  const int saved = errno;               \
  JournalOpened(fd, flags);              \
  errno = saved;                         \
  return fd

int open(const char* path, int flags, ...) { OPEN_BODY(real_open(path, flags, mode)); }
int open64(const char* path, int flags, ...) { OPEN_BODY(real_open64(path, flags, mode)); }
int openat(int dir, const char* path, int flags, ...) {
  OPEN_BODY(real_openat(dir, path, flags, mode));
}
int openat64(int dir, const char* path, int flags, ...) {
  OPEN_BODY(real_openat64(dir, path, flags, mode));
}

// The wall clock, skewed. clock_gettime may be called before Init by the dynamic loader's
// users (and dlsym itself may read the clock), so it resolves itself lazily without pthread_once.
int clock_gettime(clockid_t clock, struct timespec* ts) {
  if (real_clock_gettime == NULL) {
    real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    const char* skew = getenv("JOBBROKER_FAULTS_CLOCK_SKEW");
    if (skew != NULL) skew_ns = strtoll(skew, NULL, 10) * 1000000000LL;
  }
  const int rc = real_clock_gettime(clock, ts);
  if (rc == 0 && skew_ns != 0 &&
      (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI)) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + skew_ns;
    ts->tv_sec = (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
  }
  return rc;
}
int gettimeofday(struct timeval* tv, void* tz) {
  EnsureInit();
  const int rc = real_gettimeofday(tv, tz);
  if (rc == 0 && skew_ns != 0) {
    long long us = (long long)tv->tv_sec * 1000000LL + tv->tv_usec + skew_ns / 1000;
    tv->tv_sec = (time_t)(us / 1000000LL);
    tv->tv_usec = (suseconds_t)(us % 1000000LL);
  }
  return rc;
}
time_t time(time_t* out) {
  EnsureInit();
  time_t now = real_time(NULL) + (time_t)(skew_ns / 1000000000LL);
  if (out != NULL) *out = now;
  return now;
}
