#include "jobguard/redis/script.hpp"

#include <openssl/sha.h>

namespace jobguard::redis {

Script::Script(std::string source) : source_(std::move(source)) {
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(source_.data()), source_.size(), digest);
  static constexpr char hex[] = "0123456789abcdef";
  sha1_.reserve(2 * SHA_DIGEST_LENGTH);
  for (unsigned char c : digest) {
    sha1_.push_back(hex[c >> 4]);
    sha1_.push_back(hex[c & 0xf]);
  }
}

}  // namespace jobguard::redis
