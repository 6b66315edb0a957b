#include "common/printable.h"

namespace dcr {
namespace {

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

}  // namespace

std::string Printable(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (IsControl(c)) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += ch;
    }
  }
  return out;
}

std::string Abbreviated(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return Printable(s);
  size_t cut = max_bytes;
  // Back up over UTF-8 continuation bytes (10xxxxxx) so that no character
  // is split; at most 3 of them precede a character's first byte.
  for (int k = 0;
       k < 3 && cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80;
       ++k) {
    --cut;
  }
  return Printable(s.substr(0, cut)) + "... (" + std::to_string(s.size()) +
         " bytes)";
}

std::optional<size_t> FindControlByte(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (IsControl(static_cast<unsigned char>(s[i]))) return i;
  }
  return std::nullopt;
}

}  // namespace dcr
