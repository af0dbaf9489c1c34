#include "job/fused.hpp"

#include <fmt/format.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "guard/scripts.hpp"
#include "jobguard/error.hpp"
#include "lock/composed.hpp"

namespace jobguard::job {
namespace job_scripts {
extern const std::string_view claim;
extern const std::string_view finish;
extern const std::string_view claim_many;
extern const std::string_view finish_many;
extern const std::string_view batch_layout;
}  // namespace job_scripts

namespace detail {
using ::jobguard::detail::as_lua_function;

namespace {
std::string claim_parts() {
  return guard::scripts::with_stored_format(::jobguard::detail::acquire_as_function()) +
         as_lua_function("idem_begin", guard::scripts::idempotency_begin);
}
std::string finish_parts() {
  return guard::scripts::with_stored_format(as_lua_function("idem_complete", guard::scripts::idempotency_complete)) +
         as_lua_function("record", guard::scripts::completion_record) + ::jobguard::detail::release_as_function();
}
}  // namespace

const redis::Script& claim_script() {
  static const redis::Script s{claim_parts() + std::string(job_scripts::claim)};
  return s;
}

const redis::Script& finish_script() {
  static const redis::Script s{finish_parts() + std::string(job_scripts::finish)};
  return s;
}

const redis::Script& claim_many_script() {
  static const redis::Script s{claim_parts() + as_lua_function("claim_one", job_scripts::claim) +
                               as_lua_function("batch_layout", job_scripts::batch_layout) +
                               std::string(job_scripts::claim_many)};
  return s;
}

const redis::Script& finish_many_script() {
  static const redis::Script s{finish_parts() + as_lua_function("finish_one", job_scripts::finish) +
                               as_lua_function("batch_layout", job_scripts::batch_layout) +
                               std::string(job_scripts::finish_many)};
  return s;
}

ScriptBatcher::ScriptBatcher(redis::Client& client, const redis::Script& one, const redis::Script& many,
                             std::size_t max_batch)
    : client_(client), one_(one), many_(many), max_batch_(max_batch < 1 ? 1 : max_batch) {}

void ScriptBatcher::async_eval(std::vector<std::string> keys, std::vector<std::string> args, redis::Completion done,
                               redis::CallOptions opts) {
  Call c{std::move(keys), std::move(args), std::move(done), opts};
  // A call for one node is not the batch's business (and its view may not
  // outlive this call).
  if (!opts.node.empty()) return client_.async_eval(one_, std::move(c.keys), std::move(c.args), std::move(c.done), opts);
  // Inline on the loop thread (the runner's coroutines run there); from any
  // other, moved there, so pending_ has one thread.
  boost::asio::dispatch(client_.get_executor(),
                        [self = shared_from_this(), c = std::move(c)]() mutable { self->add(std::move(c)); });
}

void ScriptBatcher::add(Call c) {
  pending_.push_back(std::move(c));
  // A full batch goes now, not at the end of the turn: its callers were
  // resumed by one reply of a read that holds more, and the connection
  // writes it (CallOptions::weight) before this client works through the
  // rest, so the server has it meanwhile.
  if (pending_.size() >= max_batch_) return flush();
  if (flush_posted_) return;
  flush_posted_ = true;
  // Posted, not run now: the other jobs this turn resumes (a read's worth
  // of replies, a batch of stream entries) make their calls first.
  boost::asio::post(client_.get_executor(), [self = shared_from_this()] {
    self->flush_posted_ = false;
    self->flush();
  });
}

void ScriptBatcher::flush() {
  std::vector<Call> all;
  all.swap(pending_);
  // Calls that differ in their options (a deadline, fail-if-down) go apart:
  // a batch has one of each.
  std::vector<Call> batch;
  for (auto& c : all) {
    if (!batch.empty() && (batch.size() == max_batch_ || batch.front().opts.fail_if_down != c.opts.fail_if_down ||
                           batch.front().opts.timeout != c.opts.timeout)) {
      send(std::move(batch));
      batch.clear();
    }
    batch.push_back(std::move(c));
  }
  if (!batch.empty()) send(std::move(batch));
}

void ScriptBatcher::send(std::vector<Call> batch) {
  sent_.fetch_add(1, std::memory_order_relaxed);
  carried_.fetch_add(batch.size(), std::memory_order_relaxed);
  auto opts = batch.front().opts;
  if (batch.size() == 1) {
    auto& c = batch.front();
    return client_.async_eval(one_, std::move(c.keys), std::move(c.args), std::move(c.done), opts);
  }
  const std::size_t n = batch.size();
  opts.weight = static_cast<std::uint32_t>(n);
  std::vector<std::string> keys, args;
  args.reserve(1 + 2 * n);
  args.push_back(std::to_string(n));
  for (const auto& c : batch) args.push_back(std::to_string(c.keys.size()));
  for (const auto& c : batch) args.push_back(std::to_string(c.args.size()));
  std::vector<redis::Completion> dones;
  dones.reserve(n);
  for (auto& c : batch) {
    keys.insert(keys.end(), std::make_move_iterator(c.keys.begin()), std::make_move_iterator(c.keys.end()));
    args.insert(args.end(), std::make_move_iterator(c.args.begin()), std::make_move_iterator(c.args.end()));
    dones.push_back(std::move(c.done));
  }
  client_.async_eval(
      many_, std::move(keys), std::move(args),
      [dones = std::move(dones)](std::error_code ec, redis::Reply r) mutable {
        if (!ec && (!r.is_array() || r.elements.size() != dones.size())) {
          ec = make_error_code(errc::protocol_error);
          r = redis::Reply::error_reply(
              fmt::format("{} calls gathered in one script call: unexpected reply {}", dones.size(),
                          redis::to_debug_string(r)));
        }
        for (std::size_t i = 0; i < dones.size(); ++i) {
          if (ec) dones[i](ec, r);
          else dones[i](ec, std::move(r.elements[i]));
        }
      },
      opts);
}

}  // namespace detail
}  // namespace jobguard::job
