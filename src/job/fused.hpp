// Private to src/job: the guarded runner's one-call claim and finish scripts
// (scripts/claim.lua, scripts/finish.lua), composed with the lock's and the
// guards' own scripts so their rules are written once; and the batcher that
// sends the calls one event-loop turn makes together as one script call
// (scripts/claim_many.lua, scripts/finish_many.lua).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "jobguard/redis/client.hpp"
#include "jobguard/redis/script.hpp"

namespace jobguard::job::detail {
const redis::Script& claim_script();
const redis::Script& finish_script();
// n calls of claim_script()/finish_script() in one (the layout in their .lua).
const redis::Script& claim_many_script();
const redis::Script& finish_many_script();

// Calls of one shape (as many keys, as many arguments each) as the one call
// of a `many` script, in the layout scripts/batch_layout.lua reads: an
// argument every call has the same is sent once. Throws invalid_argument for
// no calls or calls of different shapes.
struct EncodedBatch {
  std::vector<std::string> keys, args;
};
EncodedBatch encode_batch(std::vector<std::vector<std::string>> keys, std::vector<std::vector<std::string>> args);

// Gathers the calls of one script made in one turn of the client's event
// loop, and sends them as one call of its `many` form: one request, one
// reply, and on the server one script run that makes the common case's
// commands once for all (each redis.call, not the request, is most of a
// guarded job's cost there; see docs/bench.md). A turn with one
// call sends `one` as it is, so a lone job's latency and its server work are
// unchanged. Each caller gets its own call's reply, or the whole call's
// error: a batch in doubt leaves every call in it in doubt, as each would
// have been alone.
//
// Not on a Redis Cluster: the calls' keys are in many slots (the runner
// does not use the one-call scripts there). Calls from any thread are moved
// to the loop thread first; the batcher lives as long as its longest call,
// and the client must outlive the calls, as it must for any call made on it.
// A completion may run inside send() (a closed client refuses at once) and
// make a new call: flush() works on its own copy of the pending calls.
class ScriptBatcher : public std::enable_shared_from_this<ScriptBatcher> {
 public:
  // At most `max_batch` calls in one. A script call runs alone on the
  // server, so an unbounded one would stall its other clients; and one batch
  // for a whole turn's calls makes the client and the server take turns: the
  // server idles while the client runs the jobs of a reply, then the client
  // idles while the server runs the next batch. Several smaller calls in one
  // write let the two overlap, as kFlushEvery does for a connection
  // (src/redis/connection.hpp). 16 did best of 8 to 64 (see docs/bench.md).
  // Batches sent only at the end of the turn can still fall back to taking
  // turns, so a full batch goes at once, weighted (CallOptions::weight): the
  // connection writes it while the client works through the rest of the read.
  static constexpr std::size_t kMaxBatch = 16;

  ScriptBatcher(redis::Client& client, const redis::Script& one, const redis::Script& many,
                std::size_t max_batch = kMaxBatch);

  // As client.async_eval(one, keys, args, done, opts).
  void async_eval(std::vector<std::string> keys, std::vector<std::string> args, redis::Completion done,
                  redis::CallOptions opts = {});

  // Script calls sent, and the calls they carried (a test's evidence that
  // concurrent calls went together).
  std::size_t sent() const noexcept { return sent_; }
  std::size_t carried() const noexcept { return carried_; }

 private:
  struct Call {
    std::vector<std::string> keys, args;
    redis::Completion done;
    redis::CallOptions opts;
  };
  void add(Call c);
  void flush();
  void send(std::vector<Call> batch);

  redis::Client& client_;
  const redis::Script& one_;
  const redis::Script& many_;
  std::size_t max_batch_;
  // Loop thread only.
  std::vector<Call> pending_;
  bool flush_posted_ = false;
  std::atomic<std::size_t> sent_{0}, carried_{0};
};
}  // namespace jobguard::job::detail
