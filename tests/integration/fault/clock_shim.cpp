// LD_PRELOAD shim that steps a process's wall clock at run time: a test
// starts redis-server with it and moves the server's clock as NTP stepping a
// drifted VM, a restored snapshot or a hypervisor pause would. Redis expires
// keys by this clock (gettimeofday), so a forward step expires lock keys
// early; the monotonic clock is left alone, as a real step leaves it.
//
// The offset (signed microseconds, one native int64) is read from the file
// named by JOBGUARD_CLOCK_OFFSET_FILE, mapped shared: the test rewrites it in
// place (pwrite of 8 bytes, never truncate: a mapped file that shrinks faults
// on access) and every later call sees the new value.
//
// Built without sanitizers and calling only libc: it is loaded into a
// program that has no sanitizer runtime.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

namespace {
using clock_gettime_fn = int (*)(clockid_t, timespec*);
using gettimeofday_fn = int (*)(timeval*, void*);

clock_gettime_fn real_clock_gettime = nullptr;
gettimeofday_fn real_gettimeofday = nullptr;
const volatile std::int64_t* offset_us = nullptr;

__attribute__((constructor)) void init() {
  real_clock_gettime = reinterpret_cast<clock_gettime_fn>(dlsym(RTLD_NEXT, "clock_gettime"));
  real_gettimeofday = reinterpret_cast<gettimeofday_fn>(dlsym(RTLD_NEXT, "gettimeofday"));
  const char* path = std::getenv("JOBGUARD_CLOCK_OFFSET_FILE");
  if (!path) return;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  void* p = ::mmap(nullptr, sizeof(std::int64_t), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p != MAP_FAILED) offset_us = static_cast<const volatile std::int64_t*>(p);
}

std::int64_t offset() { return offset_us ? *offset_us : 0; }

int raw_realtime(timespec* ts) {
  if (real_clock_gettime) return real_clock_gettime(CLOCK_REALTIME, ts);
  return static_cast<int>(::syscall(SYS_clock_gettime, CLOCK_REALTIME, ts));
}

void shift(timespec* ts) {
  const std::int64_t ns = static_cast<std::int64_t>(ts->tv_sec) * 1000000000 + ts->tv_nsec + offset() * 1000;
  ts->tv_sec = static_cast<time_t>(ns / 1000000000);
  ts->tv_nsec = static_cast<long>(ns % 1000000000);
}
}  // namespace

extern "C" {

int clock_gettime(clockid_t id, timespec* ts) {
  if (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE) {
    if (real_clock_gettime) return real_clock_gettime(id, ts);
    return static_cast<int>(::syscall(SYS_clock_gettime, id, ts));
  }
  const int rc = real_clock_gettime ? real_clock_gettime(id, ts)
                                    : static_cast<int>(::syscall(SYS_clock_gettime, id, ts));
  if (rc == 0) shift(ts);
  return rc;
}

int gettimeofday(timeval* tv, void* tz) {
  if (!tv) return real_gettimeofday ? real_gettimeofday(tv, tz) : 0;
  timespec ts{};
  const int rc = raw_realtime(&ts);
  if (rc != 0) return rc;
  shift(&ts);
  tv->tv_sec = ts.tv_sec;
  tv->tv_usec = static_cast<suseconds_t>(ts.tv_nsec / 1000);
  return 0;
}

time_t time(time_t* out) {
  timespec ts{};
  raw_realtime(&ts);
  shift(&ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
}
