// Forking the fixtures' servers (EmbeddedRedis, EmbeddedPostgres).
#pragma once

#include <sys/types.h>

#include <functional>

namespace jobguard::testing_detail {

// Runs `fork_fn` (which forks and returns the child's pid, or -1) on one
// thread that lives as long as the process. PR_SET_PDEATHSIG fires when the
// *thread* that forked the child exits, not the process: a server started
// from a short-lived thread (a test worker thread that first touched a lazily
// started fixture) was killed when that thread ended. Forking from one
// long-lived thread makes the death signal mean exactly "the process died".
pid_t on_spawner_thread(const std::function<pid_t()>& fork_fn);

}  // namespace jobguard::testing_detail
