// Private to src/job: the guarded runner's one-call claim and finish scripts
// (scripts/claim.lua, scripts/finish.lua), composed with the lock's and the
// guards' own scripts so their rules are written once.
#pragma once

#include "jobguard/redis/script.hpp"

namespace jobguard::job::detail {
const redis::Script& claim_script();
const redis::Script& finish_script();
}  // namespace jobguard::job::detail
