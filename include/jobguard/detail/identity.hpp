// Shared by the library's parts (include/jobguard/detail/, not installed), not an
// application API: what a token or an owner name is made of — this
// process's pid, the host's name, and unguessable bytes — cheaply enough to
// make one per job (src/lock/token.cpp, src/guard/idempotency_redis.cpp).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace jobguard::detail {

// getpid() is a syscall (glibc does not cache it) and showed in profiles of
// the acquire path: read once, and again by a fork handler in the child.
pid_t process_id() noexcept;

// gethostname(), read once; "unknown-host" when it fails or is empty.
const std::string& host_name();

// `n` bytes from the kernel's CSPRNG (getrandom), taken from a per-thread
// pool filled 4 KiB at a time (one syscall per 256 16-byte tokens). The pool
// is tied to the pid: a forked child never hands out bytes its parent also
// holds. Bytes handed out are wiped from the pool. Throws jobguard::Error
// when getrandom fails.
void random_bytes(unsigned char* out, std::size_t n);

// `n` bytes as lower-case hex, appended to `out`.
void append_hex(std::string& out, const unsigned char* bytes, std::size_t n);

}  // namespace jobguard::detail
