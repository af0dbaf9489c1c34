// The sans-IO request/reply matcher, fed bytes and fake time points: no
// sockets, no sleeping.
#include "redis/multiplexer.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "jobguard/error.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using detail::Clock;
using detail::Multiplexer;

namespace {

struct Outcome {
  std::error_code ec;
  Reply reply;
};

// Records what each request's completion received, and how many times.
struct Recorder {
  std::vector<std::optional<Outcome>> results;
  std::vector<int> calls;

  Completion slot(std::size_t i) {
    if (results.size() <= i) {
      results.resize(i + 1);
      calls.resize(i + 1);
    }
    return [this, i](std::error_code ec, Reply r) {
      ++calls[i];
      results[i] = Outcome{ec, std::move(r)};
    };
  }
};

const Clock::time_point kT0 = Clock::time_point{} + std::chrono::hours(1);

Multiplexer::Request req(Completion done, Clock::time_point deadline = kT0 + std::chrono::hours(1),
                         std::string payload = "*1\r\n$4\r\nPING\r\n") {
  Multiplexer::Request r;
  r.payload = std::move(payload);
  r.done = std::move(done);
  r.deadline = deadline;
  return r;
}

bool same(const Reply& a, const Reply& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case Reply::Type::nil: return true;
    case Reply::Type::integer: return a.integer == b.integer;
    case Reply::Type::string:
    case Reply::Type::status:
    case Reply::Type::error: return a.str == b.str;
    case Reply::Type::array:
      if (a.elements.size() != b.elements.size()) return false;
      for (std::size_t i = 0; i < a.elements.size(); ++i)
        if (!same(a.elements[i], b.elements[i])) return false;
      return true;
  }
  return false;
}

Reply array(std::vector<Reply> elems) {
  Reply r;
  r.type = Reply::Type::array;
  r.elements = std::move(elems);
  return r;
}

// One reply of every RESP2 type, nested arrays included, with the exact wire
// bytes a server sends for it.
struct Wire {
  std::string bytes;
  Reply expected;
};

std::vector<Wire> every_reply_type() {
  return {
      {"+OK\r\n", Reply::status_reply("OK")},
      {"-ERR wrong number of arguments\r\n", Reply::error_reply("ERR wrong number of arguments")},
      {":42\r\n", Reply::integer_reply(42)},
      {":-7\r\n", Reply::integer_reply(-7)},
      {"$5\r\nhe\r\no\r\n", Reply::string_reply("he\r\no")},  // CRLF inside a bulk string
      {"$0\r\n\r\n", Reply::string_reply("")},
      {"$-1\r\n", Reply::nil_reply()},
      {"*0\r\n", array({})},
      {"*-1\r\n", Reply::nil_reply()},
      {"*4\r\n:1\r\n*3\r\n$1\r\na\r\n$-1\r\n*1\r\n-NOPE inner\r\n+st\r\n*0\r\n",
       array({Reply::integer_reply(1),
              array({Reply::string_reply("a"), Reply::nil_reply(), array({Reply::error_reply("NOPE inner")})}),
              Reply::status_reply("st"), array({})})},
      {"-NOSCRIPT No matching script\r\n", Reply::error_reply("NOSCRIPT No matching script")},
      {"$3\r\nend\r\n", Reply::string_reply("end")},
  };
}

std::string concat(const std::vector<Wire>& ws) {
  std::string s;
  for (auto& w : ws) s += w.bytes;
  return s;
}

// Enqueues one request per expected reply and writes them all (in flight).
void send_all(Multiplexer& m, Recorder& rec, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) m.enqueue(req(rec.slot(i)));
  ASSERT_TRUE(m.wants_write());
  const std::string& buf = m.prepare_write();
  EXPECT_EQ(m.last_batch_size(), n);
  EXPECT_EQ(buf.size(), n * std::string("*1\r\n$4\r\nPING\r\n").size());
  m.write_done();
  EXPECT_EQ(m.in_flight(), n);
}

void expect_all_matched(const Recorder& rec, const std::vector<Wire>& ws, const std::string& where) {
  ASSERT_EQ(rec.results.size(), ws.size());
  for (std::size_t i = 0; i < ws.size(); ++i) {
    ASSERT_TRUE(rec.results[i].has_value()) << where << ": request " << i << " not completed";
    EXPECT_EQ(rec.calls[i], 1) << where << ": request " << i;
    EXPECT_FALSE(rec.results[i]->ec) << where << ": request " << i;
    EXPECT_TRUE(same(rec.results[i]->reply, ws[i].expected))
        << where << ": request " << i << " got " << to_debug_string(rec.results[i]->reply) << ", want "
        << to_debug_string(ws[i].expected);
  }
}

}  // namespace

TEST(Multiplexer, PipelineSplitAtEveryByteBoundaryMatchesEachReplyInOrder) {
  const auto ws = every_reply_type();
  const std::string wire = concat(ws);
  for (std::size_t cut = 0; cut <= wire.size(); ++cut) {
    Multiplexer m;
    Recorder rec;
    send_all(m, rec, ws.size());
    ASSERT_FALSE(m.feed(wire.data(), cut)) << "cut at " << cut;
    ASSERT_FALSE(m.feed(wire.data() + cut, wire.size() - cut)) << "cut at " << cut;
    expect_all_matched(rec, ws, "cut at " + std::to_string(cut));
    EXPECT_EQ(m.pending(), 0u);
  }
}

// Set as `m`'s flush (every `every` completions): records at each flush how
// many requests wait to be written.
struct FlushWatch {
  explicit FlushWatch(Multiplexer& mux, std::size_t every = 16) : m(&mux) {
    mux.set_flush(
        every,
        [](void* p) {
          auto* w = static_cast<FlushWatch*>(p);
          w->waiting.push_back(w->m->pending() - w->m->in_flight());
        },
        this);
  }
  FlushWatch(const FlushWatch&) = delete;
  FlushWatch& operator=(const FlushWatch&) = delete;
  Multiplexer* m;
  std::vector<std::size_t> waiting;
};

TEST(Multiplexer, FlushRunsAfterEveryNthCompletionOfOneFeedSoTheirRequestsCanLeaveEarly) {
  // 40 replies arrive in one feed and each completion asks for one more
  // command, as a resumed caller would. With a flush every 16, the I/O layer
  // is called after completions 16 and 32, each time with exactly the
  // requests those completions enqueued waiting to be written.
  Multiplexer m;
  FlushWatch watch(m);
  Recorder follow_ups;
  std::size_t asked = 0;
  for (std::size_t i = 0; i < 40; ++i)
    m.enqueue(req([&](std::error_code, Reply) { m.enqueue(req(follow_ups.slot(asked++))); }));
  (void)m.prepare_write();
  m.write_done();
  std::string wire;
  for (int i = 0; i < 40; ++i) wire += "+OK\r\n";
  ASSERT_FALSE(m.feed(wire.data(), wire.size()));
  EXPECT_EQ(watch.waiting, (std::vector<std::size_t>{16, 32}));
  EXPECT_EQ(asked, 40u);
  // A later feed counts afresh: 10 completions, no flush.
  m.set_flush(16, [](void* p) { static_cast<FlushWatch*>(p)->waiting.push_back(999); }, &watch);
  (void)m.prepare_write();
  m.write_done();
  std::string ten;
  for (int i = 0; i < 10; ++i) ten += "+OK\r\n";
  ASSERT_FALSE(m.feed(ten.data(), ten.size()));
  EXPECT_EQ(watch.waiting.size(), 2u);
}

TEST(Multiplexer, AReplyCarryingManyCallsCountsByItsWeightTowardTheFlush) {
  // A batch of 16 calls in one script call (CallOptions::weight): its one
  // reply resumes 16 callers, so the flush runs right after it, with the
  // follow-up it enqueued waiting; two replies of weight 1 after it do not
  // reach the next flush.
  Multiplexer m;
  FlushWatch watch(m);
  Recorder follow_ups;
  std::size_t asked = 0;
  auto batch = req([&](std::error_code, Reply) { m.enqueue(req(follow_ups.slot(asked++))); });
  batch.weight = 16;
  m.enqueue(std::move(batch));
  for (int i = 0; i < 2; ++i) m.enqueue(req([&](std::error_code, Reply) { m.enqueue(req(follow_ups.slot(asked++))); }));
  (void)m.prepare_write();
  m.write_done();
  const std::string wire = "+OK\r\n+OK\r\n+OK\r\n";
  ASSERT_FALSE(m.feed(wire.data(), wire.size()));
  EXPECT_EQ(watch.waiting, (std::vector<std::size_t>{1}));
  EXPECT_EQ(asked, 3u);
}

TEST(Multiplexer, PipelineFedOneByteAtATimeCompletesEachRequestAsSoonAsItsReplyIsWhole) {
  const auto ws = every_reply_type();
  Multiplexer m;
  Recorder rec;
  send_all(m, rec, ws.size());
  std::size_t reply = 0, end_of_reply = ws[0].bytes.size(), offset = 0;
  for (const auto& w : ws) {
    for (char c : w.bytes) {
      ASSERT_FALSE(m.feed(&c, 1));
      ++offset;
      // Request `reply` completes exactly when its last byte arrives, not before.
      const bool whole = offset == end_of_reply;
      EXPECT_EQ(rec.results[reply].has_value(), whole) << "byte " << offset;
    }
    ++reply;
    if (reply < ws.size()) end_of_reply += ws[reply].bytes.size();
  }
  expect_all_matched(rec, ws, "byte at a time");
}

TEST(Multiplexer, ErrorReplyMidPipelineGoesToItsOwnRequestOnly) {
  Multiplexer m;
  Recorder rec;
  send_all(m, rec, 3);
  const std::string wire = "+OK\r\n-WRONGTYPE Operation against a key\r\n:5\r\n";
  ASSERT_FALSE(m.feed(wire.data(), wire.size()));
  ASSERT_TRUE(rec.results[0] && rec.results[1] && rec.results[2]);
  EXPECT_TRUE(rec.results[0]->reply.is_ok());
  EXPECT_TRUE(rec.results[1]->reply.is_error());
  EXPECT_EQ(rec.results[1]->reply.str, "WRONGTYPE Operation against a key");
  EXPECT_EQ(rec.results[1]->reply.error_prefix(), "WRONGTYPE");
  EXPECT_FALSE(rec.results[2]->reply.is_error());
  EXPECT_EQ(rec.results[2]->reply.integer, 5);
}

TEST(Multiplexer, ExpireCompletesOnlyRequestsPastTheirDeadlineAndDiscardsTheLateReply) {
  using std::chrono::milliseconds;
  Multiplexer m;
  Recorder rec;
  const auto timeout = make_error_code(errc::timeout);
  m.enqueue(req(rec.slot(0), kT0 + milliseconds(10)));
  m.enqueue(req(rec.slot(1), kT0 + milliseconds(20)));
  m.enqueue(req(rec.slot(2), kT0 + milliseconds(1000)));
  m.prepare_write();
  m.write_done();
  m.enqueue(req(rec.slot(3), kT0 + milliseconds(15)));  // queued, never written
  EXPECT_EQ(m.next_deadline(), kT0 + milliseconds(10));

  EXPECT_EQ(m.expire(kT0 + milliseconds(9), timeout, "late"), 0u);
  EXPECT_EQ(m.expire(kT0 + milliseconds(15), timeout, "no reply before the deadline"), 2u);
  ASSERT_TRUE(rec.results[0] && rec.results[3]);
  EXPECT_EQ(rec.results[0]->ec, timeout);
  EXPECT_EQ(rec.results[0]->reply.str, "no reply before the deadline");
  EXPECT_EQ(rec.results[3]->ec, timeout);
  EXPECT_FALSE(rec.results[1] || rec.results[2]);
  // The expired in-flight request keeps its place so the reply order holds;
  // the expired queued one is gone.
  EXPECT_EQ(m.in_flight(), 3u);
  EXPECT_EQ(m.queued(), 0u);
  EXPECT_EQ(m.next_deadline(), kT0 + milliseconds(20));

  // The late reply for request 0 is swallowed; request 1 gets its own.
  const std::string late = "$4\r\nlate\r\n";
  ASSERT_FALSE(m.feed(late.data(), late.size()));
  EXPECT_EQ(rec.calls[0], 1);
  EXPECT_FALSE(rec.results[1]);
  const std::string second = "$6\r\nsecond\r\n";
  ASSERT_FALSE(m.feed(second.data(), second.size()));
  ASSERT_TRUE(rec.results[1]);
  EXPECT_FALSE(rec.results[1]->ec);
  EXPECT_EQ(rec.results[1]->reply.str, "second");

  EXPECT_EQ(m.expire(kT0 + milliseconds(999), timeout, "x"), 0u);
  EXPECT_EQ(m.expire(kT0 + milliseconds(1000), timeout, "x"), 1u);
  EXPECT_EQ(rec.results[2]->ec, timeout);
  EXPECT_EQ(m.next_deadline(), Clock::time_point::max());
  const std::string third = ":3\r\n";
  ASSERT_FALSE(m.feed(third.data(), third.size()));
  EXPECT_EQ(rec.calls[2], 1) << "a reply after the deadline must not complete a request twice";
  EXPECT_EQ(m.pending(), 0u);
}

TEST(Multiplexer, FailInFlightKeepsQueuedRequestsForTheNextConnection) {
  Multiplexer m;
  Recorder rec;
  m.enqueue(req(rec.slot(0)));
  m.enqueue(req(rec.slot(1)));
  m.prepare_write();  // write still in progress when the connection breaks
  m.enqueue(req(rec.slot(2), kT0 + std::chrono::hours(1), "*1\r\n$4\r\nTIME\r\n"));
  const std::string partial = "+OK\r\n$10\r\nhalf";  // request 1's reply cut by the break
  ASSERT_FALSE(m.feed(partial.data(), partial.size()));
  ASSERT_TRUE(rec.results[0]);

  m.fail_in_flight(make_error_code(errc::connection_lost), "connection closed");
  ASSERT_TRUE(rec.results[1]);
  EXPECT_EQ(rec.results[1]->ec, make_error_code(errc::connection_lost));
  EXPECT_EQ(rec.results[1]->reply.str, "connection closed");
  EXPECT_FALSE(rec.results[2]);
  EXPECT_EQ(m.in_flight(), 0u);
  EXPECT_EQ(m.queued(), 1u);
  EXPECT_FALSE(m.write_in_progress());

  // New connection: the queued request goes out, and the half-read reply of
  // the old one does not poison the parser.
  ASSERT_TRUE(m.wants_write());
  EXPECT_EQ(m.prepare_write(), "*1\r\n$4\r\nTIME\r\n");
  m.write_done();
  const std::string fresh = ":1\r\n";
  ASSERT_FALSE(m.feed(fresh.data(), fresh.size()));
  ASSERT_TRUE(rec.results[2]);
  EXPECT_FALSE(rec.results[2]->ec);
  EXPECT_EQ(rec.results[2]->reply.integer, 1);
}

TEST(Multiplexer, FailAllAndFailQueuedCompleteEveryoneExactlyOnce) {
  Multiplexer m;
  Recorder rec;
  m.enqueue(req(rec.slot(0)));
  m.prepare_write();
  m.write_done();
  m.enqueue(req(rec.slot(1)));
  m.fail_queued(make_error_code(errc::auth_failed), "AUTH rejected");
  ASSERT_TRUE(rec.results[1]);
  EXPECT_EQ(rec.results[1]->ec, make_error_code(errc::auth_failed));
  EXPECT_FALSE(rec.results[0]);
  m.enqueue(req(rec.slot(2)));
  m.fail_all(make_error_code(errc::shutdown), "closing");
  EXPECT_EQ(rec.results[0]->ec, make_error_code(errc::shutdown));
  EXPECT_EQ(rec.results[2]->ec, make_error_code(errc::shutdown));
  EXPECT_EQ(rec.calls, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(m.pending(), 0u);
}

TEST(Multiplexer, CompletionThatEnqueuesReentrantlyIsServedInTurn) {
  Multiplexer m;
  Recorder rec;
  // Request 0's completion submits request 2 (a NOSCRIPT -> EVAL retry does this).
  m.enqueue(req([&](std::error_code ec, Reply r) {
    rec.slot(0)(ec, std::move(r));
    m.enqueue(req(rec.slot(2)));
  }));
  m.enqueue(req(rec.slot(1)));
  m.prepare_write();
  m.write_done();
  const std::string two = "-NOSCRIPT x\r\n+second\r\n";
  ASSERT_FALSE(m.feed(two.data(), two.size()));
  ASSERT_TRUE(rec.results[0] && rec.results[1]);
  EXPECT_EQ(rec.results[1]->reply.str, "second");
  EXPECT_FALSE(rec.results[2]);
  EXPECT_EQ(m.queued(), 1u);
  m.prepare_write();
  m.write_done();
  const std::string third = "+third\r\n";
  ASSERT_FALSE(m.feed(third.data(), third.size()));
  ASSERT_TRUE(rec.results[2]);
  EXPECT_EQ(rec.results[2]->reply.str, "third");

  // Re-entrancy from expire() and fail_in_flight(): the new request survives.
  Recorder rec2;
  m.enqueue(req(
      [&](std::error_code ec, Reply r) {
        rec2.slot(0)(ec, std::move(r));
        m.enqueue(req(rec2.slot(1), kT0 + std::chrono::hours(2)));
      },
      kT0));
  EXPECT_EQ(m.expire(kT0, make_error_code(errc::timeout), "t"), 1u);
  EXPECT_EQ(m.queued(), 1u);
  m.prepare_write();
  m.write_done();
  m.enqueue(req([&](std::error_code ec, Reply r) {
    rec2.slot(2)(ec, std::move(r));
    m.enqueue(req(rec2.slot(3)));
  }));
  m.prepare_write();
  m.fail_in_flight(make_error_code(errc::connection_lost), "gone");
  EXPECT_EQ(rec2.results[1]->ec, make_error_code(errc::connection_lost));
  EXPECT_EQ(rec2.results[2]->ec, make_error_code(errc::connection_lost));
  EXPECT_EQ(m.queued(), 1u) << "the retry enqueued by a failing completion is kept";
  EXPECT_FALSE(rec2.results[3]);
}

TEST(Multiplexer, CompletionThatDropsTheConnectionStopsMatchingTheRestOfTheChunk) {
  // The client's handshake does this: a rejected AUTH fails everything in
  // flight from inside its own completion.
  Multiplexer m;
  Recorder rec;
  m.enqueue(req([&](std::error_code ec, Reply r) {
    rec.slot(0)(ec, std::move(r));
    m.fail_in_flight(make_error_code(errc::auth_failed), "AUTH rejected");
  }));
  m.enqueue(req(rec.slot(1)));
  m.prepare_write();
  m.write_done();
  const std::string two = "-WRONGPASS bad\r\n+OK\r\n";
  EXPECT_FALSE(m.feed(two.data(), two.size()));
  ASSERT_TRUE(rec.results[0] && rec.results[1]);
  EXPECT_EQ(rec.results[1]->ec, make_error_code(errc::auth_failed));
  EXPECT_EQ(rec.calls[1], 1);
}

TEST(Multiplexer, UnsolicitedReplyIsAProtocolError) {
  Multiplexer m;
  const std::string r = "+OK\r\n";
  EXPECT_EQ(m.feed(r.data(), r.size()), make_error_code(errc::protocol_error));

  Multiplexer m2;
  Recorder rec;
  send_all(m2, rec, 1);
  const std::string two = ":1\r\n:2\r\n";
  EXPECT_EQ(m2.feed(two.data(), two.size()), make_error_code(errc::protocol_error));
  ASSERT_TRUE(rec.results[0]);
  EXPECT_EQ(rec.results[0]->reply.integer, 1);
}

TEST(Multiplexer, GarbageBytesAreAProtocolErrorAndCompleteNothing) {
  Multiplexer m;
  Recorder rec;
  send_all(m, rec, 1);
  const std::string junk = "HTTP/1.1 400 Bad Request\r\n";
  EXPECT_EQ(m.feed(junk.data(), junk.size()), make_error_code(errc::protocol_error));
  EXPECT_FALSE(rec.results[0]);
  // The caller drops the connection; the request then fails exactly once.
  m.fail_in_flight(make_error_code(errc::protocol_error), "unparseable reply");
  ASSERT_TRUE(rec.results[0]);
  EXPECT_EQ(rec.results[0]->ec, make_error_code(errc::protocol_error));
}

TEST(Multiplexer, HandshakeCommandsGoAheadOfUserRequestsInTheirOwnOrder) {
  Multiplexer m;
  Recorder rec;
  m.enqueue(req(rec.slot(0), kT0 + std::chrono::hours(1), "user"));
  m.enqueue_front(req(rec.slot(1), kT0 + std::chrono::hours(1), "AUTH;"));
  m.enqueue_front(req(rec.slot(2), kT0 + std::chrono::hours(1), "SELECT;"));
  ASSERT_TRUE(m.wants_write(true));
  EXPECT_EQ(m.prepare_write(true), "AUTH;SELECT;");
  m.write_done();
  EXPECT_FALSE(m.wants_write(true));
  EXPECT_TRUE(m.wants_write());
  EXPECT_EQ(m.prepare_write(), "user");
}

TEST(ClassifyErrorReply, SortsServerErrorsByWhatTheCallerDoesNext) {
  auto cls = [](const char* text) { return detail::classify_error_reply(Reply::error_reply(text)); };
  EXPECT_EQ(cls("WRONGPASS invalid username-password pair"), errc::auth_failed);
  EXPECT_EQ(cls("NOAUTH Authentication required."), errc::auth_failed);
  EXPECT_EQ(cls("NOPERM this user has no permissions"), errc::permission_denied);
  EXPECT_EQ(cls("LOADING Redis is loading the dataset in memory"), errc::server_busy);
  EXPECT_EQ(cls("BUSY Redis is busy running a script"), errc::server_busy);
  EXPECT_EQ(cls("TRYAGAIN Multiple keys request during rehashing"), errc::server_busy);
  EXPECT_EQ(cls("MASTERDOWN Link with MASTER is down"), errc::server_busy);
  EXPECT_EQ(cls("CLUSTERDOWN The cluster is down"), errc::server_busy);
  EXPECT_EQ(cls("READONLY You can't write against a read only replica."), errc::server_busy);
  EXPECT_EQ(cls("OOM command not allowed when used memory > 'maxmemory'."), errc::server_busy);
  EXPECT_EQ(cls("NOSCRIPT No matching script. Please use EVAL."), errc::script_error);
  EXPECT_EQ(cls("ERR Error running script (call to f_0123): @user_script:1: oops"), errc::script_error);
  EXPECT_EQ(cls("ERR unknown command 'FOO'"), errc::server_error);
  EXPECT_EQ(cls("WRONGTYPE Operation against a key holding the wrong kind of value"), errc::server_error);
  EXPECT_EQ(cls("ERR"), errc::server_error);
  EXPECT_EQ(next_step_for(cls("BUSY x")), next_step::retry_call);
  EXPECT_EQ(next_step_for(cls("WRONGPASS x")), next_step::stop);
}

// --- reply limits: a hostile server must not crash, stall
// or balloon the client; it gets a protocol error naming the limit. -------------

namespace {
std::error_code feed_str(Multiplexer& m, const std::string& s) { return m.feed(s.data(), s.size()); }
}  // namespace

TEST(ReplyLimits, ArrayDeclaringTwoBillionElementsIsAProtocolErrorNotAnAbort) {
  Multiplexer m;
  Recorder rec;
  send_all(m, rec, 1);
  EXPECT_EQ(feed_str(m, "*2000000000\r\n"), make_error_code(errc::protocol_error));
  EXPECT_NE(m.error_detail().find("2000000000 array elements"), std::string::npos) << m.error_detail();
  EXPECT_NE(m.error_detail().find("max_reply_elements"), std::string::npos) << m.error_detail();
  EXPECT_FALSE(rec.results[0]);  // the connection fails it when it drops
}

TEST(ReplyLimits, ElementsAreCountedOverTheWholeNestedReply) {
  Multiplexer m(detail::ReplyLimits{.max_elements = 10, .max_bulk = 1024, .max_depth = 7});
  Recorder rec;
  send_all(m, rec, 2);
  // 2 + 4 + 4 = 10 elements: at the limit, accepted.
  EXPECT_FALSE(feed_str(m, "*2\r\n*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n"));
  ASSERT_TRUE(rec.results[0]);
  EXPECT_EQ(rec.results[0]->reply.elements.size(), 2u);
  // The count starts again with the next reply; 2 + 9 is one too many.
  EXPECT_EQ(feed_str(m, "*2\r\n*9\r\n"), make_error_code(errc::protocol_error));
  EXPECT_NE(m.error_detail().find("9 array elements (2 before in the same reply)"), std::string::npos)
      << m.error_detail();
}

TEST(ReplyLimits, HugeDeclaredBulkStringIsRefusedBeforeAnyOfItIsBuffered) {
  Multiplexer m(detail::ReplyLimits{.max_elements = 100, .max_bulk = 1000, .max_depth = 7});
  Recorder rec;
  send_all(m, rec, 2);
  // The first reply is whole in the same read as the bad header: it completes.
  EXPECT_EQ(feed_str(m, "+OK\r\n$5000000000\r\nxxxxxxxx"), make_error_code(errc::protocol_error));
  ASSERT_TRUE(rec.results[0]);
  EXPECT_TRUE(rec.results[0]->reply.is_ok());
  EXPECT_FALSE(rec.results[1]);
  EXPECT_NE(m.error_detail().find("bulk string of 5000000000 bytes, over the limit of 1000 (max_bulk_bytes)"),
            std::string::npos)
      << m.error_detail();
  // Once failed, the multiplexer accepts nothing more until reset.
  EXPECT_EQ(feed_str(m, "+OK\r\n"), make_error_code(errc::protocol_error));
  m.fail_in_flight(make_error_code(errc::protocol_error), "dropped");
  ASSERT_TRUE(rec.results[1]);
  EXPECT_EQ(rec.results[1]->ec, make_error_code(errc::protocol_error));
}

TEST(ReplyLimits, BulkStringAtTheLimitSplitAcrossReadsIsAccepted) {
  Multiplexer m(detail::ReplyLimits{.max_elements = 100, .max_bulk = 10, .max_depth = 7});
  Recorder rec;
  send_all(m, rec, 2);
  const std::string bytes = "$10\r\n0123456789\r\n*2\r\n$3\r\nabc\r\n$-1\r\n";
  for (char c : bytes) ASSERT_FALSE(m.feed(&c, 1)) << m.error_detail();
  ASSERT_TRUE(rec.results[0] && rec.results[1]);
  EXPECT_EQ(rec.results[0]->reply.str, "0123456789");
  EXPECT_EQ(rec.results[1]->reply.elements[0].str, "abc");
  EXPECT_TRUE(rec.results[1]->reply.elements[1].is_nil());
}

TEST(ReplyLimits, StatusLineWithoutAnEndIsCutAtTheBulkLimit) {
  Multiplexer m(detail::ReplyLimits{.max_elements = 100, .max_bulk = 64, .max_depth = 7});
  Recorder rec;
  send_all(m, rec, 1);
  const std::string line = "+" + std::string(63, 'a');
  EXPECT_FALSE(feed_str(m, line));
  EXPECT_EQ(feed_str(m, std::string(10, 'a')), make_error_code(errc::protocol_error));
  EXPECT_NE(m.error_detail().find("without an end"), std::string::npos) << m.error_detail();
}

TEST(ReplyLimits, NestingDeeperThanTheLimitIsAProtocolError) {
  Multiplexer m(detail::ReplyLimits{.max_elements = 100, .max_bulk = 64, .max_depth = 2});
  Recorder rec;
  send_all(m, rec, 2);
  EXPECT_FALSE(feed_str(m, "*1\r\n*1\r\n:1\r\n"));
  ASSERT_TRUE(rec.results[0]);
  EXPECT_EQ(feed_str(m, "*1\r\n*1\r\n*1\r\n:1\r\n"), make_error_code(errc::protocol_error));
  EXPECT_NE(m.error_detail().find("deeper than the limit of 2"), std::string::npos) << m.error_detail();
}

TEST(ReplyLimits, MalformedLengthsAreProtocolErrors) {
  for (const std::string bad : {"$-2\r\n", "*-5\r\n", "$12x\r\n", "*\r\n", "$99999999999999999999999999\r\n"}) {
    Multiplexer m;
    Recorder rec;
    send_all(m, rec, 1);
    EXPECT_EQ(feed_str(m, bad), make_error_code(errc::protocol_error)) << bad;
    EXPECT_FALSE(m.error_detail().empty()) << bad;
  }
}

TEST(ReplyLimits, ResetReaderClearsAFailedLimiterForTheNextConnection) {
  Multiplexer m(detail::ReplyLimits{.max_elements = 4, .max_bulk = 64, .max_depth = 7});
  Recorder rec;
  send_all(m, rec, 1);
  EXPECT_EQ(feed_str(m, "*5\r\n"), make_error_code(errc::protocol_error));
  m.fail_in_flight(make_error_code(errc::protocol_error), "dropped");  // resets the reader
  Recorder rec2;
  send_all(m, rec2, 1);
  EXPECT_FALSE(feed_str(m, "*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n")) << m.error_detail();
  ASSERT_TRUE(rec2.results[0]);
  EXPECT_EQ(rec2.results[0]->reply.elements.size(), 4u);
}

// A subscribed connection's SUNSUBSCRIBE (no_reply): written in order with
// the rest, never waited for, so the replies that follow go to the requests
// after it.
TEST(Multiplexer, ANoReplyRequestIsWrittenButNotMatchedToAReply) {
  Multiplexer m;
  Recorder rec;
  m.enqueue(req(rec.slot(0)));
  auto quiet = req(rec.slot(1), kT0 + std::chrono::hours(1), "*2\r\n$12\r\nSUNSUBSCRIBE\r\n$1\r\nc\r\n");
  quiet.no_reply = true;
  m.enqueue(std::move(quiet));
  m.enqueue(req(rec.slot(2)));
  const std::string wrote = m.prepare_write();
  EXPECT_EQ(wrote, "*1\r\n$4\r\nPING\r\n*2\r\n$12\r\nSUNSUBSCRIBE\r\n$1\r\nc\r\n*1\r\n$4\r\nPING\r\n");
  m.write_done();
  EXPECT_EQ(m.in_flight(), 2u);
  const std::string wire = "+PONG\r\n:7\r\n";
  ASSERT_FALSE(m.feed(wire.data(), wire.size()));
  ASSERT_TRUE(rec.results[0] && rec.results[2]);
  EXPECT_EQ(rec.calls[1], 0);
  EXPECT_EQ(rec.results[2]->reply.integer, 7);
}
