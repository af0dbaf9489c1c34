// One guardian process per jobguard process, for every CMD group it starts.
//
// The hazard: a CMD that outlives the jobguard holding its lock keeps working
// after the renewals stop, the key expires and a second holder runs beside it.
// A destructor or a signal handler cannot help against SIGKILL, so the killing
// is done by another process: the guardian, forked once (lazily, at the first
// CMD), which holds one end of a socket pair whose other end only we hold.
// We tell it each group we start and each group we have finished with; when
// its end reaches EOF — this process exited or was killed by anything — it
// SIGKILLs every group still listed and exits.
//
// Why one per process and not one per CMD: a guardian per CMD is a second
// process (and a second exec and dynamic link) per job, most of the CPU of a
// concurrent worker running short CMDs. Why forked and not exec'd: a library
// user has no guardian binary to exec, and the child runs only raw system
// calls, which is what a fork of a multi-threaded process may do.
//
// Threads: every function may be called from any thread.
#pragma once

#include <sys/types.h>

namespace jobguard::job::detail {

// Lists `pgid` (a group whose leader is our unreaped child) with the guardian,
// starting the guardian if there is none (or it died; the groups still listed
// are then told to the new one). Throws std::system_error if no guardian can
// be started; the caller must then kill the group itself.
void guard_group(pid_t pgid);

// Starts the guardian if there is none: before a spawn, so that the fork
// (milliseconds for a big process) is not in the moment between CMD's start
// and guard_group, when a jobguard killed leaves CMD unguarded. Throws as
// guard_group does.
void ensure_guardian();

// Takes `pgid` off the list. Call it after the group was killed and before
// its leader is reaped: until then the group id cannot be reused, so the
// guardian can never kill a stranger's group.
void unguard_group(pid_t pgid) noexcept;

// The guardian's pid, or -1 if none runs in this process (tests).
pid_t guardian_pid() noexcept;

}  // namespace jobguard::job::detail
