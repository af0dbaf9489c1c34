// What tokens and owner names are made of (src/common/identity.hpp).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "jobguard/detail/identity.hpp"
#include "jobguard/guard/idempotency.hpp"

namespace jd = jobguard::detail;

TEST(Identity, RandomBytesAreNeverHandedOutTwice) {
  std::set<std::string> seen;
  for (int i = 0; i < 2000; ++i) {  // 32 KB: the pool refilled eight times
    std::array<unsigned char, 16> b{};
    jd::random_bytes(b.data(), b.size());
    EXPECT_TRUE(seen.insert(std::string(b.begin(), b.end())).second) << "draw " << i;
  }
  // A request larger than the pool is filled across refills, to its end.
  std::vector<unsigned char> big(10000, 0);
  jd::random_bytes(big.data(), big.size());
  int zero_tail = 0;
  for (std::size_t i = big.size() - 64; i < big.size(); ++i) zero_tail += big[i] == 0;
  EXPECT_LT(zero_tail, 16) << "the end of a large request was not filled";
}

// A forked child must not hand out the bytes its parent holds in its pool:
// two owners would share a token.
TEST(Identity, AForkedChildDrawsOtherBytesThanItsParentAndKnowsItsPid) {
  std::array<unsigned char, 16> warm{};
  jd::random_bytes(warm.data(), warm.size());  // the parent's pool is filled
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::array<unsigned char, 20> out{};
    jd::random_bytes(out.data(), 16);
    const pid_t p = jd::process_id();
    std::memcpy(out.data() + 16, &p, sizeof p);
    const bool ok = ::write(fds[1], out.data(), out.size()) == static_cast<ssize_t>(out.size());
    ::_exit(ok ? 0 : 1);
  }
  std::array<unsigned char, 16> mine{};
  jd::random_bytes(mine.data(), mine.size());
  std::array<unsigned char, 20> theirs{};
  ASSERT_EQ(::read(fds[0], theirs.data(), theirs.size()), static_cast<ssize_t>(theirs.size()));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_NE(std::memcmp(mine.data(), theirs.data(), 16), 0) << "parent and child drew the same bytes";
  pid_t child_says = 0;
  std::memcpy(&child_says, theirs.data() + 16, sizeof child_says);
  EXPECT_EQ(child_says, child);
  EXPECT_EQ(jd::process_id(), ::getpid());
}

TEST(Identity, HexAndTheOwnerToken) {
  std::string s = "x";
  const unsigned char b[] = {0x00, 0x0f, 0xa5, 0xff};
  jd::append_hex(s, b, sizeof b);
  EXPECT_EQ(s, "x000fa5ff");
  EXPECT_FALSE(jd::host_name().empty());
  std::set<std::string> seen;
  const std::string head = jd::host_name() + "/" + std::to_string(::getpid()) + "/";
  for (int i = 0; i < 500; ++i) {
    const auto t = jobguard::guard::make_owner_token();
    ASSERT_EQ(t.rfind(head, 0), 0u) << t;
    EXPECT_EQ(t.size(), head.size() + 16) << t;
    EXPECT_TRUE(seen.insert(t).second) << "duplicate owner " << t;
  }
}
