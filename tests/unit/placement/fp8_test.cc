// The FP8 quantizer (dcr/fp8.h) against plain restatements of its
// definition: the nearest E4M3 value found by search, and each block's
// scale computed element by element. tests/python/fp8_reference_test.py
// checks the same functions against an independent NumPy reference.
#include "dcr/fp8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dcr/shard_diff.h"

namespace dcr {
namespace {

// The E4M3 code nearest to v by search over every finite code; ties go to
// the code with an even mantissa; beyond 448 saturates; NaN is 0x7F|sign.
uint8_t NearestBySearch(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return 0x7F | sign;
  const double a = std::fabs(static_cast<double>(v));
  const float* table = Fp8E4M3Table();
  uint8_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (uint8_t c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(a - static_cast<double>(table[c]));
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  if (a >= 448.0) best = 0x7E;
  return best | sign;
}

TEST(Fp8Test, TheTableFollowsTheOcpDefinition) {
  const float* t = Fp8E4M3Table();
  EXPECT_EQ(t[0x00], 0.0f);
  EXPECT_TRUE(std::signbit(t[0x80]));
  EXPECT_EQ(t[0x01], std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(t[0x07], 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(t[0x08], std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(t[0x38], 1.0f);
  EXPECT_EQ(t[0x7E], 448.0f);
  EXPECT_EQ(t[0xFE], -448.0f);
  EXPECT_TRUE(std::isnan(t[0x7F]));
  EXPECT_TRUE(std::isnan(t[0xFF]));
  for (int c = 0; c < 0x7E; ++c) EXPECT_LT(t[c], t[c + 1]) << c;
}

TEST(Fp8Test, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(Fp8E4M3FromF32(Fp8E4M3Table()[c]), c) << c;
  }
}

TEST(Fp8Test, RoundsToTheNearestCodeTiesToEven) {
  std::vector<float> probes;
  // Every BF16 value, as F32.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    probes.push_back(std::bit_cast<float>(b << 16));
  }
  // Around every code and every midpoint between neighbours (the rounding
  // boundaries), 64 F32 ulps each side; and around 464, where RNE would
  // leave the format.
  const float* t = Fp8E4M3Table();
  std::vector<float> marks = {464.0f, std::ldexp(1.0f, -10)};
  for (int c = 0; c <= 0x7E; ++c) {
    marks.push_back(t[c]);
    if (c < 0x7E) marks.push_back((t[c] + t[c + 1]) / 2);  // exact in F32
  }
  for (float m : marks) {
    const uint32_t b = std::bit_cast<uint32_t>(m);
    for (uint32_t d = 0; d <= 128; ++d) {
      const uint32_t x = b + d - 64;
      if (b < 64 && d < 64 - b) continue;
      probes.push_back(std::bit_cast<float>(x));
      probes.push_back(-std::bit_cast<float>(x));
    }
  }
  probes.push_back(std::numeric_limits<float>::infinity());
  probes.push_back(-std::numeric_limits<float>::infinity());
  probes.push_back(std::numeric_limits<float>::max());
  probes.push_back(std::numeric_limits<float>::denorm_min());
  probes.push_back(-std::numeric_limits<float>::denorm_min());
  int wrong = 0;
  for (float v : probes) {
    const uint8_t got = Fp8E4M3FromF32(v), want = NearestBySearch(v);
    if (got != want && ++wrong < 10) {
      ADD_FAILURE() << "v=" << v << " (0x" << std::hex
                    << std::bit_cast<uint32_t>(v) << ") got 0x" << int{got}
                    << " want 0x" << int{want};
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << probes.size();
  EXPECT_EQ(Fp8E4M3FromF32(std::nanf("")), 0x7F);
  EXPECT_EQ(Fp8E4M3FromF32(-std::nanf("")), 0xFF);
  EXPECT_EQ(Fp8E4M3FromF32(-0.0f), 0x80);
  EXPECT_EQ(Fp8E4M3FromF32(1e-30f), 0x00);
  EXPECT_EQ(Fp8E4M3FromF32(-1e-30f), 0x80);
}

// The bits of `values` in dtype d.
std::vector<std::byte> Encode(DType d, const std::vector<float>& values) {
  std::vector<std::byte> out(values.size() * DTypeSize(d));
  for (size_t i = 0; i < values.size(); ++i) {
    if (d == DType::kF32) {
      std::memcpy(&out[4 * i], &values[i], 4);
    } else if (d == DType::kF16) {
      const uint16_t h = FloatToHalf(values[i]);
      std::memcpy(&out[2 * i], &h, 2);
    } else {  // BF16 by truncation: any bits will do as input
      const uint16_t h =
          static_cast<uint16_t>(std::bit_cast<uint32_t>(values[i]) >> 16);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

template <typename T>
T LoadBits(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

float Decode(DType d, const std::byte* p) {
  if (d == DType::kF32) return std::bit_cast<float>(LoadBits<uint32_t>(p));
  const uint16_t h = LoadBits<uint16_t>(p);
  if (d == DType::kF16) return HalfToFloat(h);
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// The quantizer's definition, one element at a time.
void QuantizeByDefinition(const Fp8Tensor& t, const std::vector<std::byte>& src,
                          std::vector<uint8_t>* q, std::vector<float>* s) {
  const size_t w = DTypeSize(t.dtype);
  const uint64_t br = t.per_tensor() ? t.rows : t.block_rows;
  const uint64_t bc = t.per_tensor() ? t.cols : t.block_cols;
  q->assign(t.elements(), 0);
  s->assign(t.blocks(), 0);
  for (uint64_t b = 0; b < t.blocks(); ++b) {
    const uint64_t r0 = (b / t.blocks_across()) * br;
    const uint64_t c0 = (b % t.blocks_across()) * bc;
    const uint64_t r1 = std::min(t.rows, r0 + br),
                   c1 = std::min(t.cols, c0 + bc);
    float amax = 0;
    for (uint64_t r = r0; r < r1; ++r) {
      for (uint64_t c = c0; c < c1; ++c) {
        const float x = Decode(t.dtype, &src[(r * t.cols + c) * w]);
        if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
      }
    }
    const float m = std::max(amax, t.min_amax);
    const float mult = 448.0f / m;
    (*s)[b] = m / 448.0f;
    for (uint64_t r = r0; r < r1; ++r) {
      for (uint64_t c = c0; c < c1; ++c) {
        const float x = Decode(t.dtype, &src[(r * t.cols + c) * w]);
        (*q)[r * t.cols + c] = NearestBySearch(x * mult);
      }
    }
  }
}

std::vector<float> Weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

struct Case {
  DType dtype;
  uint64_t rows, cols;
  uint32_t block_rows, block_cols;
};

class Fp8QuantizeTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8QuantizeTest, MatchesItsDefinition) {
  const Case& k = GetParam();
  Fp8Tensor t{k.dtype, k.rows, k.cols, k.block_rows, k.block_cols};
  std::vector<float> v = Weights(t.elements(), 7);
  // Hard cases, all in the first block: a NaN, infinities, a huge value
  // that sets amax, a subnormal; the second block (if any) all zeros.
  v[0] = std::nanf("");
  if (v.size() > 5) {
    v[1] = std::numeric_limits<float>::infinity();
    v[2] = -std::numeric_limits<float>::infinity();
    v[3] = 3.0f;
    v[4] = 1e-40f;
  }
  if (!t.per_tensor() && t.blocks_across() > 1) {
    for (uint64_t r = 0; r < std::min<uint64_t>(t.rows, k.block_rows); ++r) {
      for (uint64_t c = k.block_cols;
           c < std::min<uint64_t>(t.cols, 2 * k.block_cols); ++c) {
        v[r * t.cols + c] = 0.0f;
      }
    }
  }
  const std::vector<std::byte> src = Encode(k.dtype, v);
  std::vector<uint8_t> q(t.elements()), want_q;
  std::vector<float> s(t.blocks()), want_s;
  ASSERT_TRUE(QuantizeFp8(t, src, q, s).ok());
  QuantizeByDefinition(t, src, &want_q, &want_s);
  ASSERT_EQ(s.size(), want_s.size());
  for (size_t b = 0; b < s.size(); ++b) {
    EXPECT_EQ(std::bit_cast<uint32_t>(s[b]), std::bit_cast<uint32_t>(want_s[b]))
        << "block " << b;
  }
  size_t wrong = 0;
  for (size_t i = 0; i < q.size(); ++i) wrong += q[i] != want_q[i];
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(q[0], 0x7F);  // the NaN
  if (!t.per_tensor() && t.blocks_across() > 1) {
    EXPECT_EQ(s[1], kFp8DefaultMinAmax / 448.0f);  // the zero block
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8QuantizeTest,
    ::testing::Values(Case{DType::kBF16, 300, 260, 128, 128},
                      Case{DType::kBF16, 128, 256, 128, 128},
                      Case{DType::kF16, 70, 90, 32, 16},
                      Case{DType::kF32, 129, 3, 128, 128},
                      Case{DType::kBF16, 1, 1000, 1, 128},
                      Case{DType::kBF16, 50, 70, 0, 0},
                      Case{DType::kF32, 33, 65, 0, 0}));

TEST(Fp8Test, RequantizingTheTouchedBlocksEqualsQuantizingAll) {
  std::mt19937 rng(11);
  for (const Case& k :
       {Case{DType::kBF16, 300, 260, 128, 128},
        Case{DType::kF32, 97, 211, 16, 64}, Case{DType::kBF16, 64, 64, 0, 0}}) {
    Fp8Tensor t{k.dtype, k.rows, k.cols, k.block_rows, k.block_cols};
    std::vector<float> v = Weights(t.elements(), 3);
    std::vector<std::byte> src = Encode(k.dtype, v);
    std::vector<uint8_t> q(t.elements());
    std::vector<float> s(t.blocks());
    ASSERT_TRUE(QuantizeFp8(t, src, q, s).ok());
    for (int step = 0; step < 4; ++step) {
      // A step: a few elements change, one of them becoming its block's
      // new maximum, and a run of elements overwritten across rows.
      Fp8BlockSet touched(t);
      std::vector<uint32_t> pos;
      for (int i = 0; i < 20; ++i) pos.push_back(rng() % t.elements());
      for (uint32_t p : pos) v[p] = v[p] * 1.5f + (p % 7 == 0 ? 0.5f : 0.0f);
      const uint64_t first = rng() % t.elements();
      const uint64_t count = rng() % 400;
      for (uint64_t e = first; e < std::min(first + count, t.elements()); ++e) {
        v[e] = -v[e];
      }
      touched.MarkElements(0, pos);
      touched.MarkRange(first, count);
      src = Encode(k.dtype, v);
      ASSERT_TRUE(RequantizeFp8(t, src, touched, q, s).ok());
      std::vector<uint8_t> want_q(t.elements());
      std::vector<float> want_s(t.blocks());
      ASSERT_TRUE(QuantizeFp8(t, src, want_q, want_s).ok());
      EXPECT_EQ(q, want_q) << "step " << step;
      EXPECT_EQ(s, want_s) << "step " << step;
    }
  }
}

TEST(Fp8Test, ABoxWithTheTensorsScaleHoldsTheTensorsCodes) {
  std::mt19937 rng(23);
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32}) {
    Fp8Tensor t{d, 75, 130, 0, 0};
    std::vector<float> v = Weights(t.elements(), 9);
    v[5] = std::nanf("");
    v[t.elements() - 1] = -0.75f;  // the maximum, in the last element
    const std::vector<std::byte> src = Encode(d, v);
    std::vector<uint8_t> want_q(t.elements());
    std::vector<float> want_s(1);
    ASSERT_TRUE(QuantizeFp8(t, src, want_q, want_s).ok());
    auto scale = Fp8TensorScale(t, src);
    ASSERT_TRUE(scale.ok()) << scale.status().ToString();
    EXPECT_EQ(std::bit_cast<uint32_t>(scale->scale_inv),
              std::bit_cast<uint32_t>(want_s[0]));
    for (int trial = 0; trial < 50; ++trial) {
      const uint64_t r0 = rng() % t.rows, c0 = rng() % t.cols;
      const uint64_t rows = rng() % (t.rows - r0 + 1);
      const uint64_t cols = rng() % (t.cols - c0 + 1);
      const uint64_t stride = cols + rng() % 5 + (cols == 0);
      std::vector<uint8_t> q(rows * stride, 0xAA);
      ASSERT_TRUE(
          QuantizeFp8Box(t, src, *scale, r0, c0, rows, cols, q, stride).ok());
      for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t c = 0; c < stride; ++c) {
          const uint8_t want =
              c < cols ? want_q[(r0 + r) * t.cols + c0 + c] : 0xAA;
          ASSERT_EQ(q[r * stride + c], want)
              << DTypeName(d) << " box " << rows << "x" << cols << " at [" << r0
              << ", " << c0 << "] element " << r << "," << c;
        }
      }
    }
  }
  // A box outside the tensor, short codes and a blocked tensor are refused.
  Fp8Tensor t{DType::kBF16, 4, 4, 0, 0};
  const std::vector<std::byte> src = Encode(t.dtype, Weights(16, 1));
  std::vector<uint8_t> q(16);
  const Fp8Scale one{1, 1};
  EXPECT_FALSE(QuantizeFp8Box(t, src, one, 3, 0, 2, 4, q, 4).ok());
  EXPECT_FALSE(QuantizeFp8Box(t, src, one, 0, 1, 4, 4, q, 4).ok());
  EXPECT_FALSE(QuantizeFp8Box(t, src, one, 0, 0, 4, 4, q, 5).ok());
  EXPECT_FALSE(QuantizeFp8Box(t, src, one, 0, 0, 1, 0, q, 0).ok());
  EXPECT_TRUE(QuantizeFp8Box(t, src, one, 0, 0, 4, 4, q, 4).ok());
  EXPECT_FALSE(Fp8TensorScale(t, std::span(src).first(30)).ok());
  Fp8Tensor blocked{DType::kBF16, 4, 4, 2, 2};
  EXPECT_FALSE(Fp8TensorScale(blocked, src).ok());
  EXPECT_FALSE(QuantizeFp8Box(blocked, src, one, 0, 0, 4, 4, q, 4).ok());
}

TEST(Fp8Test, RequantizeWritesOnlyTheMarkedBlocks) {
  Fp8Tensor t{DType::kBF16, 40, 40, 16, 16};
  const std::vector<std::byte> src = Encode(t.dtype, Weights(t.elements(), 5));
  std::vector<uint8_t> q(t.elements(), 0xAA);
  std::vector<float> s(t.blocks(), -1.0f);
  Fp8BlockSet one(t);
  one.MarkElements(0, std::vector<uint32_t>{17 * 40 + 33});  // block (1, 2)
  ASSERT_EQ(one.count(), 1u);
  ASSERT_TRUE(RequantizeFp8(t, src, one, q, s).ok());
  for (uint64_t r = 0; r < t.rows; ++r) {
    for (uint64_t c = 0; c < t.cols; ++c) {
      const bool inside = r >= 16 && r < 32 && c >= 32;
      EXPECT_EQ(q[r * t.cols + c] == 0xAA, !inside) << r << "," << c;
    }
  }
  for (uint64_t b = 0; b < t.blocks(); ++b) {
    EXPECT_EQ(s[b] == -1.0f, b != 5) << b;
  }
}

TEST(Fp8Test, MarkingARangeMarksTheBlocksOfItsElements) {
  std::mt19937 rng(19);
  for (int trial = 0; trial < 400; ++trial) {
    Fp8Tensor t{DType::kBF16, 1 + rng() % 40, 1 + rng() % 40,
                static_cast<uint32_t>(1 + rng() % 9),
                static_cast<uint32_t>(1 + rng() % 9)};
    if (trial % 10 == 0) t.block_rows = t.block_cols = 0;
    const uint64_t first = rng() % (t.elements() + 5);
    const uint64_t count = rng() % (2 * t.elements() + 1);
    Fp8BlockSet by_range(t), by_element(t);
    by_range.MarkRange(first, count);
    std::vector<uint32_t> each;
    for (uint64_t e = first; e < first + count; ++e) {
      each.push_back(static_cast<uint32_t>(e));
    }
    by_element.MarkElements(0, each);
    for (uint64_t b = 0; b < t.blocks(); ++b) {
      ASSERT_EQ(by_range.marked(b), by_element.marked(b))
          << "trial " << trial << " block " << b << " of " << t.rows << "x"
          << t.cols << " in " << t.block_rows << "x" << t.block_cols
          << " blocks, range " << first << "+" << count;
    }
  }
  Fp8Tensor huge{DType::kBF16, 4, 4, 2, 2};
  Fp8BlockSet s(huge);
  s.MarkRange(3, UINT64_MAX);  // no overflow: marks to the end
  EXPECT_EQ(s.count(), 4u);
  s.Clear();
  s.MarkElements(UINT64_MAX - 1, std::vector<uint32_t>{5});  // wraps: ignored
  EXPECT_EQ(s.count(), 0u);
}

TEST(Fp8Test, EdgeTensorsAndSetsBehave) {
  // An empty tensor with one scale still has it: min_amax / 448.
  Fp8Tensor empty{DType::kBF16, 0, 5, 0, 0};
  std::vector<float> s(1, -1.0f);
  ASSERT_TRUE(QuantizeFp8(empty, {}, {}, s).ok());
  EXPECT_EQ(s[0], kFp8DefaultMinAmax / 448.0f);
  // A block set of a tensor CheckFp8Tensor refuses marks nothing.
  Fp8BlockSet bad(Fp8Tensor{DType::kBF16, 4, 4, 0, 2});
  bad.MarkAll();
  bad.MarkRange(0, 16);
  bad.MarkElements(0, std::vector<uint32_t>{1, 2});
  EXPECT_EQ(bad.size(), 0u);
  EXPECT_EQ(bad.count(), 0u);
  // Merge joins two threads' marks.
  Fp8Tensor t{DType::kBF16, 4, 4, 2, 2};
  Fp8BlockSet a(t), b(t);
  a.MarkElements(0, std::vector<uint32_t>{0});
  b.MarkElements(0, std::vector<uint32_t>{15});
  a.Merge(b);
  EXPECT_TRUE(a.marked(0) && a.marked(3) && !a.marked(1) && !a.marked(2));
}

TEST(Fp8Test, BadTensorsAndBuffersAreRefused) {
  EXPECT_FALSE(CheckFp8Tensor({DType::kI8, 4, 4, 2, 2}).ok());
  EXPECT_FALSE(CheckFp8Tensor({DType::kF8E4M3, 4, 4, 2, 2}).ok());
  EXPECT_FALSE(CheckFp8Tensor({DType::kBF16, 4, 4, 0, 2}).ok());
  EXPECT_FALSE(CheckFp8Tensor({DType::kBF16, 4, 4, 2, 2, 0.0f}).ok());
  EXPECT_FALSE(CheckFp8Tensor({DType::kBF16, 4, 4, 2, 2, std::nanf("")}).ok());
  EXPECT_FALSE(CheckFp8Tensor({DType::kBF16, 4, 4, 2, 2, -1.0f}).ok());
  // 448 / 2e-37 is infinite: refused; 448 x 2^-126 is the floor.
  EXPECT_FALSE(CheckFp8Tensor({DType::kBF16, 4, 4, 2, 2, 2e-37f}).ok());
  EXPECT_TRUE(CheckFp8Tensor({DType::kBF16, 4, 4, 2, 2,
                              448.0f * std::numeric_limits<float>::min()})
                  .ok());
  EXPECT_FALSE(CheckFp8Tensor({DType::kBF16, 4, 4, 2, 2,
                               std::numeric_limits<float>::infinity()})
                   .ok());
  EXPECT_FALSE(
      CheckFp8Tensor({DType::kBF16, uint64_t{1} << 40, uint64_t{1} << 40, 2, 2})
          .ok());
  Fp8Tensor t{DType::kBF16, 4, 4, 2, 2};
  std::vector<std::byte> src(32);
  std::vector<uint8_t> q(16);
  std::vector<float> s(4);
  EXPECT_TRUE(QuantizeFp8(t, src, q, s).ok());
  EXPECT_FALSE(QuantizeFp8(t, std::span(src).first(30), q, s).ok());
  EXPECT_FALSE(QuantizeFp8(t, src, std::span(q).first(15), s).ok());
  EXPECT_FALSE(QuantizeFp8(t, src, q, std::span(s).first(3)).ok());
  Fp8BlockSet other(Fp8Tensor{DType::kBF16, 8, 8, 2, 2});
  EXPECT_FALSE(RequantizeFp8(t, src, other, q, s).ok());
}

}  // namespace
}  // namespace dcr
