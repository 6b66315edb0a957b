// Identities that every layer above the format names: a version (step plus
// content digest) and a refit id.
//
// Thread safety: these are values.
#ifndef DCR_VERSION_H_
#define DCR_VERSION_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "dcr/digest.h"
#include "dcr/status.h"

namespace dcr {

// A version: the step number the trainer assigned plus the content digest
// of the canonical bits.
struct Version {
  uint64_t step = 0;
  Digest128 digest;
  friend bool operator==(const Version&, const Version&) = default;
};

// Whether `a` and `b` can name the same refit target: the same step, and
// the same digest unless either is zero ("not known yet": a target the
// root hashes while it streams and names at END, docs/PROTOCOL.md
// §"Target digests at END").
inline bool SameTarget(const Version& a, const Version& b) {
  return a.step == b.step && (a.digest == Digest128{} ||
                              b.digest == Digest128{} || a.digest == b.digest);
}

// Names one refit (one transfer from a base to a target version): 128
// random bits chosen by the coordinator. All zero means "no refit" (for
// example a store seeded offline).
struct RefitId {
  std::array<uint8_t, 16> bytes{};

  friend bool operator==(const RefitId&, const RefitId&) = default;
  bool IsZero() const { return *this == RefitId{}; }

  // 32 lower-case hex digits, bytes[0] first.
  std::string ToHex() const {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string s(32, '0');
    for (size_t i = 0; i < bytes.size(); ++i) {
      s[2 * i] = kDigits[bytes[i] >> 4];
      s[2 * i + 1] = kDigits[bytes[i] & 0xf];
    }
    return s;
  }

  // Parses exactly 32 hex digits (either case).
  static Result<RefitId> FromHex(std::string_view hex) {
    if (hex.size() != 32) {
      return Status::InvalidArgument("a refit id is 32 hex digits, got '" +
                                     std::string(hex) + "'");
    }
    RefitId id;
    for (size_t i = 0; i < 32; ++i) {
      const char c = hex[i];
      int v;
      if (c >= '0' && c <= '9') {
        v = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v = c - 'A' + 10;
      } else {
        return Status::InvalidArgument("bad hex digit in refit id '" +
                                       std::string(hex) + "'");
      }
      id.bytes[i / 2] = static_cast<uint8_t>((id.bytes[i / 2] << 4) | v);
    }
    return id;
  }
};

}  // namespace dcr

#endif  // DCR_VERSION_H_
