// Affine pieces (dcr/placement.h): tilings built at random (grid splits,
// shards larger than their box, transposes, interleaves) must pass the
// tiling check and map both ways as bijections; projected changes of all
// ranks must be exactly the canonical changed set, and each piece's
// first() and last() bound its images; overlaps, gaps and
// malformed pieces are refused with the tensor and ranks named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "dcr/placement.h"
#include "unit/placement/random_tiling.h"

namespace dcr {
namespace {

using placement_testing::RandomShape;
using placement_testing::RandomTiling;
using placement_testing::Volume;
using ::testing::HasSubstr;

TEST(AffineTest, RandomTilingsAreBijections) {
  std::mt19937_64 rng(1);
  for (int iter = 0; iter < 300; ++iter) {
    const Shape shape = RandomShape(rng);
    const std::vector<AffinePiece> pieces = RandomTiling(shape, rng);
    SCOPED_TRACE("iteration " + std::to_string(iter));
    ASSERT_TRUE(CheckTiling("t", shape, pieces).ok())
        << CheckTiling("t", shape, pieces).ToString();
    std::vector<PieceMap> maps;
    for (const auto& p : pieces) maps.emplace_back(p, shape);
    // Every canonical element comes from exactly one shard element, and
    // back.
    for (uint64_t c = 0; c < Volume(shape); ++c) {
      int found = 0;
      for (const PieceMap& m : maps) {
        uint64_t s;
        if (!m.ToShard(c, &s)) continue;
        ++found;
        ASSERT_TRUE(m.Holds(s));
        EXPECT_EQ(m.ToCanonical(s), c);
      }
      EXPECT_EQ(found, 1) << "canonical element " << c;
    }
    // Every shard element of a box lands inside the tensor, and back; the
    // images' least and greatest positions are first() and last().
    for (size_t i = 0; i < pieces.size(); ++i) {
      uint64_t held = 0;
      uint64_t lo = ~uint64_t{0}, hi = 0;
      for (uint64_t s = 0; s < Volume(pieces[i].shard_shape); ++s) {
        if (!maps[i].Holds(s)) continue;
        ++held;
        const uint64_t c = maps[i].ToCanonical(s);
        lo = std::min(lo, c);
        hi = std::max(hi, c);
        ASSERT_LT(c, Volume(shape));
        uint64_t back;
        ASSERT_TRUE(maps[i].ToShard(c, &back));
        EXPECT_EQ(back, s);
      }
      EXPECT_EQ(held, maps[i].elements());
      if (held != 0) {
        EXPECT_EQ(maps[i].first(), lo) << "piece " << i;
        EXPECT_EQ(maps[i].last(), hi) << "piece " << i;
      }
    }
  }
}

// Each rank diffs its own shards and projects the changes: together they
// are exactly the canonical changed set, each once.
TEST(AffineTest, ProjectedChangesAreTheCanonicalChangedSet) {
  std::mt19937_64 rng(2);
  for (int iter = 0; iter < 200; ++iter) {
    const Shape shape = RandomShape(rng);
    const std::vector<AffinePiece> pieces = RandomTiling(shape, rng);
    ASSERT_TRUE(CheckTiling("t", shape, pieces).ok());
    const uint64_t n = Volume(shape);
    std::vector<uint16_t> base(n), target(n);
    for (auto& x : base) x = static_cast<uint16_t>(rng());
    target = base;
    std::vector<uint64_t> want;
    for (uint64_t c = 0; c < n; ++c) {
      if (rng() % 4 == 0) {
        target[c] ^= static_cast<uint16_t>(1 + rng() % 0xffff);
        want.push_back(c);
      }
    }
    std::vector<uint64_t> got;
    for (const AffinePiece& p : pieces) {
      const PieceMap m(p, shape);
      // The shard as the trainer holds it: the box's elements gathered
      // from the canonical tensor, the rest of the shard unrelated bits.
      const uint64_t sn = Volume(p.shard_shape);
      std::vector<uint16_t> sb(sn, 7), st(sn, 7);
      for (uint64_t s = 0; s < sn; ++s) {
        if (!m.Holds(s)) continue;
        sb[s] = base[m.ToCanonical(s)];
        st[s] = target[m.ToCanonical(s)];
      }
      std::vector<uint64_t> changed;
      for (uint64_t s = 0; s < sn; ++s) {
        if (sb[s] != st[s]) changed.push_back(s);
      }
      const size_t before = got.size();
      m.Project(changed, &got);
      EXPECT_TRUE(std::is_sorted(got.begin() + static_cast<ptrdiff_t>(before),
                                 got.end()));
    }
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << "iteration " << iter;
  }
}

// Megatron-style: a column-parallel weight split by rows over 4 ranks, a
// row-parallel one by columns, a fused QKV with grouped-query attention
// interleaved per group, and a padded vocabulary.
TEST(AffineTest, MegatronLayoutsTile) {
  const uint64_t hidden = 16, head = 2, heads = 8, kv = 2, tp = 2;
  // q: [heads * head, hidden], k and v: [kv * head, hidden]. Each rank's
  // fused shard holds, per local group, the group's q heads then its k
  // head then its v head.
  const uint64_t q_per_group = heads / kv;
  const uint64_t groups_per_rank = kv / tp;
  const uint64_t group_rows = (q_per_group + 2) * head;
  std::map<std::string, std::vector<AffinePiece>> by;
  for (uint32_t r = 0; r < tp; ++r) {
    const Shape shard = {groups_per_rank * group_rows, hidden};
    for (uint64_t g = 0; g < groups_per_rank; ++g) {
      const uint64_t global = r * groups_per_rank + g;
      const uint64_t row = g * group_rows;
      auto piece = [&](uint64_t from_row, uint64_t rows, uint64_t to_row) {
        AffinePiece p =
            AffinePiece::Block(r, "qkv", {rows, hidden}, {to_row, 0});
        p.shard_shape = shard;
        p.from = {from_row, 0};
        return p;
      };
      by["q"].push_back(
          piece(row, q_per_group * head, global * q_per_group * head));
      by["k"].push_back(piece(row + q_per_group * head, head, global * head));
      by["v"].push_back(
          piece(row + (q_per_group + 1) * head, head, global * head));
    }
  }
  EXPECT_TRUE(CheckTiling("q", {heads * head, hidden}, by["q"]).ok());
  EXPECT_TRUE(CheckTiling("k", {kv * head, hidden}, by["k"]).ok());
  EXPECT_TRUE(CheckTiling("v", {kv * head, hidden}, by["v"]).ok());

  // A vocabulary of 1000 padded to 1024 across 4 ranks: the last rank's
  // shard holds 256 rows of which 232 are real.
  std::vector<AffinePiece> embed;
  for (uint32_t r = 0; r < 4; ++r) {
    const uint64_t rows = r < 3 ? 256 : 1000 - 3 * 256;
    AffinePiece p =
        AffinePiece::Block(r, "embed", {rows, hidden}, {r * 256, 0});
    p.shard_shape = {256, hidden};
    embed.push_back(p);
  }
  EXPECT_TRUE(CheckTiling("embed", {1000, hidden}, embed).ok());
}

TEST(AffineTest, OverlapsAreRefusedNamingBothRanks) {
  std::vector<AffinePiece> p = {
      AffinePiece::Block(0, "a", {4, 8}, {0, 0}),
      AffinePiece::Block(3, "b", {5, 8}, {3, 0}),
  };
  Status st = CheckTiling("w", {8, 8}, p);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(st.message(), HasSubstr("rank 0 (shard 'a')"));
  EXPECT_THAT(st.message(), HasSubstr("rank 3 (shard 'b')"));
}

TEST(AffineTest, InterleavesMeetOnlyWhereTheyShareAnElement) {
  auto rows = [](uint32_t rank, uint64_t first, uint64_t step, uint64_t n) {
    AffinePiece p = AffinePiece::Block(rank, "r", {n, 1}, {first, 0});
    p.step = {step, 1};
    return p;
  };
  // Rows 0, 2, 4, 6 and rows 1, 3, 5, 7: a tiling.
  EXPECT_TRUE(
      CheckTiling("t", {8, 1}, std::vector{rows(0, 0, 2, 4), rows(1, 1, 2, 4)})
          .ok());
  // Steps 4 and 6 from 0 and 6 meet at 12; from 1 and 6 they never do.
  EXPECT_FALSE(CheckTiling("t", {40, 1},
                           std::vector{rows(0, 0, 4, 10), rows(1, 6, 6, 5)})
                   .ok());
  Status st = CheckTiling("t", {40, 1},
                          std::vector{rows(0, 1, 4, 10), rows(1, 6, 6, 5)});
  EXPECT_THAT(st.message(), HasSubstr("held by no rank"));
  // Past the end of one progression they do not meet.
  EXPECT_THAT(CheckTiling("t", {40, 1},
                          std::vector{rows(0, 0, 4, 3), rows(1, 12, 6, 2)})
                  .message(),
              HasSubstr("held by no rank"));
}

// Where the ranges of two progressions overlap and their gcd divides the
// difference of their starts, they may still share no element; and steps
// and positions near 2^64 must not overflow the arithmetic.
TEST(AffineTest, ProgressionsMeetExactly) {
  auto rows = [](uint32_t rank, uint64_t first, uint64_t step, uint64_t n) {
    AffinePiece p = AffinePiece::Block(rank, "r", {n}, {first});
    p.step = {step};
    return p;
  };
  // {0, 6} and {4, 8}: gcd 2 divides 4, the ranges overlap on [4, 6],
  // yet they share nothing.
  EXPECT_THAT(
      CheckTiling("t", {9}, std::vector{rows(0, 0, 6, 2), rows(1, 4, 4, 2)})
          .message(),
      HasSubstr("held by no rank"));
  // {0, 6, 12} and {4, 8, 12}: they share 12.
  EXPECT_THAT(
      CheckTiling("t", {13}, std::vector{rows(0, 0, 6, 3), rows(1, 4, 4, 3)})
          .message(),
      HasSubstr("hold the same elements"));
  const uint64_t big = UINT64_MAX;
  // {0, 2^64 - 3} and {12345}: disjoint.
  EXPECT_THAT(CheckTiling("t", {big},
                          std::vector{rows(0, 0, big - 2, 2),
                                      rows(1, 12345, big - 1, 1)})
                  .message(),
              HasSubstr("held by no rank"));
  // a + 2s = b with a, s, b near 2^63-2^64: they meet.
  EXPECT_THAT(
      CheckTiling(
          "t", {big},
          std::vector{
              rows(0, 4661357722308371504ull, 6813261153219219603ull, 3),
              rows(1, 18287880028746810710ull, 14279084399169586636ull, 1)})
          .message(),
      HasSubstr("hold the same elements"));
  // One element each, steps that would overflow a product of two of them.
  EXPECT_TRUE(
      CheckTiling(
          "t", {4, 2},
          std::vector{
              [&] {
                AffinePiece p = AffinePiece::Block(0, "a", {4, 1}, {0, 0});
                p.step = {1, big};
                return p;
              }(),
              [&] {
                AffinePiece p = AffinePiece::Block(1, "b", {4, 1}, {0, 1});
                p.step = {1, big - 1};
                return p;
              }()})
          .ok());
}

TEST(AffineTest, GapsAreCounted) {
  Status st = CheckTiling(
      "w", {8, 8}, std::vector{AffinePiece::Block(0, "a", {4, 8}, {0, 0})});
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("32 of its 64 elements"));
}

TEST(AffineTest, MalformedPiecesAreRefused) {
  const Shape shape = {8, 8};
  auto expect_bad = [&](AffinePiece p, const std::string& text) {
    Status st = CheckPiece("w", shape, p);
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_THAT(st.message(), HasSubstr("tensor 'w', rank 2 shard 's'"));
    EXPECT_THAT(st.message(), HasSubstr(text));
  };
  const AffinePiece good = AffinePiece::Block(2, "s", {4, 4}, {0, 0});
  ASSERT_TRUE(CheckPiece("w", shape, good).ok());
  AffinePiece p = good;
  p.to = {6, 0};
  expect_bad(p, "leaves the canonical shape [8, 8] along dimension 0");
  p = good;
  p.axis = {0, 0};
  expect_bad(p, "permutation");
  p = good;
  p.step = {0, 1};
  expect_bad(p, "step");
  p = good;
  p.from = {1, 0};
  expect_bad(p, "leaves the shard's shape");
  p = good;
  p.extent = {0, 4};
  expect_bad(p, "empty");
  p = good;
  p.to = {0};
  expect_bad(p, "2 dimensions");
  p = good;
  p.shard_shape = {UINT64_MAX, 4};
  p.from = {0, 0};
  expect_bad(p, "overflows");
  // A canonical tensor whose size does not fit in 64 bits.
  Status st = CheckPiece("w", {uint64_t{1} << 33, uint64_t{1} << 33}, good);
  EXPECT_THAT(st.message(), HasSubstr("canonical tensor's size overflows"));
  // An empty canonical tensor is held by no piece, and needs none.
  EXPECT_TRUE(CheckTiling("e", {uint64_t{1} << 40, uint64_t{1} << 40, 0},
                          std::vector<AffinePiece>{})
                  .ok());
}

TEST(AffineTest, ScalarsMapToThemselves) {
  const AffinePiece p = AffinePiece::Block(0, "s", {}, {});
  ASSERT_TRUE(CheckTiling("scale", {}, std::vector{p}).ok());
  const PieceMap m(p, {});
  EXPECT_TRUE(m.Holds(0));
  EXPECT_EQ(m.ToCanonical(0), 0u);
  uint64_t s;
  EXPECT_TRUE(m.ToShard(0, &s));
  EXPECT_FALSE(m.ToShard(1, &s));
}

}  // namespace
}  // namespace dcr
