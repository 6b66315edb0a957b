// Helpers shared by wire's two OpenSSL users (the HMAC frame authenticator
// and the Ed25519 refit signature): error text and key file modes.
#ifndef DCR_WIRE_OPENSSL_UTIL_H_
#define DCR_WIRE_OPENSSL_UTIL_H_

#include <sys/types.h>

#include <string>

namespace dcr::wire_internal {

// The oldest queued OpenSSL error of this thread, as text; clears the
// queue. "unknown OpenSSL error" when it is empty.
std::string OpenSslError();

// A file mode's permission bits as four octal digits, e.g. "0644".
std::string ModeText(mode_t mode);

}  // namespace dcr::wire_internal

#endif  // DCR_WIRE_OPENSSL_UTIL_H_
