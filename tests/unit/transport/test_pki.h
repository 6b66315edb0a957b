// A PKI made at test time with OpenSSL (EC P-256 keys, SHA-256
// certificates) in a temporary directory of PEM files: CAs and the node
// certificates they sign, and the TlsOptions a node's transport takes.
// For tests of TLS links.
#ifndef DCR_TESTS_UNIT_TRANSPORT_TEST_PKI_H_
#define DCR_TESTS_UNIT_TRANSPORT_TEST_PKI_H_

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "dcr/transport.h"

namespace dcr::testing {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using Cert = std::unique_ptr<X509, X509Free>;

// A temporary directory of PEM files: CAs and the node certificates they
// sign (EC P-256, SHA-256, valid from an hour ago for a day).
class Pki {
 public:
  Pki() {
    char tmpl[] = "/tmp/dcr-tls-unit.XXXXXX";
    const char* d = mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    dir_ = d ? d : "/tmp";
  }
  ~Pki() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes NAME.crt and NAME.key for a self-signed CA.
  void MakeCa(const std::string& name) {
    Pkey key(EVP_EC_gen("P-256"));
    ASSERT_TRUE(key);
    Cert cert = Sign(name, key.get(), nullptr, key.get(), /*ca=*/true);
    ASSERT_TRUE(cert);
    WriteCert(name + ".crt", cert.get());
    WriteKey(name + ".key", key.get());
  }

  // Writes NAME.crt and NAME.key for a node certificate signed by CA.
  void MakeNode(const std::string& name, const std::string& ca) {
    Cert ca_cert = ReadCert(ca + ".crt");
    Pkey ca_key = ReadKey(ca + ".key");
    ASSERT_TRUE(ca_cert && ca_key);
    Pkey key(EVP_EC_gen("P-256"));
    ASSERT_TRUE(key);
    Cert cert = Sign(name, key.get(), ca_cert.get(), ca_key.get(), false);
    ASSERT_TRUE(cert);
    WriteCert(name + ".crt", cert.get());
    WriteKey(name + ".key", key.get());
  }

  // Writes NAME with `key`'s private key encrypted under a passphrase.
  void WriteEncryptedKey(const std::string& name, const std::string& from) {
    Pkey key = ReadKey(from);
    ASSERT_TRUE(key);
    FILE* f = std::fopen(path(name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    static const char kPass[] = "secret";
    EXPECT_EQ(
        PEM_write_PrivateKey(f, key.get(), EVP_aes_128_cbc(),
                             reinterpret_cast<const unsigned char*>(kPass),
                             sizeof(kPass) - 1, nullptr, nullptr),
        1);
    std::fclose(f);
  }

  void WriteText(const std::string& name, const std::string& text) {
    FILE* f = std::fopen(path(name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }

  // TLS options for node `node` trusting CA `ca`.
  TlsOptions Tls(const std::string& node, const std::string& ca) const {
    return TlsOptions{path(ca + ".crt"), path(node + ".crt"),
                      path(node + ".key")};
  }

 private:
  static bool AddExt(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!ext) return false;
    const bool ok = X509_add_ext(cert, ext, -1) == 1;
    X509_EXTENSION_free(ext);
    return ok;
  }

  // A certificate for `key` named CN=`cn`, signed by `issuer` (itself when
  // null) with `issuer_key`.
  Cert Sign(const std::string& cn, EVP_PKEY* key, X509* issuer,
            EVP_PKEY* issuer_key, bool ca) {
    Cert cert(X509_new());
    X509* x = cert.get();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), ++serial_);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(
        name, "CN", MBSTRING_ASC,
        reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
    X509* signer = issuer ? issuer : x;
    bool ok = AddExt(x, signer, NID_subject_key_identifier, "hash");
    if (ca) {
      ok = ok && AddExt(x, signer, NID_basic_constraints, "critical,CA:TRUE");
      ok = ok && AddExt(x, signer, NID_key_usage, "critical,keyCertSign");
    } else {
      ok = ok && AddExt(x, signer, NID_authority_key_identifier, "keyid");
      ok = ok && AddExt(x, signer, NID_basic_constraints, "CA:FALSE");
      ok = ok && AddExt(x, signer, NID_key_usage, "critical,digitalSignature");
      ok = ok && AddExt(x, signer, NID_ext_key_usage, "serverAuth,clientAuth");
    }
    if (!ok || X509_sign(x, issuer_key, EVP_sha256()) == 0) return nullptr;
    return cert;
  }

  void WriteCert(const std::string& name, X509* cert) {
    FILE* f = std::fopen(path(name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(PEM_write_X509(f, cert), 1);
    std::fclose(f);
  }
  void WriteKey(const std::string& name, EVP_PKEY* key) {
    FILE* f = std::fopen(path(name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(
        PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr), 1);
    std::fclose(f);
  }
  Cert ReadCert(const std::string& name) {
    FILE* f = std::fopen(path(name).c_str(), "r");
    if (!f) return nullptr;
    Cert c(PEM_read_X509(f, nullptr, nullptr, nullptr));
    std::fclose(f);
    return c;
  }
  Pkey ReadKey(const std::string& name) {
    FILE* f = std::fopen(path(name).c_str(), "r");
    if (!f) return nullptr;
    Pkey k(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
    std::fclose(f);
    return k;
  }

  std::string dir_;
  long serial_ = 0;
};

}  // namespace dcr::testing

#endif  // DCR_TESTS_UNIT_TRANSPORT_TEST_PKI_H_
