// The TLS client context for a connection's options, shared by the client's
// connections and the pub/sub subscriber so both verify the server the same
// way (protocol floor TLS 1.2, CA file or system roots, optional client cert).
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>

#include "jobguard/redis/options.hpp"

namespace jobguard::redis::detail {

// Throws Error(errc::tls_error) naming the file that could not be loaded.
std::shared_ptr<boost::asio::ssl::context> make_tls_context(const TlsOptions& tls);

}  // namespace jobguard::redis::detail
