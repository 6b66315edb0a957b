// What wire's two key users (the HMAC frame key, the Ed25519 refit keys)
// share: reading a key file safely, key file modes, OpenSSL error text.
#ifndef DCR_WIRE_KEY_FILES_H_
#define DCR_WIRE_KEY_FILES_H_

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "dcr/status.h"

namespace dcr::wire_internal {

// The oldest queued OpenSSL error of this thread, as text; clears the
// queue. "unknown OpenSSL error" when it is empty.
std::string OpenSslError();

// A file mode's permission bits as four octal digits, e.g. "0644".
std::string ModeText(mode_t mode);

// Reads the key file at `path` into `buf` and returns how many bytes it
// holds, at most buf.size(): a file that fills `buf` may be longer (give a
// buffer one byte larger than the largest key). A FIFO or other non-regular
// file is refused without blocking; with `secret`, so is a file that group
// or others may access ("run chmod 600"). `what` names the file in errors
// ("auth key file '...'"), `kind` the key in the mode error ("a key").
// NotFound when the file does not exist.
Result<size_t> ReadKeyFile(const std::string& path, const std::string& what,
                           std::string_view kind, bool secret,
                           std::span<std::byte> buf);

}  // namespace dcr::wire_internal

#endif  // DCR_WIRE_KEY_FILES_H_
