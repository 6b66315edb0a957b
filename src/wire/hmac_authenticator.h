// HMAC-SHA256 frame authentication: the FrameAuthenticator behind the
// 32-byte tag of docs/PROTOCOL.md §Frames, and the key file it is keyed
// from (topology defaults.auth_key_file, dcr-relay --auth-key-file).
//
// The key file. Its bytes are the key, used as they are (no decoding, no
// trimming of a trailing newline): at least kMinFrameKeyBytes and at most
// kMaxFrameKeyBytes of them. It must be a regular file that gives group
// and others no permission at all (mode 0600 or 0400). Make one with
//
//   head -c 32 /dev/urandom > key && chmod 600 key
//
// and give every node of the tree (the root and every relay) the same
// bytes: the tag is computed by each frame's originator and checked at
// every hop, since frames are forwarded verbatim.
//
// Thread safety: an HmacFrameAuthenticator is immutable after Create; Sign
// and Verify may run on any number of threads at once. OpenSSL types stay
// in the .cc file.
#ifndef DCR_WIRE_HMAC_AUTHENTICATOR_H_
#define DCR_WIRE_HMAC_AUTHENTICATOR_H_

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "dcr/status.h"
#include "dcr/wire.h"

namespace dcr {

inline constexpr size_t kMinFrameKeyBytes = 32;
// A key file larger than this is the wrong file, not a key.
inline constexpr size_t kMaxFrameKeyBytes = 1024;

class HmacFrameAuthenticator final : public FrameAuthenticator {
 public:
  // Keys an authenticator with `key` (copied; the caller may wipe its
  // copy). InvalidArgument if the key is shorter than kMinFrameKeyBytes or
  // longer than kMaxFrameKeyBytes; Internal if OpenSSL cannot set up
  // HMAC-SHA256.
  static Result<std::unique_ptr<HmacFrameAuthenticator>> Create(
      std::span<const std::byte> key);
  ~HmacFrameAuthenticator() override;
  HmacFrameAuthenticator(const HmacFrameAuthenticator&) = delete;
  HmacFrameAuthenticator& operator=(const HmacFrameAuthenticator&) = delete;

  // HMAC-SHA256(key, covered). Should OpenSSL fail (out of memory), the
  // tag is all zero, which no receiver accepts, and the failure is logged.
  void Sign(std::span<const std::byte> covered,
            std::span<std::byte, kAuthTagSize> tag) const override;
  // Compares in constant time (CRYPTO_memcmp).
  bool Verify(std::span<const std::byte> covered,
              std::span<const std::byte, kAuthTagSize> tag) const override;

 private:
  struct Keyed;  // the keyed OpenSSL MAC context every call starts from
  explicit HmacFrameAuthenticator(std::unique_ptr<Keyed> keyed);
  // False (and `tag` unspecified) if OpenSSL failed.
  bool Compute(std::span<const std::byte> covered,
               std::span<std::byte, kAuthTagSize> tag) const;

  std::unique_ptr<Keyed> keyed_;
};

// Reads the key file at `path` (format above) and returns an authenticator
// keyed with it. Every error names the file: NotFound if it does not exist;
// InvalidArgument if it is not a regular file, gives group or others any
// permission (the message says to run chmod 600), or holds too few or too
// many bytes; IOError if it cannot be read.
Result<std::shared_ptr<const FrameAuthenticator>> LoadFrameKey(
    const std::string& path);

}  // namespace dcr

#endif  // DCR_WIRE_HMAC_AUTHENTICATOR_H_
