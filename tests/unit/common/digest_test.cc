#include "dcr/digest.h"

#include <gtest/gtest.h>

#include <string>

namespace dcr {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

TEST(DigestTest, HexRoundTrip) {
  Digest128 d{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(d.ToHex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(d.ShortHex(), "0123456789ab");
  auto back = Digest128::FromHex(d.ToHex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, d);
  EXPECT_FALSE(Digest128::FromHex("xyz").ok());
  EXPECT_FALSE(Digest128::FromHex(std::string(32, 'g')).ok());
}

TEST(DigestTest, IncrementalEqualsOneShot) {
  std::string s(10000, 'a');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 31);
  Hasher128 h;
  h.Update(Bytes(s.substr(0, 1234)));
  h.Update(Bytes(s.substr(1234)));
  EXPECT_EQ(h.Finish(), Hash128(Bytes(s)));
  EXPECT_NE(Hash128(Bytes("a")), Hash128(Bytes("b")));
  EXPECT_NE(Hash64(Bytes("a")), Hash64(Bytes("b")));
}

}  // namespace
}  // namespace dcr
