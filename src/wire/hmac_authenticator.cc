// HMAC-SHA256 over OpenSSL 3's EVP_MAC (contract in wire/hmac_authenticator.h).
#include "wire/hmac_authenticator.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <string>

#include "common/file.h"
#include "wire/key_files.h"

namespace dcr {

using wire_internal::OpenSslError;
using wire_internal::ReadKeyFile;
namespace {

struct MacDeleter {
  void operator()(EVP_MAC* m) const { EVP_MAC_free(m); }
};
struct MacCtxDeleter {
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};
using MacPtr = std::unique_ptr<EVP_MAC, MacDeleter>;
using MacCtxPtr = std::unique_ptr<EVP_MAC_CTX, MacCtxDeleter>;

// A read buffer that is wiped when it goes: it holds key bytes.
struct KeyBuffer {
  std::array<std::byte, kMaxFrameKeyBytes + 1> bytes;
  size_t size = 0;
  ~KeyBuffer() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
};

}  // namespace

// Keyed once in Create: each Sign and Verify duplicates this context (the
// key's inner and outer SHA-256 states) instead of hashing the key again.
struct HmacFrameAuthenticator::Keyed {
  MacCtxPtr ctx;
};

HmacFrameAuthenticator::HmacFrameAuthenticator(std::unique_ptr<Keyed> keyed)
    : keyed_(std::move(keyed)) {}

HmacFrameAuthenticator::~HmacFrameAuthenticator() = default;

Result<std::unique_ptr<HmacFrameAuthenticator>> HmacFrameAuthenticator::Create(
    std::span<const std::byte> key) {
  if (key.size() < kMinFrameKeyBytes || key.size() > kMaxFrameKeyBytes) {
    return Status::InvalidArgument("an HMAC-SHA256 frame key must be " +
                                   std::to_string(kMinFrameKeyBytes) + " to " +
                                   std::to_string(kMaxFrameKeyBytes) +
                                   " bytes, got " + std::to_string(key.size()));
  }
  MacPtr mac(EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr));
  if (!mac) {
    return Status::Internal("OpenSSL offers no HMAC: " + OpenSslError());
  }
  auto keyed = std::make_unique<Keyed>();
  keyed->ctx.reset(EVP_MAC_CTX_new(mac.get()));  // holds its own reference
  if (!keyed->ctx) {
    return Status::Internal("cannot create an OpenSSL MAC context: " +
                            OpenSslError());
  }
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(keyed->ctx.get(),
                   reinterpret_cast<const unsigned char*>(key.data()),
                   key.size(), params) != 1) {
    return Status::Internal("cannot key HMAC-SHA256: " + OpenSslError());
  }
  return std::unique_ptr<HmacFrameAuthenticator>(
      new HmacFrameAuthenticator(std::move(keyed)));
}

bool HmacFrameAuthenticator::Compute(
    std::span<const std::byte> covered,
    std::span<std::byte, kAuthTagSize> tag) const {
  MacCtxPtr ctx(EVP_MAC_CTX_dup(keyed_->ctx.get()));
  if (!ctx) return false;
  if (EVP_MAC_update(ctx.get(),
                     reinterpret_cast<const unsigned char*>(covered.data()),
                     covered.size()) != 1) {
    return false;
  }
  size_t written = 0;
  if (EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(tag.data()),
                    &written, tag.size()) != 1) {
    return false;
  }
  return written == kAuthTagSize;
}

void HmacFrameAuthenticator::Sign(
    std::span<const std::byte> covered,
    std::span<std::byte, kAuthTagSize> tag) const {
  if (!Compute(covered, tag)) {
    std::fill(tag.begin(), tag.end(), std::byte{0});
    spdlog::error(
        "HMAC-SHA256 failed; the frame goes out with a tag no peer "
        "accepts: {}",
        OpenSslError());
  }
}

bool HmacFrameAuthenticator::Verify(
    std::span<const std::byte> covered,
    std::span<const std::byte, kAuthTagSize> tag) const {
  std::array<std::byte, kAuthTagSize> want;
  if (!Compute(covered, want)) {
    spdlog::error("HMAC-SHA256 failed; the frame is refused: {}",
                  OpenSslError());
    return false;
  }
  return CRYPTO_memcmp(want.data(), tag.data(), kAuthTagSize) == 0;
}

Result<std::shared_ptr<const FrameAuthenticator>> LoadFrameKey(
    const std::string& path) {
  const std::string what = "auth key file '" + path + "'";
  KeyBuffer key;
  DCR_ASSIGN_OR_RETURN(key.size, ReadKeyFile(path, what, "a key",
                                             /*secret=*/true, key.bytes));
  if (key.size < kMinFrameKeyBytes) {
    return Status::InvalidArgument(
        what + " holds " + std::to_string(key.size) + " bytes; a key needs " +
        std::to_string(kMinFrameKeyBytes) +
        " or more random bytes (head -c 32 /dev/urandom > " + path +
        " && chmod 600 " + path + ")");
  }
  if (key.size > kMaxFrameKeyBytes) {
    return Status::InvalidArgument(what + " holds more than " +
                                   std::to_string(kMaxFrameKeyBytes) +
                                   " bytes: not a key file");
  }
  auto auth = HmacFrameAuthenticator::Create(
      std::span<const std::byte>(key.bytes.data(), key.size));
  if (!auth.ok()) {
    return auth.status().WithContext(what);
  }
  return std::shared_ptr<const FrameAuthenticator>(*std::move(auth));
}

}  // namespace dcr
