// Ed25519 and SHA-256 over OpenSSL 3's EVP (contract in wire/signature.h).
#include "wire/signature.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "common/file.h"
#include "wire/key_files.h"

namespace dcr {

using wire_internal::OpenSslError;
using wire_internal::ReadKeyFile;

struct PkeyHandle {
  struct Deleter {
    void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  };
  std::unique_ptr<EVP_PKEY, Deleter> pkey;
};

namespace {

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct PkeyCtxDeleter {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;
using PkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxDeleter>;

// A read buffer wiped when it goes: it may hold a private key.
struct WipedText {
  std::string text;
  ~WipedText() { OPENSSL_cleanse(text.data(), text.size()); }
};

// Reads a key file of at most kMaxKeyFileBytes. `secret`: the file must
// give group and others no permission.
Status ReadKeyText(const std::string& path, const std::string& what,
                   bool secret, WipedText* out) {
  out->text.assign(kMaxKeyFileBytes + 1, '\0');
  DCR_ASSIGN_OR_RETURN(
      size_t have,
      ReadKeyFile(path, what, "a private key", secret,
                  std::as_writable_bytes(std::span<char>(out->text))));
  if (have > kMaxKeyFileBytes) {
    return Status::InvalidArgument(what + " holds more than " +
                                   std::to_string(kMaxKeyFileBytes) +
                                   " bytes: not a PEM key file");
  }
  OPENSSL_cleanse(out->text.data() + have, out->text.size() - have);
  out->text.resize(have);
  return Status::OK();
}

// "an RSA key", "an EC key", ... for the not-Ed25519 message.
std::string KeyTypeName(const EVP_PKEY* pkey) {
  const char* name = EVP_PKEY_get0_type_name(pkey);
  return name ? std::string("a key of type ") + name : "a key of another type";
}

Status CheckEd25519(const EVP_PKEY* pkey, const std::string& what) {
  if (EVP_PKEY_is_a(pkey, "ED25519") != 1) {
    return Status::InvalidArgument(what + " holds " + KeyTypeName(pkey) +
                                   ", not an Ed25519 key (make a pair with "
                                   "dcr keygen)");
  }
  return Status::OK();
}

Result<std::string> WritePem(EVP_PKEY* pkey, bool private_key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio) return Status::Internal("BIO_new: " + OpenSslError());
  int ok = private_key ? PEM_write_bio_PrivateKey(bio.get(), pkey, nullptr,
                                                  nullptr, 0, nullptr, nullptr)
                       : PEM_write_bio_PUBKEY(bio.get(), pkey);
  if (ok != 1) {
    return Status::Internal("cannot encode the key as PEM: " + OpenSslError());
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  std::string out(data, static_cast<size_t>(n));
  // The memory BIO's buffer held the private key.
  OPENSSL_cleanse(data, static_cast<size_t>(n));
  return out;
}

// Creates `path` with `mode`, refusing an existing file, and writes `text`.
Status WriteExclusive(const std::string& path, const std::string& text,
                      mode_t mode, const std::string& what) {
  UniqueFd fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!fd.valid()) {
    if (errno == EEXIST) {
      return Status::InvalidArgument(
          what + " '" + path +
          "' already exists; dcr keygen never overwrites a key (remove it "
          "first, or choose another path)");
    }
    return Status::FromErrno("cannot create " + what + " '" + path + "'",
                             errno);
  }
  // Whatever fails from here, the half-written file goes.
  auto failed = [&](const char* doing) {
    Status s = Status::FromErrno(
        std::string("cannot ") + doing + " " + what + " '" + path + "'", errno);
    ::unlink(path.c_str());
    return s;
  };
  // The umask may have narrowed the mode; the key file needs exactly it.
  if (::fchmod(fd.get(), mode) != 0) return failed("chmod");
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return failed("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return failed("sync");
  return Status::OK();
}

}  // namespace

Sha256Digest Sha256(std::span<const std::byte> bytes) {
  Sha256Digest d{};
  unsigned int n = 0;
  // EVP_Digest with the default provider's SHA-256 cannot fail on valid
  // input short of memory exhaustion; a zero digest then matches no
  // manifest entry, so the chunk is refused, never accepted.
  if (EVP_Digest(bytes.data(), bytes.size(),
                 reinterpret_cast<unsigned char*>(d.data()), &n, EVP_sha256(),
                 nullptr) != 1 ||
      n != kSha256Size) {
    d.fill(std::byte{0});
    ERR_clear_error();
  }
  return d;
}

std::string Sha256Hex(const Sha256Digest& d, size_t bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < std::min(bytes, d.size()); ++i) {
    auto b = static_cast<unsigned>(d[i]);
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// ------------------------------------------------------------ private key

Ed25519PrivateKey::Ed25519PrivateKey(std::unique_ptr<PkeyHandle> key)
    : key_(std::move(key)) {}
Ed25519PrivateKey::~Ed25519PrivateKey() = default;

Result<std::unique_ptr<Ed25519PrivateKey>> Ed25519PrivateKey::Generate() {
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, "ED25519", nullptr));
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1) {
    return Status::Internal("OpenSSL offers no Ed25519: " + OpenSslError());
  }
  EVP_PKEY* raw = nullptr;
  if (EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    return Status::Internal("cannot generate an Ed25519 key: " +
                            OpenSslError());
  }
  auto h = std::make_unique<PkeyHandle>();
  h->pkey.reset(raw);
  return std::unique_ptr<Ed25519PrivateKey>(
      new Ed25519PrivateKey(std::move(h)));
}

Result<std::unique_ptr<Ed25519PrivateKey>> Ed25519PrivateKey::Load(
    const std::string& path) {
  const std::string what = "signing key file '" + path + "'";
  WipedText pem;
  DCR_RETURN_IF_ERROR(ReadKeyText(path, what, /*secret=*/true, &pem));
  BioPtr bio(
      BIO_new_mem_buf(pem.text.data(), static_cast<int>(pem.text.size())));
  if (!bio) return Status::Internal("BIO_new_mem_buf: " + OpenSslError());
  // No passphrase callback: an encrypted key is refused, not prompted for.
  EVP_PKEY* raw = PEM_read_bio_PrivateKey(
      bio.get(), nullptr, [](char*, int, int, void*) { return -1; }, nullptr);
  if (!raw) {
    std::string why = OpenSslError();
    return Status::InvalidArgument(
        what + " is not a PEM private key (" + why +
        "); make a pair with dcr keygen --private F --public F");
  }
  auto h = std::make_unique<PkeyHandle>();
  h->pkey.reset(raw);
  DCR_RETURN_IF_ERROR(CheckEd25519(raw, what));
  return std::unique_ptr<Ed25519PrivateKey>(
      new Ed25519PrivateKey(std::move(h)));
}

Result<Ed25519Signature> Ed25519PrivateKey::Sign(
    std::span<const std::byte> message) const {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx) return Status::Internal("EVP_MD_CTX_new: " + OpenSslError());
  // Ed25519 takes no digest: it hashes the message itself (one shot).
  if (EVP_DigestSignInit_ex(ctx.get(), nullptr, nullptr, nullptr, nullptr,
                            key_->pkey.get(), nullptr) != 1) {
    return Status::Internal("cannot start an Ed25519 signature: " +
                            OpenSslError());
  }
  Ed25519Signature sig{};
  size_t n = sig.size();
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()),
                     &n, reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) != 1 ||
      n != sig.size()) {
    return Status::Internal("Ed25519 signing failed: " + OpenSslError());
  }
  return sig;
}

Result<std::string> Ed25519PrivateKey::PrivatePem() const {
  return WritePem(key_->pkey.get(), /*private_key=*/true);
}
Result<std::string> Ed25519PrivateKey::PublicPem() const {
  return WritePem(key_->pkey.get(), /*private_key=*/false);
}

// ------------------------------------------------------------- public key

Ed25519PublicKey::Ed25519PublicKey(std::unique_ptr<PkeyHandle> key,
                                   std::string origin)
    : key_(std::move(key)), origin_(std::move(origin)) {}
Ed25519PublicKey::~Ed25519PublicKey() = default;

Result<std::unique_ptr<Ed25519PublicKey>> Ed25519PublicKey::FromPem(
    std::string_view pem, const std::string& what) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return Status::Internal("BIO_new_mem_buf: " + OpenSslError());
  EVP_PKEY* raw = PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr);
  if (!raw) {
    std::string why = OpenSslError();
    return Status::InvalidArgument(what + " is not a PEM public key (" + why +
                                   "); give the --public file of dcr keygen");
  }
  auto h = std::make_unique<PkeyHandle>();
  h->pkey.reset(raw);
  DCR_RETURN_IF_ERROR(CheckEd25519(raw, what));
  return std::unique_ptr<Ed25519PublicKey>(
      new Ed25519PublicKey(std::move(h), what));
}

Result<std::unique_ptr<Ed25519PublicKey>> Ed25519PublicKey::Load(
    const std::string& path) {
  const std::string what = "signing public key file '" + path + "'";
  WipedText pem;
  DCR_RETURN_IF_ERROR(ReadKeyText(path, what, /*secret=*/false, &pem));
  return FromPem(pem.text, what);
}

bool Ed25519PublicKey::Verify(std::span<const std::byte> message,
                              std::span<const std::byte> signature) const {
  if (signature.size() != kEd25519SignatureSize) return false;
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx ||
      EVP_DigestVerifyInit_ex(ctx.get(), nullptr, nullptr, nullptr, nullptr,
                              key_->pkey.get(), nullptr) != 1) {
    ERR_clear_error();
    return false;
  }
  int ok = EVP_DigestVerify(
      ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
      signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
      message.size());
  ERR_clear_error();
  return ok == 1;
}

Status WriteNewKeyPair(const std::string& private_path,
                       const std::string& public_path) {
  if (private_path == public_path) {
    return Status::InvalidArgument(
        "--private and --public name the same file '" + private_path + "'");
  }
  // Refuse before writing anything if either exists.
  for (const auto& [path, what] : {std::pair{private_path, "private key file"},
                                   std::pair{public_path, "public key file"}}) {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
      return Status::InvalidArgument(
          std::string(what) + " '" + path +
          "' already exists; dcr keygen never overwrites a key (remove it "
          "first, or choose another path)");
    }
  }
  DCR_ASSIGN_OR_RETURN(auto key, Ed25519PrivateKey::Generate());
  DCR_ASSIGN_OR_RETURN(std::string pub, key->PublicPem());
  WipedText priv;
  DCR_ASSIGN_OR_RETURN(priv.text, key->PrivatePem());
  DCR_RETURN_IF_ERROR(
      WriteExclusive(private_path, priv.text, 0600, "private key file"));
  Status s = WriteExclusive(public_path, pub, 0644, "public key file");
  if (!s.ok()) {
    ::unlink(private_path.c_str());  // no private key without its pair
    return s;
  }
  return Status::OK();
}

}  // namespace dcr
