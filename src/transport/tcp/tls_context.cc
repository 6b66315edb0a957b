#include "transport/tcp/tls_context.h"

#include <openssl/err.h>
#include <openssl/x509.h>

#include <asio/ssl/error.hpp>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

namespace dcr {
namespace transport_internal {

std::string TlsErrorText(const asio::error_code& ec, SSL* ssl) {
  std::string why;
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
    why = "the peer closed the connection";
  } else if (ec.category() == asio::error::get_ssl_category()) {
    const char* reason =
        ERR_reason_error_string(static_cast<unsigned long>(ec.value()));
    why = reason ? reason : ec.message();
  } else {
    why = ec.message();
  }
  if (ssl) {
    const long verdict = SSL_get_verify_result(ssl);
    if (verdict != X509_V_OK) {
      why += std::string(" (") + X509_verify_cert_error_string(verdict) + ")";
    }
  }
  return why;
}

namespace {

// The reason of the first error on OpenSSL's queue, which it clears.
std::string TakeOpenSslError() {
  const unsigned long e = ERR_peek_error();
  const char* reason = e ? ERR_reason_error_string(e) : nullptr;
  ERR_clear_error();
  return reason ? reason : "unknown OpenSSL error";
}

// `path` names a regular file; the error names `what` and the path.
Status CheckTlsFile(const char* what, const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) {
    return Status::NotFound(std::string("TLS ") + what + " '" + path +
                            "' does not exist");
  }
  if (!std::filesystem::is_regular_file(st)) {
    return Status::InvalidArgument(std::string("TLS ") + what + " '" + path +
                                   "' is not a regular file");
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<asio::ssl::context>> MakeTlsContext(
    const TlsOptions& t) {
  const std::pair<const char*, const std::string*> keys[] = {
      {"ca_file", &t.ca_file},
      {"cert_file", &t.cert_file},
      {"key_file", &t.key_file}};
  for (const auto& [name, value] : keys) {
    if (value->empty()) {
      return Status::InvalidArgument(
          std::string("TLS needs ca_file, cert_file and key_file together; "
                      "tls.") +
          name + " is not set");
    }
  }
  DCR_RETURN_IF_ERROR(CheckTlsFile("CA file", t.ca_file));
  DCR_RETURN_IF_ERROR(CheckTlsFile("certificate file", t.cert_file));
  DCR_RETURN_IF_ERROR(CheckTlsFile("key file", t.key_file));
  ERR_clear_error();
  std::unique_ptr<asio::ssl::context> ctx;
  try {
    ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls);
  } catch (const std::system_error& e) {
    return Status::Internal(std::string("TLS context: ") + e.what());
  }
  SSL_CTX* native = ctx->native_handle();
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1) {
    return Status::Internal("TLS context: cannot require TLS 1.2: " +
                            TakeOpenSslError());
  }
  SSL_CTX_set_options(native, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                  SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(native, 0);
  asio::error_code ec;
  // An encrypted key fails to load instead of prompting on the terminal.
  ctx->set_password_callback(
      [](size_t, asio::ssl::context::password_purpose) {
        return std::string();
      },
      ec);
  ctx->load_verify_file(t.ca_file, ec);
  if (ec) {
    return Status::InvalidArgument("TLS CA file '" + t.ca_file +
                                   "': no PEM certificate could be loaded (" +
                                   TlsErrorText(ec, nullptr) + ")");
  }
  ctx->use_certificate_chain_file(t.cert_file, ec);
  if (ec) {
    return Status::InvalidArgument("TLS certificate file '" + t.cert_file +
                                   "': no PEM certificate could be loaded (" +
                                   TlsErrorText(ec, nullptr) + ")");
  }
  ctx->use_private_key_file(t.key_file, asio::ssl::context::pem, ec);
  if (!ec && SSL_CTX_check_private_key(native) != 1) {
    ec.assign(static_cast<int>(ERR_peek_error()),
              asio::error::get_ssl_category());
  }
  if (ec) {
    const int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
    ERR_clear_error();
    if (reason == X509_R_KEY_VALUES_MISMATCH ||
        reason == X509_R_KEY_TYPE_MISMATCH ||
        reason == SSL_R_PRIVATE_KEY_MISMATCH) {
      return Status::InvalidArgument("TLS key file '" + t.key_file +
                                     "' does not match the certificate in '" +
                                     t.cert_file + "'");
    }
    return Status::InvalidArgument(
        "TLS key file '" + t.key_file +
        "': no unencrypted PEM private key could be loaded (" +
        TlsErrorText(ec, nullptr) + ")");
  }
  ctx->set_verify_mode(
      asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert, ec);
  if (ec) {
    return Status::Internal("TLS context: " + TlsErrorText(ec, nullptr));
  }
  return ctx;
}

}  // namespace transport_internal

Status CheckTlsOptions(const TlsOptions& tls) {
  if (!tls.enabled()) return Status::OK();
  return transport_internal::MakeTlsContext(tls).status();
}

}  // namespace dcr
