#include "dcr/entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>
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

double H(double p) { return -(p * std::log2(p) + (1 - p) * std::log2(1 - p)); }

void PutU16(std::vector<std::byte>* v, size_t i, uint16_t x) {
  (*v)[2 * i] = std::byte{static_cast<uint8_t>(x)};
  (*v)[2 * i + 1] = std::byte{static_cast<uint8_t>(x >> 8)};
}

// 1000 BF16 elements: 500 with base 1.0 (0x3F80, exponent 0x7F), 100 of
// them changed by XOR 1 or 3 (half each); 500 with base 2.0 (0x4000,
// exponent 0x80), 10 of them changed by XOR 1.
void TwoContexts(std::vector<std::byte>* base, std::vector<std::byte>* target) {
  base->assign(2000, std::byte{0});
  for (size_t i = 0; i < 1000; ++i) PutU16(base, i, i < 500 ? 0x3F80 : 0x4000);
  *target = *base;
  for (size_t i = 0; i < 100; ++i) {
    PutU16(target, i * 5, 0x3F80 ^ (i % 2 ? 1 : 3));
  }
  for (size_t i = 0; i < 10; ++i) PutU16(target, 500 + i * 50, 0x4000 ^ 1);
}

TEST(EntropyFloorTest, ConditionalFloorOfTwoContexts) {
  std::vector<std::byte> a, b;
  TwoContexts(&a, &b);
  EntropyFloor f;
  f.Add(2, ExponentFieldOf(DType::kBF16), a, b);
  EXPECT_EQ(f.elements(), 1000u);
  EXPECT_EQ(f.changed(), 110u);
  // Order-0: 110 of 1000 changed; values 1 (60 times) and 3 (50 times).
  EXPECT_NEAR(f.position_bytes(), 1000 * H(0.11) / 8, 1e-6);
  EXPECT_NEAR(f.value_bytes(), 110 * H(50.0 / 110) / 8, 1e-6);
  // Conditional: 100 of 500 and 10 of 500; values 1 bit each in the first
  // context, 0 bits in the second.
  EXPECT_NEAR(f.conditional_position_bytes(),
              (500 * H(0.2) + 500 * H(0.02)) / 8, 1e-6);
  EXPECT_NEAR(f.conditional_value_bytes(), 100.0 / 8, 1e-6);
  EXPECT_LT(f.conditional_floor_bytes(), f.floor_bytes());

  // The same pair added as two halves into two instances and merged.
  EntropyFloor lo, hi;
  auto field = ExponentFieldOf(DType::kBF16);
  lo.Add(2, field, std::span(a).first(1000), std::span(b).first(1000));
  hi.Add(2, field, std::span(a).subspan(1000), std::span(b).subspan(1000));
  lo.Merge(hi);
  EXPECT_EQ(lo.changed(), 110u);
  EXPECT_NEAR(lo.conditional_floor_bytes(), f.conditional_floor_bytes(), 1e-6);
  EXPECT_NEAR(lo.floor_bytes(), f.floor_bytes(), 1e-6);
}

TEST(EntropyFloorTest, OneContextEqualsOrderZero) {
  // Every base element has exponent 0x7F; varied mantissas and changes.
  std::vector<std::byte> a(2000), b;
  for (size_t i = 0; i < 1000; ++i) PutU16(&a, i, 0x3F80 | (i & 0x7F));
  b = a;
  for (size_t i = 0; i < 1000; i += 7) PutU16(&b, i, 0x3F80 ^ (i % 5));
  EntropyFloor f;
  f.Add(2, ExponentFieldOf(DType::kBF16), a, b);
  EXPECT_GT(f.changed(), 100u);
  EXPECT_NEAR(f.conditional_position_bytes(), f.position_bytes(), 1e-9);
  EXPECT_NEAR(f.conditional_value_bytes(), f.value_bytes(), 1e-9);
}

TEST(EntropyFloorTest, IntegerDtypeEqualsOrderZero) {
  // The two-context pair read as I16: no exponent field, one context.
  std::vector<std::byte> a, b;
  TwoContexts(&a, &b);
  ASSERT_TRUE(ExponentFieldOf(DType::kI16).empty());
  EntropyFloor f;
  f.Add(2, ExponentFieldOf(DType::kI16), a, b);
  EXPECT_NEAR(f.conditional_floor_bytes(), f.floor_bytes(), 1e-9);
  EXPECT_NEAR(f.floor_bytes(), (1000 * H(0.11) + 110 * H(50.0 / 110)) / 8,
              1e-6);
  // A field that does not fit the element counts as empty too.
  EntropyFloor g;
  g.Add(1, ExponentField{4, 8}, a, b);
  EXPECT_NEAR(g.conditional_floor_bytes(), g.floor_bytes(), 1e-9);
}

TEST(EntropyFloorTest, ManyDistinctValuesAndWiderElements) {
  // 5000 distinct XOR values in one BF16 context (past the switch to a
  // dense table), merged with an instance that saw few.
  std::vector<std::byte> a(2 * 8192, std::byte{0}), b = a;
  for (size_t i = 0; i < 5000; ++i) PutU16(&b, i, static_cast<uint16_t>(i + 1));
  EntropyFloor many, few;
  many.Add(2, ExponentField{15, 1}, a, b);  // sign bit: one used context
  EXPECT_NEAR(many.conditional_value_bytes(), 5000 * std::log2(5000.0) / 8,
              1e-6);
  few.Add(2, ExponentField{15, 1}, std::span(a).first(20),
          std::span(b).first(20));  // values 1..10
  few.Merge(many);
  few.Merge(EntropyFloor{});
  EXPECT_EQ(few.changed(), 5010u);
  double bits = 10 * 2 * std::log2(5010.0 / 2) + 4990 * std::log2(5010.0);
  EXPECT_NEAR(few.conditional_value_bytes(), bits / 8, 1e-6);
  EXPECT_NEAR(few.value_bytes(), bits / 8, 1e-6);

  // F32: exponent in bits 23..30. 1.0f and 2.0f, one of each changed.
  std::vector<std::byte> x(16), y;
  const uint32_t one = 0x3F800000, two = 0x40000000;
  for (size_t i = 0; i < 4; ++i) {
    uint32_t v = i < 2 ? one : two;
    std::memcpy(x.data() + 4 * i, &v, 4);
  }
  y = x;
  y[0] ^= std::byte{1};
  y[8] ^= std::byte{2};
  EntropyFloor f;
  f.Add(4, ExponentFieldOf(DType::kF32), x, y);
  EXPECT_NEAR(f.position_bytes(), 4 * H(0.5) / 8, 1e-9);
  EXPECT_NEAR(f.value_bytes(), 2.0 / 8, 1e-9);
  EXPECT_NEAR(f.conditional_position_bytes(), 2 * 2 * H(0.5) / 8, 1e-9);
  EXPECT_NEAR(f.conditional_value_bytes(), 0.0, 1e-9);
}

}  // namespace
}  // namespace dcr
