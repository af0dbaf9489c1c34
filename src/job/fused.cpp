#include "job/fused.hpp"

#include <fmt/format.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

#include "jobguard/detail/guard_scripts.hpp"
#include "jobguard/error.hpp"
#include "jobguard/detail/lock_compose.hpp"

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

EncodedBatch encode_batch(std::vector<std::vector<std::string>> keys, std::vector<std::vector<std::string>> args) {
  const std::size_t n = args.size();
  if (n == 0 || keys.size() != n) throw Error(errc::invalid_argument, "encode_batch: no calls, or keys for a different number");
  const std::size_t nk = keys.front().size(), na = args.front().size();
  for (std::size_t i = 0; i < n; ++i)
    if (keys[i].size() != nk || args[i].size() != na)
      throw Error(errc::invalid_argument, fmt::format("encode_batch: call {} has {} keys and {} arguments, call 0 {} and {}",
                                                      i, keys[i].size(), args[i].size(), nk, na));
  std::string mask(na, 's');
  for (std::size_t j = 0; j < na; ++j)
    for (std::size_t i = 1; i < n; ++i)
      if (args[i][j] != args[0][j]) {
        mask[j] = 'p';
        break;
      }
  EncodedBatch b;
  b.args.reserve(4 + na + n * na);
  b.args.push_back(std::to_string(n));
  b.args.push_back(std::to_string(nk));
  b.args.push_back(std::to_string(na));
  b.args.push_back(mask);
  for (std::size_t j = 0; j < na; ++j)
    if (mask[j] == 's') b.args.push_back(std::move(args[0][j]));
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < na; ++j)
      if (mask[j] == 'p') b.args.push_back(std::move(args[i][j]));
  b.keys.reserve(n * nk);
  for (auto& k : keys) b.keys.insert(b.keys.end(), std::make_move_iterator(k.begin()), std::make_move_iterator(k.end()));
  return b;
}

void ScriptBatcher::flush() {
  std::vector<Call> all;
  all.swap(pending_);
  // A batch has one set of options (a deadline, fail-if-down) and one shape
  // (key and argument counts: batch_layout.lua's); calls that differ go in
  // another. Calls made together were concurrent, so regrouping them keeps
  // an order their callers could have seen.
  std::vector<std::vector<Call>> groups;
  auto same = [](const Call& a, const Call& b) {
    return a.opts.fail_if_down == b.opts.fail_if_down && a.opts.timeout == b.opts.timeout &&
           a.keys.size() == b.keys.size() && a.args.size() == b.args.size();
  };
  for (auto& c : all) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return same(x.front(), c); });
    if (g == groups.end()) {
      groups.emplace_back();
      g = std::prev(groups.end());
    }
    g->push_back(std::move(c));
    if (g->size() == max_batch_) {
      send(std::move(*g));
      groups.erase(g);
    }
  }
  for (auto& g : groups) send(std::move(g));
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
  std::vector<std::vector<std::string>> keys, args;
  std::vector<redis::Completion> dones;
  keys.reserve(n);
  args.reserve(n);
  dones.reserve(n);
  for (auto& c : batch) {
    keys.push_back(std::move(c.keys));
    args.push_back(std::move(c.args));
    dones.push_back(std::move(c.done));
  }
  auto encoded = encode_batch(std::move(keys), std::move(args));
  client_.async_eval(
      many_, std::move(encoded.keys), std::move(encoded.args),
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
