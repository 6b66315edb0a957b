// 128-bit content digests (XXH3-128) and 64-bit checksums (XXH3-64).
//
// Digests name content, not trust: they detect accidental change. Frames
// that must resist a forger carry an authentication tag instead.
//
// Thread safety: Digest128 is a value. A Hasher128 is not thread-safe.
#ifndef DCR_DIGEST_H_
#define DCR_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

struct Digest128 {
  uint64_t high = 0;
  uint64_t low = 0;

  friend bool operator==(const Digest128&, const Digest128&) = default;
  // 32 lower-case hex digits, high word first (XXH3 canonical order).
  std::string ToHex() const;
  // The first 12 hex digits: what logs and tables print.
  std::string ShortHex() const { return ToHex().substr(0, 12); }
  static Result<Digest128> FromHex(std::string_view hex);
  bool IsZero() const { return high == 0 && low == 0; }
};

// XXH3-128 of `data` (seed 0).
Digest128 Hash128(std::span<const std::byte> data);
// XXH3-64 of `data` (seed 0).
uint64_t Hash64(std::span<const std::byte> data);

// Incremental XXH3-128. Update() may be called any number of times;
// Finish() may be called repeatedly and does not reset the state.
class Hasher128 {
 public:
  Hasher128();
  ~Hasher128();
  Hasher128(const Hasher128&) = delete;
  Hasher128& operator=(const Hasher128&) = delete;
  Hasher128(Hasher128&&) noexcept;
  Hasher128& operator=(Hasher128&&) noexcept;

  void Update(std::span<const std::byte> data);
  void Update(std::string_view s) {
    Update(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  void UpdateU64(uint64_t v);  // little-endian
  void Update(const Digest128& d) {
    UpdateU64(d.high);
    UpdateU64(d.low);
  }
  Digest128 Finish() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dcr

#endif  // DCR_DIGEST_H_
