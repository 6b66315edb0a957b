// The linear digest (dcr/digest.h): every kernel against the definition
// computed the slow way, parts that add up to the whole for any partition
// of the bytes, linearity (an XOR mask updates a digest), and the field's
// laws for the multiplication underneath.
#include "common/linear_digest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dcr/digest.h"

namespace dcr {
namespace {

using linear_digest::MultiplyGeneric;

LinearDigest Random(std::mt19937_64& rng) { return {rng(), rng()}; }

std::vector<std::byte> RandomBytes(size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// L(S) by its definition: XOR over blocks of X_b K^(b+1), powers by
// repeated multiplication, the last block zero-padded.
LinearDigest Reference(std::span<const std::byte> s) {
  LinearDigest out, power = kLinearDigestKey;
  for (size_t b = 0; 16 * b < s.size(); ++b) {
    unsigned char x[16] = {};
    std::memcpy(x, s.data() + 16 * b, std::min<size_t>(16, s.size() - 16 * b));
    LinearDigest xb;
    std::memcpy(&xb.low, x, 8);
    std::memcpy(&xb.high, x + 8, 8);
    out ^= MultiplyGeneric(xb, power);
    power = MultiplyGeneric(power, kLinearDigestKey);
  }
  return out;
}

std::vector<const linear_digest::Kernels*> AllKernels() {
  std::vector<const linear_digest::Kernels*> out;
  for (const auto& [name, k] : linear_digest::AllKernels()) out.push_back(k);
  return out;
}

TEST(LinearDigestTest, MultiplicationIsAField) {
  std::mt19937_64 rng(1);
  const LinearDigest one{1, 0};
  for (const auto* k : AllKernels()) {
    for (int i = 0; i < 200; ++i) {
      LinearDigest a = Random(rng), b = Random(rng), c = Random(rng);
      EXPECT_EQ(k->multiply(a, one), a);
      EXPECT_EQ(k->multiply(a, b), k->multiply(b, a));
      EXPECT_EQ(k->multiply(k->multiply(a, b), c),
                k->multiply(a, k->multiply(b, c)));
      EXPECT_EQ(k->multiply(a, b ^ c), k->multiply(a, b) ^ k->multiply(a, c));
      EXPECT_EQ(k->multiply(a, b), MultiplyGeneric(a, b));
    }
    // x^127 * x = x^128 = x^7 + x^2 + x + 1.
    EXPECT_EQ(k->multiply({0, 1ull << 63}, {2, 0}), (LinearDigest{0x87, 0}));
  }
  EXPECT_FALSE(kLinearDigestKey.IsZero());
  EXPECT_NE(kLinearDigestKey, (LinearDigest{1, 0}));
}

TEST(LinearDigestTest, PowersAndInversePowers) {
  std::mt19937_64 rng(5);
  const LinearDigest one{1, 0};
  LinearDigest p = one;
  for (uint64_t n = 0; n < 70; ++n) {
    EXPECT_EQ(linear_digest::Power(n), p) << n;
    EXPECT_EQ(GfMultiply(linear_digest::InversePower(n), p), one) << n;
    p = MultiplyGeneric(p, kLinearDigestKey);
  }
  for (int i = 0; i < 50; ++i) {
    uint64_t a = rng() >> (rng() % 64), b = rng() >> (rng() % 64);
    if (a > UINT64_MAX - b) continue;
    EXPECT_EQ(linear_digest::Power(a + b),
              GfMultiply(linear_digest::Power(a), linear_digest::Power(b)));
    EXPECT_EQ(
        GfMultiply(linear_digest::Power(a), linear_digest::InversePower(a)),
        one);
  }
}

TEST(LinearDigestTest, KernelsMatchTheDefinition) {
  std::mt19937_64 rng(2);
  linear_digest::Powers k;
  k.k[0] = kLinearDigestKey;
  for (size_t j = 1; j < linear_digest::kGroup; ++j) {
    k.k[j] = MultiplyGeneric(k.k[j - 1], kLinearDigestKey);
  }
  // Up to 100 blocks: whole groups of 8 and 32 and what follows them;
  // past 256 groups of 32, the 256-bit kernel moves a body into place by
  // Power rather than a table.
  for (uint64_t blocks : {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 64, 65,
                          100, 32 * 256 + 5, 32 * 257 + 1, 32 * 258}) {
    auto bytes = RandomBytes(16 * blocks, rng);
    for (const auto* kernel : AllKernels()) {
      EXPECT_EQ(kernel->body(bytes.data(), blocks, k), Reference(bytes))
          << blocks << " blocks";
    }
  }
  for (size_t n = 0; n < 300; ++n) {
    auto bytes = RandomBytes(n, rng);
    EXPECT_EQ(LinearHash(0, bytes), Reference(bytes)) << n << " bytes";
  }
}

// A kernel this CPU could run is compiled in and listed, so the tests above
// check it (a build without its flags would leave it out silently).
TEST(LinearDigestTest, EveryKernelThisCpuRunsIsListed) {
  std::vector<std::string> names;
  for (const auto& [name, k] : linear_digest::AllKernels()) {
    names.emplace_back(name);
  }
  EXPECT_EQ(names.front(), "generic");
#if defined(__x86_64__) && defined(__GNUC__)
  auto listed = [&](const char* name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  const bool clmul =
      __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  const bool vpclmul = clmul && __builtin_cpu_supports("vpclmulqdq");
  EXPECT_EQ(listed("pclmul"), clmul);
  EXPECT_EQ(listed("vpclmulqdq/avx2"),
            vpclmul && __builtin_cpu_supports("avx2"));
  EXPECT_EQ(listed("vpclmulqdq"),
            vpclmul && __builtin_cpu_supports("avx512bw"));
#endif
}

TEST(LinearDigestTest, AnyPartitionAddsUpToTheWhole) {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 100; ++iter) {
    auto s = RandomBytes(1 + rng() % 5000, rng);
    const LinearDigest whole = LinearHash(0, s);
    LinearDigest parts;
    for (size_t at = 0; at < s.size();) {
      size_t n = std::min<size_t>(
          s.size() - at, rng() % 3 == 0 ? 1 + rng() % 20 : 1 + rng() % 700);
      parts ^= LinearHash(at, std::span(s).subspan(at, n));
      at += n;
    }
    ASSERT_EQ(parts, whole) << "iteration " << iter;
    // A part is what the whole string with zeros elsewhere hashes to.
    size_t at = rng() % s.size(), n = 1 + rng() % (s.size() - at);
    std::vector<std::byte> only(s.size());
    std::memcpy(only.data() + at, s.data() + at, n);
    ASSERT_EQ(LinearHash(at, std::span(s).subspan(at, n)), LinearHash(0, only));
  }
  // Far offsets: a tensor of terabytes.
  auto s = RandomBytes(100, rng);
  const uint64_t far = (1ull << 41) + 3;
  EXPECT_EQ(LinearHash(far, s),
            LinearHash(far, std::span(s).first(40)) ^
                LinearHash(far + 40, std::span(s).subspan(40)));
}

TEST(LinearDigestTest, RunsAddUpAsTheirOwnHashes) {
  std::mt19937_64 rng(7);
  // Aligned runs (whole blocks: the Horner path) and every kind of
  // misalignment (the fallback), at near and far offsets.
  for (int iter = 0; iter < 400; ++iter) {
    const bool aligned = iter % 2 == 0;
    const uint64_t unit = aligned ? 16 : 1;
    const uint64_t run = unit * (1 + rng() % (aligned ? 80 : 1300));
    const uint64_t count = rng() % 40;
    const uint64_t stride = run + unit * (rng() % 3 == 0 ? 0 : rng() % 100);
    const uint64_t data_stride = run + rng() % 50;
    const uint64_t offset =
        unit * (rng() % 4 == 0 ? (1ull << 37) + rng() % 1000 : rng() % 1000);
    auto data =
        RandomBytes(count == 0 ? 0 : (count - 1) * data_stride + run, rng);
    LinearDigest each;
    for (uint64_t i = 0; i < count; ++i) {
      each ^= LinearHash(offset + i * stride,
                         std::span(data).subspan(i * data_stride, run));
    }
    ASSERT_EQ(
        LinearHashRuns(offset, stride, run, count, data.data(), data_stride),
        each)
        << "iteration " << iter << ": " << count << " runs of " << run
        << " bytes, stride " << stride << ", at " << offset;
  }
  // Back to back, the runs are one string.
  auto s = RandomBytes(64 * 48, rng);
  EXPECT_EQ(LinearHashRuns(4096, 64, 64, 48, s.data(), 64),
            LinearHash(4096, s));
  EXPECT_TRUE(LinearHashRuns(0, 16, 16, 0, nullptr, 16).IsZero());
}

TEST(LinearDigestTest, AnXorMaskUpdatesTheDigest) {
  std::mt19937_64 rng(4);
  auto base = RandomBytes(4096, rng);
  auto target = base;
  std::vector<std::byte> mask(base.size());
  for (int i = 0; i < 40; ++i) {
    size_t at = rng() % base.size();
    auto m = static_cast<std::byte>(1 + rng() % 255);
    target[at] ^= m;
    mask[at] ^= m;
  }
  EXPECT_EQ(LinearHash(0, target), LinearHash(0, base) ^ LinearHash(0, mask));
  // Every single-bit change of a block changes the digest, and moving a
  // block elsewhere does too.
  auto one = RandomBytes(64, rng);
  const LinearDigest d = LinearHash(0, one);
  for (size_t bit = 0; bit < 8 * one.size(); ++bit) {
    auto c = one;
    c[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    ASSERT_NE(LinearHash(0, c), d) << "bit " << bit;
  }
  auto swapped = one;
  std::swap_ranges(swapped.begin(), swapped.begin() + 16, swapped.begin() + 16);
  EXPECT_NE(LinearHash(0, swapped), d);
}

// Scattered elements hash as the dense string holding them among zeros,
// at every element size, density and offset (aligned: Horner over the
// blocks; unaligned: element by element), gaps of any length included.
TEST(LinearDigestTest, ScatteredElementsHashAsTheirDenseString) {
  std::mt19937_64 rng(6);
  for (int iter = 0; iter < 400; ++iter) {
    const size_t w = size_t{1} << (rng() % 4);
    const uint64_t n = 1 + rng() % 3000;
    const double density = std::array{0.0005, 0.03, 0.3, 1.0}[rng() % 4];
    const uint64_t offset =
        rng() % 3 == 0 ? rng() % 64 : w * (rng() % 3 == 0 ? rng() : rng() % 64);
    std::vector<uint64_t> positions;
    for (uint64_t e = 0; e < n; ++e) {
      if (std::generate_canonical<double, 53>(rng) < density) {
        positions.push_back(e);
      }
    }
    auto values = RandomBytes(positions.size() * w, rng);
    std::vector<std::byte> dense(n * w);
    for (size_t k = 0; k < positions.size(); ++k) {
      std::memcpy(&dense[positions[k] * w], &values[k * w], w);
    }
    SCOPED_TRACE("w " + std::to_string(w) + " n " + std::to_string(n) +
                 " offset " + std::to_string(offset) + " count " +
                 std::to_string(positions.size()));
    ASSERT_EQ(LinearHashElements(offset, w, positions.data(), positions.size(),
                                 values.data()),
              LinearHash(offset, dense));
  }
  // Elements 2^40 apart: one product spans the gap.
  const uint64_t far[] = {3, (1ull << 40) + 5};
  const std::byte v[] = {std::byte{7}, std::byte{9}, std::byte{1},
                         std::byte{2}};
  EXPECT_EQ(
      LinearHashElements(0, 2, far, 2, v),
      LinearHash(6, {v, 2}) ^ LinearHash(((1ull << 40) + 5) * 2, {v + 2, 2}));
  EXPECT_TRUE(LinearHashElements(0, 2, far, 0, v).IsZero());
}

TEST(TensorDigestTest, IsTheLinearDigestBoundToTheLength) {
  std::mt19937_64 rng(5);
  auto s = RandomBytes(1000, rng);
  const Digest128 d = TensorDigest(s);
  const LinearDigest len =
      MultiplyGeneric(LinearDigest{s.size(), 0}, kTensorDigestLengthKey);
  const LinearDigest want = Reference(s) ^ len;
  EXPECT_EQ(d, (Digest128{want.high, want.low}));
  // Parts at their offsets finish to the same digest.
  LinearDigest parts;
  for (size_t at = 0; at < s.size(); at += 37) {
    parts ^= LinearHash(
        at, std::span(s).subspan(at, std::min<size_t>(37, s.size() - at)));
  }
  EXPECT_EQ(FinishTensorDigest(parts, s.size()), d);
  // Trailing zeros, and all-zero tensors of other sizes, differ although
  // their L is the same.
  auto padded = s;
  padded.resize(s.size() + 16);
  EXPECT_EQ(LinearHash(0, padded), LinearHash(0, s));
  EXPECT_NE(TensorDigest(padded), d);
  std::vector<std::byte> z1(8), z2(16);
  EXPECT_NE(TensorDigest(z1), TensorDigest(z2));
  EXPECT_NE(TensorDigest({}), TensorDigest(z1));
  EXPECT_EQ(TensorDigest({}), Digest128{});
  // A fixed value pins the format (docs/FORMAT.md's example).
  std::vector<std::byte> abc = {std::byte{'a'}, std::byte{'b'}, std::byte{'c'}};
  EXPECT_EQ(TensorDigest(abc).ToHex(), "b2d9f5b5a68d45b536d985b1c5c13f8b");
}

}  // namespace
}  // namespace dcr
