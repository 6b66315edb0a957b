// A keyed stand-in for the HMAC-SHA256 frame authenticator (not secure:
// XXH3 under a seed), so tests can exercise the tag layout now.
#ifndef DCR_TESTS_UNIT_WIRE_TEST_AUTHENTICATOR_H_
#define DCR_TESTS_UNIT_WIRE_TEST_AUTHENTICATOR_H_

#include <xxhash.h>

#include <cstring>

#include "dcr/wire.h"

namespace dcr::testing {

class TestAuthenticator : public FrameAuthenticator {
 public:
  explicit TestAuthenticator(uint64_t key) : key_(key) {}

  void Sign(std::span<const std::byte> covered,
            std::span<std::byte, kAuthTagSize> tag) const override {
    for (size_t i = 0; i < kAuthTagSize; i += 8) {
      uint64_t h = XXH3_64bits_withSeed(covered.data(), covered.size(),
                                        key_ * 4 + i / 8);
      std::memcpy(tag.data() + i, &h, 8);
    }
  }
  bool Verify(std::span<const std::byte> covered,
              std::span<const std::byte, kAuthTagSize> tag) const override {
    std::byte expect[kAuthTagSize];
    Sign(covered, expect);
    return std::memcmp(expect, tag.data(), kAuthTagSize) == 0;
  }

 private:
  uint64_t key_;
};

}  // namespace dcr::testing

#endif  // DCR_TESTS_UNIT_WIRE_TEST_AUTHENTICATOR_H_
