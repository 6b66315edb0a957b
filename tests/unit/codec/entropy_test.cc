#include "dcr/entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace dcr {
namespace {

TEST(EntropyFloorTest, MatchesClosedForm) {
  // 1000 BF16 elements, 100 changed, XOR values 1 (half) and 3 (half):
  // positions 1000 * H(0.1) bits, values 100 * 1 bit.
  std::vector<std::byte> a(2000, std::byte{0}), b = a;
  for (int i = 0; i < 100; ++i)
    b[i * 20] = std::byte{static_cast<uint8_t>(i % 2 ? 1 : 3)};
  EntropyFloor f;
  f.Add(2, a, b);
  EXPECT_EQ(f.elements(), 1000u);
  EXPECT_EQ(f.changed(), 100u);
  double hp = -(0.1 * std::log2(0.1) + 0.9 * std::log2(0.9));
  EXPECT_NEAR(f.position_bytes(), 1000 * hp / 8, 1e-6);
  EXPECT_NEAR(f.value_bytes(), 100.0 / 8, 1e-6);
  EntropyFloor g;
  g.Add(2, a, b);
  g.Merge(f);
  EXPECT_EQ(g.changed(), 200u);
  EXPECT_NEAR(g.floor_bytes(), 2 * f.floor_bytes(), 1e-6);
}

TEST(EntropyFloorTest, NoChangeIsZeroAndWidthsAreSeparate) {
  std::vector<std::byte> a(64, std::byte{7});
  EntropyFloor f;
  f.Add(4, a, a);
  EXPECT_EQ(f.floor_bytes(), 0.0);
  auto b = a;
  b[0] = std::byte{8};
  f.Add(8, a, b);
  EXPECT_EQ(f.changed(), 1u);
  EXPECT_EQ(f.elements(), 16u + 8u);
}

}  // namespace
}  // namespace dcr
