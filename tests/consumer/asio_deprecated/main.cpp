// Compiles only while io_context::work (deprecated in Asio) is visible: our
// BOOST_ASIO_NO_DEPRECATED stays inside the library.
#include <boost/asio/io_context.hpp>
#include <jobguard/jobguard.hpp>

int designated_initializers();

int main() {
  boost::asio::io_context ctx;
  boost::asio::io_context::work work(ctx);
  const auto opts = jobguard::redis::parse_url("redis://127.0.0.1:6379/0");
  return opts.port == 6379 ? designated_initializers() : 1;
}
