// Everything in jobguard::jobguard, in one include. A translation unit that
// needs one part includes that part's headers instead (a lock user:
// <jobguard/lock.hpp>, <jobguard/lease.hpp>) and compiles faster.
//
// Not here: <jobguard/testing/embedded_redis.hpp> and
// <jobguard/testing/embedded_postgres.hpp> (the test fixtures, target
// jobguard::testing); the operator's tooling of target jobguard::ops, which
// `jobguard serve` and `jobguard doctor` are made of: <jobguard/ops/http.hpp>,
// <jobguard/ops/metrics_server.hpp>, <jobguard/ops/dashboard.hpp>,
// <jobguard/ops/doctor.hpp>, <jobguard/ops/fleet_exporter.hpp>; and
// <jobguard/observe/json.hpp> (pulls in nlohmann/json).
// The consumer test (tests/consumer) fails when a header is neither here nor
// named in this comment.
#pragma once

#include "jobguard/clock.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/text.hpp"
#include "jobguard/version.hpp"

// jobguard::redis
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/command.hpp"
#include "jobguard/redis/options.hpp"
#include "jobguard/redis/reply.hpp"
#include "jobguard/redis/script.hpp"
#include "jobguard/redis/subscriber.hpp"

// jobguard::lock (admin: the operator's list / force release / audit; async:
// the completion-token forms, which need Asio like redis/client.hpp above)
#include "jobguard/admin.hpp"
#include "jobguard/async.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/quorum.hpp"
#include "jobguard/multilock.hpp"
#include "jobguard/rwlock.hpp"
#include "jobguard/semaphore.hpp"

// jobguard::guard (FenceCheck, the Redis stores) and jobguard::pg (the Pg* classes)
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/fence_check.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/guard/postgres.hpp"

// jobguard::job
#include "jobguard/job/catalog.hpp"
#include "jobguard/job/lock_class.hpp"
#include "jobguard/job/locked_run.hpp"
#include "jobguard/job/process.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/job/supervisor.hpp"
#include "jobguard/job/limits.hpp"
#include "jobguard/job/unique.hpp"
#include "jobguard/job/worker.hpp"

// jobguard::observe
#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/exposition.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/observe/metrics.hpp"
