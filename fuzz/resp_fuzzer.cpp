// libFuzzer harness: the sans-IO multiplexer (RESP reader + request/reply
// matching), fed server bytes split at fuzzer-chosen boundaries, with
// deadlines crossed part-way. Invariants: no crash, leak, UB or unbounded
// allocation (libFuzzer's -malloc_limit_mb); every request completes exactly
// once; replies handed out are walkable.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "check.hpp"
#include "jobguard/error.hpp"
#include "redis/multiplexer.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using detail::Clock;
using detail::Multiplexer;

namespace {

std::size_t walk(const Reply& r, int depth) {
  if (depth > 64) fuzz::fail("reply nested deeper than the reader allows");
  std::size_t n = r.str.size();
  for (const auto& e : r.elements) n += walk(e, depth + 1);
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  // Byte 0: how many requests (1..16); byte 1: chunk size for feeding
  // (1..64); byte 2: after how many chunks deadlines pass (0 = never).
  const std::size_t requests = 1 + data[0] % 16;
  const std::size_t chunk = 1 + data[1] % 64;
  const std::size_t expire_after = data[2] % 8;
  data += 3;
  size -= 3;

  const auto t0 = Clock::time_point{} + std::chrono::hours(1);
  std::vector<int> calls(requests, 0);
  std::size_t touched = 0;
  {
    Multiplexer mux;
    for (std::size_t i = 0; i < requests; ++i) {
      Multiplexer::Request r;
      r.payload = "*1\r\n$4\r\nPING\r\n";
      r.deadline = t0 + std::chrono::seconds(i % 2 == 0 ? 1 : 100);
      r.internal = i == 0 && requests > 1;
      r.done = [&calls, &touched, i](std::error_code, Reply reply) {
        ++calls[i];
        touched += walk(reply, 0);
      };
      mux.enqueue(std::move(r));
    }
    (void)mux.prepare_write();
    mux.write_done();

    std::size_t chunks = 0;
    for (std::size_t off = 0; off < size; off += chunk) {
      const std::size_t n = std::min(chunk, size - off);
      if (mux.feed(reinterpret_cast<const char*>(data) + off, n)) break;  // protocol error: connection dropped
      if (expire_after != 0 && ++chunks == expire_after)
        mux.expire(t0 + std::chrono::seconds(2), make_error_code(errc::timeout), "deadline passed");
    }
    mux.fail_all(make_error_code(errc::connection_lost), "fuzz: connection closed");
    if (mux.pending() != 0) fuzz::fail("requests left after fail_all");
  }
  for (int c : calls)
    if (c != 1) fuzz::fail("a request did not complete exactly once");
  return static_cast<int>(touched & 0);
}
