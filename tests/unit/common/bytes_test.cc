#include "common/bytes.h"

#include <gtest/gtest.h>

namespace dcr {
namespace {

TEST(BytesTest, WriterReaderRoundTrip) {
  std::vector<std::byte> buf;
  ByteWriter w(&buf);
  w.Put<uint8_t>(7);
  w.Put<uint32_t>(0xdeadbeef);
  w.Put<uint64_t>(1ull << 40);
  for (uint64_t v : {0ull, 127ull, 128ull, 300ull, ~0ull}) w.PutVarint(v);
  ByteReader r(buf);
  uint8_t a;
  uint32_t b;
  uint64_t c;
  ASSERT_TRUE(r.Get(&a) && r.Get(&b) && r.Get(&c));
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 0xdeadbeefu);
  EXPECT_EQ(c, 1ull << 40);
  for (uint64_t v : {0ull, 127ull, 128ull, 300ull, ~0ull}) {
    uint64_t got;
    ASSERT_TRUE(r.GetVarint(&got));
    EXPECT_EQ(got, v);
  }
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_FALSE(r.Get(&a));
  EXPECT_FALSE(r.ok());
}

TEST(BytesTest, TruncatedVarintFails) {
  std::vector<std::byte> buf = {std::byte{0x80}, std::byte{0x80}};
  ByteReader r(buf);
  uint64_t v;
  EXPECT_FALSE(r.GetVarint(&v));
}

TEST(BytesTest, NonMinimalOrOverflowingVarintFails) {
  uint64_t v;
  std::vector<std::byte> redundant = {std::byte{0x84}, std::byte{0x00}};
  EXPECT_FALSE(ByteReader(redundant).GetVarint(&v));
  std::vector<std::byte> big(9, std::byte{0xff});
  big.push_back(std::byte{0x02});
  EXPECT_FALSE(ByteReader(big).GetVarint(&v));
  big.back() = std::byte{0x01};
  ASSERT_TRUE(ByteReader(big).GetVarint(&v));
  EXPECT_EQ(v, ~0ull);
}

TEST(BytesTest, HumanBytes) {
  EXPECT_EQ(HumanBytes(312), "312 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(3ull << 30), "3.00 GiB");
}

}  // namespace
}  // namespace dcr
