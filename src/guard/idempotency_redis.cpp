#include <fmt/format.h>

#include <array>

#include "jobguard/detail/identity.hpp"
#include "guard/async_internal.hpp"
#include "jobguard/detail/guard_scripts.hpp"
#include "jobguard/detail/completion_parts.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::guard {
namespace {

using detail::from_ms;

std::int64_t as_int(const redis::Reply& r) {
  if (r.is_integer()) return r.integer;
  if (r.is_string()) return std::stoll(r.str);
  return 0;
}

}  // namespace

const char* to_string(BeginStatus s) noexcept {
  switch (s) {
    case BeginStatus::claimed: return "claimed";
    case BeginStatus::in_progress: return "in progress";
    case BeginStatus::completed: return "completed";
    case BeginStatus::fingerprint_conflict: return "fingerprint conflict";
  }
  return "?";
}

std::string make_owner_token() {
  // Made for every guarded job: from the pool of kernel randomness and the
  // host and pid read once (common/identity.hpp), not a RAND_bytes, a
  // gethostname and a getpid each time.
  std::array<unsigned char, 8> b{};
  jobguard::detail::random_bytes(b.data(), b.size());
  const std::string& host = jobguard::detail::host_name();
  std::string out;
  out.reserve(host.size() + 32);
  out.append(host).append(1, '/').append(std::to_string(jobguard::detail::process_id())).append(1, '/');
  jobguard::detail::append_hex(out, b.data(), b.size());
  return out;
}

namespace detail {
void check_begin_args(std::string_view key, std::chrono::milliseconds lease, const IdempotencyOptions& o) {
  if (key.empty()) throw Error(errc::invalid_argument, "empty idempotency key");
  if (lease.count() <= 0)
    throw Error(errc::invalid_argument, fmt::format("idempotency key \"{}\": lease must be > 0", key));
  if (o.retention.count() <= 0)
    throw Error(errc::invalid_argument, fmt::format("idempotency key \"{}\": retention must be > 0", key));
}
}  // namespace detail

RedisIdempotencyStore::RedisIdempotencyStore(redis::Client& client, IdempotencyOptions options)
    : client_(client), opts_(std::move(options)) {
  if (opts_.retention.count() > 0)
    piece_ = std::make_shared<const scripts::KeyPiece>(
        scripts::KeyPiece{&client_, this, std::to_string(opts_.retention.count())});
}

namespace {

const redis::Script& begin_script() {
  static const redis::Script script{scripts::with_stored_format(scripts::idempotency_begin)};
  return script;
}
const redis::Script& complete_script() {
  static const redis::Script script{scripts::with_stored_format(scripts::idempotency_complete)};
  return script;
}
const redis::Script& abandon_script() {
  static const redis::Script script{scripts::with_stored_format(scripts::idempotency_abandon)};
  return script;
}

BeginResult parse_begin(const redis::Reply& r) {
  if (!r.is_array() || r.elements.size() != 5 || !r.elements[0].is_string())
    throw Error(errc::protocol_error, "idempotency_begin script: unexpected reply " + redis::to_debug_string(r));
  const std::string& st = r.elements[0].str;
  BeginResult b;
  b.owner = r.elements[1].str;
  b.since = from_ms(as_int(r.elements[2]));
  if (st == "claimed" || st == "reclaimed") {
    b.status = BeginStatus::claimed;
    b.reclaimed = st == "reclaimed";
  } else if (st == "in_progress") {
    b.status = BeginStatus::in_progress;
    b.lease_left = std::chrono::milliseconds(as_int(r.elements[3]));
  } else if (st == "completed") {
    b.status = BeginStatus::completed;
    b.result = r.elements[4].str;
  } else if (st == "conflict") {
    b.status = BeginStatus::fingerprint_conflict;
    b.stored_fingerprint = r.elements[4].str;
  } else {
    throw Error(errc::protocol_error, "idempotency_begin script: unknown status " + st);
  }
  return b;
}

// True, or the lease_lost failure: the key is no longer `owner`'s.
bool parse_complete(const redis::Reply& r, std::string_view key, std::string_view owner) {
  if (!r.is_array() || r.elements.empty())
    throw Error(errc::protocol_error, "idempotency_complete script: unexpected reply " + redis::to_debug_string(r));
  if (r.elements[0].integer == 1) return true;
  const std::string state = r.elements.size() > 1 && !r.elements[1].is_nil() ? r.elements[1].str : "absent";
  const std::string holder = r.elements.size() > 2 && !r.elements[2].is_nil() ? r.elements[2].str : "nobody";
  throw Error(errc::lease_lost, fmt::format("idempotency key \"{}\": not held by {} (state {}, owner {})", key,
                                            owner, state, holder));
}

bool parse_abandon(const redis::Reply& r) { return r.is_integer() && r.integer == 1; }

}  // namespace

BeginResult RedisIdempotencyStore::parse_begin_reply(const redis::Reply& r) { return parse_begin(r); }
void RedisIdempotencyStore::check_complete_reply(const redis::Reply& r, std::string_view key, std::string_view owner) {
  parse_complete(r, key, owner);
}

void IdempotencyStore::async_begin(std::string_view, std::string_view, std::chrono::milliseconds, std::string_view,
                                   Done<BeginResult> done) {
  detail::no_async_form(done, "this idempotency store");
}
void IdempotencyStore::async_complete(std::string_view, std::string_view, std::string_view, Done<bool> done) {
  detail::no_async_form(done, "this idempotency store");
}
void IdempotencyStore::async_abandon(std::string_view, std::string_view, Done<bool> done) {
  detail::no_async_form(done, "this idempotency store");
}

BeginResult RedisIdempotencyStore::begin(std::string_view key, std::string_view fingerprint,
                                         std::chrono::milliseconds lease, std::string_view owner) {
  detail::check_begin_args(key, lease, opts_);
  const std::string me = owner.empty() ? make_owner_token() : std::string(owner);
  return parse_begin(client_.eval(begin_script(), {opts_.prefix + std::string(key)},
                                  {std::string(fingerprint), me, std::to_string(lease.count()),
                                   std::to_string(opts_.retention.count())},
                                  {opts_.timeout}));
}

void RedisIdempotencyStore::complete(std::string_view key, std::string_view owner, std::string_view result) {
  parse_complete(client_.eval(complete_script(), {opts_.prefix + std::string(key)},
                              {std::string(owner), std::string(result), std::to_string(opts_.retention.count())},
                              {opts_.timeout}),
                 key, owner);
}

bool RedisIdempotencyStore::abandon(std::string_view key, std::string_view owner) {
  return parse_abandon(
      client_.eval(abandon_script(), {opts_.prefix + std::string(key)}, {std::string(owner)}, {opts_.timeout}));
}

void RedisIdempotencyStore::async_begin(std::string_view key, std::string_view fingerprint,
                                        std::chrono::milliseconds lease, std::string_view owner,
                                        Done<BeginResult> done) {
  std::string me;
  if (!detail::checked(done, [&] {
        detail::check_begin_args(key, lease, opts_);
        me = owner.empty() ? make_owner_token() : std::string(owner);
      }))
    return;
  client_.async_eval(begin_script(), {opts_.prefix + std::string(key)},
                     {std::string(fingerprint), std::move(me), std::to_string(lease.count()),
                      std::to_string(opts_.retention.count())},
                     detail::reporting<BeginResult>(client_, std::move(done), parse_begin), {opts_.timeout});
}

void RedisIdempotencyStore::async_complete(std::string_view key, std::string_view owner, std::string_view result,
                                           Done<bool> done) {
  client_.async_eval(complete_script(), {opts_.prefix + std::string(key)},
                     {std::string(owner), std::string(result), std::to_string(opts_.retention.count())},
                     detail::reporting<bool>(client_, std::move(done),
                                             [k = std::string(key), o = std::string(owner)](const redis::Reply& r) {
                                               return parse_complete(r, k, o);
                                             }),
                     {opts_.timeout});
}

void RedisIdempotencyStore::async_abandon(std::string_view key, std::string_view owner, Done<bool> done) {
  client_.async_eval(abandon_script(), {opts_.prefix + std::string(key)}, {std::string(owner)},
                     detail::reporting<bool>(client_, std::move(done), parse_abandon), {opts_.timeout});
}

}  // namespace jobguard::guard
