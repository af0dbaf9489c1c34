// Peers that misbehave on purpose, on loopback ports, in the test process:
//  - HostileServer: accepts connections and answers the first command of its
//    first connection with whatever bytes the test gives it (a reply that
//    declares two billion elements...), then behaves like a tiny Redis that
//    answers PING with PONG on every later connection.
//  - FrozenRelay: forwards bytes between clients and a real redis-server, and
//    can freeze every connection open now (it stops reading and writing
//    them, like a dead NAT entry) while new connections still pass.
// A fake is legitimate here: it is the hostile peer under test, not a stand-in
// for Redis' behaviour.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace jobguard::test {

inline int listen_loopback(std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0) {
    ::close(fd);
    throw std::runtime_error("bind/listen");
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

inline int connect_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class HostileServer {
 public:
  // `first_reply` answers the first read of the first connection. When
  // `then_flood`, junk follows it in 64 KB chunks until the client hangs up
  // (a bulk string that never ends).
  explicit HostileServer(std::string first_reply, bool then_flood = false)
      : first_(std::move(first_reply)), flood_(then_flood) {
    lfd_ = listen_loopback(port_);
    thread_ = std::thread([this] { run(); });
  }
  ~HostileServer() {
    stop_ = true;
    thread_.join();
    ::close(lfd_);
    for (int fd : conns_) ::close(fd);
  }
  std::uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }
  // The client hung up on the hostile connection (it dropped it, as it must).
  bool hostile_closed_by_client() const { return hostile_closed_.load(); }
  std::uint64_t flooded_bytes() const { return flooded_.load(); }

 private:
  void run() {
    std::vector<std::string> pending;
    while (!stop_) {
      std::vector<pollfd> fds{{lfd_, POLLIN, 0}};
      for (int fd : conns_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          conns_.push_back(c);
          if (accepted_++ == 0) hostile_fd_ = c;
        }
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const int fd = fds[i].fd;
        char buf[4096];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
          if (fd == hostile_fd_) {
            hostile_closed_ = true;
            hostile_fd_ = -1;  // the number may be reused by the next connection
          }
          drop(fd);
          continue;
        }
        if (fd == hostile_fd_) {
          if (!answered_) {
            answered_ = true;
            send_all(fd, first_);
            if (flood_) flood(fd);
          }
          continue;
        }
        // A tiny Redis: PONG for every PING in what arrived.
        const std::string got(buf, static_cast<std::size_t>(n));
        for (std::size_t at = got.find("PING"); at != std::string::npos; at = got.find("PING", at + 1))
          send_all(fd, "+PONG\r\n");
      }
    }
  }
  void flood(int fd) {
    const std::string junk(64 * 1024, 'x');
    // A send timeout, so a client that neither reads nor hangs up cannot
    // wedge this thread (the destructor joins it).
    timeval tv{0, 100 * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    while (!stop_) {
      const ssize_t n = ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n < 0) {
        hostile_closed_ = true;  // EPIPE / ECONNRESET: the client closed it
        hostile_fd_ = -1;
        drop(fd);
        return;
      }
      flooded_ += static_cast<std::uint64_t>(n);
    }
  }
  static void send_all(int fd, const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<std::size_t>(n);
    }
  }
  void drop(int fd) {
    ::close(fd);
    std::erase(conns_, fd);
  }

  std::string first_;
  bool flood_;
  int lfd_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false}, hostile_closed_{false};
  std::atomic<int> accepted_{0};
  std::atomic<std::uint64_t> flooded_{0};
  std::vector<int> conns_;  // relay thread only
  int hostile_fd_ = -1;
  bool answered_ = false;
};

class FrozenRelay {
 public:
  explicit FrozenRelay(std::uint16_t upstream) : upstream_(upstream) {
    lfd_ = listen_loopback(port_);
    thread_ = std::thread([this] { run(); });
  }
  ~FrozenRelay() {
    stop_ = true;
    thread_.join();
    ::close(lfd_);
    for (auto& p : pairs_) {
      ::close(p.a);
      ::close(p.b);
    }
  }
  std::uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }
  // Every connection open now stops moving bytes, both ways, for good;
  // connections made later pass.
  void freeze_existing() { freeze_.store(true); }

 private:
  struct Pair {
    int a, b;  // client side, server side
    bool frozen;
  };
  void run() {
    while (!stop_) {
      if (freeze_.exchange(false)) {
        for (auto& p : pairs_) p.frozen = true;
      }
      std::vector<pollfd> fds{{lfd_, POLLIN, 0}};
      std::vector<std::pair<std::size_t, bool>> who;  // pair index, is client side
      for (std::size_t i = 0; i < pairs_.size(); ++i) {
        if (pairs_[i].frozen) continue;
        fds.push_back({pairs_[i].a, POLLIN, 0});
        who.emplace_back(i, true);
        fds.push_back({pairs_[i].b, POLLIN, 0});
        who.emplace_back(i, false);
      }
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          const int s = connect_loopback(upstream_);
          if (s < 0) {
            ::close(c);
          } else {
            pairs_.push_back({c, s, false});
            ++accepted_;
          }
        }
      }
      std::vector<std::size_t> dead;
      for (std::size_t k = 1; k < fds.size(); ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto& p = pairs_[who[k - 1].first];
        const int from = who[k - 1].second ? p.a : p.b;
        const int to = who[k - 1].second ? p.b : p.a;
        char buf[16384];
        const ssize_t n = ::recv(from, buf, sizeof buf, 0);
        if (n <= 0 || ::send(to, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n)
          dead.push_back(who[k - 1].first);
      }
      std::sort(dead.begin(), dead.end());
      dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
      for (auto it = dead.rbegin(); it != dead.rend(); ++it) {
        ::close(pairs_[*it].a);
        ::close(pairs_[*it].b);
        pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(*it));
      }
    }
  }

  std::uint16_t upstream_;
  int lfd_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false}, freeze_{false};
  std::atomic<int> accepted_{0};
  std::vector<Pair> pairs_;  // relay thread only
};

}  // namespace jobguard::test
