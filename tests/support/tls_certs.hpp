// Certificates for TLS tests, made by the openssl CLI in a temporary
// directory for this test run: a CA ("ca"), a second, unrelated CA
// ("other-ca"), and a server certificate the first signs for IP:127.0.0.1
// and DNS:localhost ("server"). The directory goes with the object.
#pragma once

#include <string>

namespace jobguard::test {

class TlsCerts {
 public:
  // Throws std::runtime_error naming the openssl command that failed.
  TlsCerts();
  ~TlsCerts();
  TlsCerts(const TlsCerts&) = delete;
  TlsCerts& operator=(const TlsCerts&) = delete;

  const std::string& dir() const noexcept { return dir_; }
  std::string ca() const { return dir_ + "/ca.crt"; }
  std::string other_ca() const { return dir_ + "/other-ca.crt"; }
  std::string server_cert() const { return dir_ + "/server.crt"; }
  std::string server_key() const { return dir_ + "/server.key"; }

 private:
  std::string dir_;
};

}  // namespace jobguard::test
