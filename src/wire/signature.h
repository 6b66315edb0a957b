// Ed25519 signatures and SHA-256 for signed refits (docs/PROTOCOL.md
// §"Signed refits"): the root signs the refit manifest with its private key
// (topology root.signing_key_file); relays verify it with the public key
// (defaults.signing_public_key_file, dcr-relay
// --signing-public-key-file). Unlike the frame key, which every node
// holds, only the root holds the private key, so a relay that holds the
// hop key can still not forge what the root signed.
//
// Key files are PEM, as `dcr keygen` and `openssl genpkey -algorithm
// ed25519` write them: a private key is PKCS#8 ("BEGIN PRIVATE KEY") in a
// regular file that gives group and others no permission (mode 0600 or
// 0400), a public key is SubjectPublicKeyInfo ("BEGIN PUBLIC KEY").
//
// Thread safety: keys are immutable after they are made; Sign, Verify and
// Sha256 may run on any number of threads at once. OpenSSL types stay in
// the .cc file.
#ifndef DCR_WIRE_SIGNATURE_H_
#define DCR_WIRE_SIGNATURE_H_

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "dcr/status.h"

namespace dcr {

inline constexpr size_t kSha256Size = 32;
inline constexpr size_t kEd25519SignatureSize = 64;
// A key file larger than this is the wrong file, not a PEM key.
inline constexpr size_t kMaxKeyFileBytes = 16 * 1024;

using Sha256Digest = std::array<std::byte, kSha256Size>;
using Ed25519Signature = std::array<std::byte, kEd25519SignatureSize>;

// SHA-256 of `bytes`.
Sha256Digest Sha256(std::span<const std::byte> bytes);
// Lower-case hex of the first `bytes` bytes of a digest (all by default).
std::string Sha256Hex(const Sha256Digest& d, size_t bytes = kSha256Size);

struct PkeyHandle;  // an owned EVP_PKEY

class Ed25519PrivateKey {
 public:
  // A new random key pair.
  static Result<std::unique_ptr<Ed25519PrivateKey>> Generate();
  // Reads a PEM private key file. Every error names the file: NotFound if
  // it does not exist; InvalidArgument if it is not a regular file, gives
  // group or others any permission (the message says to run chmod 600), is
  // too large, is not a PEM private key, or holds a key of another type
  // than Ed25519; IOError if it cannot be read.
  static Result<std::unique_ptr<Ed25519PrivateKey>> Load(
      const std::string& path);
  ~Ed25519PrivateKey();
  Ed25519PrivateKey(const Ed25519PrivateKey&) = delete;
  Ed25519PrivateKey& operator=(const Ed25519PrivateKey&) = delete;

  // Ed25519 (pure, RFC 8032) signature of `message`. Internal if OpenSSL
  // fails.
  Result<Ed25519Signature> Sign(std::span<const std::byte> message) const;
  // PEM encodings: PKCS#8 private key, SubjectPublicKeyInfo public key.
  Result<std::string> PrivatePem() const;
  Result<std::string> PublicPem() const;

 private:
  explicit Ed25519PrivateKey(std::unique_ptr<PkeyHandle> key);
  std::unique_ptr<PkeyHandle> key_;
};

class Ed25519PublicKey {
 public:
  // Reads a PEM public key file. Errors name the file: NotFound if it does
  // not exist; InvalidArgument if it is not a regular file, is too large,
  // is not a PEM public key, or holds another type of key; IOError if it
  // cannot be read.
  static Result<std::unique_ptr<Ed25519PublicKey>> Load(
      const std::string& path);
  // Parses PEM text; `what` names its origin in errors.
  static Result<std::unique_ptr<Ed25519PublicKey>> FromPem(
      std::string_view pem, const std::string& what);
  ~Ed25519PublicKey();
  Ed25519PublicKey(const Ed25519PublicKey&) = delete;
  Ed25519PublicKey& operator=(const Ed25519PublicKey&) = delete;

  // True iff `signature` is this key's signature of `message`.
  bool Verify(std::span<const std::byte> message,
              std::span<const std::byte> signature) const;
  // Where the key came from (the file), for messages.
  const std::string& origin() const { return origin_; }

 private:
  Ed25519PublicKey(std::unique_ptr<PkeyHandle> key, std::string origin);
  std::unique_ptr<PkeyHandle> key_;
  std::string origin_;
};

// Writes a new key pair for `dcr keygen`: the private key to
// `private_path` (mode 0600) and its public key to `public_path` (mode
// 0644). InvalidArgument naming the file if either exists: a key is never
// overwritten. On any error neither file is left behind.
Status WriteNewKeyPair(const std::string& private_path,
                       const std::string& public_path);

}  // namespace dcr

#endif  // DCR_WIRE_SIGNATURE_H_
