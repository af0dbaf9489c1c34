#include "redis/multiplexer.hpp"

#include <hiredis/read.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>

#include "jobguard/error.hpp"

namespace jobguard::redis::detail {
namespace {

// hiredis builds replies through these hooks. We build our Reply in place:
// an array's children live inside its `elements` vector and are appended in
// order (hiredis creates them by increasing index). The vector of an array
// grows only while that array is the innermost open one, so the pointers
// hiredis keeps for the open arrays stay valid, and only the root is
// allocated on its own. Nothing is sized by the declared count beyond a
// small reserve: memory follows the bytes that actually arrived.
Reply* place(const redisReadTask* task) {
  if (task->parent != nullptr) {
    auto* parent = static_cast<Reply*>(task->parent->obj);
    return &parent->elements.emplace_back();
  }
  return new Reply();
}

void* create_string(const redisReadTask* task, char* str, size_t len) {
  Reply* r = place(task);
  r->type = task->type == REDIS_REPLY_ERROR    ? Reply::Type::error
            : task->type == REDIS_REPLY_STATUS ? Reply::Type::status
                                               : Reply::Type::string;
  r->str.assign(str, len);
  return r;
}

void* create_array(const redisReadTask* task, int elements) {
  Reply* r = place(task);
  r->type = Reply::Type::array;
  r->elements.reserve(static_cast<std::size_t>(std::clamp(elements, 0, 4096)));
  return r;
}

void* create_integer(const redisReadTask* task, long long value) {
  Reply* r = place(task);
  r->type = Reply::Type::integer;
  r->integer = value;
  return r;
}

void* create_nil(const redisReadTask* task) {
  Reply* r = place(task);
  r->type = Reply::Type::nil;
  return r;
}

// hiredis frees only roots (a finished reply we did not take, or a partial one
// on a protocol error); children are owned by their parent's vector.
void free_object(void* obj) { delete static_cast<Reply*>(obj); }

redisReplyObjectFunctions g_functions = {create_string, create_array, create_integer, create_nil,
                                         free_object};

}  // namespace

void Multiplexer::ReaderDeleter::operator()(redisReader* r) const noexcept { redisReaderFree(r); }

Multiplexer::Multiplexer(ReplyLimits limits) : limiter_(limits) { reset_reader(); }
Multiplexer::~Multiplexer() = default;

void Multiplexer::reset_reader() {
  reader_.reset(redisReaderCreateWithFunctions(&g_functions));
  if (!reader_) throw std::bad_alloc();
  limiter_.reset();
  error_detail_.clear();
}

void Multiplexer::enqueue(Request r) {
  min_deadline_ = std::min(min_deadline_, r.deadline);
  queued_.push_back(std::move(r));
}

void Multiplexer::enqueue_front(Request r) {
  min_deadline_ = std::min(min_deadline_, r.deadline);
  // Keep several handshake commands in their submission order.
  auto it = std::find_if(queued_.begin(), queued_.end(), [](const Request& q) { return !q.internal; });
  r.internal = true;
  queued_.insert(it, std::move(r));
}

bool Multiplexer::wants_write(bool internal_only) const noexcept {
  if (writing_ || queued_.empty()) return false;
  return !internal_only || queued_.front().internal;
}

const std::string& Multiplexer::prepare_write(bool internal_only) {
  write_buf_.clear();
  last_batch_ = 0;
  while (!queued_.empty() && (!internal_only || queued_.front().internal)) {
    Request& r = queued_.front();
    write_buf_.append(r.payload);
    if (!r.no_reply) in_flight_.push_back(InFlight{std::move(r.done), r.deadline, r.internal, r.weight});
    queued_.pop_front();
    ++last_batch_;
  }
  writing_ = !write_buf_.empty();
  return write_buf_;
}

void Multiplexer::write_done() noexcept { writing_ = false; }

std::error_code Multiplexer::feed(const char* data, std::size_t n) {
  // Only the bytes before a header over a limit reach the reader: replies
  // already whole in this read still complete, nothing past it is buffered.
  const std::size_t accepted = limiter_.scan(data, n);
  if (accepted > 0 && redisReaderFeed(reader_.get(), data, accepted) != REDIS_OK) {
    error_detail_ = fmt::format("unparseable reply ({})", reader_->errstr);
    return make_error_code(errc::protocol_error);
  }
  std::size_t since_flush = 0;
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK) {
      error_detail_ = fmt::format("unparseable reply ({})", reader_->errstr);
      return make_error_code(errc::protocol_error);
    }
    if (raw == nullptr) break;
    std::unique_ptr<Reply> reply(static_cast<Reply*>(raw));
    ++replies_;
    if (push_ && push_(push_ctx_, *reply)) continue;
    if (in_flight_.empty()) {
      error_detail_ = "a reply arrived that no call was waiting for";
      return make_error_code(errc::protocol_error);
    }
    Completion done = std::move(in_flight_.front().done);
    const bool internal = in_flight_.front().internal;
    const std::size_t weight = in_flight_.front().weight;
    in_flight_.pop_front();
    if (done) finish(done, internal, std::error_code{}, std::move(*reply));  // empty when it already timed out
    since_flush += weight;
    if (flush_ && since_flush >= flush_every_) {
      since_flush = 0;
      flush_(flush_ctx_);
    }
  }
  if (limiter_.failed()) {
    error_detail_ = limiter_.why();
    return make_error_code(errc::protocol_error);
  }
  return {};
}

void Multiplexer::fail_in_flight(std::error_code ec, const std::string& detail) {
  // Detach first: a completion may enqueue new work (a retry) on this object.
  std::deque<InFlight> failed;
  failed.swap(in_flight_);
  writing_ = false;
  reset_reader();
  for (auto& f : failed)
    if (f.done) finish(f.done, f.internal, ec, Reply::error_reply(detail));
}

void Multiplexer::fail_queued(std::error_code ec, const std::string& detail) {
  std::deque<Request> failed;
  failed.swap(queued_);
  for (auto& r : failed) finish(r.done, r.internal, ec, Reply::error_reply(detail));
}

void Multiplexer::fail_all(std::error_code ec, const std::string& detail) {
  fail_in_flight(ec, detail);
  fail_queued(ec, detail);
  min_deadline_ = Clock::time_point::max();
}

std::size_t Multiplexer::expire(Clock::time_point now, std::error_code ec, const std::string& detail) {
  if (now < min_deadline_) return 0;
  std::vector<std::pair<Completion, bool>> expired;
  auto next = Clock::time_point::max();
  for (auto& f : in_flight_) {
    if (!f.done) continue;
    if (f.deadline <= now) expired.emplace_back(std::move(f.done), f.internal), f.done = nullptr;
    else next = std::min(next, f.deadline);
  }
  for (auto it = queued_.begin(); it != queued_.end();) {
    if (it->deadline <= now) {
      expired.emplace_back(std::move(it->done), it->internal);
      it = queued_.erase(it);
    } else {
      next = std::min(next, it->deadline);
      ++it;
    }
  }
  min_deadline_ = next;
  for (auto& [done, internal] : expired) finish(done, internal, ec, Reply::error_reply(detail));
  return expired.size();
}

void ReplyLimiter::reset() noexcept {
  open_.clear();
  declared_ = 0;
  bulk_left_ = 0;
  in_header_ = false;
  type_ = 0;
  number_.clear();
  line_len_ = 0;
  why_.clear();
}

bool ReplyLimiter::fail(std::string why) {
  why_ = std::move(why);
  return false;
}

void ReplyLimiter::item_done() noexcept {
  while (!open_.empty()) {
    if (--open_.back() > 0) return;
    open_.pop_back();
  }
  declared_ = 0;  // the reply is whole
}

bool ReplyLimiter::on_header(char type, std::string_view number) {
  if (type == '+' || type == '-' || type == ':') {
    item_done();
    return true;
  }
  if (type != '$' && type != '*')
    return fail(fmt::format("unexpected RESP type byte 0x{:02x}", static_cast<unsigned char>(type)));
  if (!number.empty() && number.back() == '\r') number.remove_suffix(1);
  long long v = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
  if (ec != std::errc() || end != number.data() + number.size() || number.empty())
    return fail(fmt::format("malformed {} length \"{}\"", type == '$' ? "bulk string" : "array",
                            number.substr(0, 24)));
  if (v == -1) {
    item_done();
    return true;
  }
  if (v < -1) return fail(fmt::format("negative {} length {}", type == '$' ? "bulk string" : "array", v));
  if (type == '$') {
    if (static_cast<unsigned long long>(v) > limits_.max_bulk)
      return fail(fmt::format("reply declares a bulk string of {} bytes, over the limit of {} (max_bulk_bytes)", v,
                              limits_.max_bulk));
    bulk_left_ = static_cast<std::size_t>(v) + 2;
    return true;
  }
  if (v == 0) {
    item_done();
    return true;
  }
  if (static_cast<unsigned long long>(v) > limits_.max_elements - declared_)
    return fail(fmt::format("reply declares {} array elements ({} before in the same reply), over the limit of {} "
                            "(max_reply_elements)",
                            v, declared_, limits_.max_elements));
  if (static_cast<int>(open_.size()) + 1 > limits_.max_depth)
    return fail(fmt::format("reply nests arrays deeper than the limit of {} (max_reply_depth)", limits_.max_depth));
  declared_ += static_cast<std::size_t>(v);
  open_.push_back(v);
  return true;
}

std::size_t ReplyLimiter::scan(const char* data, std::size_t n) {
  if (failed()) return 0;
  // Longest header worth reading: a type byte, a sign, 19 digits, CR.
  constexpr std::size_t kMaxNumber = 24;
  std::size_t header_start = 0;
  std::size_t i = 0;
  while (i < n) {
    if (bulk_left_ > 0) {
      const std::size_t k = std::min(bulk_left_, n - i);
      bulk_left_ -= k;
      i += k;
      if (bulk_left_ == 0) item_done();
      continue;
    }
    if (!in_header_) {
      in_header_ = true;
      type_ = data[i];
      number_.clear();
      line_len_ = 0;
      header_start = i;
      ++i;
      continue;
    }
    const void* nl = std::memchr(data + i, '\n', n - i);
    const std::size_t end = nl ? static_cast<std::size_t>(static_cast<const char*>(nl) - data) : n;
    line_len_ += end - i;
    if (type_ == '$' || type_ == '*' || type_ == ':') {
      if (line_len_ > kMaxNumber) {
        fail(fmt::format("malformed reply: a '{}' header line longer than {} bytes", type_, kMaxNumber));
        return header_start;
      }
      number_.append(data + i, end - i);
    } else if (line_len_ > limits_.max_bulk) {
      fail(fmt::format("reply line of more than {} bytes without an end, over the limit (max_bulk_bytes)",
                       limits_.max_bulk));
      return header_start;
    }
    i = end;
    if (!nl) break;
    ++i;
    in_header_ = false;
    if (!on_header(type_, number_)) return header_start;
  }
  return n;
}

std::error_code classify_error_reply(const Reply& r) {
  const std::string_view p = r.error_prefix();
  if (p == "WRONGPASS" || p == "NOAUTH") return make_error_code(errc::auth_failed);
  // Logged in, but the ACL refuses this command or key: the credentials are
  // right, the user's rights are not (a different fix than a password).
  if (p == "NOPERM") return make_error_code(errc::permission_denied);
  // OOM (maxmemory with noeviction) belongs here: the server refuses writes
  // until memory is freed, the same "cannot serve us now" as READONLY.
  if (p == "LOADING" || p == "BUSY" || p == "TRYAGAIN" || p == "MASTERDOWN" || p == "CLUSTERDOWN" ||
      p == "READONLY" || p == "OOM")
    return make_error_code(errc::server_busy);
  if (p == "NOSCRIPT" || (p == "ERR" && r.str.find("script") != std::string::npos))
    return make_error_code(errc::script_error);
  return make_error_code(errc::server_error);
}

}  // namespace jobguard::redis::detail
