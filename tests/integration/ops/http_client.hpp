// A deliberately plain HTTP/1.1 client for tests: blocking POSIX sockets with
// poll() deadlines, independent of the Beast code under test.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

namespace jobguard::test {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// A connected loopback socket, closed on destruction.
class TcpConn {
 public:
  TcpConn(std::uint16_t port, std::chrono::milliseconds timeout) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket() failed");
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port) + " failed");
    }
  }
  ~TcpConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  TcpConn(const TcpConn&) = delete;
  TcpConn& operator=(const TcpConn&) = delete;

  void send_all(const std::string& data) {
    std::size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      off += static_cast<std::size_t>(n);
    }
  }

  // Reads until the peer closes or the deadline passes (then throws).
  std::string read_to_eof(std::chrono::milliseconds timeout) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + timeout;
    char buf[8192];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) throw std::runtime_error("HTTP read timed out");
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r == 0) throw std::runtime_error("HTTP read timed out");
      if (r < 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return out;
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) return out;
        throw std::runtime_error("recv failed");
      }
      out.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_ = -1;
};

inline HttpResponse parse_http_response(const std::string& raw) {
  HttpResponse r;
  const auto head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) throw std::runtime_error("no HTTP header end in: " + raw.substr(0, 200));
  const std::string head = raw.substr(0, head_end);
  std::size_t pos = head.find("\r\n");
  const std::string status_line = head.substr(0, pos);
  if (status_line.rfind("HTTP/1.1 ", 0) != 0) throw std::runtime_error("bad status line: " + status_line);
  r.status = std::stoi(status_line.substr(9, 3));
  while (pos != std::string::npos && pos < head.size()) {
    const std::size_t start = pos + 2;
    const std::size_t end = head.find("\r\n", start);
    const std::string line = head.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const auto colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      r.headers[name] = value;
    }
    pos = end;
  }
  r.body = raw.substr(head_end + 4);
  if (auto it = r.headers.find("content-length"); it != r.headers.end()) {
    if (r.body.size() != std::stoul(it->second)) throw std::runtime_error("body shorter than Content-Length");
  }
  return r;
}

// One request on a fresh connection with "Connection: close".
inline HttpResponse http_request(std::uint16_t port, const std::string& method, const std::string& target,
                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  TcpConn c(port, timeout);
  c.send_all(method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  return parse_http_response(c.read_to_eof(timeout));
}

}  // namespace jobguard::test
