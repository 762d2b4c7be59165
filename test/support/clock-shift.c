/*
 * LD_PRELOAD library for tests: shifts this process's wall clock (CLOCK_REALTIME, gettimeofday,
 * time) by the number of milliseconds written in the file named by CLOCK_SHIFT_FILE, read on
 * every call, so a test can make one redis-server's clock jump while it runs (Redis expires keys
 * by this clock). The monotonic clocks are left alone. Only system calls are used: no malloc and
 * no dlsym, which jemalloc would re-enter (libfaketime fails that way on redis-server).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long shift_ms(void) {
  static const char *path;
  if (!path) path = getenv("CLOCK_SHIFT_FILE");
  if (!path) return 0;
  int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
  if (fd < 0) return 0;
  char text[32];
  long n = syscall(SYS_read, fd, text, sizeof text - 1);
  syscall(SYS_close, fd);
  if (n <= 0) return 0;
  long long value = 0;
  int negative = 0;
  for (long i = 0; i < n; i++) {
    if (i == 0 && text[i] == '-') negative = 1;
    else if (text[i] >= '0' && text[i] <= '9') value = value * 10 + (text[i] - '0');
    else break;
  }
  return negative ? -value : value;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
  int result = (int)syscall(SYS_clock_gettime, clock, ts);
  if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
    long long shift = shift_ms();
    long long ns = (long long)ts->tv_nsec + (shift % 1000) * 1000000LL;
    ts->tv_sec += shift / 1000 + ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) {
      ts->tv_nsec += 1000000000LL;
      ts->tv_sec -= 1;
    }
  }
  return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
  struct timespec ts;
  int result = clock_gettime(CLOCK_REALTIME, &ts);
  (void)tz;
  if (result == 0 && tv) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return result;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
