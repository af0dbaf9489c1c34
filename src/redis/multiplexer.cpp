#include "redis/multiplexer.hpp"

#include <hiredis/read.h>

#include <algorithm>
#include <utility>

#include "jobguard/error.hpp"

namespace jobguard::redis::detail {
namespace {

// hiredis builds replies through these hooks. We build our Reply in place:
// an array's children live inside its pre-sized `elements` vector, so the
// pointer handed back for a child stays valid and only the root is allocated.
Reply* place(const redisReadTask* task) {
  if (task->parent != nullptr) {
    auto* parent = static_cast<Reply*>(task->parent->obj);
    return &parent->elements[static_cast<std::size_t>(task->idx)];
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
  r->elements.resize(static_cast<std::size_t>(std::max(elements, 0)));
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

Multiplexer::Multiplexer() { reset_reader(); }
Multiplexer::~Multiplexer() = default;

void Multiplexer::reset_reader() {
  reader_.reset(redisReaderCreateWithFunctions(&g_functions));
  if (!reader_) throw std::bad_alloc();
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
    in_flight_.push_back(InFlight{std::move(r.done), r.deadline, r.internal});
    queued_.pop_front();
    ++last_batch_;
  }
  writing_ = !write_buf_.empty();
  return write_buf_;
}

void Multiplexer::write_done() noexcept { writing_ = false; }

std::error_code Multiplexer::feed(const char* data, std::size_t n) {
  if (redisReaderFeed(reader_.get(), data, n) != REDIS_OK) return make_error_code(errc::protocol_error);
  std::size_t since_flush = 0;
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK) return make_error_code(errc::protocol_error);
    if (raw == nullptr) return {};
    std::unique_ptr<Reply> reply(static_cast<Reply*>(raw));
    if (in_flight_.empty()) return make_error_code(errc::protocol_error);  // unsolicited reply
    Completion done = std::move(in_flight_.front().done);
    const bool internal = in_flight_.front().internal;
    in_flight_.pop_front();
    if (done) finish(done, internal, std::error_code{}, std::move(*reply));  // empty when it already timed out
    if (flush_ && ++since_flush == flush_every_) {
      since_flush = 0;
      flush_(flush_ctx_);
    }
  }
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

std::error_code classify_error_reply(const Reply& r) {
  const std::string_view p = r.error_prefix();
  if (p == "WRONGPASS" || p == "NOAUTH" || p == "NOPERM") return make_error_code(errc::auth_failed);
  if (p == "LOADING" || p == "BUSY" || p == "TRYAGAIN" || p == "MASTERDOWN" || p == "CLUSTERDOWN" ||
      p == "READONLY")
    return make_error_code(errc::server_busy);
  if (p == "NOSCRIPT" || (p == "ERR" && r.str.find("script") != std::string::npos))
    return make_error_code(errc::script_error);
  return make_error_code(errc::server_error);
}

}  // namespace jobguard::redis::detail
