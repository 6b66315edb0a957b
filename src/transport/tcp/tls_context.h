// The TLS context of a TCP transport and the words for TLS errors. Every
// link of a transport shares one context (MakeTlsContext); a handshake's
// failure is explained by TlsErrorText.
//
// Thread safety: the functions are; an asio::ssl::context is shared
// read-only by the transport's links.
#ifndef DCR_TRANSPORT_TCP_TLS_CONTEXT_H_
#define DCR_TRANSPORT_TCP_TLS_CONTEXT_H_

#include <openssl/ssl.h>

#include <asio/error_code.hpp>
#include <asio/ssl/context.hpp>
#include <memory>
#include <string>

#include "dcr/status.h"
#include "dcr/transport.h"

namespace dcr::transport_internal {

// Why a TLS operation failed, in words: OpenSSL's reason without the
// library name, and for a certificate (`ssl` set) the chain check's verdict.
std::string TlsErrorText(const asio::error_code& ec, SSL* ssl);

// The context every link of a transport shares: TLS 1.2 at least, each end
// verifies the other's chain against the CA, no compression, no
// renegotiation, no session tickets (links are long-lived and never
// resumed). Every error names the file at fault.
Result<std::unique_ptr<asio::ssl::context>> MakeTlsContext(const TlsOptions& t);

}  // namespace dcr::transport_internal

#endif  // DCR_TRANSPORT_TCP_TLS_CONTEXT_H_
