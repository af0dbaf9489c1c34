#include "support/tls_certs.hpp"

#include <fmt/format.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace jobguard::test {
namespace {

void run(const std::string& cmd) {
  if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) throw std::runtime_error("failed: " + cmd);
}

void make_ca(const std::string& dir, const std::string& name) {
  run(fmt::format(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj '/CN=jobguard test {0}' "
      "-keyout {1}/{0}.key -out {1}/{0}.crt",
      name, dir));
}

}  // namespace

TlsCerts::TlsCerts() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "jobguard-tls-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  make_ca(dir_, "ca");
  make_ca(dir_, "other-ca");
  std::ofstream(dir_ + "/ext.cnf") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                      "basicConstraints=CA:FALSE\n"
                                      "extendedKeyUsage=serverAuth\n";
  run(fmt::format("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=localhost' "
                  "-keyout {0}/server.key -out {0}/server.csr",
                  dir_));
  run(fmt::format("openssl x509 -req -in {0}/server.csr -CA {0}/ca.crt -CAkey {0}/ca.key -CAcreateserial "
                  "-days 2 -extfile {0}/ext.cnf -out {0}/server.crt",
                  dir_));
}

TlsCerts::~TlsCerts() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace jobguard::test
