#include "dcr/digest.h"

#include <xxhash.h>

#include <cstring>

namespace dcr {

std::string Digest128::ToHex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kHex[(high >> (4 * i)) & 0xf];
    s[31 - i] = kHex[(low >> (4 * i)) & 0xf];
  }
  return s;
}

Result<Digest128> Digest128::FromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return Status::InvalidArgument("a digest is 32 hex digits, got '" +
                                   std::string(hex) + "'");
  }
  Digest128 d;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t v;
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      v = c - 'A' + 10;
    } else {
      return Status::InvalidArgument("bad hex digit in digest '" +
                                     std::string(hex) + "'");
    }
    uint64_t& word = i < 16 ? d.high : d.low;
    word = (word << 4) | v;
  }
  return d;
}

Digest128 Hash128(std::span<const std::byte> data) {
  XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  return Digest128{h.high64, h.low64};
}

uint64_t Hash64(std::span<const std::byte> data) {
  return XXH3_64bits(data.data(), data.size());
}

struct Hasher128::State {
  XXH3_state_t* s;
};

Hasher128::Hasher128() : state_(std::make_unique<State>()) {
  state_->s = XXH3_createState();
  XXH3_128bits_reset(state_->s);
}

Hasher128::~Hasher128() {
  if (state_) XXH3_freeState(state_->s);
}

Hasher128::Hasher128(Hasher128&&) noexcept = default;
Hasher128& Hasher128::operator=(Hasher128&& other) noexcept {
  if (this != &other) {
    if (state_) XXH3_freeState(state_->s);
    state_ = std::move(other.state_);
  }
  return *this;
}

void Hasher128::Update(std::span<const std::byte> data) {
  XXH3_128bits_update(state_->s, data.data(), data.size());
}

void Hasher128::UpdateU64(uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  XXH3_128bits_update(state_->s, b, sizeof(b));
}

Digest128 Hasher128::Finish() const {
  XXH128_hash_t h = XXH3_128bits_digest(state_->s);
  return Digest128{h.high64, h.low64};
}

}  // namespace dcr
