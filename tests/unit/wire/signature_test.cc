// Ed25519 keys and signatures for signed refits: key files (every refusal
// names the file), sign and verify, SHA-256, and the key pair dcr keygen
// writes.
#include "wire/signature.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using Bytes = std::vector<std::byte>;
using testing::TextBytes;

std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteText(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path, std::ios::binary) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return st.st_mode & 07777;
}

// A PEM EC (P-256) key pair: well-formed keys of the wrong type.
std::pair<std::string, std::string> EcPems() {
  EVP_PKEY* k = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  EXPECT_NE(k, nullptr);
  BIO* priv = BIO_new(BIO_s_mem());
  BIO* pub = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(priv, k, nullptr, nullptr, 0, nullptr, nullptr);
  PEM_write_bio_PUBKEY(pub, k);
  char* d = nullptr;
  long n = BIO_get_mem_data(priv, &d);
  std::string a(d, n);
  n = BIO_get_mem_data(pub, &d);
  std::string b(d, n);
  BIO_free(priv);
  BIO_free(pub);
  EVP_PKEY_free(k);
  return {a, b};
}

TEST(Sha256Test, KnownAnswers) {
  // FIPS 180-2 examples.
  EXPECT_EQ(Sha256Hex(Sha256(TextBytes("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(Sha256({})),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex(Sha256(TextBytes("abc")), 4), "ba7816bf");
}

TEST(SignatureTest, KeygenWritesAPairThatSignsAndVerifies) {
  testing::TempDir dir;
  std::string priv = dir.Path("root.key"), pub = dir.Path("root.pub");
  ASSERT_TRUE(WriteNewKeyPair(priv, pub).ok());
  EXPECT_EQ(ModeOf(priv), 0600u);
  EXPECT_EQ(ModeOf(pub), 0644u);
  EXPECT_THAT(ReadText(priv), HasSubstr("-----BEGIN PRIVATE KEY-----"));
  EXPECT_THAT(ReadText(pub), HasSubstr("-----BEGIN PUBLIC KEY-----"));

  auto key = Ed25519PrivateKey::Load(priv);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto verifier = Ed25519PublicKey::Load(pub);
  ASSERT_TRUE(verifier.ok()) << verifier.status().ToString();
  EXPECT_THAT((*verifier)->origin(), HasSubstr(pub));

  Bytes msg = TextBytes("refit manifest bytes");
  auto sig = (*key)->Sign(msg);
  ASSERT_TRUE(sig.ok());
  EXPECT_TRUE((*verifier)->Verify(msg, *sig));
  // Ed25519 is deterministic.
  EXPECT_EQ(*(*key)->Sign(msg), *sig);

  // A changed message, a changed signature, a short one, another key.
  Bytes other = msg;
  other[0] ^= std::byte{1};
  EXPECT_FALSE((*verifier)->Verify(other, *sig));
  Ed25519Signature bad = *sig;
  bad[63] ^= std::byte{0x80};
  EXPECT_FALSE((*verifier)->Verify(msg, bad));
  EXPECT_FALSE((*verifier)->Verify(msg, std::span(*sig).first(63)));
  EXPECT_FALSE((*verifier)->Verify(msg, {}));
  std::string priv2 = dir.Path("b.key"), pub2 = dir.Path("b.pub");
  ASSERT_TRUE(WriteNewKeyPair(priv2, pub2).ok());
  auto verifier2 = Ed25519PublicKey::Load(pub2);
  ASSERT_TRUE(verifier2.ok());
  EXPECT_FALSE((*verifier2)->Verify(msg, *sig));
  EXPECT_NE(ReadText(priv), ReadText(priv2));
}

TEST(SignatureTest, KeygenNeverOverwrites) {
  testing::TempDir dir;
  std::string priv = dir.Path("root.key"), pub = dir.Path("root.pub");
  ASSERT_TRUE(WriteNewKeyPair(priv, pub).ok());
  std::string before = ReadText(priv);
  // Either file existing refuses the whole pair, and writes nothing.
  Status s = WriteNewKeyPair(priv, dir.Path("new.pub"));
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(),
              HasSubstr("private key file '" + priv + "' already exists"));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("new.pub")));
  s = WriteNewKeyPair(dir.Path("new.key"), pub);
  EXPECT_THAT(s.message(),
              HasSubstr("public key file '" + pub + "' already exists"));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("new.key")));
  EXPECT_EQ(ReadText(priv), before);
  EXPECT_TRUE(
      WriteNewKeyPair(dir.Path("x"), dir.Path("x")).IsInvalidArgument());
  // An unwritable place: nothing is left behind.
  s = WriteNewKeyPair(dir.Path("new.key"), dir.Path("no/such/dir.pub"));
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(dir.Path("new.key")));
}

TEST(SignatureTest, PrivateKeyFileRefusals) {
  testing::TempDir dir;
  std::string priv = dir.Path("root.key"), pub = dir.Path("root.pub");
  ASSERT_TRUE(WriteNewKeyPair(priv, pub).ok());

  auto missing = Ed25519PrivateKey::Load(dir.Path("none.key"));
  EXPECT_TRUE(missing.status().IsNotFound());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("signing key file '" + dir.Path("none.key") +
                        "' does not exist"));

  for (mode_t mode : {0640, 0604, 0644}) {
    ASSERT_EQ(::chmod(priv.c_str(), mode), 0);
    auto open = Ed25519PrivateKey::Load(priv);
    EXPECT_TRUE(open.status().IsInvalidArgument()) << mode;
    EXPECT_THAT(open.status().message(), HasSubstr("chmod 600 " + priv));
  }
  ASSERT_EQ(::chmod(priv.c_str(), 0400), 0);
  EXPECT_TRUE(Ed25519PrivateKey::Load(priv).ok());

  EXPECT_THAT(Ed25519PrivateKey::Load(dir.path().string()).status().message(),
              HasSubstr("is not a regular file"));

  // The public key where the private one belongs, garbage, another type.
  std::string given_pub = dir.Path("pub-as-priv.key");
  WriteText(given_pub, ReadText(pub), 0600);
  auto wrong = Ed25519PrivateKey::Load(given_pub);
  EXPECT_TRUE(wrong.status().IsInvalidArgument());
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("'" + given_pub + "' is not a PEM private key"));
  std::string garbage = dir.Path("garbage.key");
  WriteText(garbage, "not a key\n", 0600);
  EXPECT_THAT(Ed25519PrivateKey::Load(garbage).status().message(),
              HasSubstr("is not a PEM private key"));
  auto [ec_priv, ec_pub] = EcPems();
  std::string ec = dir.Path("ec.key");
  WriteText(ec, ec_priv, 0600);
  auto ec_key = Ed25519PrivateKey::Load(ec);
  EXPECT_TRUE(ec_key.status().IsInvalidArgument());
  EXPECT_THAT(ec_key.status().message(),
              HasSubstr("'" + ec + "' holds a key of type EC, not an Ed25519"));
  std::string big = dir.Path("big.key");
  WriteText(big, std::string(kMaxKeyFileBytes + 1, 'A'), 0600);
  EXPECT_THAT(Ed25519PrivateKey::Load(big).status().message(),
              HasSubstr("not a PEM key file"));
}

TEST(SignatureTest, PublicKeyFileRefusals) {
  testing::TempDir dir;
  std::string priv = dir.Path("root.key"), pub = dir.Path("root.pub");
  ASSERT_TRUE(WriteNewKeyPair(priv, pub).ok());
  // A public key may be readable by anyone.
  ASSERT_EQ(::chmod(pub.c_str(), 0644), 0);
  EXPECT_TRUE(Ed25519PublicKey::Load(pub).ok());

  auto missing = Ed25519PublicKey::Load(dir.Path("none.pub"));
  EXPECT_TRUE(missing.status().IsNotFound());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("signing public key file '" + dir.Path("none.pub") +
                        "' does not exist"));
  auto given_priv = Ed25519PublicKey::Load(priv);
  EXPECT_TRUE(given_priv.status().IsInvalidArgument());
  EXPECT_THAT(given_priv.status().message(),
              HasSubstr("'" + priv + "' is not a PEM public key"));
  auto [ec_priv, ec_pub] = EcPems();
  std::string ec = dir.Path("ec.pub");
  WriteText(ec, ec_pub, 0644);
  EXPECT_THAT(Ed25519PublicKey::Load(ec).status().message(),
              HasSubstr("holds a key of type EC, not an Ed25519 key"));
}

}  // namespace
}  // namespace dcr
