// The context loops (codec/context_scan.h): every compilation this CPU
// runs (generic, AVX2, AVX-512, AVX-512 VBMI2) must find the same
// range-local indices and scan them back to the same positions and groups,
// over every element width, range count, inverted ranges, and spans whose
// length is not a multiple of 64; and refuse indices a corrupt chunk could
// name. Their changed-element scans (FindChanges) and value-group steps
// must match plain loops.
#include "codec/context_scan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <string>

namespace dcr {
namespace {

struct Case {
  size_t w;
  ExponentField field;
  size_t n;
  size_t k;
  double density;
};

// Random ranges over the field (k of them, ascending bounds), some
// inverted, groups contiguous (at most kMaxContextGroups).
Ranges RandomRanges(const Case& c, std::mt19937_64& rng) {
  Ranges r;
  r.field = c.field;
  const uint32_t classes = 1u << c.field.bits;
  r.k = std::min<size_t>(c.k, classes);
  std::vector<uint32_t> cuts;
  for (uint32_t e = 1; e < classes; ++e) cuts.push_back(e);
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(r.k - 1);
  std::sort(cuts.begin(), cuts.end());
  uint8_t group = 0;
  for (size_t q = 0; q < r.k; ++q) {
    r.upper[q] = static_cast<uint16_t>(q + 1 < r.k ? cuts[q] : classes);
    r.inverted[q] = rng() % 3 == 0 ? 1 : 0;
    if (q > 0 && group + 1 < 4 && rng() % 2 == 0) ++group;
    r.group[q] = group;
  }
  r.BuildLut();
  return r;
}

template <size_t W>
uint32_t Exp(const std::vector<std::byte>& base, size_t i, ExponentField f) {
  return ExponentAt<W>(base.data(), i, f);
}

uint32_t ExpOf(size_t w, const std::vector<std::byte>& base, size_t i,
               ExponentField f) {
  return w == 1 ? Exp<1>(base, i, f)
                : (w == 2 ? Exp<2>(base, i, f) : Exp<4>(base, i, f));
}

class ContextScanTest : public ::testing::TestWithParam<Case> {};

TEST_P(ContextScanTest, EveryCompilationAgreesAndRoundTrips) {
  const Case c = GetParam();
  const auto scans = ContextScans();
  ASSERT_FALSE(scans.empty());
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::mt19937_64 rng(seed * 7919 + c.n + c.k);
    const Ranges r = RandomRanges(c, rng);
    std::vector<std::byte> base(c.n * c.w);
    for (auto& b : base) b = static_cast<std::byte>(rng());
    std::vector<uint32_t> positions;
    std::vector<uint8_t> rng_of;
    std::bernoulli_distribution changed(c.density);
    for (size_t i = 0; i < c.n; ++i) {
      if (!changed(rng)) continue;
      positions.push_back(static_cast<uint32_t>(i));
      rng_of.push_back(r.lut[ExpOf(c.w, base, i, c.field)]);
    }
    if (positions.empty()) continue;

    RangeLocals want;
    for (size_t s = 0; s < scans.size(); ++s) {
      SCOPED_TRACE(scans[s].first + " seed " + std::to_string(seed));
      RangeLocals locals;
      scans[s].second->local_indices(c.w, base.data(), c.n, r, positions,
                                     rng_of.data(), &locals);
      if (s == 0) {
        want = locals;
      } else {
        for (size_t q = 0; q < r.k; ++q) EXPECT_EQ(locals[q], want[q]) << q;
      }
      for (const auto& [name, ops] : scans) {
        SCOPED_TRACE("scanned by " + name);
        std::vector<uint32_t> got;
        std::vector<uint8_t> groups;
        Status st = ops->scan_positions(c.w, base.data(), c.n, r, locals, &got,
                                        &groups, positions.size(), "chunk");
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(got, positions);
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(groups[i], r.group[rng_of[i]]) << i;
        }
      }
    }

    // A corrupt chunk: one more index than a range holds, or a count the
    // indices do not produce, is refused by every compilation.
    for (const auto& [name, ops] : scans) {
      SCOPED_TRACE(name);
      std::vector<uint32_t> got;
      std::vector<uint8_t> groups;
      EXPECT_FALSE(ops->scan_positions(c.w, base.data(), c.n, r, want, &got,
                                       &groups, positions.size() + 1, "chunk")
                       .ok());
      if (positions.size() > 1) {
        EXPECT_FALSE(ops->scan_positions(c.w, base.data(), c.n, r, want, &got,
                                         &groups, positions.size() - 1, "chunk")
                         .ok());
      }
      RangeLocals beyond = want;
      beyond[0].push_back(static_cast<uint32_t>(c.n) + 70);
      EXPECT_FALSE(ops->scan_positions(c.w, base.data(), c.n, r, beyond, &got,
                                       &groups, positions.size() + 1, "chunk")
                       .ok());
    }
  }
}

// The changed-element scan of every compilation against a plain loop, over
// every width, lengths around the 16- and 64-element steps, densities from
// none to all, XOR and target values, and changes confined to one byte of
// an element.
TEST(FindChangesTest, EveryCompilationMatchesAPlainLoop) {
  std::mt19937_64 rng(7);
  for (size_t w : {1, 2, 4, 8}) {
    for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 1000, 4099}) {
      for (double density : {0.0, 0.01, 0.3, 1.0}) {
        std::vector<std::byte> a(n * w), b;
        for (auto& x : a) x = static_cast<std::byte>(rng());
        b = a;
        for (size_t i = 0; i < n; ++i) {
          if (std::uniform_real_distribution<double>(0, 1)(rng) < density) {
            b[i * w + rng() % w] ^= static_cast<std::byte>(1 + rng() % 255);
          }
        }
        for (bool xor_values : {true, false}) {
          std::vector<uint32_t> want_pos;
          std::vector<std::vector<uint8_t>> want(w);
          for (size_t i = 0; i < n; ++i) {
            if (std::memcmp(&a[i * w], &b[i * w], w) == 0) continue;
            want_pos.push_back(static_cast<uint32_t>(i));
            for (size_t j = 0; j < w; ++j) {
              uint8_t v = static_cast<uint8_t>(b[i * w + j]);
              if (xor_values) v ^= static_cast<uint8_t>(a[i * w + j]);
              want[j].push_back(v);
            }
          }
          for (const auto& [name, ops] : ContextScans()) {
            SCOPED_TRACE(name + " w " + std::to_string(w) + " n " +
                         std::to_string(n) + " density " +
                         std::to_string(density) + " xor " +
                         std::to_string(xor_values));
            // Exactly n entries each: the scan must not write past them.
            std::vector<uint32_t> pos(n);
            std::vector<std::vector<uint8_t>> planes(w,
                                                     std::vector<uint8_t>(n));
            uint8_t* ptrs[8];
            for (size_t j = 0; j < w; ++j) ptrs[j] = planes[j].data();
            const size_t got = ops->find_changes(w, a.data(), b.data(), n,
                                                 xor_values, pos.data(), ptrs);
            ASSERT_EQ(got, want_pos.size());
            pos.resize(got);
            EXPECT_EQ(pos, want_pos);
            for (size_t j = 0; j < w; ++j) {
              planes[j].resize(got);
              EXPECT_EQ(planes[j], want[j]) << "plane " << j;
            }
          }
        }
      }
    }
  }
}

// The decoder's value-group steps of every compilation against plain
// loops: group counts, and each change's value taken from its group's
// planes in order, over every width, group count and lengths around the
// 64-change step. Each group plane holds exactly its values (ASan sees a
// read past them), and the output is poisoned first.
TEST(ValueGroupsTest, EveryCompilationMatchesAPlainLoop) {
  std::mt19937_64 rng(11);
  for (size_t w : {1, 2, 4}) {
    for (size_t groups : {1, 2, 3, 4}) {
      for (size_t n : {0, 1, 63, 64, 65, 127, 128, 200, 1000}) {
        std::vector<uint8_t> group(n);
        // Skewed, as real chunks are: some groups rare or absent.
        for (auto& g : group) {
          g = static_cast<uint8_t>(
              std::min<uint64_t>(rng() % (groups + 2), groups - 1));
        }
        std::vector<size_t> count(groups, 0);
        for (uint8_t g : group) ++count[g];
        std::vector<std::vector<uint8_t>> planes(groups * w);
        std::vector<const uint8_t*> gp(groups * w);
        for (size_t g = 0; g < groups; ++g) {
          for (size_t j = 0; j < w; ++j) {
            auto& p = planes[g * w + j];
            p.resize(count[g]);
            for (auto& x : p) x = static_cast<uint8_t>(rng());
            gp[g * w + j] = p.data();
          }
        }
        std::vector<std::byte> want(n * w);
        std::vector<size_t> next(groups, 0);
        for (size_t i = 0; i < n; ++i) {
          const size_t g = group[i];
          for (size_t j = 0; j < w; ++j) {
            want[i * w + j] = std::byte{planes[g * w + j][next[g]]};
          }
          ++next[g];
        }
        for (const auto& [name, ops] : ContextScans()) {
          SCOPED_TRACE(name + " w " + std::to_string(w) + " groups " +
                       std::to_string(groups) + " n " + std::to_string(n));
          std::array<size_t, 4> got_count;
          got_count.fill(99);
          ops->count_groups(group.data(), n, groups, got_count.data());
          for (size_t g = 0; g < groups; ++g) {
            EXPECT_EQ(got_count[g], count[g]) << "group " << g;
          }
          if (groups < 2) continue;  // JoinPlanes' case, not this op's
          std::vector<std::byte> got(n * w, std::byte{0xA5});
          ops->gather_groups(w, group.data(), n, groups, gp.data(), got.data());
          EXPECT_EQ(got, want);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Widths, ContextScanTest,
    ::testing::Values(
        Case{2, {7, 8}, 4096, 8, 0.03},         // BF16, the common case
        Case{2, {7, 8}, 64 * 70 + 13, 8, 0.6},  // dense: inverted ranges
        Case{2, {7, 8}, 64 * 33 + 1, 1, 0.05},
        Case{2, {7, 8}, 64 * 40 + 63, 16, 0.1},   // beyond the unrolled 8
        Case{2, {10, 5}, 5000, 5, 0.05},          // F16
        Case{2, {8, 8}, 3000, 6, 0.05},           // a field with the sign bit
        Case{4, {23, 8}, 64 * 50 + 17, 8, 0.05},  // F32
        Case{1, {3, 4}, 64 * 60 + 5, 7, 0.05},    // F8_E4M3
        Case{1, {2, 5}, 4100, 12, 0.2}),          // F8_E5M2
    [](const auto& param_info) {
      const Case& c = param_info.param;
      return "w" + std::to_string(c.w) + "_shift" +
             std::to_string(c.field.shift) + "_k" + std::to_string(c.k) + "_n" +
             std::to_string(c.n);
    });

}  // namespace
}  // namespace dcr
