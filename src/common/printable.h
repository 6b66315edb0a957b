// Renders text that came from outside (tensor names, configuration values,
// environment variables) for one line of an error or a log: control bytes
// escaped, long values cut short. A NUL byte in a message would end the
// line where C's printf stops; a 100 KB value would bury the message.
//
// Thread safety: pure functions.
#ifndef DCR_COMMON_PRINTABLE_H_
#define DCR_COMMON_PRINTABLE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace dcr {

// The values shown whole by Abbreviated (bytes).
inline constexpr size_t kMaxQuotedBytes = 80;

// `s` with each control byte (0x00-0x1f, 0x7f) written as \xNN (lower-case
// hex); every other byte as it is, so UTF-8 text is unchanged.
std::string Printable(std::string_view s);

// Printable(s) when `s` is at most `max_bytes` long; else Printable of its
// first `max_bytes` bytes (shortened to end on a UTF-8 character boundary)
// followed by "... (N bytes)", N the length of `s`.
std::string Abbreviated(std::string_view s, size_t max_bytes = kMaxQuotedBytes);

// The offset of the first control byte (as Printable escapes) in `s`, if
// any.
std::optional<size_t> FindControlByte(std::string_view s);

}  // namespace dcr

#endif  // DCR_COMMON_PRINTABLE_H_
